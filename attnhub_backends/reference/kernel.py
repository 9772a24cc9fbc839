"""Blockwise float64 attention and its analytic backward in NumPy: the oracle of every backend.

Queries are processed in blocks so that memory is O(block x Nk), never O(Nq x Nk); within a block
only the key columns between the first and last attended key are touched. SPEC §9 modifiers
(softcap, bias, sinks) and §11 offsets are applied per block; §10 ragged requests (lengths,
packed sequences, paged caches) are split into one dense problem per batch entry or sequence
(:mod:`segments`), each exactly the request SPEC §10 says it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from attnhub.modifiers.alibi import MODIFIER as ALIBI
from attnhub.positions import check_position_range, grid_positions, rule_mask
from attnhub.request import Request
from attnhub.rules import ExplicitMask, Full
from attnhub_backends.reference import segments

#: Bytes of float64 logits one query block may hold (per temporary).
BLOCK_BYTES = 1 << 25


def _query_blocks(req: Request) -> int:
    per_row = 8 * max(1, req.batch * req.heads_q * req.nk)
    return max(1, min(req.nq, BLOCK_BYTES // per_row))


class _Block:
    """One block of queries: its rows, the key columns it touches and the rule's mask there."""

    def __init__(
        self, rows: slice, lo: int, hi: int, keep: np.ndarray, fq: np.ndarray, fk: np.ndarray
    ) -> None:
        self.rows, self.lo, self.hi, self.keep = rows, lo, hi, keep
        self.fq, self.fk = fq, fk  # the rows' and columns' flat positions (1-d: P(i), R(j))
        self._alibi: tuple[np.ndarray, np.ndarray] | None = None

    def alibi_distances(self) -> tuple[np.ndarray, np.ndarray]:
        """(|P − R| less each row's nearest column's, that nearest distance (rows, 1)), float64 from
        exact integers; computed once per block (forward and backward both read it)."""
        if self._alibi is None:
            d = np.abs(self.fq[:, None] - self.fk[None, :])
            near = d.min(axis=1, keepdims=True)
            self._alibi = (d - near).astype(np.float64), near.astype(np.float64)
        return self._alibi


def _blocks(req: Request) -> Iterator[_Block]:
    # SPEC §12: positions in [-2**30, 2**30) (the core checks it; a request given directly is
    # checked here too), so that the int64 positions and their differences below cannot wrap.
    check_position_range(req.seq_q, req.seq_k, req.q_offset, req.k_offset)
    pq, pk, fq, fk = grid_positions(req.seq_q, req.seq_k, req.sync)
    if req.q_offset or req.k_offset:  # SPEC §11 (1-d: the flat index is the position)
        pq, fq = [pq[0] + req.q_offset], fq + req.q_offset
        pk, fk = [pk[0] + req.k_offset], fk + req.k_offset
    rule = Full() if isinstance(req.rule, ExplicitMask) else req.rule
    bq = _query_blocks(req)
    for start in range(0, req.nq, bq):
        rows = slice(start, min(start + bq, req.nq))
        keep = rule_mask(rule, [p[rows] for p in pq], pk, fq[rows], fk)
        cols = np.flatnonzero(keep.any(axis=0))
        if cols.size == 0:
            yield _Block(rows, 0, 0, keep[:, :0], fq[rows], fk[:0])
            continue
        lo, hi = int(cols[0]), int(cols[-1]) + 1
        yield _Block(rows, lo, hi, keep[:, lo:hi], fq[rows], fk[lo:hi])


def _restrict(a: np.ndarray, req: Request, blk: _Block) -> np.ndarray:
    """A rank-4 broadcastable array (mask or bias) restricted to a block, shaped
    (b, Hkv|1, G|1, rows, cols) for broadcasting against the grouped logits."""
    mb, mh, mq, mk = a.shape
    m = a[:, :, blk.rows if mq > 1 else slice(None), slice(blk.lo, blk.hi) if mk > 1 else slice(None)]
    if mh > 1:
        return m.reshape(mb, req.heads_kv, req.group, m.shape[2], m.shape[3])
    return m.reshape(mb, 1, 1, m.shape[2], m.shape[3])


