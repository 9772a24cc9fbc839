"""attnhub as torch.library custom ops, for code that ``torch.compile`` traces.

Eager calls keep the core's fast path (a custom op's dispatch costs more host time than the whole
cached call). While Dynamo traces, :func:`attention` takes over instead:

1. :func:`_decide` runs once per trace as plain Python (``assume_constant_result``): it validates
   the call on stand-in tensors with the inputs' metadata, chooses the backend, and returns the
   constants the graph needs (sequence shapes, the mask brought to rank 4, the resolved scale,
   the backend's name) or the error;
2. the traced code moves q, k, v into the canonical (B, H, N, D) layout (views, traced as torch
   ops) and calls ``torch.ops.attnhub.attention`` with the chosen backend named, so that the
   compiled graph always runs the backend it was traced for;
3. the op's real kernel runs that backend's ``forward`` (``forward_for_grad`` when a backward
   will follow); its fake kernel gives the outputs' shapes and dtypes; its autograd formula calls
   ``torch.ops.attnhub.attention_backward``, which runs the backend's ``backward`` through the
   same glue as eager autograd (:func:`attnhub.glue.torch_autograd.call_backward`).

The backend is chosen when the code is traced: ``use_backend`` or ``ATTNHUB_*`` changes made
after compiling do not re-dispatch a compiled graph.
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any

import torch

from attnhub.backend import Backend
from attnhub.dispatch import CACHE, DBIAS_REASON, DISPATCHER, explain_request, override_state
from attnhub.errors import (
    AttnhubError,
    BackendUnsupported,
    NoBackendError,
    SpecError,
    backend_error,
    passes_through,
)
from attnhub.frameworks import adapter_for
from attnhub.glue.torch_autograd import call_backward
from attnhub.operands import Operands
from attnhub.registry import REGISTRY
from attnhub.request import Request, build_request, check_backend_arg
from attnhub.results import check_result
from attnhub.rules import Causal, ExplicitMask, Full, Local

#: True while an op's real kernel runs: a backend that itself calls the patched SDPA is not routed
#: back into attnhub (attnhub.torch reads it).
INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("attnhub_inside", default=False)

_HALF = ("float16", "bfloat16")


def encode_rule(mask: Any) -> str:
    """The mask rule as an op argument: ``full``, ``causal``, ``local:W[xW]:S:C`` or ``mask``."""
    if mask is None or mask == "full" or isinstance(mask, Full):
        return "full"
    if mask == "causal" or isinstance(mask, Causal):
        return "causal"
    if isinstance(mask, Local):
        w = mask.window if isinstance(mask.window, tuple) else (mask.window,)
        return f"local:{'x'.join(map(str, w))}:{mask.log2_stride}:{int(mask.causal)}"
    return "mask"


def decode_rule(rule: str) -> Any:
    """The ``mask`` argument of :func:`attnhub.attention` for an encoded rule (None: explicit)."""
    if rule in ("full", "causal"):
        return rule
    if rule.startswith("local:"):
        _, w, s, c = rule.split(":")
        windows = tuple(int(x) for x in w.split("x"))
        return Local(windows[0] if len(windows) == 1 else windows, int(s), c == "1")
    return None


def _stand_in(shape: tuple[int, ...], dtype: Any, device: Any, grad: bool) -> torch.Tensor:
    """A tensor with this metadata that holds one element (zero strides): enough to validate and
    dispatch a call while it is traced."""
    t = torch.empty_strided(shape, (0,) * len(shape), dtype=dtype, device=device)
    return t.requires_grad_() if grad else t


@torch._dynamo.disable
def eager_call(q, k, v, mask, sync, scale, layout, backend, return_lse, extras) -> Any:
    """A call with SPEC §9-§11 arguments under torch.compile: run eagerly (a graph break) until
    the custom ops take those arguments (docs/semantics.md)."""
    from attnhub.plan import plan_for

    plan = plan_for(q, k, v, mask, sync, scale, layout, return_lse, backend, extras)
    return plan.execute(q, k, v, mask, extras)


@torch._dynamo.disable
def eager(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` run eagerly under torch.compile (a graph break): the entry points
    that have no custom op (``attention_varlen``, ``attention_kvcache``), which Dynamo would
    otherwise trace into, kernel launches included."""
    return fn(*args, **kwargs)


