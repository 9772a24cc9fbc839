"""Per-row and per-key positions of ragged 1-d requests (SPEC §10-§11), computed with jnp.

With lengths, packed sequences or offsets the position of a query or key depends on its batch
entry's (or packed sequence's) valid lengths, which may be traced arrays under ``jax.jit``: no
value is read on the host. Every query row and key column gets a validity flag, a position on its
segment's common grid (SPEC §2 with the segment's lengths) and, for packed sequences, the index of
its sequence; :func:`keep` then evaluates the rule on a tile from those arrays alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp

from attnhub.request import Request
from attnhub.rules import Causal, Local

#: Positions and their differences are int32; a window bound above this admits every pair.
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Segments:
    """(Bs, N) arrays, Bs = B (lengths) or 1, padded with invalid entries to whole tiles."""

    qok: Any  # bool: a valid query row
    qpos: Any  # int32: position on its segment's grid (SPEC §2, §11)
    kok: Any
    kpos: Any
    qseg: Any = None  # int32 packed-sequence index (varlen only)
    kseg: Any = None


def uses_segments(req: Request) -> bool:
    """True when positions are not the static ones of :mod:`rulemask` (lengths, varlen, offsets)."""
    return bool(req.q_lengths or req.k_lengths or req.varlen or req.q_offset or req.k_offset)


def _positions(loc: Any, lq: Any, lk: Any, sync: str, query: bool) -> Any:
    """SPEC §2 position of local index ``loc`` in a segment of ``lq`` queries and ``lk`` keys."""
    m = jnp.maximum(lq, lk)
    own = lq if query else lk
    if sync == "none_front":
        return loc
    if sync == "none_end":
        return loc + m - own
    step = m // jnp.maximum(own, 1)
    if sync == "scale_front":
        return loc * step
    return (loc + 1) * step - 1  # scale_end


def _pad(x: Any, n: int, value: Any) -> Any:
    return jnp.pad(x, ((0, 0), (0, n - x.shape[1])), constant_values=value)


def segments(req: Request, ops: dict[str, Any], nq_pad: int, nk_pad: int) -> Segments:
    """The :class:`Segments` of ``req`` from its length arrays (``ops``: q_lengths, k_lengths,
    cu_seqlens_q, cu_seqlens_k, each a jnp array or None)."""
    i32 = jnp.int32
    nq, nk = req.nq, req.nk
    iq = jnp.arange(nq, dtype=i32)[None, :]
    ik = jnp.arange(nk, dtype=i32)[None, :]
    qseg = kseg = None
    if req.varlen:
        cu_q = ops["cu_seqlens_q"].astype(i32)
        cu_k = ops["cu_seqlens_k"].astype(i32)
        qseg = jnp.searchsorted(cu_q[1:], iq, side="right").astype(i32)
        kseg = jnp.searchsorted(cu_k[1:], ik, side="right").astype(i32)
        len_q, len_k = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
        last = len_q.shape[0] - 1
        qs, ks = jnp.minimum(qseg, last), jnp.minimum(kseg, last)
        qloc, kloc = iq - cu_q[qs], ik - cu_k[ks]
        q_lq, q_lk, k_lq, k_lk = len_q[qs], len_k[qs], len_q[ks], len_k[ks]
        qok = (qseg <= last) & (iq < cu_q[-1])
        kok = (kseg <= last) & (ik < cu_k[-1])
    else:
        ql, kl = ops.get("q_lengths"), ops.get("k_lengths")
        lq = jnp.full((1, 1), nq, i32) if ql is None else jnp.clip(ql.astype(i32), 0, nq)[:, None]
        lk = jnp.full((1, 1), nk, i32) if kl is None else jnp.clip(kl.astype(i32), 0, nk)[:, None]
        left = req.padding_side == "left"
        qloc = iq - (nq - lq) if left else iq + 0 * lq
        kloc = ik - (nk - lk) if left else ik + 0 * lk
        qok = (qloc >= 0) & (qloc < lq)
        kok = (kloc >= 0) & (kloc < lk)
        q_lq = k_lq = lq
        q_lk = k_lk = lk
    qpos = _positions(qloc, q_lq, q_lk, req.sync, True) + i32(req.q_offset)
    kpos = _positions(kloc, k_lq, k_lk, req.sync, False) + i32(req.k_offset)
    bs = max(qok.shape[0], kok.shape[0])

    def fit(x: Any, n: int, value: Any) -> Any:
        return _pad(jnp.broadcast_to(x, (bs, x.shape[1])), n, value)

    return Segments(
        qok=fit(qok, nq_pad, False),
        qpos=fit(qpos.astype(i32), nq_pad, 0),
        kok=fit(kok, nk_pad, False),
        kpos=fit(kpos.astype(i32), nk_pad, 0),
        qseg=None if qseg is None else fit(qseg, nq_pad, -1),
        kseg=None if kseg is None else fit(kseg, nk_pad, -2),
    )


def keep(req: Request, seg: Segments, qrows: Any, kcols: Any) -> Any:
    """(Bs, L, bq, bk) bool for the lanes' query rows ``qrows`` (L, bq) x key columns (L, bk)."""
    qok, kok = seg.qok[:, qrows][..., :, None], seg.kok[:, kcols][..., None, :]
    ok = qok & kok
    if seg.qseg is not None:
        ok = ok & (seg.qseg[:, qrows][..., :, None] == seg.kseg[:, kcols][..., None, :])
    rule = req.rule
    if not isinstance(rule, (Causal, Local)):
        return ok
    pq, pk = seg.qpos[:, qrows][..., :, None], seg.kpos[:, kcols][..., None, :]
    if isinstance(rule, Causal) or rule.causal:
        ok = ok & (pq >= pk)
    if isinstance(rule, Local):
        s = rule.stride
        (w,) = rule.windows(1)
        delta = jnp.abs(pq - pk)
        if s > 1:
            ok = ok & ((delta & (s - 1)) == 0)
        if s * w <= _INT32_MAX:
            ok = ok & (delta < s * w)
    return ok
