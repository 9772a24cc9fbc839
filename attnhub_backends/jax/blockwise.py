"""Blockwise attention in ``jax.lax``: online-softmax forward and a backward recomputing from lse.

Shapes inside: queries are grouped per kv head, ``(B, Hkv, G, Nq, D)``, then cut into tiles
``(B, Hkv, G, nQT, bq, D)``; keys and values into ``(B, Hkv, nKT, bk, D)``. One ``lax.scan`` step
of a lane plan (see :mod:`plan`) handles one (query tile, key tile) pair per lane for all lanes at
once, so only ``lanes x bq x bk`` logits per head exist at any time, never ``Nq x Nk``, and tiles
the rule masks entirely are never visited. The mask inside a tile is evaluated from positions
(SPEC §2-3), per batch entry or packed sequence for ragged requests (:mod:`ragged`); an explicit
mask array and a bias are read tile by tile. Score modifiers (SPEC §9): softcap and bias enter the
logits, sinks the final normalisation; the backward returns dbias (summed over the bias's
broadcast dimensions) and dsinks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from attnhub.request import Request
from attnhub.rules import ExplicitMask, Full
from attnhub_backends.jax import plan as planning
from attnhub_backends.jax import ragged, rulemask, softcap


@dataclass(frozen=True)
class Config:
    """How the blockwise path runs a request: tile sizes, compute dtype, lane memory budget."""

    bq: int
    bk: int
    compute_dtype: str  # dtype of the matmul operands ("float32" for half inputs on the CPU)
    lane_budget: int  # bytes of float32 logits one scan step may hold


def _acc_dtype(req: Request) -> Any:
    return jnp.float64 if req.dtype == "float64" else jnp.float32


def _precision(cfg: Config) -> Any:
    if cfg.compute_dtype in ("float32", "float64"):
        return jax.lax.Precision.HIGHEST
    return None


def _max_lanes(req: Request, cfg: Config) -> int:
    per_lane = max(1, req.batch * req.heads_q * cfg.bq * cfg.bk * 4)
    return max(1, cfg.lane_budget // per_lane)


def tile_pairs(req: Request, cfg: Config) -> tuple[tuple[int, ...], ...]:
    """The key tiles each query tile visits: from the rule where positions are static or known
    up to a subset (right padding, offsets with sync none_front), else every tile."""
    rule = Full() if isinstance(req.rule, ExplicitMask) else req.rule
    if not ragged.uses_segments(req):
        return planning.tile_pairs(rule, req.seq_q, req.seq_k, req.sync, cfg.bq, cfg.bk)
    shifted_fixed = (
        not req.varlen
        and req.sync == "none_front"
        and (req.padding_side == "right" or not (req.q_lengths or req.k_lengths))
    )
    if shifted_fixed:
        return planning.shifted_pairs(rule, req.nq, req.nk, req.q_offset, req.k_offset, cfg.bq, cfg.bk)
    return planning.all_pairs(math.ceil(req.nq / cfg.bq), math.ceil(req.nk / cfg.bk))


def _ops(ops: dict[str, Any] | None) -> dict[str, Any]:
    return {} if ops is None else ops


class _Problem:
    """Everything about one request under one config: tiles, positions, the rule, modifiers."""

    def __init__(self, req: Request, cfg: Config, ops: dict[str, Any] | None = None) -> None:
        self.req, self.cfg = req, cfg
        ops = _ops(ops)
        self.nqt = math.ceil(req.nq / cfg.bq)
        self.nkt = math.ceil(req.nk / cfg.bk)
        self.rule = Full() if isinstance(req.rule, ExplicitMask) else req.rule
        self.pairs = tile_pairs(req, cfg)
        self.acc = _acc_dtype(req)
        self.cdt = jnp.dtype(cfg.compute_dtype)
        self.prec = _precision(cfg)
        self.seg = None
        if ragged.uses_segments(req):
            self.seg = ragged.segments(req, ops, self.nqt * cfg.bq, self.nkt * cfg.bk)
        bias = ops.get("bias")
        self.btiles = None if bias is None else self.mask_tiles(bias)
        self.sinks = ops.get("sinks")

    # ---- tiling -------------------------------------------------------------------------
    def q_tiles(self, x: Any) -> Any:
        """(B, Hq, Nq, D) -> (B, Hkv, G, nQT, bq, D), zero padded, in the compute dtype; rows that
        are no query (SPEC §10 padding) are zeroed (see :meth:`k_tiles`)."""
        r = self.req
        x = x.astype(self.cdt).reshape(r.batch, r.heads_kv, r.group, r.nq, x.shape[-1])
        x = jnp.pad(x, ((0, 0),) * 3 + ((0, self.nqt * self.cfg.bq - r.nq), (0, 0)))
        if self.seg is not None:
            x = jnp.where(self.seg.qok[:, None, None, :, None], x, jnp.zeros((), x.dtype))
        return x.reshape(r.batch, r.heads_kv, r.group, self.nqt, self.cfg.bq, x.shape[-1])

    def row_tiles(self, x: Any, pad: float = 0.0) -> Any:
        """(B, Hq, Nq) -> (B, Hkv, G, nQT, bq), padded with ``pad``."""
        r = self.req
        x = x.reshape(r.batch, r.heads_kv, r.group, r.nq)
        x = jnp.pad(x, ((0, 0),) * 3 + ((0, self.nqt * self.cfg.bq - r.nq),), constant_values=pad)
        return x.reshape(r.batch, r.heads_kv, r.group, self.nqt, self.cfg.bq)

    def k_tiles(self, x: Any) -> Any:
        """(B, Hkv, Nk, D) -> (B, Hkv, nKT, bk, D), zero padded, in the compute dtype.

        Keys that are no key of their entry (SPEC §10 padding, unused rows of a paged cache) are
        zeroed: their probabilities are 0, but NaN stored there would reach valid rows through
        0·NaN in the matmuls (a select over k and v, no Nq x Nk mask). The caller's arrays are
        not modified."""
        r = self.req
        x = jnp.pad(x.astype(self.cdt), ((0, 0), (0, 0), (0, self.nkt * self.cfg.bk - r.nk), (0, 0)))
        if self.seg is not None:
            x = jnp.where(self.seg.kok[:, None, :, None], x, jnp.zeros((), x.dtype))
        return x.reshape(r.batch, r.heads_kv, self.nkt, self.cfg.bk, x.shape[-1])

    def untile_q(self, x: Any, dtype: Any) -> Any:
        """(B, Hkv, G, nQT, bq, D) -> (B, Hq, Nq, D)."""
        r = self.req
        x = x.reshape(r.batch, r.heads_q, self.nqt * self.cfg.bq, x.shape[-1])[:, :, : r.nq]
        return x.astype(dtype)

    def untile_rows(self, x: Any) -> Any:
        r = self.req
        return x.reshape(r.batch, r.heads_q, self.nqt * self.cfg.bq)[:, :, : r.nq]

    def untile_k(self, x: Any, dtype: Any) -> Any:
        r = self.req
        x = x.reshape(r.batch, r.heads_kv, self.nkt * self.cfg.bk, x.shape[-1])[:, :, : r.nk]
        return x.astype(dtype)

    def mask_tiles(self, mask: Any) -> Any:
        """An explicit (mb, mh, mq, mk) mask as (mb, mh, nQT|1, bq|1, nKT|1, bk|1)."""
        r, cfg = self.req, self.cfg
        mb, mh, mq, mk = mask.shape
        if mq > 1:
            mask = jnp.pad(mask, ((0, 0), (0, 0), (0, self.nqt * cfg.bq - mq), (0, 0)))
        if mk > 1:
            mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, self.nkt * cfg.bk - mk)))
        qshape = (self.nqt, cfg.bq) if mq > 1 else (1, 1)
        kshape = (self.nkt, cfg.bk) if mk > 1 else (1, 1)
        del r
        return mask.reshape(mb, mh, *qshape, *kshape)

    # ---- masks --------------------------------------------------------------------------
    def keep(self, qt: Any, kt: Any, valid: Any) -> Any:
        """(lanes, bq, bk) bool: the rule on query tiles ``qt`` x key tiles ``kt`` (lanes,)."""
        cfg = self.cfg
        qi = (qt * cfg.bq)[:, None, None] + jnp.arange(cfg.bq, dtype=jnp.int32)[None, :, None]
        kj = (kt * cfg.bk)[:, None, None] + jnp.arange(cfg.bk, dtype=jnp.int32)[None, None, :]
        if self.seg is not None:  # (Bs, L, bq, bk), per batch entry or packed sequence
            ok = ragged.keep(self.req, self.seg, qi[:, :, 0], kj[:, 0, :]) & valid[None, :, None, None]
            return ok[:, None, None]
        ok = rulemask.keep(self.req, qi, kj) & valid[:, None, None]
        return jnp.broadcast_to(ok, (kt.shape[0], cfg.bq, cfg.bk))

    def explicit(self, mtiles: Any, qt: Any, kt: Any) -> Any:
        """The explicit mask of the lanes' tiles, broadcastable to (B, Hkv, G, L, bq, bk)."""
        r = self.req
        mb, mh = mtiles.shape[:2]
        zero = jnp.zeros_like(qt)
        iq = qt if mtiles.shape[2] > 1 else zero
        ik = kt if mtiles.shape[4] > 1 else zero
        m = mtiles[:, :, iq, :, ik, :]  # (L, mb, mh, bq|1, bk|1)
        m = jnp.moveaxis(m, 0, 2)  # (mb, mh, L, bq|1, bk|1)
        if mh > 1:
            return m.reshape(mb, r.heads_kv, r.group, *m.shape[2:])
        return m.reshape(mb, 1, 1, *m.shape[2:])

    def logits(self, q: Any, k: Any, qt: Any, kt: Any, valid: Any, mtiles: Any) -> tuple[Any, Any]:
        """Masked logits (B, Hkv, G, L, bq, bk) in the accumulation dtype (-inf where masked), and
        ``tanh(t / softcap)`` (None without softcap) for the backward's chain rule."""
        s = jnp.einsum("bhgiqd,bhikd->bhgiqk", q, k, preferred_element_type=self.acc, precision=self.prec)
        s = s * jnp.asarray(self.req.scale, self.acc)
        th = None
        if self.req.softcap is not None:  # any finite cap, 1e300 included (softcap.py)
            s, th = softcap.apply(s, self.req.softcap, self.acc)
        keep = self.keep(qt, kt, valid)
        if mtiles is not None:  # a bool mask (an additive one arrives as the bias)
            keep = keep & self.explicit(mtiles, qt, kt)
        if self.btiles is not None:
            s = s + self.explicit(self.btiles, qt, kt).astype(self.acc)
        return jnp.where(keep, s, -jnp.inf), th

    def dbias_add(self, db: Any, ds: Any, qt: Any, kt: Any) -> Any:
        """Add the lanes' dS (B, Hkv, G, L, bq, bk) into dbias tiles, summed over broadcast dims."""
        r = self.req
        mb, mh, nq1, bq1, nk1, bk1 = db.shape
        if mb == 1:
            ds = ds.sum(axis=0, keepdims=True)
        ds = ds.reshape(mb, r.heads_q, *ds.shape[3:]) if mh > 1 else ds.sum(axis=(1, 2))[:, None]
        if bq1 == 1:
            ds = ds.sum(axis=-2, keepdims=True)
        if bk1 == 1:
            ds = ds.sum(axis=-1, keepdims=True)
        zero = jnp.zeros_like(qt)
        iq = qt if nq1 > 1 else zero
        ik = kt if nk1 > 1 else zero
        return db.at[:, :, iq, :, ik, :].add(jnp.moveaxis(ds, 2, 0))

    def row_ok(self) -> Any:
        """(Bs, 1, Nq) bool: valid query rows (None when every row is valid)."""
        if self.seg is None:
            return None
        return self.seg.qok[:, None, : self.req.nq]

    def apply_sinks(self, out: Any, lse: Any) -> tuple[Any, Any]:
        """SPEC §9: the virtual sink key joins every valid row's softmax (out (B, Hq, Nq, Dv) and
        lse (B, Hq, Nq) in the accumulation dtype); padded rows keep 0 and -inf."""
        sink = self.sinks.astype(self.acc)[None, :, None]
        full = jnp.logaddexp(lse, sink)
        ok = self.row_ok()
        if ok is not None:
            full = jnp.where(ok, full, -jnp.inf)
        dead = full == -jnp.inf
        factor = jnp.where(dead, 0.0, jnp.exp(lse - jnp.where(dead, 0.0, full)))
        return out * factor[..., None], full

    def mm(self, spec: str, a: Any, b: Any) -> Any:
        return jnp.einsum(spec, a, b, preferred_element_type=self.acc, precision=self.prec)