@torch._dynamo.assume_constant_result
def _decide(
    qm: tuple, km: tuple, vm: tuple, mask: Any, sync: Any, scale: Any, layout: Any, return_lse: Any,
    backend: Any, needs_grad: bool, mask_grad: bool,
) -> tuple:  # fmt: skip
    """``(None, rule, seq_q, seq_k, mask_shape, scale, backend_name)`` for a call attnhub serves, or
    ``(error, decline_reason(error))``: run once per trace, outside the graph (the result is a
    constant of it)."""
    try:
        with torch.enable_grad():
            q, k, v = (_stand_in(*m, needs_grad) for m in (qm, km, vm))
            m = _stand_in(*mask, mask_grad) if isinstance(mask, tuple) else mask
            if isinstance(m, str) and m.startswith("local:"):
                m = decode_rule(m)
            req, _ = build_request(q, k, v, m, sync, scale, layout, return_lse)
        check_backend_arg(backend)
        chosen = DISPATCHER.choose(req, backend)
        if (needs_grad or mask_grad) and getattr(chosen, "backward_by_autograd", False):
            chosen = _graph_safe_backend(req, backend, chosen)
    except AttnhubError as exc:
        return (exc, decline_reason(exc))
    rule = req.rule
    # The op takes a boolean mask or a float mask (the bias, SPEC §9) as its ``mask`` tensor.
    mask_shape = rule.shape if isinstance(rule, ExplicitMask) else req.bias
    encoded = "mask" if mask_shape is not None else encode_rule(rule)
    return (None, encoded, req.seq_q, req.seq_k, mask_shape, req.scale, chosen.name)


def _graph_safe_backend(req: Any, backend: Any, chosen: Any) -> Any:
    """A backend whose backward differentiates its own kernel with torch autograd cannot run it
    inside the backward custom op (autograd is below the op there): auto takes the next candidate,
    a backend named explicitly declines."""
    reason = "its backward runs torch autograd, which a compiled graph's backward op cannot"
    if backend != "auto":
        raise BackendUnsupported(chosen.name, [reason])
    table = REGISTRY.backends()
    for verdict in explain_request(req, backend, probe_all=True).verdicts:
        candidate = table.get(verdict.name)
        if (
            not verdict.reasons
            and candidate is not None
            and not getattr(candidate, "backward_by_autograd", False)
        ):
            return candidate
    raise NoBackendError({chosen.name: [reason]})


def decline_reason(exc: BaseException) -> str | None:
    """Why attnhub declines a call, for patch_sdpa to hand it to torch (its ``sdpa_stats`` key):
    the error's name, or ``attn_mask grad`` when every backend declined because the float mask
    requires grad (SPEC §9); None for an error that is not a refusal to serve."""
    if not isinstance(exc, (SpecError, BackendUnsupported, NoBackendError)):
        return None
    if isinstance(exc, NoBackendError):
        reasons = [r for rs in exc.reasons.values() for r in rs]
        if any(r.startswith(DBIAS_REASON) for r in reasons):
            return "attn_mask grad"
    if isinstance(exc, BackendUnsupported) and any(r.startswith(DBIAS_REASON) for r in exc.reasons):
        return "attn_mask grad"
    return type(exc).__name__


def _meta(x: torch.Tensor) -> tuple:
    return (tuple(x.shape), x.dtype, x.device)


@torch._dynamo.disable
def _raise(exc: BaseException) -> None:
    raise exc