@dataclasses.dataclass
class _Mods:
    """The float64 NumPy modifiers of one dense problem."""

    mask: np.ndarray | None = None  # bool rank 4
    bias: np.ndarray | None = None  # float64 rank 4
    sinks: np.ndarray | None = None  # float64 (Hq,)
    alibi: np.ndarray | None = None  # float64 (B | 1, Hq) ALiBi slopes


def _logits(qg, k64, req: Request, blk: _Block, mods: _Mods):
    """Masked float64 logits of a block, shape (B, Hkv, G, rows, cols), and the softcap's
    derivative factor ``1 - tanh²`` (None without softcap)."""
    s = (qg[:, :, :, blk.rows, :] @ np.swapaxes(k64[:, :, :, blk.lo : blk.hi, :], -1, -2)) * req.scale
    dcap = None
    if req.softcap is not None:
        th = np.tanh(s / req.softcap)
        s, dcap = req.softcap * th, 1.0 - th * th
    keep = blk.keep
    if mods.mask is not None:
        keep = keep & _restrict(mods.mask, req, blk)
    if mods.bias is not None:
        s = s + _restrict(mods.bias, req, blk)
    if mods.alibi is not None:  # SPEC §9: − slope · |P(i) − R(j)|, less the row's constant (_alibi_shift)
        s = s - _slopes(req, mods) * blk.alibi_distances()[0]
    return np.where(keep, s, -np.inf), dcap


def _slopes(req: Request, mods: _Mods) -> np.ndarray:
    return mods.alibi.reshape(mods.alibi.shape[0], req.heads_kv, req.group, 1, 1)  # type: ignore[union-attr]


def _alibi_shift(req: Request, blk: _Block, mods: _Mods) -> np.ndarray | float:
    """The ALiBi term of each row of a block at its nearest column, (B | 1, Hkv, G, rows, 1), which
    :func:`_logits` leaves out: at SPEC §11's positions the term reaches 1e9, where float64 would
    lose the logits' differences; distances are integers, so the split is exact. Softmax ignores
    it; lse adds it back and the sink's logit is compared against it. 0 without ALiBi."""
    if mods.alibi is None or blk.hi == blk.lo:
        return 0.0
    return -_slopes(req, mods) * blk.alibi_distances()[1]


def _sink_logits(req: Request, mods: _Mods) -> np.ndarray | None:
    """Sinks shaped (1, Hkv, G, 1, 1) to join every row's softmax, or None."""
    if mods.sinks is None:
        return None
    return mods.sinks.reshape(1, req.heads_kv, req.group, 1, 1)


def _softmax_parts(s, sink):
    """Unnormalised probabilities, row sums (the sink's share included) and row maxima, safe for
    fully masked rows."""
    m = s.max(axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf)
    if sink is not None:
        m = np.maximum(m, sink)
    m_safe = np.where(m == -np.inf, 0.0, m)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    if sink is not None:
        l = l + np.exp(sink - m_safe)
    return p, l, m_safe


def _weighted_values(p: np.ndarray, s: np.ndarray, vb: np.ndarray) -> np.ndarray:
    """``p @ vb`` over a block's keys, except that a NaN or Inf in the value of a key a row
    excludes (logit −inf: the rule, a mask, lengths or a −inf bias) does not reach that row, as
    SPEC §4 asks of the oracle (``0 × NaN`` would spread it); the exact sum only where needed."""
    bad = ~np.isfinite(vb).all(axis=(0, 1, 2, 4))  # keys with a NaN or Inf in their value
    if not bad.any():
        return p @ vb
    good, bad = np.flatnonzero(~bad), np.flatnonzero(bad)
    pv = p[..., good] @ vb[:, :, :, good]
    terms = p[..., bad, None] * vb[:, :, :, None, bad]  # (B, Hkv, G, rows, bad keys, Dv)
    return pv + np.where((s[..., bad] != -np.inf)[..., None], terms, 0.0).sum(axis=-2)


