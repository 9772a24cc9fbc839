"""torch.autograd glue: any backend with ``forward``/``backward`` becomes differentiable in torch.

An exception in the backend's ``backward`` reaches the caller as :class:`attnhub.BackendError`
naming the backend and the request (the original is its ``__cause__``). A float mask that requires
grad is only ever given to a backend declaring ``dbias`` (the dispatcher declines it otherwise);
its backward then returns ``(dq, dk, dv, dmask)``, and a missing ``dmask`` is an error, never a
dropped gradient (SPEC §9). :func:`call_backward` is that contract, shared with the custom ops
that ``torch.compile`` traces (attnhub/glue/torch_ops.py).
"""

from __future__ import annotations

from typing import Any

import torch

from attnhub.request import Request


def call_backward(
    backend: Any, req: Request, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, mask: Any,
    mask_grad: bool,
) -> tuple[Any, Any, Any, Any]:  # fmt: skip
    """``backend.backward`` as the glue calls it: (dq, dk, dv, dmask or None), errors named."""
    from attnhub.api import backend_error, passes_through

    name = getattr(backend, "name", type(backend).__name__)
    try:
        grads = tuple(backend.backward(q, k, v, out, lse, dout.contiguous(), req, mask))
    except Exception as exc:
        if passes_through(exc):
            raise
        raise backend_error(name, req, f"backward raised {type(exc).__name__}: {exc}") from exc
    if len(grads) not in (3, 4):
        raise backend_error(name, req, f"backward returned {len(grads)} gradients, expected 3 or 4")
    dmask = grads[3] if len(grads) == 4 else None
    if mask_grad and dmask is None:
        raise backend_error(name, req, "gave no gradient for the mask, which requires grad")
    return grads[0], grads[1], grads[2], dmask


class _AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, backend, req, mask):  # type: ignore[override]
        if any(ctx.needs_input_grad[:3]) or ctx.needs_input_grad[5]:
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
        dq, dk, dv, dmask = call_backward(
            ctx.backend, ctx.req, q, k, v, out, lse, dout, ctx.mask, ctx.needs_input_grad[5]
        )
        return dq, dk, dv, None, None, dmask


def run_with_autograd(backend: Any, q: Any, k: Any, v: Any, req: Request, mask: Any) -> tuple[Any, Any]:
    """Run ``backend.forward`` so that torch autograd calls ``backend.backward``."""
    return _AttentionFunction.apply(q, k, v, backend, req, mask)
