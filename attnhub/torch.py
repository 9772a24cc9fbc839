"""Route ``torch.nn.functional.scaled_dot_product_attention`` through attnhub's dispatch.

``patch_sdpa()`` replaces the function in ``torch.nn.functional`` (what ``nn.MultiheadAttention``
and ``nn.Transformer*`` layers call) with a wrapper that maps SDPA's arguments onto
:func:`attnhub.attention`:

- ``is_causal=True`` -> ``mask="causal"`` with ``sync="none_front"`` (SDPA aligns the causal
  mask top-left: query i attends keys j <= i, also when L != S);
- ``attn_mask`` -> an explicit mask (bool: True = attend; float: additive bias);
- ``scale`` -> ``scale`` (None: ``1/sqrt(E)`` in both);
- ``enable_gqa=True`` -> GQA (query head h reads kv head ``h // (Hq // Hkv)``, as SDPA does).

Calls attnhub cannot serve go to the original function unchanged: ``dropout_p != 0``, both
``attn_mask`` and ``is_causal``, leading batch dimensions that differ between q, k and v, ranks
below 3, Hq != Hkv without ``enable_gqa``, anything attnhub rejects (``SpecError``) or no backend
accepts (``NoBackendError``, ``BackendUnsupported``; among them a float ``attn_mask`` that requires
grad, whose gradient no backend computes yet: SPEC §9, counted as ``fallback:attn_mask grad``),
and calls made while attnhub is already running (a backend that itself calls SDPA). A backend that fails on a call it accepted raises
``attnhub.BackendError``; it is not hidden by a fallback. ``unpatch_sdpa()`` restores torch's
function. ``sdpa_stats()`` counts routed and fallen-back calls and names the backends that ran.

Under ``torch.compile`` the wrapper is traced: a call attnhub serves becomes its custom op
(``torch.ops.attnhub.attention``, attnhub/torch_ops.py), one it declines torch's own
function, decided once per trace; ``sdpa_stats()`` then counts traces, not runs.

A query row whose keys are all masked gives 0 (SPEC §4), as torch 2.13's SDPA does (older torch
versions gave NaN there).
"""

from __future__ import annotations

import contextvars
import functools
import math
import threading
from collections import Counter
from typing import Any

import torch

from attnhub import torch_ops
from attnhub.errors import BackendUnsupported, NoBackendError, SpecError
from attnhub.torch_ops import INSIDE

__all__ = ["is_patched", "patch_sdpa", "reset_sdpa_stats", "sdpa_stats", "unpatch_sdpa"]

_lock = threading.Lock()
_original: Any = None
_backend = "auto"
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("attnhub_in_sdpa", default=False)
_stats: Counter = Counter()


def sdpa_stats() -> dict[str, int]:
    """Counts since the last reset: ``routed``, ``fallback``, ``fallback:<why>``, ``backend:<name>``."""
    with _lock:
        return dict(_stats)


def reset_sdpa_stats() -> None:
    with _lock:
        _stats.clear()


def _count(*keys: str) -> None:
    with _lock:
        for key in keys:
            _stats[key] += 1


def is_patched() -> bool:
    """True while ``torch.nn.functional.scaled_dot_product_attention`` is attnhub's wrapper."""
    return _original is not None


