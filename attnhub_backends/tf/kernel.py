"""Blockwise online-softmax attention and its recomputing backward, in TensorFlow ops.

Every loop runs in Python at trace time over a :class:`~attnhub_backends.tf.tiles.Plan` (AutoGraph
is kept out with ``do_not_convert``), so the same code works eagerly, inside ``tf.function`` and
under XLA (``jit_compile=True``): shapes are static and every slice is a constant. Memory is
O(B·H·(N·D + block_q·block_k)); the ``Nq x Nk`` logits are never formed. Half types are computed
in float32, float64 in float64.

SPEC §9 (softcap, bias, sinks) is applied per tile; the bias and sinks get their gradients in
the same backward loop. Ragged requests (§10: lengths, packed sequences) mask every computed tile
from the per-entry positions of :mod:`~attnhub_backends.tf.ragged` and skip, at run time with
``tf.cond``, the tiles in which the lengths leave no attended pair.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Local
from attnhub_backends.tf import ragged, softcap
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

    def __init__(self, q, k, v, req: Request, plan: Plan, mask, ops: Any = None) -> None:
        self.req, self.plan = req, plan
        self.ct = compute_dtype(req)
        b, hkv, g = req.batch, req.heads_kv, req.group
        self.shape5 = (b, hkv, g)
        # SPEC §10: per-entry positions and segments (None for a dense request)
        self.seg = ragged.for_request(req, ops) if req.ragged else None
        q, k, v = (tf.cast(x, self.ct) for x in (q, k, v))
        if self.seg is not None:
            # padding rows never reach a result; zeroed so that NaN or garbage there (an unused
            # cache row) cannot leak through 0·x in a matmul
            if self.seg.q_valid is not None:
                q = tf.where(self.seg.q_valid[:, None, :, None], q, tf.zeros((), self.ct))
            if self.seg.k_valid is not None:
                k = tf.where(self.seg.k_valid[:, None, :, None], k, tf.zeros((), self.ct))
                v = tf.where(self.seg.k_valid[:, None, :, None], v, tf.zeros((), self.ct))
        # q pre-scaled once: logits = (scale·q)·k
        self.qs = tf.reshape(q * tf.constant(req.scale, self.ct), (b, hkv, g, req.nq, -1))
        # keys and values cut once into the plan's tiles (a slice per use would copy per use)
        self.k = self._split_keys(k)
        self.v = self._split_keys(v)
        self.mask = mask
        self.bool_mask = isinstance(req.rule, ExplicitMask) and req.rule.kind == "bool"
        self.bias = None if req.bias is None else tf.cast(ops.bias, self.ct)
        self.sinks = None
        if req.sinks:
            self.sinks = tf.reshape(tf.cast(ops.sinks, self.ct), (1, hkv, g, 1, 1))

    def _split_keys(self, x: tf.Tensor) -> list[tf.Tensor]:
        bk, n = self.plan.block_k, self.req.nk
        sizes = [min(bk, n - i * bk) for i in range(self.plan.num_tiles)]
        return [x] if len(sizes) == 1 else tf.split(x, sizes, axis=2)

    def rows(self, x5: tf.Tensor, blk: RowBlock) -> tf.Tensor:
        """Rows of a block of a (B, Hkv, G, N, X) tensor, folded to (B, Hkv, G·rows, X)."""
        b, hkv, g = self.shape5
        return tf.reshape(x5[:, :, :, blk.q0 : blk.q1, :], (b, hkv, g * (blk.q1 - blk.q0), -1))

    def seg_keep(self, blk: RowBlock, tile: Tile) -> tf.Tensor:
        """The (B, 1, 1, rows, cols) lengths/segments-and-rule mask of a ragged request's tile."""
        return ragged.tile_keep(self.seg, self.req.rule, slice(blk.q0, blk.q1), slice(tile.k0, tile.k1))

    def logits(
        self, qb: tf.Tensor, blk: RowBlock, tile: Tile, after: Any = None, seg_keep: Any = None
    ) -> tuple[tf.Tensor, Any]:
        """Masked logits s (B, Hkv, G, rows, cols) and ``tanh(t / softcap)`` (None without softcap).

        SPEC §9 order: ``t = scale·q·k``, ``t = softcap·tanh(t/softcap)``, ``s = t + bias``; pairs
        the rule, a bool mask or the lengths exclude are -inf whatever the bias.
        ``after``: a tensor the logits must wait for. In a graph, every tile's matmul is otherwise
        ready at once and the executor would hold all tiles' logits alive together.
        """
        b, hkv, g = self.shape5
        r, c = blk.q1 - blk.q0, tile.k1 - tile.k0
        req = self.req
        # the whole tile waits (matmul, mask slices and rule mask), not just its matmul
        with tf.control_dependencies([] if after is None else [after]):
            s = tf.matmul(qb, self.k[tile.index], transpose_b=True)
            s = tf.reshape(s, (b, hkv, g, r, c))
            th = None
            if req.softcap is not None:  # any finite cap, 1e300 included (softcap.py)
                s, th = softcap.apply(s, req.softcap)
            if self.bias is not None:
                s = s + _part(self.bias, req.bias, req, blk, tile)
            keep = None
            if self.bool_mask:
                keep = _part(self.mask, req.rule.shape, req, blk, tile)
            if self.seg is not None:
                seg_keep = self.seg_keep(blk, tile) if seg_keep is None else seg_keep
                keep = seg_keep if keep is None else tf.logical_and(keep, seg_keep)
            elif not tile.full:
                keep = _rule_keep(req, self.plan, blk, tile)
            if keep is not None:
                s = tf.where(keep, s, tf.constant(NEG_INF, self.ct))
        return s, th


