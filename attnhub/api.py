"""The public entry points: ``attention``, ``explain`` and ``backends``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from attnhub.dispatch import CACHE, Explanation, _disabled, explain_request
from attnhub.errors import AttnhubError, SpecError
from attnhub.extras import NONE as NO_EXTRAS
from attnhub.extras import Extras, added_modifiers
from attnhub.frameworks import adapter_for
from attnhub.plan import cacheable_scale, call_key, plan_for
from attnhub.registry import REGISTRY
from attnhub.request import build_request_ex, check_backend_arg

_modules = sys.modules


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any = None,
    sync: str = "none_front",
    scale: float | None = None,
    layout: str = "bhsd",
    backend: str = "auto",
    return_lse: bool = False,
    bias: Any = None,
    softcap: float | None = None,
    sinks: Any = None,
    q_lengths: Any = None,
    k_lengths: Any = None,
    padding_side: str = "right",
    q_offset: int = 0,
    k_offset: int = 0,
    **modifiers: Any,
) -> Any:
    """Exact scaled-dot-product attention (SPEC.md) on the caller's arrays.

    Returns ``out`` in the caller's framework, device, dtype and layout, or ``(out, lse)`` with
    ``return_lse=True``. ``backend="auto"`` picks the highest-priority backend able to run the
    request; a named backend that cannot raises :class:`attnhub.BackendUnsupported`.

    Score modifiers (SPEC §9): ``bias`` (additive, broadcastable to (B, Hq, Nq, Nk), differentiable),
    ``softcap`` (Gemma 2's ``softcap·tanh(t/softcap)``), ``sinks`` ((Hq,) logits of a virtual
    zero-value key). Ragged batches (SPEC §10, 1-d): ``q_lengths``/``k_lengths`` ((B,) ints) with
    ``padding_side`` "right" (valid tokens first) or "left". Offsets (SPEC §11): ``q_offset``,
    ``k_offset`` shift query and key positions (sync ``none_front``). A score modifier added since
    SPEC's first edition is one more keyword (:mod:`attnhub.modifiers`).
    """
    more = added_modifiers("attention", modifiers) if modifiers else ()
    if (
        bias is None and softcap is None and sinks is None and q_lengths is None and k_lengths is None
        and padding_side == "right" and q_offset == 0 and k_offset == 0 and not more
    ):  # fmt: skip
        extras = NO_EXTRAS
    else:
        extras = Extras(
            bias, softcap, sinks, q_lengths, k_lengths, padding_side, q_offset, k_offset, more=more
        )
    torch = _modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        # Traced by torch.compile: through attnhub's custom ops (attnhub/torch_ops.py).
        from attnhub import torch_ops

        if extras is not NO_EXTRAS:
            return torch_ops.eager_call(q, k, v, mask, sync, scale, layout, backend, return_lse, extras)
        return torch_ops.attention(q, k, v, mask, sync, scale, layout, backend, return_lse)
    if extras is NO_EXTRAS and (scale is None or cacheable_scale(scale)):
        # The fast path: one key, one dict lookup, the plan's pre-bound call (see plan_for).
        try:
            key = call_key(adapter_for(q), q, k, v, mask, sync, scale, layout, return_lse, backend, None)
            hit = CACHE.recent.get(key)
        except (TypeError, AttributeError, AttnhubError):  # planned below, which says what is wrong
            hit = None
        if hit is not None:
            return hit.call(q, k, v, mask, extras)
    return plan_for(q, k, v, mask, sync, scale, layout, return_lse, backend, extras).call(
        q, k, v, mask, extras
    )


def explain(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any = None,
    sync: str = "none_front",
    scale: float | None = None,
    layout: str = "bhsd",
    backend: str = "auto",
    return_lse: bool = False,
    **extras: Any,
) -> Explanation:
    """Which backend ``attention`` would run for these arguments (the same keywords, SPEC §9-§11
    ones included), and why each other one would not."""
    try:
        ex = Extras.from_keywords(**extras)
    except TypeError as exc:
        raise SpecError("explain", "the keyword arguments of attnhub.attention", str(exc)) from None
    req, _, _ = build_request_ex(q, k, v, mask, sync, scale, layout, return_lse, ex)
    check_backend_arg(backend)
    return explain_request(req, backend, probe_all=True)


@dataclass(frozen=True)
class BackendRecord:
    """One registered backend as ``attnhub.backends()`` reports it."""

    name: str
    available: bool
    reason: str | None
    priority: int
    frameworks: tuple[str, ...]
    device_types: tuple[str, ...]
    dtypes: tuple[str, ...]
    features: tuple[str, ...]
    version: str | None
    disabled: bool


def backends() -> list[BackendRecord]:
    """Every registered backend, highest priority first, with availability and capabilities."""
    disabled = _disabled()
    records = []
    for b in REGISTRY.backends().values():
        try:
            reason = b.availability()
        except Exception as exc:  # an availability probe must never take the listing down
            reason = f"availability() raised {type(exc).__name__}: {exc}"
        try:
            version = b.version() if reason is None else None
        except Exception:
            version = None
        records.append(
            BackendRecord(
                name=b.name,
                available=reason is None,
                reason=reason,
                priority=b.priority,
                frameworks=tuple(b.frameworks),
                device_types=tuple(b.device_types),
                dtypes=tuple(b.dtypes),
                features=tuple(sorted(b.features)),
                version=version,
                disabled=b.name in disabled,
            )
        )
    return records


# TensorFlow's AutoGraph would otherwise rewrite these (and everything they call: dispatch,
# plugin loading, backends' trace-time Python) inside tf.function and warn about what it cannot
# convert. attnhub's own code is plain trace-time Python; marking the entry points as AutoGraph
# artifacts (the attribute tf.autograph.experimental.do_not_convert sets) calls them unconverted.
for _entry in (attention, explain, backends):
    _entry.autograph_info__ = frozenset()  # type: ignore[attr-defined]
del _entry
