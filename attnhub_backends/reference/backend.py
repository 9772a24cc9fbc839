"""The ``reference`` backend: NumPy float64, every feature of SPEC, lowest priority."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from attnhub.backend import Backend
from attnhub.frameworks import adapter_for
from attnhub.request import Request
from attnhub_backends.reference import kernel


class ReferenceBackend(Backend):
    """Float64 NumPy attention for NumPy arrays and CPU arrays of torch, TensorFlow and JAX."""

    name: ClassVar[str] = "reference"
    priority: ClassVar[int] = 0
    frameworks: ClassVar[tuple[str, ...]] = ("numpy", "torch", "tensorflow", "jax")
    device_types: ClassVar[tuple[str, ...]] = ("cpu",)
    features: ClassVar[frozenset[str]] = frozenset(
        {
            "1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward",
            "deterministic", "dlse", "bias", "dbias", "softcap", "sinks", "lengths", "varlen", "paged", "alibi",
            "offsets",
        }
    )  # fmt: skip

    def version(self) -> str:
        return f"numpy {np.__version__}"

    def extra_reasons(self, req: Request) -> list[str]:
        if req.symbolic:
            return [
                "needs concrete arrays; the inputs are traced (jax.jit / tf.function): "
                f"use the {'jax' if req.framework == 'jax' else 'tf'} backend"
            ]
        if req.framework == "jax" and (req.bias_grad or req.sinks_grad):
            return [
                "needs concrete arrays; jax.grad traces the bias/sinks it differentiates: use the jax backend"
            ]
        return []

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        ad = adapter_for(q)
        arrays = [ad.to_numpy(x) for x in (q, k, v)]
        m = None if mask is None else adapter_for(mask).to_numpy(mask)
        out, lse = kernel.forward(*arrays, req, m, _numpy_ops(operands))
        lse_dtype = "float64" if req.dtype == "float64" else "float32"
        return ad.from_numpy(out, req.dtype, q), ad.from_numpy(lse, lse_dtype, q)

    def forward_for_grad(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any, Any]:
        out, lse = self.forward(q, k, v, req, mask, operands)
        return out, lse, out

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None,
        operands: Any = None, dlse: Any = None,
    ) -> tuple[Any, ...]:  # fmt: skip
        ad = adapter_for(q)
        arrays = [ad.to_numpy(x) for x in (q, k, v, dout)]
        m = None if mask is None else adapter_for(mask).to_numpy(mask)
        dl = None if dlse is None else adapter_for(dlse).to_numpy(dlse)
        ops = _numpy_ops(operands)
        grads = kernel.backward(*arrays, req, m, dl, ops)
        result = [ad.from_numpy(g, req.dtype, q) for g in grads[:3]]
        if operands is None:
            return tuple(result)
        dbias = dsinks = None
        if req.bias_grad and grads[3] is not None:
            dbias = _like(grads[3], operands.bias)
        if req.sinks_grad and grads[4] is not None:
            dsinks = _like(grads[4], operands.sinks)
        return (*result, dbias, dsinks)


def _numpy_ops(operands: Any) -> Any:
    return kernel.backend_ops(operands, lambda x: adapter_for(x, "operand").to_numpy(x))


def _like(g: np.ndarray, x: Any) -> Any:
    """``g`` as an array of ``x``'s framework, dtype and device."""
    ad = adapter_for(x, "operand")
    return ad.from_numpy(g, ad.dtype_name(x), x)