def _part(x: tf.Tensor, shape: tuple[int, ...], req: Request, blk: RowBlock, tile: Tile) -> tf.Tensor:
    """A rank-4 array broadcast over (B, Hq, Nq, Nk) on one tile: (B|1, Hkv|1, G|1, rows|1, cols|1)."""
    mb, mh, mq, mk = shape
    if mq > 1:
        x = x[:, :, blk.q0 : blk.q1, :]
    if mk > 1:
        x = x[:, :, :, tile.k0 : tile.k1]
    r, c = (blk.q1 - blk.q0 if mq > 1 else 1), (tile.k1 - tile.k0 if mk > 1 else 1)
    if mh > 1:
        return tf.reshape(x, (mb, req.heads_kv, req.group, r, c))
    return tf.reshape(x, (mb, 1, 1, r, c))


def _forward_tile(cx: _Ctx, qb, blk: RowBlock, tile: Tile, last, state, seg_keep=None) -> tuple:
    """One online-softmax step: state (m, m with -inf as 0, denom, acc) after ``tile``."""
    b, hkv, g = cx.shape5
    r = blk.q1 - blk.q0
    s, _ = cx.logits(qb, blk, tile, last, seg_keep)
    mt = tf.reduce_max(s, axis=-1, keepdims=True)
    m_new = mt if state is None else tf.maximum(state[0], mt)
    m_safe = tf.where(m_new == NEG_INF, tf.zeros_like(m_new), m_new)
    p = tf.exp(s - m_safe)
    lt = tf.reduce_sum(p, axis=-1, keepdims=True)
    pv = tf.matmul(tf.reshape(p, (b, hkv, g * r, -1)), cx.v[tile.index])
    pv = tf.reshape(pv, (b, hkv, g, r, cx.req.dim_v))
    if state is None:
        return m_new, m_safe, lt, pv
    # exp(m_old - m_safe): 0 where nothing was attended yet (denom = acc = 0; never 0·inf)
    alpha = tf.exp(state[0] - m_safe)
    return m_new, m_safe, state[2] * alpha + lt, state[3] * alpha + pv


@tf.autograph.experimental.do_not_convert
def forward(q, k, v, req: Request, plan: Plan, mask=None, ops=None) -> tuple[tf.Tensor, tf.Tensor]:
    """(out, lse) on canonical tensors: out in the input dtype, lse float32 (float64 for float64)."""
    out, lse, _ = forward_with_residual(q, k, v, req, plan, mask, ops)
    return out, lse


