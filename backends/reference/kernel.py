"""Blockwise float64 attention and its analytic backward in NumPy: the oracle of every backend.

Queries are processed in blocks so that memory is O(block x Nk), never O(Nq x Nk); within a block
only the key columns between the first and last attended key are touched.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from attnhub.positions import grid_positions, rule_mask
from attnhub.request import Request
from attnhub.rules import ExplicitMask, Full

#: Bytes of float64 logits one query block may hold (per temporary).
BLOCK_BYTES = 1 << 25


def _query_blocks(req: Request) -> int:
    per_row = 8 * max(1, req.batch * req.heads_q * req.nk)
    return max(1, min(req.nq, BLOCK_BYTES // per_row))


class _Block:
    """One block of queries: its rows, the key columns it touches and the logits there."""

    def __init__(self, rows: slice, lo: int, hi: int, keep: np.ndarray) -> None:
        self.rows, self.lo, self.hi, self.keep = rows, lo, hi, keep


def _blocks(req: Request) -> Iterator[_Block]:
    pq, pk, fq, fk = grid_positions(req.seq_q, req.seq_k, req.sync)
    rule = Full() if isinstance(req.rule, ExplicitMask) else req.rule
    bq = _query_blocks(req)
    for start in range(0, req.nq, bq):
        rows = slice(start, min(start + bq, req.nq))
        keep = rule_mask(rule, [p[rows] for p in pq], pk, fq[rows], fk)
        cols = np.flatnonzero(keep.any(axis=0))
        if cols.size == 0:
            yield _Block(rows, 0, 0, keep[:, :0])
            continue
        lo, hi = int(cols[0]), int(cols[-1]) + 1
        yield _Block(rows, lo, hi, keep[:, lo:hi])


def _mask_block(mask: np.ndarray, req: Request, blk: _Block) -> np.ndarray:
    """The explicit mask restricted to a block, shaped (b, Hkv|1, G|1, rows, cols) for broadcasting."""
    mb, mh, mq, mk = mask.shape
    m = mask[:, :, blk.rows if mq > 1 else slice(None), blk.lo : blk.hi if mk > 1 else None]
    if mh > 1:
        return m.reshape(mb, req.heads_kv, req.group, m.shape[2], m.shape[3])
    return m.reshape(mb, 1, 1, m.shape[2], m.shape[3])


def _logits(qg, k64, req: Request, blk: _Block, mask):
    """Masked float64 logits of a block, shape (B, Hkv, G, rows, cols)."""
    s = (qg[:, :, :, blk.rows, :] @ np.swapaxes(k64[:, :, :, blk.lo : blk.hi, :], -1, -2)) * req.scale
    keep = blk.keep
    if mask is not None:
        part = _mask_block(mask, req, blk)
        if req.rule.kind == "bool":
            keep = keep & part
        else:
            s = s + part.astype(np.float64)
    return np.where(keep, s, -np.inf)


def _softmax_parts(s):
    """Unnormalised probabilities, row sums and row maxima, safe for fully masked rows."""
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(m == -np.inf, 0.0, m)
    p = np.exp(s - m_safe)
    return p, p.sum(axis=-1, keepdims=True), m_safe


def _grouped(q: np.ndarray, req: Request) -> np.ndarray:
    return q.astype(np.float64).reshape(req.batch, req.heads_kv, req.group, req.nq, q.shape[-1])


def _kv(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)[:, :, None]


def forward(q, k, v, req: Request, mask=None) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) in float64 for canonical NumPy inputs (see attnhub.backend)."""
    qg, k64, v64 = _grouped(q, req), _kv(k), _kv(v)
    out = np.zeros((req.batch, req.heads_kv, req.group, req.nq, req.dim_v))
    lse = np.full((req.batch, req.heads_kv, req.group, req.nq), -np.inf)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for blk in _blocks(req):
            if blk.hi == blk.lo:
                continue
            s = _logits(qg, k64, req, blk, mask)
            p, l, m = _softmax_parts(s)
            pv = p @ v64[:, :, :, blk.lo : blk.hi, :]
            out[:, :, :, blk.rows, :] = np.where(l == 0, 0.0, pv / l)
            lse[:, :, :, blk.rows] = (m + np.log(l))[..., 0]
    shape = (req.batch, req.heads_q, req.nq)
    return out.reshape(*shape, req.dim_v), lse.reshape(shape)


def backward(q, k, v, dout, req: Request, mask=None, dlse=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv) in float64; the forward is recomputed exactly in float64 per block.

    ``dlse`` (B, Hq, Nq), when given, is the upstream gradient of lse: dS = P * (dP - rowsum(dO·O) + dlse).
    """
    qg, k64, v64 = _grouped(q, req), _kv(k), _kv(v)
    dog = _grouped(dout, req)
    dlg = None if dlse is None else _grouped(np.asarray(dlse)[..., None], req)
    dq = np.zeros_like(qg)
    dk = np.zeros((req.batch, req.heads_kv, req.nk, req.dim_qk))
    dv = np.zeros((req.batch, req.heads_kv, req.nk, req.dim_v))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for blk in _blocks(req):
            if blk.hi == blk.lo:
                continue
            s = _logits(qg, k64, req, blk, mask)
            p, l, _ = _softmax_parts(s)
            p = np.where(l == 0, 0.0, p / l)
            vb = v64[:, :, :, blk.lo : blk.hi, :]
            kb = k64[:, :, :, blk.lo : blk.hi, :]
            do = dog[:, :, :, blk.rows, :]
            o = p @ vb
            dp = do @ np.swapaxes(vb, -1, -2)
            delta = (do * o).sum(axis=-1, keepdims=True)
            if dlg is not None:
                delta = delta - dlg[:, :, :, blk.rows, :]
            ds = p * (dp - delta) * req.scale
            dq[:, :, :, blk.rows, :] = ds @ kb
            dk[:, :, blk.lo : blk.hi, :] += (np.swapaxes(ds, -1, -2) @ qg[:, :, :, blk.rows, :]).sum(axis=2)
            dv[:, :, blk.lo : blk.hi, :] += (np.swapaxes(p, -1, -2) @ do).sum(axis=2)
    return dq.reshape(req.batch, req.heads_q, req.nq, req.dim_qk), dk, dv
