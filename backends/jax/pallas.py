"""A Pallas (Triton) forward kernel for NVIDIA GPUs: the requests cuDNN cannot serve exactly.

One program per (query tile, batch, query head) keeps its query tile, running max, sum and output
accumulator on chip and walks only the key tiles ``[lo, hi)`` that the tile plan says hold an
attended pair (a NumPy table made at trace time). Inside a tile the rule is evaluated from
positions computed from the indices (SPEC §2: every sync mode is affine per dimension), so no
mask is read from memory. The backward is the blockwise ``jax.lax`` one (recomputing from lse).

``ATTNHUB_JAX_PALLAS=0`` turns the path off; ``=interpret`` runs it in Pallas' interpreter on
any device (tests on the CPU).
"""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnhub.request import Request
from attnhub.rules import Causal, Full, Local
from attnhub_backends.jax import plan as planning

ENV = "ATTNHUB_JAX_PALLAS"
BQ, BK = 128, 64


def mode() -> str:
    """ "on" (GPU), "off" or "interpret"."""
    value = os.environ.get(ENV, "1")
    return {"0": "off", "off": "off", "interpret": "interpret"}.get(value, "on")


def obstacles(req: Request) -> list[str]:
    """Why the Pallas kernel cannot serve ``req`` (empty: it can)."""
    m = mode()
    why: list[str] = []
    if m == "off":
        return [f"disabled by {ENV}=0"]
    if m == "on" and req.device_type != "cuda":
        return ["not on an NVIDIA GPU"]
    if req.dtype not in ("float16", "bfloat16"):
        why.append(f"the Pallas kernel takes float16/bfloat16 (float32 would run as tf32), got {req.dtype}")
    if not isinstance(req.rule, (Full, Causal, Local)):
        why.append("the Pallas kernel reads no explicit mask arrays")
    for name, d in (("Dqk", req.dim_qk), ("Dv", req.dim_v)):
        if d not in (16, 32, 64, 128):
            why.append(f"the Pallas kernel needs {name} in 16/32/64/128, got {d}")
    return why


def _axis(lq: int, lk: int, sync: str) -> tuple[int, int, int, int]:
    """(aq, cq, ak, ck): positions P(i) = aq*i + cq and R(j) = ak*j + ck along one dimension."""
    m = max(lq, lk)
    if sync == "none_front":
        return 1, 0, 1, 0
    if sync == "none_end":
        return 1, m - lq, 1, m - lk
    sq, sk = m // lq, m // lk
    if sync == "scale_front":
        return sq, 0, sk, 0
    return sq, sq - 1, sk, sk - 1  # scale_end


def _tile_bounds(req: Request, nqt: int) -> np.ndarray:
    """(nQT, 2) int32: first and one-past-last key tile that any query of the tile attends."""
    pairs = planning.tile_pairs(req.rule, req.seq_q, req.seq_k, req.sync, BQ, BK)
    out = np.zeros((nqt, 2), dtype=np.int32)
    for i, row in enumerate(pairs):
        if row:
            out[i] = (row[0], row[-1] + 1)
    return out


def _keep(req: Request, qi: Any, kj: Any) -> Any:
    """The rule on query indices ``qi`` (BQ, 1) x key indices ``kj`` (1, BK), inside the kernel."""
    keep = kj < req.nk
    rule = req.rule
    if isinstance(rule, Full):
        return keep
    axes = [_axis(a, b, req.sync) for a, b in zip(req.seq_q, req.seq_k)]
    if req.ndim == 1:
        iq, ik = [qi], [kj]
    else:
        xq, xk = req.seq_q[1], req.seq_k[1]
        iq = [jax.lax.div(qi, jnp.int32(xq)), jax.lax.rem(qi, jnp.int32(xq))]
        ik = [jax.lax.div(kj, jnp.int32(xk)), jax.lax.rem(kj, jnp.int32(xk))]
    pq = [a[0] * i + a[1] for a, i in zip(axes, iq)]
    pk = [a[2] * j + a[3] for a, j in zip(axes, ik)]
    if isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal):
        mx = max(req.seq_q[-1], req.seq_k[-1])
        fq = pq[0] if req.ndim == 1 else pq[0] * mx + pq[1]
        fk = pk[0] if req.ndim == 1 else pk[0] * mx + pk[1]
        keep = keep & (fq >= fk)
    if isinstance(rule, Local):
        s = rule.log2_stride
        for d, w in enumerate(rule.windows(req.ndim)):
            delta = jnp.maximum(pq[d] - pk[d], pk[d] - pq[d])
            if s:
                keep = keep & ((delta & ((1 << s) - 1)) == 0)
                delta = jax.lax.shift_right_logical(delta, jnp.int32(s))
            keep = keep & (delta < w)
    return keep


