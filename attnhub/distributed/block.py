"""One block of a sharded attention: forward through ``attnhub.attention`` and the block's part
of the global gradient through a backend's ``backward``.

The merged result of blocks ``b`` is ``O = Σ_b w_b·O_b`` with ``w_b = exp(lse_b − lse)`` and
``lse = log Σ_b exp(lse_b)``. Block ``b``'s part of the gradient is the attention backward with the
*global* probabilities ``P = exp(S_b − lse)`` and ``D = rowsum(dO·O)``. Two exact routes:

* **flash convention** (backends declaring "given_lse", triton and cuda: backward reads ``out``
  and ``lse`` as given): pass the merged ``O`` (float32, as their ``forward_for_grad`` saves it)
  and the merged ``lse``;
* **dlse** (backends declaring "dlse", e.g. reference): recompute the block's ``O_b``, ``lse_b``
  and pass ``dout = w_b·dO`` and ``dlse = w_b·(rowsum(dO·O_b) − rowsum(dO·O))``.

A backend offering neither (sdpa, whose backward re-runs torch autograd without lse) is not used
for gradients: ``backend="auto"`` takes the next one able to; a named one raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

import attnhub
from attnhub.distributed.schedule import Call
from attnhub.errors import BackendUnsupported
from attnhub.extras import NONE, Extras, operands_for


def grad_fallbacks() -> tuple[str, ...]:
    """The backends tried, highest priority first, for gradients when ``backend="auto"`` picks
    one with no exact route: every registered backend declaring "given_lse" or "dlse"."""
    from attnhub.registry import REGISTRY

    able = [b for b in REGISTRY.backends().values() if {"given_lse", "dlse"} & set(b.features)]
    return tuple(b.name for b in sorted(able, key=lambda b: -b.priority))


def positions(call: Call) -> tuple[str, int, int]:
    """(sync, q_offset, k_offset) for the call: offsets that only align the last query with the
    last key are the sync mode ``none_end`` (which backends without SPEC §11 offsets run)."""
    qo, ko = call.q_offset, call.k_offset
    if qo == ko:
        return "none_front", 0, 0
    if qo - ko == (call.k_hi - call.k_lo) - (call.q_hi - call.q_lo):
        return "none_end", 0, 0
    return "none_front", qo, ko


def extras_for(call: Call, softcap: float | None) -> tuple[str, Extras]:
    sync, qo, ko = positions(call)
    if softcap is None and qo == 0 and ko == 0:
        return sync, NONE
    return sync, Extras(softcap=softcap, q_offset=qo, k_offset=ko)


def forward(q: Any, k: Any, v: Any, call: Call, scale: float, softcap: float | None, backend: str):
    """(out, lse) of one block (rows/keys already sliced), lse float32 (float64 for float64)."""
    sync, qo, ko = positions(call)
    return attnhub.attention(
        q, k, v, mask=call.rule, sync=sync, scale=scale, softcap=softcap, backend=backend,
        return_lse=True, q_offset=qo, k_offset=ko,
    )  # fmt: skip


def _route(be: Any) -> str | None:
    if "dlse" in be.features:
        return "dlse"
    if "given_lse" in be.features:
        return "flash"
    return None


def _candidates(backend: str) -> Iterator[str]:
    """``backend``; after ``"auto"`` the gradient fallbacks, looked up only if auto's choice has no
    exact route (every block's backward asks: the registry is not walked on the common path)."""
    yield backend
    if backend == "auto":
        yield from grad_fallbacks()


def _grad_plan(q, k, v, call: Call, scale: float, softcap: float | None, backend: str):
    from attnhub.plan import plan_for

    sync, ex = extras_for(call, softcap)
    reasons = []
    for name in _candidates(backend):
        try:
            plan = plan_for(q, k, v, call.rule, sync, scale, "bhsd", True, name, ex)
        except BackendUnsupported as exc:
            reasons.append(str(exc))
            continue
        route = _route(plan.backend)
        if route is not None:
            return plan, route, ex
        reasons.append(
            f"backend {plan.backend.name!r}: its backward takes no dlse and does not read the given "
            "out/lse, so a block's share of the merged gradient cannot be formed"
        )
    raise BackendUnsupported(
        "context-parallel backward: no backend can run this block's gradient; use backend='auto' or "
        "a backend declaring 'given_lse' or 'dlse'. " + " | ".join(reasons)
    )


def flash_lse(lse: Any) -> Any:
    """The merged lse as a flash-convention backward reads it: a fully masked row (lse = −inf)
    has P = 0 in every block, and +inf gives exp(S − lse) = 0. Computed once per rank."""
    return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)


def backward(
    q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, call: Call, scale: float,
    softcap: float | None, backend: str, lse_flash: Any = None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """(dq, dk, dv) of one block for the merged output ``o`` and lse ``lse`` (already sliced;
    ``lse_flash``: the same rows of :func:`flash_lse`, computed here when not given).

    Flash-convention backends read strided row slices as they are (they copy what their kernels
    cannot stride over), so no slice is copied here; the dlse route gets contiguous inputs."""
    plan, route, ex = _grad_plan(q, k, v, call, scale, softcap, backend)
    be, req = plan.backend, plan.req
    ops = operands_for(ex, plan.ad, q, req) if plan.operands else None
    if route == "flash":
        lse_in = flash_lse(lse) if lse_flash is None else lse_flash
        o_in = o.to(torch.float64 if q.dtype == torch.float64 else torch.float32)  # no copy: o is
        grads = be.backward(q, k, v, o_in, lse_in, do, req, None, ops)  # the float32 accumulator
        return grads[0], grads[1], grads[2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out_b, lse_b, saved = be.forward_for_grad(q, k, v, req, None, ops)
    acc = lse.dtype
    lse_b = lse_b.to(acc)
    w = torch.where(torch.isneginf(lse_b), torch.zeros_like(lse_b), torch.exp(lse_b - lse))
    do_acc = do.to(acc)
    d_b = (do_acc * out_b.to(acc)).sum(-1)
    d = (do_acc * o.to(acc)).sum(-1)
    dout = (w.unsqueeze(-1) * do_acc).to(q.dtype).contiguous()
    dlse = (w * (d_b - d)).contiguous()
    grads = be.backward(q, k, v, saved, lse_b, dout, req, None, ops, dlse)
    return grads[0], grads[1], grads[2]
