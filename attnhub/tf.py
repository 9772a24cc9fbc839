"""tf_flash_attention's public API on top of :func:`attnhub.attention`, for its users.

The six functions of `nothingstopsme/tf_flash_attention` (``flash_attention.flash_attention``)
with its argument names, order and defaults, its channel-first shapes and its outputs:

- inputs ``batch_shape + (channels, *sequence)``, where ``batch_shape`` (heads included) may have
  any rank and must be the same for Q, K and V;
- scale ``1/sqrt(channels of Q)`` (the kernel's ``dot_scaler``);
- output ``O`` of shape ``batch_shape + (channels of V, *query sequence)``, or ``(O, l, m)`` with
  ``returning_l_m=True``: ``m`` is the maximum scaled logit of each query's attended keys and
  ``l = sum(exp(logit - m))`` over them (``l`` in float32 for half inputs, else the input dtype;
  ``m`` in the input dtype); ``log(l) + m`` is attnhub's lse. As in the original, ``l`` and ``m``
  carry no gradient. Differences are listed in docs/backends/tf.md (fully masked rows give
  ``l = 0`` and ``m = -inf`` where the CUDA kernel leaves ``m`` at a large negative filler).

Importing this module imports TensorFlow; ``import attnhub`` alone does not.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from attnhub.api import attention
from attnhub.errors import SpecError
from attnhub.request import build_request, to_canonical
from attnhub.rules import Causal, Full, Local, Rule

__all__ = ["causal_1d", "causal_2d", "full_1d", "full_2d", "local_1d", "local_2d"]

# trace-time Python: AutoGraph must not rewrite it inside tf.function
_plain = tf.autograph.experimental.do_not_convert


def _attend(Q: Any, K: Any, V: Any, ndim: int, rule: Rule, sync_mode: str, returning_l_m: bool, backend: str):
    shapes = {n: tuple(x.shape) for n, x in (("Q", Q), ("K", K), ("V", V))}
    for n, s in shapes.items():
        if len(s) < ndim + 1:
            raise SpecError(f"{n}.shape", f"batch_shape + (channels, {ndim} sequence dims)", s)
    batch = shapes["Q"][: -ndim - 1]
    for n in ("K", "V"):
        if shapes[n][: -ndim - 1] != batch:
            raise SpecError(f"batch shape of {n}", f"{batch} (the batch shape of Q)", shapes[n][: -ndim - 1])
    if any(d is None for d in batch):
        raise SpecError(
            "batch shape of Q", "static sizes (inside tf.function, fix the input signature)", batch
        )
    nb = math.prod(batch)

    def canon(x: Any) -> Any:
        return tf.reshape(x, (nb, 1, *x.shape[-ndim - 1 :]))

    q, k, v = canon(Q), canon(K), canon(V)
    res = attention(
        q, k, v, mask=rule, sync=sync_mode, layout="bhds", backend=backend, return_lse=returning_l_m
    )
    out = res[0] if returning_l_m else res
    O = tf.reshape(out, (*batch, *out.shape[2:]))
    if not returning_l_m:
        return O
    m = _row_max(q, k, v, rule, sync_mode)
    lse = tf.reshape(res[1], m.shape)
    l_dtype = tf.float32 if q.dtype in (tf.float16, tf.bfloat16) else q.dtype
    finite = tf.math.is_finite(m)
    l = tf.where(
        finite, tf.exp(tf.cast(lse, m.dtype) - tf.where(finite, m, tf.zeros_like(m))), tf.zeros_like(m)
    )
    seq = tuple(q.shape[3:])
    l = tf.stop_gradient(tf.reshape(tf.cast(l, l_dtype), (*batch, *seq)))
    m = tf.stop_gradient(tf.reshape(tf.cast(m, q.dtype), (*batch, *seq)))
    return O, l, m


def _row_max(q: Any, k: Any, v: Any, rule: Rule, sync: str) -> Any:
    """Maximum scaled logit per query over its attended keys (-inf where none), blockwise."""
    from attnhub_backends.tf import kernel
    from attnhub_backends.tf.tiles import plan_for

    req, ad = build_request(q, k, v, rule, sync, None, "bhds", False)
    qc, kc = to_canonical(ad, q, "bhds"), to_canonical(ad, k, "bhds")
    return kernel.row_max(qc, kc, req, plan_for(req))


@_plain
def full_1d(Q, K, V, sync_mode="none_front", returning_l_m=False, *, backend="auto"):
    """Full attention on 1-d sequences: Q (..., C, Lq), K (..., C, Lk), V (..., Cv, Lk) -> O (..., Cv, Lq)."""
    return _attend(Q, K, V, 1, Full(), sync_mode, returning_l_m, backend)


@_plain
def causal_1d(Q, K, V, sync_mode, returning_l_m=False, *, backend="auto"):
    """Causal attention on 1-d sequences (flat query index >= flat key index under ``sync_mode``)."""
    return _attend(Q, K, V, 1, Causal(), sync_mode, returning_l_m, backend)


@_plain
def local_1d(
    Q, K, V, window_size, log2_stride_size, is_causal, sync_mode, returning_l_m=False, *, backend="auto"
):
    """Local attention on 1-d sequences: windows of ``2*window_size-1`` every ``2**log2_stride_size``."""
    rule = Local(window_size, log2_stride_size, bool(is_causal))
    return _attend(Q, K, V, 1, rule, sync_mode, returning_l_m, backend)


@_plain
def full_2d(Q, K, V, sync_mode="none_front", returning_l_m=False, *, backend="auto"):
    """Full attention on 2-d sequences: Q (..., C, Yq, Xq), K (..., C, Yk, Xk), V (..., Cv, Yk, Xk)."""
    return _attend(Q, K, V, 2, Full(), sync_mode, returning_l_m, backend)


@_plain
def causal_2d(Q, K, V, sync_mode, returning_l_m=False, *, backend="auto"):
    """Causal attention on 2-d sequences (row-major flat positions on the common grid)."""
    return _attend(Q, K, V, 2, Causal(), sync_mode, returning_l_m, backend)


@_plain
def local_2d(
    Q, K, V, window_size, log2_stride_size, is_causal, sync_mode, returning_l_m=False, *, backend="auto"
):
    """Local attention on 2-d sequences: square windows of ``2*window_size-1`` per dimension."""
    rule = Local(window_size, log2_stride_size, bool(is_causal))
    return _attend(Q, K, V, 2, rule, sync_mode, returning_l_m, backend)
