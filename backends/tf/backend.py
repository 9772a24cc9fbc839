"""The ``tf`` backend class: capabilities, and the ``tf.custom_gradient`` glue around the kernel."""

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

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None
    ) -> tuple[Any, Any, Any]:
        from attnhub_backends.tf import kernel
        from attnhub_backends.tf.tiles import plan_for

        return kernel.backward(q, k, v, out, lse, dout, req, plan_for(req), mask)

    def run(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        """Forward under ``tf.custom_gradient``: the tape keeps q, k, v, out (in the compute dtype) and lse.

        Memory stays O(L); the backward recomputes the tiles from lse.
        """
        import tensorflow as tf

        from attnhub_backends.tf import kernel
        from attnhub_backends.tf.tiles import plan_for

        plan = plan_for(req)

        @tf.custom_gradient
        def _attend(q, k, v):
            out, lse, out_ct = kernel.forward_with_residual(q, k, v, req, plan, mask)

            def grad(dout, dlse=None):
                if dout is None:
                    dout = tf.zeros_like(out)
                return kernel.backward(q, k, v, out_ct, lse, dout, req, plan, mask, dlse)

            return (out, lse), grad

        return _attend(q, k, v)