def _grouped(q: np.ndarray, req: Request) -> np.ndarray:
    return q.astype(np.float64).reshape(req.batch, req.heads_kv, req.group, req.nq, q.shape[-1])


def _kv(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)[:, :, None]


def _mods(req: Request, mask, ops) -> _Mods:
    bias = None if ops is None else ops.bias
    sinks = None if ops is None else ops.sinks
    alibi = None if ops is None or not ops.more else ops.more.get(ALIBI.name)
    return _Mods(
        alibi=None if alibi is None else np.asarray(alibi, dtype=np.float64),
        mask=None if mask is None else np.asarray(mask),
        bias=None if bias is None else np.asarray(bias, dtype=np.float64),
        sinks=None if sinks is None else np.asarray(sinks, dtype=np.float64),
    )


def forward(q, k, v, req: Request, mask=None, ops=None) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) in float64 for canonical NumPy inputs (see attnhub.backend); ``ops`` holds the
    §9-§11 arrays as NumPy (an :class:`attnhub.operands.Operands`)."""
    mods = _mods(req, mask, ops)
    if req.ragged:
        return segments.forward(_dense_forward, q, k, v, req, mods, ops)
    return _dense_forward(q, k, v, req, mods)


def _dense_forward(q, k, v, req: Request, mods: _Mods) -> tuple[np.ndarray, np.ndarray]:
    qg, k64, v64 = _grouped(q, req), _kv(k), _kv(v)
    sink = _sink_logits(req, mods)
    out = np.zeros((req.batch, req.heads_kv, req.group, req.nq, req.dim_v))
    lse = np.full((req.batch, req.heads_kv, req.group, req.nq), -np.inf)
    if sink is not None:
        lse[...] = sink[..., 0]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for blk in _blocks(req):
            if blk.hi == blk.lo:
                continue
            s, _ = _logits(qg, k64, req, blk, mods)
            shift = _alibi_shift(req, blk, mods)
            p, l, m = _softmax_parts(s, None if sink is None else sink - shift)
            pv = _weighted_values(p, s, v64[:, :, :, blk.lo : blk.hi, :])
            out[:, :, :, blk.rows, :] = np.where(l == 0, 0.0, pv / l)
            lse[:, :, :, blk.rows] = np.where(l == 0, -np.inf, m + np.log(l) + shift)[..., 0]
    shape = (req.batch, req.heads_q, req.nq)
    return out.reshape(*shape, req.dim_v), lse.reshape(shape)


def backward(q, k, v, dout, req: Request, mask=None, dlse=None, ops=None) -> tuple:
    """(dq, dk, dv) in float64, or (dq, dk, dv, dbias, dsinks) when ``ops`` is given (None for
    a gradient the request does not have); the forward is recomputed exactly per block.

    ``dlse`` (B, Hq, Nq), when given, is the upstream gradient of lse: dS = P * (dP - rowsum(dO·O) + dlse).
    """
    mods = _mods(req, mask, ops)
    if req.ragged:
        grads = segments.backward(_dense_backward, q, k, v, dout, req, mods, ops, dlse)
    else:
        grads = _dense_backward(q, k, v, dout, req, mods, dlse)
    return grads if ops is not None else grads[:3]


def _dense_backward(q, k, v, dout, req: Request, mods: _Mods, dlse=None) -> tuple:
    qg, k64, v64 = _grouped(q, req), _kv(k), _kv(v)
    dog = _grouped(dout, req)
    dlg = None if dlse is None else _grouped(np.asarray(dlse)[..., None], req)
    sink = _sink_logits(req, mods)
    dq = np.zeros_like(qg)
    dk = np.zeros((req.batch, req.heads_kv, req.nk, req.dim_qk))
    dv = np.zeros((req.batch, req.heads_kv, req.nk, req.dim_v))
    dbias = None if mods.bias is None else np.zeros(mods.bias.shape)
    dsinks = None if sink is None else np.zeros((req.batch, req.heads_kv, req.group))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        covered = np.zeros(req.nq, dtype=bool)
        for blk in _blocks(req):
            if blk.hi == blk.lo:
                continue
            covered[blk.rows] = True
            s, dcap = _logits(qg, k64, req, blk, mods)
            blk_sink = None if sink is None else sink - _alibi_shift(req, blk, mods)
            p, l, m = _softmax_parts(s, blk_sink)
            p = np.where(l == 0, 0.0, p / l)
            vb = v64[:, :, :, blk.lo : blk.hi, :]
            kb = k64[:, :, :, blk.lo : blk.hi, :]
            do = dog[:, :, :, blk.rows, :]
            o = p @ vb
            dp = do @ np.swapaxes(vb, -1, -2)
            delta = (do * o).sum(axis=-1, keepdims=True)
            if dlg is not None:
                delta = delta - dlg[:, :, :, blk.rows, :]
            ds = p * (dp - delta)  # dL/ds: the gradient of the biased logits
            if sink is not None:
                p_sink = np.where(l == 0, 0.0, np.exp(blk_sink - m) / l)
                dsinks += (-(p_sink * delta)[..., 0]).sum(axis=-1)
            if dbias is not None:
                _accumulate_bias(dbias, ds, req, blk)
            dt = ds if dcap is None else ds * dcap
            dt = dt * req.scale
            dq[:, :, :, blk.rows, :] = dt @ kb
            dk[:, :, blk.lo : blk.hi, :] += (np.swapaxes(dt, -1, -2) @ qg[:, :, :, blk.rows, :]).sum(axis=2)
            dv[:, :, blk.lo : blk.hi, :] += (np.swapaxes(p, -1, -2) @ do).sum(axis=2)
        if sink is not None and dlg is not None and not covered.all():
            # Rows no key reaches (lse = sink): d lse / d sink = 1.
            dsinks += dlg[:, :, :, ~covered, 0].sum(axis=-1)
    dsinks_hq = None if dsinks is None else dsinks.reshape(req.batch, req.heads_q).sum(axis=0)
    return dq.reshape(req.batch, req.heads_q, req.nq, req.dim_qk), dk, dv, dbias, dsinks_hq


def _accumulate_bias(dbias: np.ndarray, ds: np.ndarray, req: Request, blk: _Block) -> None:
    """Add a block's dL/ds (B, Hkv, G, rows, cols) into ``dbias`` (the bias's rank-4 shape),
    summed over the bias's broadcast dimensions."""
    g = ds.reshape(req.batch, req.heads_q, ds.shape[3], ds.shape[4])
    mb, mh, mq, mk = dbias.shape
    axes = tuple(a for a, n in enumerate((mb, mh, mq, mk)) if n == 1 and g.shape[a] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    rows = blk.rows if mq > 1 else slice(None)
    cols = slice(blk.lo, blk.hi) if mk > 1 else slice(None)
    dbias[:, :, rows, cols] += g


def backend_ops(ops: Any, to_numpy) -> Any:
    """``ops`` (an :class:`attnhub.operands.Operands` of framework arrays) as NumPy."""
    if ops is None:
        return None
    conv = {f.name: getattr(ops, f.name) for f in dataclasses.fields(ops)}
    for name, x in conv.items():
        if isinstance(x, dict):  # Operands.more: the added modifiers' arrays
            conv[name] = {n: a if isinstance(a, np.ndarray) else to_numpy(a) for n, a in x.items()}
        elif x is not None and not isinstance(x, (int, np.ndarray)):
            conv[name] = to_numpy(x)
    return type(ops)(**conv)
