"""Empty work (B, H, Lq, Dv or Lk = 0) under autograd: an output connected to the inputs.

The core makes the output of empty work itself (no backend runs). When the caller differentiates,
that output must still be part of the graph, or ``backward()`` fails ("does not require grad")
and TensorFlow reports no gradient: every gradient of empty work is zero (a row with no keys is
fully masked, SPEC §4), including a float mask's (SPEC §9). JAX needs nothing: ``jax.grad`` gives
zeros for inputs an output does not depend on.
"""

from __future__ import annotations

from typing import Any

from attnhub.request import Request


def connect(req: Request, out: Any, q: Any, k: Any, v: Any, mask: Any, *more: Any) -> Any:
    """``out`` (zeros or empty) as a function of q, k, v, a float mask and ``more`` float arrays
    (bias, sinks) with zero gradients."""
    if req.framework == "torch":
        return _connect_torch(req, out, q, k, v, mask, more)
    if req.framework == "tensorflow":
        return _connect_tf(out, q, k, v, mask, more)
    return out


def _float_mask(mask: Any, is_float: Any) -> Any:
    if mask is None or isinstance(mask, str) or not hasattr(mask, "shape") or not is_float(mask):
        return None
    return mask


def _connect_torch(req: Request, out: Any, q: Any, k: Any, v: Any, mask: Any, more: tuple) -> Any:
    import torch

    m = _float_mask(mask, torch.is_floating_point)
    if not (req.needs_grad or req.bias_grad or req.sinks_grad):
        return out
    inputs = (q, k, v) if m is None else (q, k, v, m)
    inputs += tuple(x for x in more if x is not None)
    return _Empty.apply(out, *inputs)


def _torch_empty_function() -> Any:
    import torch

    class _EmptyFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, out, *inputs):  # type: ignore[override]
            ctx.shapes = [(x.shape, x.dtype, x.device) for x in inputs]
            return out.clone()

        @staticmethod
        def backward(ctx, dout):  # type: ignore[override]
            return (None, *(torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.shapes))

    return _EmptyFn


class _Lazy:
    fn: Any = None

    def apply(self, *args: Any) -> Any:
        if self.fn is None:
            self.fn = _torch_empty_function()
        return self.fn.apply(*args)


_Empty = _Lazy()


def _connect_tf(out: Any, q: Any, k: Any, v: Any, mask: Any, more: tuple) -> Any:
    import tensorflow as tf

    m = _float_mask(mask, lambda x: x.dtype.is_floating)
    inputs = (q, k, v) if m is None else (q, k, v, m)
    inputs += tuple(x for x in more if x is not None)

    @tf.custom_gradient
    def _empty(*xs: Any) -> Any:
        def grad(dout: Any) -> Any:
            return [tf.zeros_like(x) for x in xs]

        return tf.identity(out), grad

    return _empty(*inputs)
