"""The ``tf`` backend class: capabilities and the kernel's forward and backward (the core's TF glue
wraps them in ``tf.custom_gradient``)."""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.request import Request


class TFBackend(Backend):
    """Blockwise online-softmax attention for TensorFlow tensors on CPU and GPU.

    Runs eagerly, inside ``tf.function`` and under ``jit_compile=True``; tiles the rule masks
    entirely are skipped at trace time; the backward recomputes each tile from lse, so memory
    stays linear in the sequence length.
    """

    name: ClassVar[str] = "tf"
    priority: ClassVar[int] = 50
    frameworks: ClassVar[tuple[str, ...]] = ("tensorflow",)
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward", "deterministic"}
    )
    requires: ClassVar[tuple[str, ...]] = ("tensorflow",)

    def availability(self) -> str | None:
        if importlib.util.find_spec("tensorflow") is None:
            return "TensorFlow is not installed: pip install 'attnhub[tf]' (or attnhub[tf-cpu])"
        return None

    def version(self) -> str | None:
        import tensorflow as tf

        return f"tensorflow {tf.__version__}"

    def forward(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        from attnhub_backends.tf import kernel
        from attnhub_backends.tf.tiles import plan_for

        return kernel.forward(q, k, v, req, plan_for(req), mask)

    def forward_for_grad(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None
    ) -> tuple[Any, Any, Any]:
        """(out, lse, out in the compute dtype): the backward's rowsum(dO·O) reads O before rounding."""
        from attnhub_backends.tf import kernel
        from attnhub_backends.tf.tiles import plan_for

        return kernel.forward_with_residual(q, k, v, req, plan_for(req), mask)

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
        """Recomputes each tile from lse (memory stays linear in the sequence length)."""
        from attnhub_backends.tf import kernel
        from attnhub_backends.tf.tiles import plan_for

        return kernel.backward(q, k, v, out, lse, dout, req, plan_for(req), mask, dlse)