def _lanes_table(lp: planning.Lanes) -> tuple[Any, ...]:
    """The lane plan as scan inputs, one row per step."""
    return tuple(jnp.asarray(a.T) for a in (lp.outer, lp.inner, lp.valid, lp.first, lp.last))


def _take(x: Any, idx: Any, axis: int, direct: bool) -> Any:
    """Tiles ``idx`` of ``x`` along ``axis``; with direct lanes lane i is tile i: no gather."""
    return x if direct else jnp.take(x, idx, axis=axis)


def _plain_buffers(req: Request, *xs: Any) -> tuple[Any, ...]:
    """``xs`` behind an optimisation barrier on the CPU, so that XLA sees plain buffers.

    XLA:CPU (seen with jaxlib 0.10.2) miscompiles a dot of its YNNPACK fusions when it can see
    that an operand is a broadcast: the ones cotangent of ``.sum()`` under ``jax.jit``, or a
    ``jnp.full`` q made inside the jitted function, gave dq and dk of 1e27 or NaN (attnhub issue
    36; ``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`` made it go away). The barrier hides
    where the arrays come from; it costs nothing for arrays that are buffers already.
    """
    if req.device_type != "cpu":
        return xs
    return tuple(jax.lax.optimization_barrier(xs))


def _finish(m: Any, l: Any, o: Any) -> tuple[Any, Any]:
    """Normalised output and lse from running max, sum and accumulator (0 and -inf if empty)."""
    empty = l == 0
    safe_l = jnp.where(empty, 1.0, l)
    out = jnp.where(empty[..., None], 0.0, o / safe_l[..., None])
    lse = jnp.where(empty, -jnp.inf, jnp.where(m == -jnp.inf, 0.0, m) + jnp.log(safe_l))
    return out, lse