def patch_sdpa(backend: str = "auto") -> None:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` through attnhub.

    ``backend`` is passed to :func:`attnhub.attention` (``"auto"``: the dispatcher decides per
    call). Patching twice only updates ``backend``.
    """
    global _original, _backend
    with _lock:
        _backend = backend
        if _original is not None:
            return
        _original = torch.nn.functional.scaled_dot_product_attention
        torch.nn.functional.scaled_dot_product_attention = _make_wrapper(_original)


def unpatch_sdpa() -> None:
    """Restore torch's own ``scaled_dot_product_attention`` (no-op when not patched)."""
    global _original
    with _lock:
        if _original is None:
            return
        torch.nn.functional.scaled_dot_product_attention = _original
        _original = None


def _make_wrapper(original: Any) -> Any:
    @functools.wraps(original)
    def scaled_dot_product_attention(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # Traced by torch.compile: attnhub's custom ops, or torch's function for what attnhub
            # declines (decided once per trace; the stats count traces, not runs).
            why = _static_why(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
            if why is None:
                out, found = _route_traced(query, key, value, attn_mask, is_causal, scale)
                if out is not None:
                    return out
                why = found
            _count_traced("fallback", f"fallback:{why}")
            kwargs = {"scale": scale, "enable_gqa": True} if enable_gqa else {"scale": scale}
            return original(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)
        why = _unroutable(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        if why is None:
            token = _inside.set(True)
            try:
                out, name = _route(query, key, value, attn_mask, is_causal, scale)
            except _DECLINED as exc:  # rejected before any kernel ran: torch decides
                why = _why(exc)
            else:
                _count("routed", f"backend:{name}")
                return out
            finally:
                _inside.reset(token)
        _count("fallback", f"fallback:{why}")
        kwargs: dict[str, Any] = {"scale": scale}
        if enable_gqa:
            kwargs["enable_gqa"] = True
        return original(query, key, value, attn_mask, dropout_p, is_causal, **kwargs)

    return scaled_dot_product_attention


#: What sends a call back to torch: attnhub rejected it before any kernel ran. A BackendError (a
#: backend failed on a request it had accepted) is a bug to see, not a reason to fall back.
_DECLINED = (SpecError, BackendUnsupported, NoBackendError)


def _why(exc: Exception) -> str:
    """The fallback reason counted in ``sdpa_stats()`` for a declined call."""
    return torch_ops.decline_reason(exc) or type(exc).__name__


def _unroutable(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    """Why this call goes to torch's own function, or None when attnhub may serve it."""
    if _inside.get() or INSIDE.get():
        return "reentrant"
    return _static_why(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)


def _static_why(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    """The reasons to fall back that the arguments' types and shapes decide (traceable by Dynamo)."""
    if not all(isinstance(x, torch.Tensor) for x in (q, k, v)):
        return "not tensors"
    if dropout_p:
        return "dropout"
    if attn_mask is not None and is_causal:
        return "attn_mask with is_causal"
    if q.dim() < 3 or not q.dim() == k.dim() == v.dim():
        return "rank"
    if not q.shape[:-3] == k.shape[:-3] == v.shape[:-3] or k.shape[-3] != v.shape[-3]:
        return "batch dims"
    if q.shape[-3] != k.shape[-3] and not enable_gqa:
        return "heads"
    return None


@torch._dynamo.assume_constant_result
def _count_traced(*keys: str) -> bool:
    """:func:`_count` run once when Dynamo traces the call (its result is a constant of the graph)."""
    _count(*keys)
    return True


def _route_traced(q, k, v, attn_mask, is_causal, scale) -> tuple[torch.Tensor | None, str]:
    """(attnhub's result, backend name), or (None, why) when attnhub declines: as Dynamo traces it."""
    qc, kc, vc, mask = _fold(q, k, v, attn_mask, is_causal)
    out, found = torch_ops.attention(qc, kc, vc, mask, "none_front", scale, "bhsd", _backend, False, True)
    if out is None:
        return None, found
    _count_traced("routed", f"backend:{found}")
    return out.reshape(*q.shape[:-1], v.shape[-1]), found


def _fold(q, k, v, attn_mask, is_causal) -> tuple[Any, Any, Any, Any]:
    """q, k, v as bhsd with the leading dims folded into the batch, and the mask argument."""
    lead = tuple(q.shape[:-3]) if q.dim() > 3 else ()
    b = math.prod(lead) if lead else 1

    def fold(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:  # (N, L, E) is one head per batch entry
            return x.unsqueeze(1)
        return x.reshape(b, *x.shape[-3:])

    mask: Any = "causal" if is_causal else None
    if attn_mask is not None:
        mask = _fold_mask(attn_mask, q, lead)
    return fold(q), fold(k), fold(v), mask


def _route(q, k, v, attn_mask, is_causal, scale) -> tuple[torch.Tensor, str]:
    """attnhub's result for an SDPA call (bhsd with the leading dims folded into the batch), and
    the name of the backend that ran it."""
    from attnhub.plan import plan_for

    qc, kc, vc, mask = _fold(q, k, v, attn_mask, is_causal)
    # What attnhub.attention does, keeping the plan to name its backend.
    plan = plan_for(qc, kc, vc, mask, "none_front", scale, "bhsd", False, _backend)
    out = plan.call(qc, kc, vc, mask)
    return out.reshape(*q.shape[:-1], v.shape[-1]), plan.backend.name


def _fold_mask(mask: torch.Tensor, q: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """SDPA's mask (broadcastable to (*lead, Hq?, L, S)) as a rank-4 mask for the folded call."""
    if q.dim() == 3:  # q (N, L, E): the mask broadcasts to (N, L, S) -> (N, 1, L, S)
        m = mask.reshape((1,) * (3 - mask.dim()) + tuple(mask.shape)) if mask.dim() < 3 else mask
        return m.unsqueeze(1)
    full_rank = q.dim()
    m = mask.reshape((1,) * (full_rank - mask.dim()) + tuple(mask.shape)) if mask.dim() < full_rank else mask
    if len(lead) <= 1:
        return m
    if all(s == 1 for s in m.shape[:-3]):
        return m.reshape(1, *m.shape[-3:])
    return m.expand(*lead, *m.shape[-3:]).reshape(math.prod(lead), *m.shape[-3:])