def _canonical(x: torch.Tensor, layout: str) -> torch.Tensor:
    r = x.dim()
    if layout == "bshd":
        x = x.permute(0, r - 2, *range(1, r - 2), r - 1)
    elif layout == "bhds":
        x = x.permute(0, 1, *range(3, r), 2)
    return x.flatten(2, -2) if r > 4 else x


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, sync: Any, scale: Any, layout: Any,
    backend: Any, return_lse: Any, decline: bool = False,
) -> Any:  # fmt: skip
    """:func:`attnhub.attention` as Dynamo traces it (see the module docstring).

    With ``decline=True`` a call attnhub declines returns ``(None, decline_reason(error))`` instead
    of raising (patch_sdpa then traces torch's own function); a served one returns ``(result, name)``.
    """
    grad = torch.is_grad_enabled()
    needs_grad = grad and (q.requires_grad or k.requires_grad or v.requires_grad)
    is_array = isinstance(mask, torch.Tensor)
    mask_grad = is_array and grad and mask.requires_grad and mask.is_floating_point()
    # A rule object made inside the traced code is Dynamo's; its constant form is a string.
    if isinstance(mask, (Full, Causal, Local)):
        mask = encode_rule(mask)
    decision = _decide(
        _meta(q), _meta(k), _meta(v), _meta(mask) if is_array else mask, sync, scale, layout, return_lse,
        backend, needs_grad, mask_grad,
    )  # fmt: skip
    if decision[0] is not None:
        if decline and decision[1] is not None:
            return None, decision[1]
        _raise(decision[0])
    _, rule, seq_q, seq_k, mask_shape, scale_value, name = decision
    m4 = mask.reshape(mask_shape) if is_array else None
    out, lse, _ = torch.ops.attnhub.attention(
        _canonical(q, layout), _canonical(k, layout), _canonical(v, layout), m4, rule, sync, scale_value,
        list(seq_q), list(seq_k), return_lse, name, needs_grad, mask_grad,
    )  # fmt: skip
    b, hq, dv = out.shape[0], out.shape[1], out.shape[3]
    out = out.reshape(b, hq, *seq_q, dv)
    r = out.dim()
    if layout == "bshd":
        out = out.permute(0, *range(2, r - 1), 1, r - 1)
    elif layout == "bhds":
        out = out.permute(0, 1, r - 1, *range(2, r - 1))
    result = (out, lse.reshape(b, hq, *seq_q)) if return_lse else out
    return (result, name) if decline else result


# --- the ops -------------------------------------------------------------------------------------


def _op_plan(
    q, k, v, mask, rule, sync, scale, seq_q, seq_k, return_lse, backend, needs_grad, mask_grad
) -> tuple[Request, Backend]:
    """The request and backend of an op call (real or fake tensors), through the dispatch cache."""
    ad = adapter_for(q)
    key = (
        "torch-op", ad.call_key(q, k, v), None if mask is None else ad.mask_key(mask), rule, sync, scale,
        tuple(seq_q), tuple(seq_k), return_lse, backend, needs_grad, mask_grad, override_state(),
    )  # fmt: skip
    try:
        hit = CACHE.get(key)
    except TypeError:  # symbolic sizes (dynamic shapes): planned without the cache, sizes specialized
        key, hit = None, None
    if hit is not None:
        return hit
    b, hq, hk = q.shape[0], q.shape[1], k.shape[1]
    views = (
        q.reshape(b, hq, *seq_q, q.shape[-1]), k.reshape(b, hk, *seq_k, k.shape[-1]),
        v.reshape(b, hk, *seq_k, v.shape[-1]),
    )  # fmt: skip
    arg = mask if rule == "mask" else decode_rule(rule)
    req, _ = build_request(*views, arg, sync, scale, "bhsd", return_lse)
    req = dataclasses.replace(req, needs_grad=needs_grad, bias_grad=mask_grad and req.bias is not None)
    plan = (req, DISPATCHER.choose(req, backend))
    if key is not None:
        CACHE.put(key, plan)
    return plan


def _backend_args(req: Request, mask: torch.Tensor | None) -> tuple[torch.Tensor | None, Operands | None]:
    """(mask, operands) as every backend takes them: a float mask travels as ``operands.bias``."""
    if req.bias is not None:
        return None, Operands(bias=mask)
    return mask, None


def _saved_dtype(backend: Backend, req: Request) -> torch.dtype | None:
    """The dtype of the separate output that a backward reads (None: it reads ``out`` itself).

    A backend overriding ``forward_for_grad`` keeps a float32 output for half-precision inputs."""
    if (
        req.needs_grad
        and req.dtype in _HALF
        and type(backend).forward_for_grad is not Backend.forward_for_grad
    ):
        return torch.float32
    return None


def _lse_dtype(req: Request) -> torch.dtype:
    return torch.float64 if req.dtype == "float64" else torch.float32


