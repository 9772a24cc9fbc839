"""Per-entry positions of ragged requests (SPEC §10-§11) as TensorFlow tensors.

With ``q_lengths``/``k_lengths`` or packed sequences (``attention_varlen``) the positions of SPEC §2
depend on lengths known only when the call runs (they may be symbolic inside ``tf.function``), so
they cannot be planned at trace time like the rule masks of dense requests. Here each query row
and key column gets, per batch entry, its position on the common grid of its own segment and a
segment id; a pair is attended iff both ids agree and the rule holds on the two positions. Padded
rows and columns get ids that never agree. Nothing here reads a tensor's value on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from attnhub.request import Request
from attnhub.rules import Causal, Local, Rule

#: Segment ids of padded query rows and padded key columns (they never match anything).
PAD_Q, PAD_K = -1, -2


@dataclass(frozen=True)
class Segments:
    """Positions and segment ids, (B, Nq) for queries and (B, Nk) for keys, int32.

    ``q_valid`` (B, Nq) bool marks the rows that are queries at all (False: padding, whose lse is
    -inf whatever the sinks say); None when every row is one.
    """

    qpos: tf.Tensor
    kpos: tf.Tensor
    qseg: tf.Tensor
    kseg: tf.Tensor
    q_valid: Any
    k_valid: Any


def _affine(lq: tf.Tensor, lk: tf.Tensor, sync: str) -> tuple[tf.Tensor, ...]:
    """(a_q, b_q, a_k, b_k) of :func:`attnhub.positions.axis_affine`, element-wise on tensors."""
    one, zero = tf.ones_like(lq), tf.zeros_like(lq)
    m = tf.maximum(lq, lk)
    if sync == "none_front":
        return one, zero, one, zero
    if sync == "none_end":
        return one, m - lq, one, m - lk
    sq = tf.where(lq > 0, m // tf.maximum(lq, 1), one)
    sk = tf.where(lk > 0, m // tf.maximum(lk, 1), one)
    if sync == "scale_front":
        return sq, zero, sk, zero
    return sq, sq - 1, sk, sk - 1  # scale_end


def _lengths(x: Any, full: int, batch: int) -> tf.Tensor:
    if x is None:
        return tf.fill((batch,), tf.constant(full, tf.int32))
    return tf.cast(tf.reshape(x, (batch,)), tf.int32)


def padded(req: Request, q_lengths: Any, k_lengths: Any) -> Segments:
    """Segments of a padded batch: entry b's valid queries and keys form its segment."""
    b, nq, nk = req.batch, req.nq, req.nk
    lq, lk = _lengths(q_lengths, nq, b)[:, None], _lengths(k_lengths, nk, b)[:, None]
    i = tf.range(nq, dtype=tf.int32)[None, :]
    j = tf.range(nk, dtype=tf.int32)[None, :]
    if req.padding_side == "left":
        i, j = i - (nq - lq), j - (nk - lk)
    q_valid = tf.logical_and(i >= 0, i < lq)
    k_valid = tf.logical_and(j >= 0, j < lk)
    aq, bq, ak, bk = _affine(lq, lk, req.sync)
    qpos = aq * i + bq + req.q_offset
    kpos = ak * j + bk + req.k_offset
    qseg = tf.where(q_valid, 0, PAD_Q)
    kseg = tf.where(k_valid, 0, PAD_K)
    return Segments(
        qpos, kpos, qseg, kseg, q_valid if req.q_lengths else None, k_valid if req.k_lengths else None
    )


def _split_packed(cu: tf.Tensor, total: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(sequence id, index inside it, start) of every token 0..total-1 of packed ``cu_seqlens``."""
    cu = tf.cast(tf.reshape(cu, (-1,)), tf.int32)
    t = tf.range(total, dtype=tf.int32)
    seq = tf.searchsorted(cu[1:], t, side="right", out_type=tf.int32)
    return seq, t - tf.gather(cu, seq), cu


def packed(req: Request, cu_q: Any, cu_k: Any) -> Segments:
    """Segments of packed sequences: token rows of sequence n form segment n (SPEC §10)."""
    sq, iq, cq = _split_packed(cu_q, req.nq)
    sk, jk, ck = _split_packed(cu_k, req.nk)
    len_q, len_k = cq[1:] - cq[:-1], ck[1:] - ck[:-1]
    # a query row's affine map uses its own sequence's lengths; so does a key column's
    aq, bq, _, _ = _affine(tf.gather(len_q, sq), tf.gather(len_k, sq), req.sync)
    _, _, ak, bk = _affine(tf.gather(len_q, sk), tf.gather(len_k, sk), req.sync)
    qpos = (aq * iq + bq + req.q_offset)[None, :]
    kpos = (ak * jk + bk + req.k_offset)[None, :]
    return Segments(qpos, kpos, sq[None, :], sk[None, :], None, None)


def for_request(req: Request, operands: Any) -> Segments | None:
    """The segments of a ragged request, None for a dense one."""
    if req.varlen:
        return packed(req, operands.cu_seqlens_q, operands.cu_seqlens_k)
    if req.q_lengths or req.k_lengths:
        return padded(req, operands.q_lengths, operands.k_lengths)
    return None


def rule_keep(rule: Rule, pq: tf.Tensor, pk: tf.Tensor) -> tf.Tensor | None:
    """1-d rule on broadcastable position tensors (True = attended); None for Full."""
    if not isinstance(rule, Causal | Local):
        return None  # Full, or an explicit mask (applied from its array)
    if isinstance(rule, Causal):
        return pq >= pk
    (w,) = rule.windows(1)
    s = rule.stride
    delta = tf.abs(pq - pk)
    keep = delta < w if s == 1 else tf.logical_and(delta % s == 0, delta // s < w)
    return tf.logical_and(keep, pq >= pk) if rule.causal else keep


def tile_keep(seg: Segments, rule: Rule, rows: slice, cols: slice) -> tf.Tensor:
    """(B, 1, 1, rows, cols) mask of one tile: same segment and the rule on the positions."""
    same = seg.qseg[:, rows, None] == seg.kseg[:, None, cols]
    ok = rule_keep(rule, seg.qpos[:, rows, None], seg.kpos[:, None, cols])
    keep = same if ok is None else tf.logical_and(same, ok)
    return keep[:, None, None]
