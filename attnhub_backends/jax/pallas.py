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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attnhub import settings
from attnhub.request import Request
from attnhub.rules import Causal, Full, Local
from attnhub_backends.jax import plan as planning
from attnhub_backends.jax import rulemask, softcap

BQ, BK = 128, 64


def mode() -> str:
    """ "on" (GPU), "off" or "interpret", from ``ATTNHUB_JAX_PALLAS``."""
    return settings.value("ATTNHUB_JAX_PALLAS")


def obstacles(req: Request) -> list[str]:
    """Why the Pallas kernel cannot serve ``req`` (empty: it can)."""
    m = mode()
    why: list[str] = []
    if m == "off":
        return ["disabled by ATTNHUB_JAX_PALLAS=0"]
    if m == "on" and req.device_type != "cuda":
        return ["not on an NVIDIA GPU"]
    if req.dtype not in ("float16", "bfloat16"):
        why.append(f"the Pallas kernel takes float16/bfloat16 (float32 would run as tf32), got {req.dtype}")
    if not isinstance(req.rule, (Full, Causal, Local)):
        why.append("the Pallas kernel reads no explicit mask arrays")
    if req.bias is not None or req.ragged:
        why.append("the Pallas kernel takes no bias, lengths, packed sequences or paged caches")
    if req.softcap is not None and softcap.split(req.softcap, np.float32) not in (None, (req.softcap, 0)):
        why.append(f"the Pallas kernel takes softcaps up to 2**{softcap.MAX_EXP} (or beyond any logit)")
    for name, d in (("Dqk", req.dim_qk), ("Dv", req.dim_v)):
        if d not in (16, 32, 64, 128):
            why.append(f"the Pallas kernel needs {name} in 16/32/64/128, got {d}")
    return why


def _tile_bounds(req: Request, nqt: int) -> np.ndarray:
    """(nQT, 2) int32: first and one-past-last key tile that any query of the tile attends."""
    if req.q_offset or req.k_offset:
        pairs = planning.shifted_pairs(req.rule, req.nq, req.nk, req.q_offset, req.k_offset, BQ, BK)
    else:
        pairs = planning.tile_pairs(req.rule, req.seq_q, req.seq_k, req.sync, BQ, BK)
    out = np.zeros((nqt, 2), dtype=np.int32)
    for i, row in enumerate(pairs):
        if row:
            out[i] = (row[0], row[-1] + 1)
    return out


def forward(
    q: Any, k: Any, v: Any, req: Request, out_dtype: Any = None, sinks: Any = None
) -> tuple[Any, Any]:
    """(out (B, Hq, Nq, Dv) in ``out_dtype`` (default q's), lse (B, Hq, Nq) float32) through the
    Pallas kernel; softcap and offsets inside it, sinks (SPEC §9) applied to its result."""
    dtype = out_dtype or q.dtype
    if sinks is None:
        return _kernel(q, k, v, req, dtype)
    out, lse = _kernel(q, k, v, req, jnp.float32)
    full = jnp.logaddexp(lse, sinks.astype(jnp.float32)[None, :, None])
    dead = full == -jnp.inf
    factor = jnp.where(dead, 0.0, jnp.exp(lse - jnp.where(dead, 0.0, full)))
    return (out * factor[..., None]).astype(dtype), full


def _kernel(q: Any, k: Any, v: Any, req: Request, out_dtype: Any) -> tuple[Any, Any]:
    from jax.experimental import pallas as pl

    nqt, nkt = math.ceil(req.nq / BQ), math.ceil(req.nk / BK)
    nq_pad, nk_pad = nqt * BQ, nkt * BK
    if nq_pad != req.nq:
        q = jnp.pad(q, ((0, 0), (0, 0), (0, nq_pad - req.nq), (0, 0)))
    if nk_pad != req.nk:
        k = jnp.pad(k, ((0, 0), (0, 0), (0, nk_pad - req.nk), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, 0), (0, nk_pad - req.nk), (0, 0)))
    bounds = jnp.asarray(_tile_bounds(req, nqt))
    g, dqk, dv, scale, cap = req.group, req.dim_qk, req.dim_v, req.scale, req.softcap

    def kernel(b_ref: Any, q_ref: Any, k_ref: Any, v_ref: Any, o_ref: Any, lse_ref: Any) -> None:
        i = pl.program_id(0)
        two = b_ref[...]
        first = jnp.arange(2) == 0
        lo = jnp.sum(jnp.where(first, two, 0), dtype=jnp.int32)
        hi = jnp.sum(jnp.where(first, 0, two), dtype=jnp.int32)
        qt = q_ref[...]
        qi = i * BQ + jnp.arange(BQ, dtype=jnp.int32)[:, None]

        def body(t: Any, carry: tuple) -> tuple:
            m, l, acc = carry
            start = t * BK
            kt = k_ref[pl.dslice(start, BK), :]
            vt = v_ref[pl.dslice(start, BK), :]
            s = jax.lax.dot_general(
                qt, kt, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            ) * jnp.float32(scale)
            if cap is not None:  # any finite cap, 1e300 included (softcap.py)
                s, _ = softcap.apply(s, cap, jnp.float32)
            keep = rulemask.keep(req, qi, start + jnp.arange(BK, dtype=jnp.int32)[None, :])
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
            jax.ShapeDtypeStruct((req.batch, req.heads_q, nq_pad, dv), out_dtype),
            jax.ShapeDtypeStruct((req.batch, req.heads_q, nq_pad), jnp.float32),
        ],
        interpret=interpret,
        **params,
    )(bounds, q, k, v)
    return out[:, :, : req.nq], lse[:, :, : req.nq]
