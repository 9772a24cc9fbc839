"""Blockwise online-softmax attention and its recomputing backward, in TensorFlow ops.

Every loop runs in Python at trace time over a :class:`~attnhub_backends.tf.tiles.Plan` (AutoGraph
is kept out with ``do_not_convert``), so the same code works eagerly, inside ``tf.function`` and
under XLA (``jit_compile=True``): shapes are static and every slice is a constant. Memory is O(B·H·(N·D + block_q·block_k)); the ``Nq x Nk``
logits are never formed. Half types are computed in float32, float64 in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Local
from attnhub_backends.tf.tiles import Plan, RowBlock, Tile

NEG_INF = float("-inf")


def compute_dtype(req: Request) -> tf.DType:
    """float64 for float64 requests, float32 otherwise (SPEC §4 accumulation)."""
    return tf.float64 if req.dtype == "float64" else tf.float32


def _const(a: np.ndarray) -> tf.Tensor:
    dtype = tf.int32 if a.size == 0 or (a.max() < 2**31 and a.min() > -(2**31)) else tf.int64
    return tf.constant(a, dtype=dtype)


def _rule_keep(req: Request, plan: Plan, blk: RowBlock, tile: Tile) -> tf.Tensor:
    """Boolean (rows, cols) mask of the rule on one partial tile, evaluated from positions."""
    rows, cols = slice(blk.q0, blk.q1), slice(tile.k0, tile.k1)
    rule = req.rule
    keep = None

    def causal() -> tf.Tensor:
        return _const(plan.fq[rows])[:, None] >= _const(plan.fk[cols])[None, :]

    if isinstance(rule, Causal):
        return causal()
    assert isinstance(rule, Local)
    s = rule.stride
    for d, w in enumerate(rule.windows(req.ndim)):
        delta = tf.abs(_const(plan.pq[d][rows])[:, None] - _const(plan.pk[d][cols])[None, :])
        ok = delta < w if s == 1 else tf.logical_and(delta % s == 0, delta // s < w)
        keep = ok if keep is None else tf.logical_and(keep, ok)
    if rule.causal:
        keep = tf.logical_and(keep, causal())
    return keep


def _after(x: tf.Tensor, dep: tf.Tensor) -> tf.Tensor:
    """``x``, made to depend on ``dep`` through data (an exact zero derived from one element).

    Used once per row block on its queries: XLA drops control dependencies, so without it XLA may
    compute every block's logits ahead and hold them all. Tiles within a block are ordered by
    control dependencies (cheaper: no copy). ``isnan`` keeps NaN in ``dep`` out of ``x``.
    """
    with tf.control_dependencies([dep]):
        probe = tf.math.is_nan(tf.reshape(dep, [-1])[0])
    return x + tf.cast(probe, x.dtype) * tf.constant(0, x.dtype)


class _Ctx:
    """Per-call tensors and helpers shared by the forward and backward loops."""

    def __init__(self, q, k, v, req: Request, plan: Plan, mask) -> None:
        self.req, self.plan = req, plan
        self.ct = compute_dtype(req)
        b, hkv, g = req.batch, req.heads_kv, req.group
        self.shape5 = (b, hkv, g)
        # q pre-scaled once: logits = (scale·q)·k
        self.qs = tf.reshape(tf.cast(q, self.ct) * tf.constant(req.scale, self.ct), (b, hkv, g, req.nq, -1))
        # keys and values cut once into the plan's tiles (a slice per use would copy per use)
        self.k = self._split_keys(tf.cast(k, self.ct))
        self.v = self._split_keys(tf.cast(v, self.ct))
        self.mask = mask
        self.explicit = isinstance(req.rule, ExplicitMask)

    def _split_keys(self, x: tf.Tensor) -> list[tf.Tensor]:
        bk, n = self.plan.block_k, self.req.nk
        sizes = [min(bk, n - i * bk) for i in range(self.plan.num_tiles)]
        return [x] if len(sizes) == 1 else tf.split(x, sizes, axis=2)

    def rows(self, x5: tf.Tensor, blk: RowBlock) -> tf.Tensor:
        """Rows of a block of a (B, Hkv, G, N, X) tensor, folded to (B, Hkv, G·rows, X)."""
        b, hkv, g = self.shape5
        return tf.reshape(x5[:, :, :, blk.q0 : blk.q1, :], (b, hkv, g * (blk.q1 - blk.q0), -1))

    def logits(self, qb: tf.Tensor, blk: RowBlock, tile: Tile, after: Any = None) -> tuple[tf.Tensor, Any]:
        """Masked logits (B, Hkv, G, rows, cols) and the element mask applied (None if none).

        ``after``: a tensor the logits must wait for. In a graph, every tile's matmul is otherwise
        ready at once and the executor would hold all tiles' logits alive together.
        """
        b, hkv, g = self.shape5
        r, c = blk.q1 - blk.q0, tile.k1 - tile.k0
        # the whole tile waits (matmul, mask slices and rule mask), not just its matmul
        with tf.control_dependencies([] if after is None else [after]):
            s = tf.matmul(qb, self.k[tile.index], transpose_b=True)
            s = tf.reshape(s, (b, hkv, g, r, c))
            keep = None
            if self.explicit:
                part = self._mask_part(blk, tile)
                if self.req.rule.kind == "bool":
                    keep = part
                else:
                    s = s + tf.cast(part, self.ct)
            elif not tile.full:
                keep = _rule_keep(self.req, self.plan, blk, tile)
            if keep is not None:
                s = tf.where(keep, s, tf.constant(NEG_INF, self.ct))
        return s, keep

    def _mask_part(self, blk: RowBlock, tile: Tile) -> tf.Tensor:
        """The explicit mask on a tile, shaped (mb, Hkv|1, G|1, rows|1, cols|1)."""
        mb, mh, mq, mk = self.req.rule.shape
        m = self.mask
        if mq > 1:
            m = m[:, :, blk.q0 : blk.q1, :]
        if mk > 1:
            m = m[:, :, :, tile.k0 : tile.k1]
        r, c = int(m.shape[2]), int(m.shape[3])
        if mh > 1:
            return tf.reshape(m, (mb, self.req.heads_kv, self.req.group, r, c))
        return tf.reshape(m, (mb, 1, 1, r, c))


@tf.autograph.experimental.do_not_convert
def forward(q, k, v, req: Request, plan: Plan, mask=None) -> tuple[tf.Tensor, tf.Tensor]:
    """(out, lse) on canonical tensors: out in the input dtype, lse float32 (float64 for float64)."""
    out, lse, _ = forward_with_residual(q, k, v, req, plan, mask)
    return out, lse


@tf.autograph.experimental.do_not_convert
def forward_with_residual(
    q, k, v, req: Request, plan: Plan, mask=None
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(out, lse, out in the compute dtype): the backward's rowsum(dO·O) needs O before rounding.

    With half inputs and peaked softmax rows, dP − rowsum(dO·O) cancels; O rounded to bfloat16
    there costs dq several times SPEC's tolerance, so the backward gets the float32 O.
    """
    cx = _Ctx(q, k, v, req, plan, mask)
    b, hkv, g = cx.shape5
    ct = cx.ct
    outs, lses = [], []
    last = None  # the tensor the next tile waits for (sequential tiles bound the memory)
    for blk in plan.blocks:
        r = blk.q1 - blk.q0
        if not blk.tiles:
            outs.append(tf.zeros((b, hkv, g, r, req.dim_v), ct))
            lses.append(tf.fill((b, hkv, g, r), tf.constant(NEG_INF, ct)))
            continue
        qb = cx.rows(cx.qs, blk) if last is None else _after(cx.rows(cx.qs, blk), last)
        m = denom = acc = m_safe_prev = None
        for tile in blk.tiles:
            s, _ = cx.logits(qb, blk, tile, last)
            mt = tf.reduce_max(s, axis=-1, keepdims=True)
            m_new = mt if m is None else tf.maximum(m, mt)
            m_safe = tf.where(m_new == NEG_INF, tf.zeros_like(m_new), m_new)
            p = tf.exp(s - m_safe)
            lt = tf.reduce_sum(p, axis=-1, keepdims=True)
            pv = tf.matmul(tf.reshape(p, (b, hkv, g * r, -1)), cx.v[tile.index])
            pv = tf.reshape(pv, (b, hkv, g, r, req.dim_v))
            if m is None:
                denom, acc = lt, pv
            else:
                alpha = tf.exp(m_safe_prev - m_safe)
                denom = denom * alpha + lt
                acc = acc * alpha + pv
            m, m_safe_prev, last = m_new, m_safe, acc
        outs.append(tf.math.divide_no_nan(acc, denom))
        lse = tf.where(denom == 0, tf.constant(NEG_INF, ct), m_safe_prev + tf.math.log(denom))
        lses.append(lse[..., 0])
    out = outs[0] if len(outs) == 1 else tf.concat(outs, axis=3)
    lse = lses[0] if len(lses) == 1 else tf.concat(lses, axis=3)
    out_ct = tf.reshape(out, (b, req.heads_q, req.nq, req.dim_v))
    lse = tf.reshape(lse, (b, req.heads_q, req.nq))
    return tf.cast(out_ct, q.dtype), lse, out_ct


