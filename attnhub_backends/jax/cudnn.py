"""The cuDNN path: ``jax.nn.dot_product_attention(implementation="cudnn")`` where it is exact.

cuDNN's fused attention knows no sync modes, strides, 2-d windows or float32 lse, so it serves a
request only when its own semantics coincide with SPEC's:

- ``Full()``: any lengths; ``Causal()``: query and key sequence shapes equal (then every sync
  mode puts query i and key i at the same position, and the flat-index rule is the plain
  lower-triangular mask that cuDNN's causal mask computes; its alignment for Lq != Lk is not
  relied on). Neither rule leaves a row fully masked when Lk > 0.
- ``Local`` is declined: cuDNN's sliding window is left-only and has no stride or 2-d form.
- float16/bfloat16, Dqk == Dv, a multiple of 8 and at most 128, no explicit mask, no lse
  (cuDNN's softmax statistics come back rounded to the input dtype).
- Even query and key lengths: cuDNN's backward rejects odd ones (``NotImplementedError`` under
  ``jax.grad``), and a gradient may follow any call.
- Of SPEC §9-§11 only ``q_lengths``/``k_lengths`` with right padding and the rule ``Full``
  (cuDNN's ``query_seq_lengths``/``key_value_seq_lengths``): positions do not matter under
  ``Full``, padded query rows and rows without keys are set to 0 here (a length 0 is passed to
  cuDNN as 1 and its rows zeroed, so that no 0/0 reaches its backward).
"""

from __future__ import annotations

from typing import Any

from attnhub import settings
from attnhub.request import Request
from attnhub.rules import Causal, Full


def obstacles(req: Request) -> list[str]:
    """Why cuDNN cannot serve ``req`` exactly (empty: it can)."""
    why: list[str] = []
    if req.device_type != "cuda":
        why.append("not on an NVIDIA GPU")
        return why
    if not settings.value("ATTNHUB_JAX_CUDNN"):  # "0" keeps the path off (benchmarks compare both)
        why.append("disabled by ATTNHUB_JAX_CUDNN=0")
    if req.dtype not in ("float16", "bfloat16"):
        why.append(f"cuDNN flash attention takes float16/bfloat16, got {req.dtype}")
    rule = req.rule
    if isinstance(rule, Causal):
        if req.seq_q != req.seq_k:
            why.append("causal with Sq != Sk: cuDNN's causal alignment is not SPEC's sync modes")
    elif not isinstance(rule, Full):
        why.append(f"cuDNN has no exact form of {rule.describe()}")
    if req.return_lse:
        why.append("cuDNN returns lse rounded to the input dtype, not float32")
    if req.dim_qk != req.dim_v:
        why.append("cuDNN path needs Dqk == Dv")
    if req.dim_qk % 8 or req.dim_qk > 128:
        why.append(f"cuDNN path needs a head dim that is a multiple of 8 and <= 128, got {req.dim_qk}")
    why.extend(_modifier_obstacles(req))
    if req.nq % 2 or req.nk % 2:
        # Found by `attnhub certify jax --device cuda`: jax.grad of the cuDNN call raises
        # NotImplementedError for odd lengths, and whether a gradient follows is unknown here.
        why.append(f"cuDNN's backward needs even sequence lengths, got Lq={req.nq}, Lk={req.nk}")
    return why


#: cuDNN's sequence lengths serve right-padded requests only once tests/test_jax_modifiers_gpu.py
#: (test_cudnn_right_padding, which turns this on) has passed on a GPU; until then such requests
#: take the blockwise path, which is verified.
LENGTHS_VERIFIED = False


def _modifier_obstacles(req: Request) -> list[str]:
    """Why cuDNN cannot serve the §9-§11 arguments of ``req`` exactly."""
    if not req.modified:
        return []
    why = []
    used = {
        "bias": req.bias is not None,
        "softcap": req.softcap is not None,
        "sinks": req.sinks,
        "packed sequences": req.varlen,
        "paged KV caches": bool(req.paged),
        "offsets": bool(req.q_offset or req.k_offset),
    }
    names = [n for n, u in used.items() if u]
    if names:
        why.append(f"the cuDNN path takes no {', '.join(names)}")
    if req.q_lengths or req.k_lengths:
        if not LENGTHS_VERIFIED:
            why.append("cuDNN with sequence lengths awaits its GPU test (cudnn.LENGTHS_VERIFIED)")
        if req.padding_side != "right":
            why.append("cuDNN's sequence lengths are right padding only")
        if not isinstance(req.rule, Full):
            why.append("cuDNN with lengths serves the rule Full only (its causal mask is not per-entry sync)")
    return why


def attention(q: Any, k: Any, v: Any, req: Request, ops: dict[str, Any] | None = None) -> Any:
    """out (B, Hq, Nq, D) through cuDNN for canonical (B, H, N, D) inputs (see :func:`obstacles`)."""
    import jax.numpy as jnp
    from jax import nn

    ops = ops or {}
    causal = isinstance(req.rule, Causal)
    t = (0, 2, 1, 3)  # canonical (B, H, N, D) <-> jax.nn's (B, T, N, H)
    ql, kl = ops.get("q_lengths"), ops.get("k_lengths")
    lengths: dict[str, Any] = {}
    if ql is not None or kl is not None:
        ql = jnp.full((req.batch,), req.nq, jnp.int32) if ql is None else ql.astype(jnp.int32)
        kl = jnp.full((req.batch,), req.nk, jnp.int32) if kl is None else kl.astype(jnp.int32)
        lengths = {"query_seq_lengths": jnp.maximum(ql, 1), "key_value_seq_lengths": jnp.maximum(kl, 1)}
    out = nn.dot_product_attention(
        jnp.transpose(q, t),
        jnp.transpose(k, t),
        jnp.transpose(v, t),
        scale=req.scale,
        is_causal=causal,
        implementation="cudnn",
        **lengths,
    )
    out = jnp.transpose(out, t)
    if lengths:
        rows = jnp.arange(req.nq, dtype=jnp.int32)[None, :]
        ok = (rows < ql[:, None]) & (kl[:, None] > 0)
        out = jnp.where(ok[:, None, :, None], out, jnp.zeros((), out.dtype))
    return out
