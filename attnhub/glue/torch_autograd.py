"""torch.autograd glue: any backend with ``forward``/``backward`` becomes differentiable in torch."""

from __future__ import annotations

from typing import Any

import torch

from attnhub.request import Request


class _AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, backend, req, mask):  # type: ignore[override]
        if any(ctx.needs_input_grad[:3]):
            out, lse, saved = backend.forward_for_grad(q, k, v, req, mask)
        else:
            out, lse = backend.forward(q, k, v, req, mask)
            saved = out
        ctx.save_for_backward(q, k, v, saved, lse)
        ctx.backend, ctx.req, ctx.mask = backend, req, mask
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.backend.backward(q, k, v, out, lse, dout.contiguous(), ctx.req, ctx.mask)
        return dq, dk, dv, None, None, None


def run_with_autograd(backend: Any, q: Any, k: Any, v: Any, req: Request, mask: Any) -> tuple[Any, Any]:
    """Run ``backend.forward`` so that torch autograd calls ``backend.backward``."""
    return _AttentionFunction.apply(q, k, v, backend, req, mask)