@tf.autograph.experimental.do_not_convert
def backward(q, k, v, out, lse, dout, req: Request, plan: Plan, mask=None, dlse=None):
    """(dq, dk, dv) recomputed block by block from lse; ``dlse`` is the upstream gradient of lse."""
    cx = _Ctx(q, k, v, req, plan, mask)
    b, hkv, g = cx.shape5
    ct = cx.ct
    do5 = tf.reshape(tf.cast(dout, ct), (b, hkv, g, req.nq, req.dim_v))
    # D_i = rowsum(dO·O) (minus dlse_i when lse itself receives a gradient)
    dd = tf.reduce_sum(do5 * tf.reshape(tf.cast(out, ct), (b, hkv, g, req.nq, req.dim_v)), -1, keepdims=True)
    if dlse is not None:
        dd = dd - tf.reshape(tf.cast(dlse, ct), (b, hkv, g, req.nq, 1))
    lse5 = tf.reshape(tf.cast(lse, ct), (b, hkv, g, req.nq, 1))
    # fully masked rows (lse = -inf) must give p = 0, not exp(-inf + inf)
    lse5 = tf.where(lse5 == NEG_INF, tf.constant(float("inf"), ct), lse5)
    dqs, dks, dvs = [], [None] * plan.num_tiles, [None] * plan.num_tiles
    last = None
    for blk in plan.blocks:
        r = blk.q1 - blk.q0
        if not blk.tiles:
            dqs.append(tf.zeros((b, hkv, g, r, req.dim_qk), ct))
            continue
        qb = cx.rows(cx.qs, blk) if last is None else _after(cx.rows(cx.qs, blk), last)
        dob = cx.rows(do5, blk)
        lse_b = lse5[:, :, :, blk.q0 : blk.q1, :]
        dd_b = dd[:, :, :, blk.q0 : blk.q1, :]
        dq = None
        for tile in blk.tiles:
            s, _ = cx.logits(qb, blk, tile, last)
            p = tf.exp(s - lse_b)
            vt = cx.v[tile.index]
            dp = tf.reshape(tf.matmul(dob, vt, transpose_b=True), p.shape)
            ds = tf.reshape(p * (dp - dd_b), (b, hkv, g * r, -1))
            p2 = tf.reshape(p, (b, hkv, g * r, -1))
            part_q = tf.matmul(ds, cx.k[tile.index])
            dq = part_q if dq is None else dq + part_q
            part_k = tf.matmul(ds, qb, transpose_a=True)
            part_v = tf.matmul(p2, dob, transpose_a=True)
            i = tile.index
            dks[i] = part_k if dks[i] is None else dks[i] + part_k
            dvs[i] = part_v if dvs[i] is None else dvs[i] + part_v
            last = dvs[i]
        dqs.append(tf.reshape(dq, (b, hkv, g, r, req.dim_qk)))
    dq = dqs[0] if len(dqs) == 1 else tf.concat(dqs, axis=3)
    dq = tf.reshape(dq, (b, req.heads_q, req.nq, req.dim_qk)) * tf.constant(req.scale, ct)
    dk = _assemble(dks, plan, req, req.dim_qk, ct)
    dv = _assemble(dvs, plan, req, req.dim_v, ct)
    return tf.cast(dq, q.dtype), tf.cast(dk, q.dtype), tf.cast(dv, q.dtype)