@tf.autograph.experimental.do_not_convert
def forward_with_residual(
    q, k, v, req: Request, plan: Plan, mask=None, ops=None
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(out, lse, out in the compute dtype): the backward's rowsum(dO·O) needs O before rounding.

    With half inputs and peaked softmax rows, dP − rowsum(dO·O) cancels; O rounded to bfloat16
    there costs dq several times SPEC's tolerance, so the backward gets the float32 O.
    ``ops``: the request's :class:`attnhub.operands.Operands` (bias, sinks, lengths, cu_seqlens).
    """
    cx = _Ctx(q, k, v, req, plan, mask, ops)
    b, hkv, g = cx.shape5
    ct = cx.ct
    outs, lses = [], []
    last = None  # the tensor the next tile waits for (sequential tiles bound the memory)
    for blk in plan.blocks:
        r = blk.q1 - blk.q0
        if not blk.tiles:
            outs.append(tf.zeros((b, hkv, g, r, req.dim_v), ct))
            empty = tf.fill((b, hkv, g, r), tf.constant(NEG_INF, ct))
            # a row that attends nothing keeps the sink alone: lse = sinks[h]
            lses.append(empty if cx.sinks is None else tf.maximum(empty, cx.sinks[..., 0]))
            continue
        qb = cx.rows(cx.qs, blk) if last is None else _after(cx.rows(cx.qs, blk), last)
        state = None
        if cx.seg is not None:  # tiles are skipped at run time where the lengths leave no pair
            state = (
                tf.fill((b, hkv, g, r, 1), tf.constant(NEG_INF, ct)),
                tf.zeros((b, hkv, g, r, 1), ct),
                tf.zeros((b, hkv, g, r, 1), ct),
                tf.zeros((b, hkv, g, r, req.dim_v), ct),
            )
        for tile in blk.tiles:
            if cx.seg is None:
                state = _forward_tile(cx, qb, blk, tile, last, state)
            else:
                keep, prev = cx.seg_keep(blk, tile), state
                state = tf.cond(
                    tf.reduce_any(keep),
                    lambda: _forward_tile(cx, qb, blk, tile, last, prev, keep),  # noqa: B023
                    lambda: prev,  # noqa: B023
                )
            last = state[3]
        m, m_safe_prev, denom, acc = state
        if cx.sinks is not None:
            # the sink: one more key, logit sinks[h], value 0 (SPEC §9)
            m_all = tf.maximum(m, cx.sinks)
            m_all_safe = tf.where(m_all == NEG_INF, tf.zeros_like(m_all), m_all)
            alpha = tf.exp(m - m_all_safe)  # 0 where no real key was attended (denom = 0 there)
            denom = denom * alpha + tf.exp(cx.sinks - m_all_safe)
            acc = acc * alpha
            m_safe_prev = m_all_safe
        outs.append(tf.math.divide_no_nan(acc, denom))
        lse = tf.where(denom == 0, tf.constant(NEG_INF, ct), m_safe_prev + tf.math.log(denom))
        lses.append(lse[..., 0])
    out = outs[0] if len(outs) == 1 else tf.concat(outs, axis=3)
    lse = lses[0] if len(lses) == 1 else tf.concat(lses, axis=3)
    out_ct = tf.reshape(out, (b, req.heads_q, req.nq, req.dim_v))
    lse = tf.reshape(lse, (b, req.heads_q, req.nq))
    if cx.seg is not None and cx.seg.q_valid is not None:
        lse = tf.where(cx.seg.q_valid[:, None, :], lse, tf.constant(NEG_INF, ct))  # padding rows
    return tf.cast(out_ct, q.dtype), lse, out_ct


@tf.autograph.experimental.do_not_convert
def backward(q, k, v, out, lse, dout, req: Request, plan: Plan, mask=None, dlse=None, ops=None):
    """Gradients recomputed block by block from lse; ``dlse`` is the upstream gradient of lse.

    Returns (dq, dk, dv), or (dq, dk, dv, dbias, dsinks) for a request with a bias or sinks
    (dbias of the bias's rank-4 shape when ``req.bias_grad``, dsinks (Hq,) when ``req.sinks_grad``,
    else None).
    """
    cx = _Ctx(q, k, v, req, plan, mask, ops)
    b, hkv, g = cx.shape5
    ct = cx.ct
    do5 = tf.reshape(tf.cast(dout, ct), (b, hkv, g, req.nq, req.dim_v))
    if cx.seg is not None and cx.seg.q_valid is not None:
        do5 = tf.where(cx.seg.q_valid[:, None, None, :, None], do5, tf.zeros((), ct))
    # D_i = rowsum(dO·O) (minus dlse_i when lse itself receives a gradient)
    dd = tf.reduce_sum(do5 * tf.reshape(tf.cast(out, ct), (b, hkv, g, req.nq, req.dim_v)), -1, keepdims=True)
    if dlse is not None:
        dd = dd - tf.reshape(tf.cast(dlse, ct), (b, hkv, g, req.nq, 1))
    lse5 = tf.reshape(tf.cast(lse, ct), (b, hkv, g, req.nq, 1))
    # fully masked rows (lse = -inf) must give p = 0, not exp(-inf + inf)
    lse5 = tf.where(lse5 == NEG_INF, tf.constant(float("inf"), ct), lse5)
    dbias = _BiasGrad(req, plan, ct) if req.bias_grad else None
    dqs, dks, dvs = [], [None] * plan.num_tiles, [None] * plan.num_tiles
    last = None
    for bi, blk in enumerate(plan.blocks):
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
            args = (cx, qb, dob, lse_b, dd_b, blk, tile, last, dbias)
            if cx.seg is None:
                parts = _backward_tile(*args)
            else:  # skipped at run time where the lengths leave no pair (zero gradients)
                keep = cx.seg_keep(blk, tile)
                zeros = _backward_zeros(cx, blk, tile, dbias)
                parts = tf.cond(
                    tf.reduce_any(keep),
                    lambda: _backward_tile(*args, keep),  # noqa: B023
                    lambda: zeros,  # noqa: B023
                )
            part_q, part_k, part_v = parts[:3]
            if dbias is not None:
                dbias.add(parts[3], bi, tile)
            dq = part_q if dq is None else dq + part_q
            i = tile.index
            dks[i] = part_k if dks[i] is None else dks[i] + part_k
            dvs[i] = part_v if dvs[i] is None else dvs[i] + part_v
            last = dvs[i]
        dqs.append(tf.reshape(dq, (b, hkv, g, r, req.dim_qk)))
    dq = dqs[0] if len(dqs) == 1 else tf.concat(dqs, axis=3)
    dq = tf.reshape(dq, (b, req.heads_q, req.nq, req.dim_qk)) * tf.constant(req.scale, ct)
    dk = _assemble(dks, plan, req, req.dim_qk, ct)
    dv = _assemble(dvs, plan, req, req.dim_v, ct)
    grads = (tf.cast(dq, q.dtype), tf.cast(dk, q.dtype), tf.cast(dv, q.dtype))
    if req.bias is None and not req.sinks:
        return grads
    db = None if dbias is None else tf.cast(dbias.result(), ops.bias.dtype)
    dsinks = None
    if req.sinks_grad:
        # the sink's logit gets P_sink·(0 - D_i) per row: its value is 0
        p_sink = tf.exp(cx.sinks - lse5)
        dsinks = -tf.reduce_sum(p_sink * dd, axis=(0, 3, 4))
        dsinks = tf.cast(tf.reshape(dsinks, (req.heads_q,)), ops.sinks.dtype)
    return (*grads, db, dsinks)


def _backward_tile(cx: _Ctx, qb, dob, lse_b, dd_b, blk: RowBlock, tile: Tile, last, dbias, seg_keep=None):
    """One tile's (dq part, dk part, dv part[, dbias part]) recomputed from lse."""
    b, hkv, g = cx.shape5
    r = blk.q1 - blk.q0
    s, th = cx.logits(qb, blk, tile, last, seg_keep)
    p = tf.exp(s - lse_b)
    dp = tf.reshape(tf.matmul(dob, cx.v[tile.index], transpose_b=True), p.shape)
    ds = p * (dp - dd_b)  # the gradient of the final logits s
    piece = () if dbias is None else (dbias.reduce(ds),)
    if th is not None:
        ds = ds * (1 - th * th)  # through softcap·tanh(t / softcap)
    ds = tf.reshape(ds, (b, hkv, g * r, -1))
    p2 = tf.reshape(p, (b, hkv, g * r, -1))
    part_q = tf.matmul(ds, cx.k[tile.index])
    part_k = tf.matmul(ds, qb, transpose_a=True)
    part_v = tf.matmul(p2, dob, transpose_a=True)
    return (part_q, part_k, part_v, *piece)


def _backward_zeros(cx: _Ctx, blk: RowBlock, tile: Tile, dbias) -> tuple:
    """What :func:`_backward_tile` returns for a tile without an attended pair."""
    b, hkv, g = cx.shape5
    r, c, req = blk.q1 - blk.q0, tile.k1 - tile.k0, cx.req
    zeros = (
        tf.zeros((b, hkv, g * r, req.dim_qk), cx.ct),
        tf.zeros((b, hkv, c, req.dim_qk), cx.ct),
        tf.zeros((b, hkv, c, req.dim_v), cx.ct),
    )
    return zeros if dbias is None else (*zeros, tf.zeros(dbias.piece_shape(r, c), cx.ct))


class _BiasGrad:
    """dbias accumulated tile by tile, summed over the bias's broadcast dimensions."""

    def __init__(self, req: Request, plan: Plan, ct: tf.DType) -> None:
        self.req, self.plan, self.ct = req, plan, ct
        self.shape = req.bias
        self.parts: dict[tuple[int, int], tf.Tensor] = {}

    def piece_shape(self, r: int, c: int) -> tuple[int, int, int, int]:
        """Shape of one tile's piece of dbias (rows and cols kept only where the bias has them)."""
        bb, bh, bq, bk = self.shape
        return bb, bh, r if bq > 1 else 1, c if bk > 1 else 1

    def reduce(self, ds: tf.Tensor) -> tf.Tensor:
        """One tile's logit gradient (B, Hkv, G, rows, cols) summed over the broadcast dims."""
        bb, bh, bq, bk = self.shape
        dims = ((0, bb > 1), (1, bh > 1), (2, bh > 1), (3, bq > 1), (4, bk > 1))
        axes = [a for a, kept in dims if not kept]
        x = tf.reduce_sum(ds, axis=axes, keepdims=True) if axes else ds
        return tf.reshape(x, self.piece_shape(int(ds.shape[3]), int(ds.shape[4])))

    def add(self, x: tf.Tensor, bi: int, tile: Tile) -> None:
        """Add one tile's piece (see :meth:`reduce`) of row block ``bi``."""
        bq, bk = self.shape[2:]
        key = (bi if bq > 1 else 0, tile.index if bk > 1 else 0)
        self.parts[key] = x if key not in self.parts else self.parts[key] + x

    def result(self) -> tf.Tensor:
        """dbias of exactly the bias's shape (zeros where no tile was computed)."""
        bb, bh, bq, bk = self.shape
        plan, req = self.plan, self.req
        row_groups = [(i, blk.q1 - blk.q0) for i, blk in enumerate(plan.blocks)] if bq > 1 else [(0, 1)]
        col_groups = (
            [(i, min(req.nk, (i + 1) * plan.block_k) - i * plan.block_k) for i in range(plan.num_tiles)]
            if bk > 1
            else [(0, 1)]
        )
        rows = []
        for ri, nr in row_groups:
            cols = [self.parts.get((ri, ci), tf.zeros((bb, bh, nr, nc), self.ct)) for ci, nc in col_groups]
            rows.append(cols[0] if len(cols) == 1 else tf.concat(cols, axis=3))
        return rows[0] if len(rows) == 1 else tf.concat(rows, axis=2)


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
def row_max(q, k, req: Request, plan: Plan, mask=None, ops=None) -> tf.Tensor:
    """Maximum final logit per query over its attended keys, (B, Hq, Nq), -inf where none."""
    cx = _Ctx(q, k, k[..., :1], req, plan, mask, ops)
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