def forward(q: Any, k: Any, v: Any, req: Request) -> tuple[Any, Any]:
    """(out (B, Hq, Nq, Dv), lse (B, Hq, Nq) float32) through the Pallas kernel."""
    from jax.experimental import pallas as pl

    nqt, nkt = math.ceil(req.nq / BQ), math.ceil(req.nk / BK)
    nq_pad, nk_pad = nqt * BQ, nkt * BK
    if nq_pad != req.nq:
        q = jnp.pad(q, ((0, 0), (0, 0), (0, nq_pad - req.nq), (0, 0)))
    if nk_pad != req.nk:
        k = jnp.pad(k, ((0, 0), (0, 0), (0, nk_pad - req.nk), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, 0), (0, nk_pad - req.nk), (0, 0)))
    bounds = jnp.asarray(_tile_bounds(req, nqt))
    g, dqk, dv, scale = req.group, req.dim_qk, req.dim_v, req.scale

    def kernel(b_ref: Any, q_ref: Any, k_ref: Any, v_ref: Any, o_ref: Any, lse_ref: Any) -> None:
        i = pl.program_id(0)
        two = b_ref[...]
        first = jnp.arange(2) == 0
        lo = jnp.sum(jnp.where(first, two, 0))
        hi = jnp.sum(jnp.where(first, 0, two))
        qt = q_ref[...]
        qi = i * BQ + jnp.arange(BQ)[:, None]

        def body(t: Any, carry: tuple) -> tuple:
            m, l, acc = carry
            start = t * BK
            kt = k_ref[pl.dslice(start, BK), :]
            vt = v_ref[pl.dslice(start, BK), :]
            s = jax.lax.dot_general(
                qt, kt, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            ) * jnp.float32(scale)
            keep = _keep(req, qi, start + jnp.arange(BK)[None, :])
            s = jnp.where(keep, s, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=1))
            m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
            p = jnp.exp(s - m_safe[:, None])
            alpha = jnp.exp(m - m_safe)
            l = alpha * l + jnp.sum(p, axis=1)
            pv = jax.lax.dot_general(
                p.astype(vt.dtype), vt, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            return m_new, l, acc * alpha[:, None] + pv

        init = (
            jnp.full((BQ,), -jnp.inf, jnp.float32),
            jnp.zeros((BQ,), jnp.float32),
            jnp.zeros((BQ, dv), jnp.float32),
        )
        m, l, acc = jax.lax.fori_loop(lo, hi, body, init)
        empty = l == 0
        safe_l = jnp.where(empty, 1.0, l)
        o_ref[...] = jnp.where(empty[:, None], 0.0, acc / safe_l[:, None]).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(empty, -jnp.inf, jnp.where(m == -jnp.inf, 0.0, m) + jnp.log(safe_l))

    interpret = mode() == "interpret"
    params: dict[str, Any] = {}
    if not interpret:
        from jax.experimental.pallas import triton as plgpu

        make = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams", None)
        if make is not None:
            warps = 8 if max(dqk, dv) >= 128 else 4
            params["compiler_params"] = make(num_warps=warps, num_stages=3)
    out, lse = pl.pallas_call(
        kernel,
        grid=(nqt, req.batch, req.heads_q),
        in_specs=[
            pl.BlockSpec((None, 2), lambda i, b, h: (i, 0)),
            pl.BlockSpec((None, None, BQ, dqk), lambda i, b, h: (b, h, i, 0)),
            pl.BlockSpec((None, None, nk_pad, dqk), lambda i, b, h: (b, jax.lax.div(h, jnp.int32(g)), 0, 0)),
            pl.BlockSpec((None, None, nk_pad, dv), lambda i, b, h: (b, jax.lax.div(h, jnp.int32(g)), 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, BQ, dv), lambda i, b, h: (b, h, i, 0)),
            pl.BlockSpec((None, None, BQ), lambda i, b, h: (b, h, i)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((req.batch, req.heads_q, nq_pad, dv), q.dtype),
            jax.ShapeDtypeStruct((req.batch, req.heads_q, nq_pad), jnp.float32),
        ],
        interpret=interpret,
        **params,
    )(bounds, q, k, v)
    return out[:, :, : req.nq], lse[:, :, : req.nq]
