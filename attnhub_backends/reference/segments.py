"""SPEC §10 in the reference: a ragged request as one dense problem per batch entry or sequence.

Each segment is the request SPEC §10 describes (its valid queries against its valid keys, the rule
and sync mode evaluated on them); its results are written into zero outputs (padded query rows:
out 0, lse −inf, zero gradients) and its gradients scattered back (paged caches: into their blocks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from attnhub.request import Request
from attnhub.rules import ExplicitMask


@dataclasses.dataclass(frozen=True)
class Segment:
    """Batch entry ``b`` (0 for packed sequences): query rows [qs, qs+ql), key rows [ks, ks+kl)."""

    b: int
    qs: int
    ql: int
    ks: int
    kl: int


def spans(req: Request, ops: Any) -> Iterator[Segment]:
    """The segments of a ragged request, from its lengths, cu_seqlens or block table."""
    if req.varlen:
        cq = np.asarray(ops.cu_seqlens_q, dtype=np.int64)
        ck = np.asarray(ops.cu_seqlens_k, dtype=np.int64)
        for n in range(len(cq) - 1):
            yield Segment(0, int(cq[n]), int(cq[n + 1] - cq[n]), int(ck[n]), int(ck[n + 1] - ck[n]))
        return
    nq, nk = req.nq, req.nk
    # Clamped to [0, L] as the kernels do: lengths the core could not check (ATTNHUB_TRUST_LENGTHS).
    ql = (
        np.full(req.batch, nq)
        if ops.q_lengths is None
        else np.clip(np.asarray(ops.q_lengths, np.int64), 0, nq)
    )
    kl = (
        np.full(req.batch, nk)
        if ops.k_lengths is None
        else np.clip(np.asarray(ops.k_lengths, np.int64), 0, nk)
    )
    left = req.padding_side == "left" and not req.paged
    for b in range(req.batch):
        qb, kb = int(ql[b]), int(kl[b])
        yield Segment(b, nq - qb if left else 0, qb, nk - kb if left else 0, kb)


def _slice4(a: np.ndarray | None, seg: Segment) -> np.ndarray | None:
    """A rank-4 broadcastable array restricted to the segment (broadcast dims kept)."""
    if a is None:
        return None
    return a[_index4(a.shape, seg)]


def _index4(shape: tuple[int, ...], seg: Segment) -> tuple[slice, ...]:
    """The segment's slices of a rank-4 broadcastable shape (a broadcast dim is kept whole)."""
    mb, _, mq, mk = shape
    whole = slice(None)
    return (
        slice(seg.b, seg.b + 1) if mb > 1 else whole,
        whole,
        slice(seg.qs, seg.qs + seg.ql) if mq > 1 else whole,
        slice(seg.ks, seg.ks + seg.kl) if mk > 1 else whole,
    )


def _keys(k: np.ndarray, req: Request, ops: Any, seg: Segment) -> tuple[np.ndarray, np.ndarray | None]:
    """The segment's keys (1, Hkv, kl, D) and, for a paged cache, their (block, row) indices."""
    if not req.paged:
        return k[seg.b : seg.b + 1, :, seg.ks : seg.ks + seg.kl], None
    bs = req.paged
    j = np.arange(seg.kl)
    table = np.asarray(ops.block_table, dtype=np.int64)
    where = np.stack([table[seg.b, j // bs], j % bs])
    return np.transpose(k[where[0], where[1]], (1, 0, 2))[None], where


def _sub_request(req: Request, seg: Segment, mods: Any) -> Request:
    rule = req.rule
    if isinstance(rule, ExplicitMask):
        rule = ExplicitMask(kind=rule.kind, shape=_slice4(mods.mask, seg).shape)  # type: ignore[union-attr]
    bias = None if mods.bias is None else _slice4(mods.bias, seg).shape
    return dataclasses.replace(
        req, batch=1, seq_q=(seg.ql,), seq_k=(seg.kl,), rule=rule, bias=bias, q_lengths=False,
        k_lengths=False, varlen=False, paged=0, padding_side="right",
    )  # fmt: skip


def _sub_mods(mods: Any, seg: Segment) -> Any:
    alibi = mods.alibi
    if alibi is not None and alibi.shape[0] > 1:  # (B, Hq) slopes: the segment's batch entry
        alibi = alibi[seg.b : seg.b + 1]
    return dataclasses.replace(mods, mask=_slice4(mods.mask, seg), bias=_slice4(mods.bias, seg), alibi=alibi)


def forward(dense: Callable, q, k, v, req: Request, mods: Any, ops: Any) -> tuple[np.ndarray, np.ndarray]:
    """(out, lse) of a ragged request from ``dense(q, k, v, sub_request, sub_mods)`` per segment."""
    out = np.zeros((req.batch, req.heads_q, req.nq, req.dim_v))
    lse = np.full((req.batch, req.heads_q, req.nq), -np.inf)
    for seg in spans(req, ops):
        if seg.ql == 0:
            continue
        kb, _ = _keys(k, req, ops, seg)
        vb, _ = _keys(v, req, ops, seg)
        qb = q[seg.b : seg.b + 1, :, seg.qs : seg.qs + seg.ql]
        o, l = dense(qb, kb, vb, _sub_request(req, seg, mods), _sub_mods(mods, seg))
        out[seg.b, :, seg.qs : seg.qs + seg.ql] = o[0]
        lse[seg.b, :, seg.qs : seg.qs + seg.ql] = l[0]
    return out, lse


def backward(dense: Callable, q, k, v, dout, req: Request, mods: Any, ops: Any, dlse: Any) -> tuple:
    """(dq, dk, dv, dbias, dsinks) of a ragged request, per segment through ``dense``."""
    dq = np.zeros(q.shape)
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    dbias = None if mods.bias is None else np.zeros(mods.bias.shape)
    dsinks = None if mods.sinks is None else np.zeros(req.heads_q)
    dl = None if dlse is None else np.asarray(dlse, dtype=np.float64)
    for seg in spans(req, ops):
        if seg.ql == 0:
            continue
        rows = slice(seg.qs, seg.qs + seg.ql)
        kb, where = _keys(k, req, ops, seg)
        vb, _ = _keys(v, req, ops, seg)
        sub = _sub_request(req, seg, mods)
        g = dense(
            q[seg.b : seg.b + 1, :, rows], kb, vb, dout[seg.b : seg.b + 1, :, rows], sub,
            _sub_mods(mods, seg), None if dl is None else dl[seg.b : seg.b + 1, :, rows],
        )  # fmt: skip
        dq[seg.b, :, rows] = g[0][0]
        if where is None:
            dk[seg.b, :, seg.ks : seg.ks + seg.kl] += g[1][0]
            dv[seg.b, :, seg.ks : seg.ks + seg.kl] += g[2][0]
        else:  # paged: back into the blocks, (Hkv, kl, D) -> rows of (num_blocks, bs, Hkv, D)
            np.add.at(dk, (where[0], where[1]), np.transpose(g[1][0], (1, 0, 2)))
            np.add.at(dv, (where[0], where[1]), np.transpose(g[2][0], (1, 0, 2)))
        if dbias is not None:
            dbias[_index4(dbias.shape, seg)] += g[3]
        if dsinks is not None:
            dsinks += g[4]
    return dq, dk, dv, dbias, dsinks