def forward(
    q: Any,
    k: Any,
    v: Any,
    req: Request,
    cfg: Config,
    mask: Any = None,
    out_dtype: Any = None,
    ops: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """(out (B, Hq, Nq, Dv) in ``out_dtype`` (default: the input dtype), lse (B, Hq, Nq) float32/float64).

    ``ops``: the §9-§11 arrays as jnp arrays (bias, sinks, q_lengths, k_lengths, cu_seqlens_q,
    cu_seqlens_k), absent keys or None where not given; ``mask`` is a bool explicit mask only.
    """
    q, k, v = _plain_buffers(req, q, k, v)
    pb = _Problem(req, cfg, ops)
    lp = planning.lanes(pb.pairs, _max_lanes(req, cfg))
    n_lanes, direct = lp.shape[0], lp.direct
    qt_all, kt_all, vt_all = pb.q_tiles(q), pb.k_tiles(k), pb.k_tiles(v)
    mtiles = None if mask is None else pb.mask_tiles(mask)
    b, hkv, g = req.batch, req.heads_kv, req.group
    acc = pb.acc
    row = (b, hkv, g, n_lanes, cfg.bq)
    init: tuple = (jnp.full(row, -jnp.inf, acc), jnp.zeros(row, acc), jnp.zeros((*row, req.dim_v), acc))
    if not direct:
        init += (
            jnp.zeros((b, hkv, g, pb.nqt, cfg.bq, req.dim_v), acc),
            jnp.full((b, hkv, g, pb.nqt, cfg.bq), -jnp.inf, acc),
        )

    def step(carry: tuple, xs: tuple) -> tuple[tuple, None]:
        m, l, o = carry[:3]
        qt, kt, valid, first, last = xs
        if not direct:
            fr = first[:, None]
            m = jnp.where(fr, -jnp.inf, m)
            l = jnp.where(fr, 0.0, l)
            o = jnp.where(fr[..., None], 0.0, o)
        s, _ = pb.logits(_take(qt_all, qt, 3, direct), kt_all[:, :, kt], qt, kt, valid, mtiles)
        m_new = jnp.maximum(m, s.max(axis=-1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - m_safe[..., None])
        alpha = jnp.exp(m - m_safe)
        l = alpha * l + p.sum(axis=-1)
        o = alpha[..., None] * o + pb.mm("bhgiqk,bhikd->bhgiqd", p.astype(pb.cdt), vt_all[:, :, kt])
        if direct:
            return (m_new, l, o), None
        out, lse = carry[3:]
        done_o, done_lse = _finish(m_new, l, o)
        dest = jnp.where(last, qt, pb.nqt)  # out of range (dropped) unless the tile is done
        out = out.at[:, :, :, dest].set(done_o, mode="drop")
        lse = lse.at[:, :, :, dest].set(done_lse, mode="drop")
        return (m_new, l, o, out, lse), None

    carry, _ = jax.lax.scan(step, init, _lanes_table(lp))
    out, lse = _finish(*carry[:3]) if direct else carry[3:]
    dtype = q.dtype if out_dtype is None else out_dtype
    if pb.sinks is None:
        return pb.untile_q(out, dtype), pb.untile_rows(lse)
    out, lse = pb.apply_sinks(pb.untile_q(out, acc), pb.untile_rows(lse))
    return out.astype(dtype), lse


def backward(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    dout: Any,
    req: Request,
    cfg: Config,
    mask: Any = None,
    dlse: Any = None,
    ops: dict[str, Any] | None = None,
) -> tuple[Any, Any, Any, Any, Any]:
    """(dq, dk, dv, dbias, dsinks) recomputing probabilities from ``lse``; ``dlse`` is lse's
    cotangent, if any. dbias has the bias's shape and dtype, dsinks the sinks'; None without them."""
    q, k, v, out, dout = _plain_buffers(req, q, k, v, out, dout)
    pb = _Problem(req, cfg, ops)
    acc = pb.acc
    qt_all, kt_all, vt_all = pb.q_tiles(q), pb.k_tiles(k), pb.k_tiles(v)
    dot_all = pb.q_tiles(dout)
    mtiles = None if mask is None else pb.mask_tiles(mask)
    delta = (dout.astype(acc) * out.astype(acc)).sum(axis=-1)
    if dlse is not None:
        delta = delta - dlse.astype(acc)
    lse_all = pb.row_tiles(lse.astype(acc), -jnp.inf)
    delta_all = pb.row_tiles(delta)
    b, hkv, g = req.batch, req.heads_kv, req.group
    scale = jnp.asarray(req.scale, acc)

    def probs(qt: Any, kt: Any, valid: Any, dq_direct: bool) -> tuple[Any, Any, Any, Any, Any]:
        """q tiles, dO tiles, P, dS (the logits' gradient: dbias) and dT (the gradient of
        scale·q·k, through softcap) of the lanes, (B, Hkv, G, L, bq, bk)."""
        q_l = _take(qt_all, qt, 3, dq_direct)
        do_l = _take(dot_all, qt, 3, dq_direct)
        s, th = pb.logits(q_l, kt_all[:, :, kt], qt, kt, valid, mtiles)
        lse_t = _take(lse_all, qt, 3, dq_direct)[..., None]
        dead = lse_t == -jnp.inf
        p = jnp.where(dead, 0.0, jnp.exp(s - jnp.where(dead, 0.0, lse_t)))
        dp = pb.mm("bhgiqd,bhikd->bhgiqk", do_l, vt_all[:, :, kt])
        ds = p * (dp - _take(delta_all, qt, 3, dq_direct)[..., None])
        dt = ds if th is None else ds * (1.0 - th * th)
        return q_l, do_l, p, ds, dt

    # dq: lanes over query tiles.
    lq = planning.lanes(pb.pairs, _max_lanes(req, cfg))
    nlq, dq_direct = lq.shape[0], lq.direct

    with_db = pb.btiles is not None

    def dq_step(carry: tuple, xs: tuple) -> tuple[tuple, None]:
        a = carry[0]
        qt, kt, valid, first, last = xs
        if not dq_direct:
            a = jnp.where(first[:, None, None], 0.0, a)
        _, _, _, ds, dt = probs(qt, kt, valid, dq_direct)
        a = a + pb.mm("bhgiqk,bhikd->bhgiqd", dt.astype(pb.cdt), kt_all[:, :, kt])
        db = (pb.dbias_add(carry[-1], ds, qt, kt),) if with_db else ()
        if dq_direct:
            return (a, *db), None
        dest = jnp.where(last, qt, pb.nqt)
        return (a, carry[1].at[:, :, :, dest].set(a * scale, mode="drop"), *db), None

    init_q: tuple = (jnp.zeros((b, hkv, g, nlq, cfg.bq, req.dim_qk), acc),)
    if not dq_direct:
        init_q += (jnp.zeros((b, hkv, g, pb.nqt, cfg.bq, req.dim_qk), acc),)
    if with_db:
        init_q += (jnp.zeros(pb.btiles.shape, acc),)
    carry, _ = jax.lax.scan(dq_step, init_q, _lanes_table(lq))
    dq = carry[0] * scale if dq_direct else carry[1]
    dbias = None
    if with_db:
        bias = _ops(ops)["bias"]
        mb, mh, mq, mk = bias.shape
        dbias = carry[-1].reshape(mb, mh, carry[-1].shape[2] * carry[-1].shape[3], -1)
        dbias = dbias[:, :, :mq, :mk].astype(bias.dtype)
    dsinks = None
    if pb.sinks is not None:
        dead = lse == -jnp.inf
        p_sink = jnp.where(
            dead, 0.0, jnp.exp(pb.sinks.astype(acc)[None, :, None] - jnp.where(dead, 0.0, lse))
        )
        dsinks = -(p_sink * delta).sum(axis=(0, 2)).astype(pb.sinks.dtype)

    # dk, dv: lanes over key tiles.
    lk = planning.lanes(planning.transpose_pairs(pb.pairs, pb.nkt), _max_lanes(req, cfg))
    nlk, kv_direct = lk.shape[0], lk.direct

    def dkv_step(carry: tuple, xs: tuple) -> tuple[tuple, None]:
        ak, av = carry[:2]
        kt, qt, valid, first, last = xs
        if not kv_direct:
            fr = first[:, None, None]
            ak = jnp.where(fr, 0.0, ak)
            av = jnp.where(fr, 0.0, av)
        q_l, do_l, p, _, dt = probs(qt, kt, valid, False)
        av = av + pb.mm("bhgiqk,bhgiqd->bhikd", p.astype(pb.cdt), do_l)
        ak = ak + pb.mm("bhgiqk,bhgiqd->bhikd", dt.astype(pb.cdt), q_l)
        if kv_direct:
            return (ak, av), None
        dest = jnp.where(last, kt, pb.nkt)
        dk = carry[2].at[:, :, dest].set(ak * scale, mode="drop")
        dv = carry[3].at[:, :, dest].set(av, mode="drop")
        return (ak, av, dk, dv), None

    init_k: tuple = (
        jnp.zeros((b, hkv, nlk, cfg.bk, req.dim_qk), acc),
        jnp.zeros((b, hkv, nlk, cfg.bk, req.dim_v), acc),
    )
    if not kv_direct:
        init_k += (
            jnp.zeros((b, hkv, pb.nkt, cfg.bk, req.dim_qk), acc),
            jnp.zeros((b, hkv, pb.nkt, cfg.bk, req.dim_v), acc),
        )
    carry, _ = jax.lax.scan(dkv_step, init_k, _lanes_table(lk))
    dk, dv = (carry[0] * scale, carry[1]) if kv_direct else (carry[2], carry[3])
    return pb.untile_q(dq, q.dtype), pb.untile_k(dk, k.dtype), pb.untile_k(dv, v.dtype), dbias, dsinks
