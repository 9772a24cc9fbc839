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
        {
            *("1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward", "dlse"),
            *("deterministic", "bias", "dbias", "softcap", "sinks", "lengths", "varlen", "offsets", "paged"),
        }
    )
    requires: ClassVar[tuple[str, ...]] = ("tensorflow",)

    def availability(self) -> str | None:
        if importlib.util.find_spec("tensorflow") is None:
            return "TensorFlow is not installed: pip install 'attnhub[tf]' (or attnhub[tf-cpu])"
        return None

    def version(self) -> str | None:
        import tensorflow as tf

        return f"tensorflow {tf.__version__}"

    def note(self, req: Request) -> str | None:
        if req.paged:
            return "paged cache gathered per entry; ragged tiles masked per element, empty ones skipped at run time"
        if req.ragged:
            return "ragged: every computed tile masked per element, tiles without a valid pair skipped at run time"
        return None

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        from attnhub_backends.tf import kernel
        from attnhub_backends.tf.tiles import plan_for

        k, v, req = _unpaged(k, v, req, operands)
        return kernel.forward(q, k, v, req, plan_for(req), mask, operands)

    def forward_for_grad(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any, Any]:
        """(out, lse, out in the compute dtype): the backward's rowsum(dO·O) reads O before rounding."""
        from attnhub_backends.tf import kernel
        from attnhub_backends.tf.tiles import plan_for

        k, v, req = _unpaged(k, v, req, operands)
        return kernel.forward_with_residual(q, k, v, req, plan_for(req), mask, operands)

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
        operands: Any = None,
        dlse: Any = None,
    ) -> tuple[Any, ...]:
        """Recomputes each tile from lse (memory stays linear in the sequence length).

        (dq, dk, dv), plus (dbias, dsinks) for a request with a bias or sinks (SPEC §9).
        """
        from attnhub_backends.tf import kernel
        from attnhub_backends.tf.tiles import plan_for

        kd, vd, dreq = _unpaged(k, v, req, operands)
        grads = kernel.backward(q, kd, vd, out, lse, dout, dreq, plan_for(dreq), mask, dlse, operands)
        if req.paged:
            from attnhub_backends.tf import paged

            dk = paged.scatter(grads[1], k, operands.block_table)
            dv = paged.scatter(grads[2], v, operands.block_table)
            grads = (grads[0], dk, dv, *grads[3:])
        return grads


def _unpaged(k: Any, v: Any, req: Request, operands: Any) -> tuple[Any, Any, Request]:
    """Paged caches gathered into the contiguous keys of a right-padded batch (paged.py)."""
    if not req.paged:
        return k, v, req
    from attnhub_backends.tf import paged

    bt = operands.block_table
    return paged.gather(k, bt), paged.gather(v, bt), paged.dense_request(req)