def _assemble(parts: list, plan: Plan, req: Request, dim: int, ct: tf.DType) -> tf.Tensor:
    """Concatenate per-key-tile gradients, with zeros for tiles no query attends."""
    full = []
    for i, x in enumerate(parts):
        if x is None:
            k0 = i * plan.block_k
            x = tf.zeros((req.batch, req.heads_kv, min(req.nk, k0 + plan.block_k) - k0, dim), ct)
        full.append(x)
    return full[0] if len(full) == 1 else tf.concat(full, axis=2)


@tf.autograph.experimental.do_not_convert
def row_max(q, k, req: Request, plan: Plan, mask=None) -> tf.Tensor:
    """Maximum scaled logit per query over its attended keys, (B, Hq, Nq), -inf where none."""
    cx = _Ctx(q, k, k[..., :1], req, plan, mask)
    b, hkv, g = cx.shape5
    parts, last = [], None
    for blk in plan.blocks:
        r = blk.q1 - blk.q0
        m = tf.fill((b, hkv, g, r), tf.constant(NEG_INF, cx.ct))
        qb = cx.rows(cx.qs, blk) if last is None else _after(cx.rows(cx.qs, blk), last)
        for tile in blk.tiles:
            s, _ = cx.logits(qb, blk, tile, last)
            m = last = tf.maximum(m, tf.reduce_max(s, axis=-1))
        parts.append(m)
    m = parts[0] if len(parts) == 1 else tf.concat(parts, axis=3)
    return tf.reshape(m, (b, req.heads_q, req.nq))
