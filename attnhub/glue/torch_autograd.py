"""torch.autograd glue: any backend with ``forward``/``backward`` becomes differentiable in torch.

An exception in the backend's ``backward`` reaches the caller as :class:`attnhub.BackendError`
naming the backend and the request (the original is its ``__cause__``). A bias (or float mask) that
requires grad is only ever given to a backend declaring ``dbias`` (the dispatcher declines it
otherwise); its backward then returns ``(dq, dk, dv, dbias, dsinks)``, and a missing ``dbias`` is an
error, never a dropped gradient (SPEC §9). :func:`call_backward` is that contract, shared with the
custom ops that ``torch.compile`` traces (attnhub/torch_ops.py). lse is differentiable: its upstream
gradient reaches a backend declaring "dlse" as ``dlse``; for any other backend a gradient flowing
into lse is an error naming the backends that take it, never dropped (lse only logged, or
detached, passes None).
"""

from __future__ import annotations

from typing import Any

import torch

from attnhub.request import Request


def call_backward(
    backend: Any, req: Request, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, mask: Any,
    operands: Any = None, dlse: Any = None,
) -> tuple[Any, Any, Any, Any, Any]:  # fmt: skip
    """``backend.backward`` as the glue calls it: (dq, dk, dv, dbias or None, dsinks or None),
    errors named; a gradient the request asks for and the backend does not give is an error, never
    a dropped gradient (SPEC §9)."""
    from attnhub.errors import backend_error, passes_through

    name = getattr(backend, "name", type(backend).__name__)
    try:
        grads = tuple(backend.backward(q, k, v, out, lse, dout.contiguous(), req, mask, operands, dlse))
    except Exception as exc:
        if passes_through(exc):
            raise
        raise backend_error(name, req, f"backward raised {type(exc).__name__}: {exc}") from exc
    if len(grads) not in (3, 5):
        raise backend_error(name, req, f"backward returned {len(grads)} gradients, expected 3 or 5")
    dbias = grads[3] if len(grads) == 5 else None
    dsinks = grads[4] if len(grads) == 5 else None
    if req.bias_grad and dbias is None:
        raise backend_error(name, req, "gave no gradient for the bias/float mask, which requires grad")
    if req.sinks_grad and dsinks is None:
        raise backend_error(name, req, "gave no gradient for sinks, which require grad")
    return grads[0], grads[1], grads[2], dbias, dsinks


class _AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, sinks, backend, req, mask, operands):  # type: ignore[override]
        if operands is None and not any(ctx.needs_input_grad[:3]):
            out, lse = backend.forward(q, k, v, req, mask, operands)
            saved = out
        else:
            out, lse, saved = backend.forward_for_grad(q, k, v, req, mask, operands)
        ctx.save_for_backward(q, k, v, saved, lse)
        ctx.backend, ctx.req, ctx.mask, ctx.operands = backend, req, mask, operands
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None, not zeros
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        if dlse is not None and "dlse" not in ctx.backend.features:
            from attnhub.errors import backend_error

            raise backend_error(
                ctx.backend.name, ctx.req,
                "cannot differentiate lse (its backward takes no dlse), and the loss uses lse: use a "
                "backend declaring 'dlse' (the reference backend does), or detach lse",
            )  # fmt: skip
        if dout is None:  # only lse carries a gradient
            dout = torch.zeros(out.shape, dtype=q.dtype, device=q.device)
        dq, dk, dv, dbias, dsinks = call_backward(
            ctx.backend, ctx.req, q, k, v, out, lse, dout, ctx.mask, ctx.operands, dlse
        )
        dbias = dbias if ctx.needs_input_grad[3] else None
        dsinks = dsinks if ctx.needs_input_grad[4] else None
        return dq, dk, dv, dbias, dsinks, None, None, None, None


def run_with_autograd(
    backend: Any, q: Any, k: Any, v: Any, req: Request, mask: Any, operands: Any
) -> tuple[Any, Any]:
    """Run ``backend.forward`` so that torch autograd calls ``backend.backward``; a bias and sinks
    that require grad get their gradients."""
    bias = None if operands is None else operands.bias
    sinks = None if operands is None else operands.sinks
    return _AttentionFunction.apply(q, k, v, bias, sinks, backend, req, mask, operands)
