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
    if req.nq % 2 or req.nk % 2:
        # Found by `attnhub certify jax --device cuda`: jax.grad of the cuDNN call raises
        # NotImplementedError for odd lengths, and whether a gradient follows is unknown here.
        why.append(f"cuDNN's backward needs even sequence lengths, got Lq={req.nq}, Lk={req.nk}")
    return why


def attention(q: Any, k: Any, v: Any, req: Request) -> Any:
    """out (B, Hq, Nq, D) through cuDNN for canonical (B, H, N, D) inputs (see :func:`obstacles`)."""
    import jax.numpy as jnp
    from jax import nn

    causal = isinstance(req.rule, Causal)
    t = (0, 2, 1, 3)  # canonical (B, H, N, D) <-> jax.nn's (B, T, N, H)
    out = nn.dot_product_attention(
        jnp.transpose(q, t),
        jnp.transpose(k, t),
        jnp.transpose(v, t),
        scale=req.scale,
        is_causal=causal,
        implementation="cudnn",
    )
    return jnp.transpose(out, t)
