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
        {"1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward", "deterministic"}
    )

    def version(self) -> str:
        return f"numpy {np.__version__}"

    def extra_reasons(self, req: Request) -> list[str]:
        if req.symbolic:
            return [
                "needs concrete arrays; the inputs are traced (jax.jit / tf.function): "
                f"use the {'jax' if req.framework == 'jax' else 'tf'} backend"
            ]
        return []

    def forward(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        ad = adapter_for(q)
        arrays = [ad.to_numpy(x) for x in (q, k, v)]
        m = None if mask is None else adapter_for(mask).to_numpy(mask)
        out, lse = kernel.forward(*arrays, req, m)
        lse_dtype = "float64" if req.dtype == "float64" else "float32"
        return ad.from_numpy(out, req.dtype, q), ad.from_numpy(lse, lse_dtype, q)

    def backward(
        self,
        q: Any,
        k: Any,
        v: Any,
        out: Any,
        lse: Any,
        dout: Any,
        req: Request,
        mask: Any = None,
        dlse: Any = None,
    ) -> tuple[Any, Any, Any]:
        ad = adapter_for(q)
        arrays = [ad.to_numpy(x) for x in (q, k, v, dout)]
        m = None if mask is None else adapter_for(mask).to_numpy(mask)
        dl = None if dlse is None else adapter_for(dlse).to_numpy(dlse)
        grads = kernel.backward(*arrays, req, m, dl)
        return tuple(ad.from_numpy(g, req.dtype, q) for g in grads)  # type: ignore[return-value]