@torch.library.custom_op("attnhub::attention", mutates_args=())
def _attention_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, rule: str, sync: str,
    scale: float, seq_q: list[int], seq_k: list[int], return_lse: bool, backend: str, needs_grad: bool,
    mask_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(out (B, Hq, Nq, Dv), lse (B, Hq, Nq), saved): ``saved`` is what the backward reads as the
    output when it differs from ``out`` (else an empty tensor)."""
    req, be = _op_plan(
        q, k, v, mask, rule, sync, scale, seq_q, seq_k, return_lse, backend, needs_grad, mask_grad
    )
    shape = (req.batch, req.heads_q, req.nq, req.dim_v)
    saved_dtype = _saved_dtype(be, req)
    if req.is_empty:
        out = q.new_zeros(shape)
        lse = q.new_full(shape[:3], float("-inf"), dtype=_lse_dtype(req))
        return out, lse, q.new_empty(shape if saved_dtype else (0,), dtype=saved_dtype)
    token = INSIDE.set(True)
    try:
        m, ops = _backend_args(req, mask)
        if needs_grad:
            out, lse, saved = be.forward_for_grad(q, k, v, req, m, ops)
        else:
            (out, lse), saved = be.forward(q, k, v, req, m, ops), None
    except Exception as exc:
        if passes_through(exc):
            raise
        raise backend_error(be.name, req, f"raised {type(exc).__name__}: {exc}") from exc
    finally:
        INSIDE.reset(token)
    if lse is None and not return_lse:
        lse = q.new_empty(shape[:3], dtype=_lse_dtype(req))
    check_result(adapter_for(q), be.name, req, out, lse, shape, True, q)
    # Outputs are fresh contiguous tensors, as the fake kernel promises.
    saved = q.new_empty((0,)) if saved_dtype is None else saved.to(saved_dtype).contiguous()
    return out.contiguous(), lse.contiguous(), saved


@_attention_op.register_fake
def _(q, k, v, mask, rule, sync, scale, seq_q, seq_k, return_lse, backend, needs_grad, mask_grad):
    req, be = _op_plan(
        q, k, v, mask, rule, sync, scale, seq_q, seq_k, return_lse, backend, needs_grad, mask_grad
    )
    shape = (req.batch, req.heads_q, req.nq, req.dim_v)
    saved_dtype = _saved_dtype(be, req)
    saved = q.new_empty((0,)) if saved_dtype is None else q.new_empty(shape, dtype=saved_dtype)
    return q.new_empty(shape), q.new_empty(shape[:3], dtype=_lse_dtype(req)), saved


@torch.library.custom_op("attnhub::attention_backward", mutates_args=())
def _attention_backward_op(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, mask: torch.Tensor | None, rule: str, sync: str, scale: float, seq_q: list[int],
    seq_k: list[int], return_lse: bool, backend: str, mask_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv, dmask): dmask is empty unless the float mask is differentiated."""
    req, be = _op_plan(q, k, v, mask, rule, sync, scale, seq_q, seq_k, return_lse, backend, True, mask_grad)
    if req.is_empty:
        dmask = torch.zeros_like(mask) if req.bias_grad else q.new_empty((0,))
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), dmask
    token = INSIDE.set(True)
    try:
        dq, dk, dv, dmask, _ = call_backward(be, req, q, k, v, out, lse, dout, *_backend_args(req, mask))
    finally:
        INSIDE.reset(token)
    if dmask is None or not req.bias_grad:
        dmask = q.new_empty((0,))
    elif dmask.shape != mask.shape:
        dmask = dmask.sum_to_size(mask.shape)
    return (dq.contiguous(), dk.contiguous(), dv.contiguous(), dmask.contiguous())


@_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, mask, rule, sync, scale, seq_q, seq_k, return_lse, backend, mask_grad):
    req, _ = _op_plan(q, k, v, mask, rule, sync, scale, seq_q, seq_k, return_lse, backend, True, mask_grad)
    dmask = mask.new_empty(mask.shape) if req.bias_grad else q.new_empty((0,))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dmask


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, mask, rule, sync, scale, seq_q, seq_k, return_lse, backend, _needs_grad, mask_grad = inputs
    out, lse, saved = output
    ctx.save_for_backward(q, k, v, saved if saved.numel() else out, lse, mask)
    ctx.args = (rule, sync, scale, seq_q, seq_k, return_lse, backend, mask_grad)
    ctx.mark_non_differentiable(lse, saved)


def _backward(ctx, dout, _dlse, _dsaved):
    q, k, v, out, lse, mask = ctx.saved_tensors
    dq, dk, dv, dmask = torch.ops.attnhub.attention_backward(dout, q, k, v, out, lse, mask, *ctx.args)
    dmask = dmask if ctx.args[-1] and mask is not None and dmask.shape == mask.shape else None
    return dq, dk, dv, dmask, None, None, None, None, None, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)
