"""The ``jax`` backend: attention for JAX arrays on CPU and NVIDIA GPUs, jit/grad/vmap-compatible."""

from __future__ import annotations

import importlib.util
import sys
from importlib import metadata
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.frameworks import FLOAT_DTYPES
from attnhub.request import Request


class JaxBackend(Backend):
    """Blockwise online-softmax attention in ``jax.lax``; cuDNN on NVIDIA GPUs where it is exact.

    ``run`` returns ``jax.Array``s from a ``jax.custom_vjp`` function, so ``jax.grad``,
    ``jax.jit`` and ``jax.vmap`` work on ``attnhub.attention`` directly.
    """

    name: ClassVar[str] = "jax"
    priority: ClassVar[int] = 50
    frameworks: ClassVar[tuple[str, ...]] = ("jax",)
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward"}
    )
    requires: ClassVar[tuple[str, ...]] = ("jax",)

    def availability(self) -> str | None:
        if importlib.util.find_spec("jax") is None:
            return "jax is not installed: pip install 'attnhub[jax]'"
        return None

    def version(self) -> str | None:
        mod = sys.modules.get("jax")
        if mod is not None:
            return f"jax {mod.__version__}"
        try:
            return f"jax {metadata.version('jax')}"
        except metadata.PackageNotFoundError:
            return None

    def extra_reasons(self, req: Request) -> list[str]:
        if req.dtype == "float64" and req.framework == "jax":
            import jax

            if not jax.config.jax_enable_x64:
                return [
                    "float64 needs jax's 64-bit mode: jax.config.update('jax_enable_x64', True) "
                    "(or JAX_ENABLE_X64=1)"
                ]
        return []

    def path_for(self, req: Request) -> tuple[str, str]:
        """(path, why): ``"cudnn"`` where cuDNN serves ``req`` exactly, else ``"pallas"`` on NVIDIA
        GPUs where the Pallas kernel can, else ``"blockwise"``."""
        from attnhub_backends.jax import cudnn, pallas

        why = cudnn.obstacles(req)
        if not why:
            return "cudnn", "jax.nn.dot_product_attention(implementation='cudnn') serves it exactly"
        not_cudnn = "cuDNN: " + "; ".join(why)
        why_not = pallas.obstacles(req)
        if not why_not:
            return "pallas", f"Pallas flash kernel with tile skipping ({not_cudnn})"
        return "blockwise", f"blockwise online softmax in jax.lax ({not_cudnn}; Pallas: {'; '.join(why_not)})"

    def note(self, req: Request) -> str | None:
        path, why = self.path_for(req)
        return f"path={path}: {why}"

    def forward(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        """(out, lse) of the blockwise path (always with lse), not differentiable by itself."""
        from attnhub_backends.jax import blockwise
        from attnhub_backends.jax.paths import config_for

        return blockwise.forward(q, k, v, req, config_for(req), mask)

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None
    ) -> tuple[Any, Any, Any]:
        from attnhub_backends.jax import blockwise
        from attnhub_backends.jax.paths import config_for

        return blockwise.backward(q, k, v, out, lse, dout, req, config_for(req), mask)

    def run(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        """The chosen path as a jitted ``custom_vjp`` function (cuDNN: its own VJP)."""
        from attnhub_backends.jax.paths import function_for

        path, _ = self.path_for(req)
        return function_for(req, path)(q, k, v, mask)
