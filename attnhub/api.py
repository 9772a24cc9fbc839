"""The public entry points: ``attention``, ``explain`` and ``backends``."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnhub import fastpath
from attnhub.backend import Backend, serves_legacy
from attnhub.dispatch import CACHE, DISPATCHER, Explanation, _disabled, explain_request, override_state
from attnhub.errors import AttnhubError, BackendError, SpecError
from attnhub.extras import NONE as NO_EXTRAS
from attnhub.extras import Extras, operands_for
from attnhub.frameworks import Adapter, adapter_for
from attnhub.registry import REGISTRY
from attnhub.request import Request, build_request_ex, check_backend_arg, from_canonical, to_canonical
from attnhub.rules import Causal, ExplicitMask, Full, Local

_modules = sys.modules


class _Plan:
    """Everything decided once per call signature: the request, the backend, the layout moves."""

    __slots__ = (
        "req", "breq", "ad", "backend", "run", "reshape_in", "reshape_out", "lse_shape", "out_shape",
        "lse_dtype", "guard_bias", "empty", "mask_array", "legacy", "operands", "bias_from_mask", "call",
    )  # fmt: skip

    def __init__(self, req: Request, ad: Adapter, backend: Backend, bias_from_mask: bool = False) -> None:
        self.req, self.ad, self.backend, self.run = req, ad, backend, backend.run
        #: A float mask moved into ``bias`` by validation (redone on a cache hit without validating).
        self.bias_from_mask = bias_from_mask
        # A backend written before SPEC §9 reads a bias (rule Full, nothing else) as its float mask.
        self.legacy = serves_legacy(backend, req)
        self.breq = req.legacy_additive() if self.legacy else req
        self.operands = req.modified and not self.legacy
        # A 1-d bhsd request is already canonical: no reshape on the hot path.
        self.reshape_in = not (req.layout == "bhsd" and req.ndim == 1)
        self.reshape_out = self.reshape_in
        self.lse_shape = (req.batch, req.heads_q, *req.seq_q)
        self.out_shape = (req.batch, req.heads_q, req.nq, req.dim_v)
        self.lse_dtype = "float64" if req.dtype == "float64" else "float32"
        # A bias traced by jax.jit may be differentiated after the trace (grad of jit): guard it so
        # that its gradient is never silently zero (SPEC §9).
        self.guard_bias = (
            req.framework == "jax" and req.symbolic and req.bias is not None
            and "dbias" not in backend.features
        )  # fmt: skip
        self.empty = req.is_empty
        self.mask_array = isinstance(req.rule, ExplicitMask)
        # Backend.run only decides whether the framework's autograd glue wraps the forward; the
        # decision depends on the request alone, so it is taken here. A backend overriding run()
        # keeps it.
        grads = req.needs_grad or req.bias_grad or req.sinks_grad
        if type(backend).run is Backend.run and not (
            "backward" in backend.features
            and (req.framework == "tensorflow" or (req.framework == "torch" and grads))
        ):
            self.run = backend.forward
        #: What a call with this signature runs: ``call(q, k, v, mask, extras)`` returns what
        #: :meth:`execute` returns. A plain request (canonical 1-d bhsd arrays, a rule, no §9-§11
        #: argument, no lse) gets a pre-bound callable (:func:`attnhub.fastpath.bind`).
        self.call = self.execute
        if not (
            self.reshape_in or self.empty or self.mask_array or self.legacy or self.operands
            or self.guard_bias or bias_from_mask or req.return_lse or req.modified
        ):  # fmt: skip
            self.call = fastpath.bind(self)

    def execute(self, q: Any, k: Any, v: Any, mask: Any, extras: Extras = NO_EXTRAS) -> Any:
        req, ad = self.req, self.ad
        if self.bias_from_mask:
            extras = dataclasses.replace(extras, bias=mask)
        if self.empty:
            return _empty_result(ad, q, k, v, mask, req, extras)
        if self.reshape_in:
            q, k, v = (to_canonical(ad, x, req.layout) for x in (q, k, v))
        mask = adapter_for(mask).reshape(mask, req.rule.shape) if self.mask_array else None  # type: ignore[union-attr]
        if self.guard_bias:
            from attnhub.glue.jax_guard import guard_mask

            extras = dataclasses.replace(extras, bias=guard_mask(extras.bias, self.backend.name))
        try:
            if self.legacy:
                mask = adapter_for(extras.bias).reshape(extras.bias, req.bias)  # type: ignore[arg-type]
                out, lse = self.run(q, k, v, self.breq, mask)
            elif self.operands:
                ops = operands_for(extras, ad, q, req)
                out, lse = self.run(q, k, v, req, mask, operands=ops)
            else:
                out, lse = self.run(q, k, v, req, mask)
        except Exception as exc:
            if passes_through(exc):
                raise
            raise backend_error(self.backend.name, req, f"raised {type(exc).__name__}: {exc}") from exc
        if req.return_lse or ad.result_problem(out, self.out_shape, None, q) is not None:
            # what check_result asks first; without lse, nothing else
            check_result(ad, self.backend.name, req, out, lse, self.out_shape, req.return_lse, q)
        if self.reshape_out:
            out = from_canonical(ad, out, req)
        if req.return_lse:
            if req.ndim > 1:
                lse = ad.reshape(lse, self.lse_shape)
            return out, lse
        return out


def check_result(
    ad: Adapter, name: str, req: Request, out: Any, lse: Any, shape: tuple, with_lse: bool, like: Any
) -> None:
    """Raise :class:`BackendError` unless ``out`` is a ``shape`` array of ``like``'s framework,
    dtype and device (and, with ``with_lse``, lse one of ``shape[:3]`` in float32, float64 for
    float64); cheap in the usual case, as it runs on every call."""
    why = ad.result_problem(out, shape, None, like)  # like's dtype: req.dtype
    if why is None:
        if not with_lse:
            return
        why = ad.result_problem(lse, shape[:3], "float64" if req.dtype == "float64" else "float32", like)
        if why is None:
            return
        why = "lse: expected " + why
    else:
        why = "out: expected " + why
    raise backend_error(name, req, f"returned a wrong result ({why})")


def _mask_key(mask: Any) -> Any:
    if mask is None or isinstance(mask, (str, Full, Causal, Local)):
        return mask
    if hasattr(mask, "shape") and hasattr(mask, "dtype"):
        return ("array", adapter_for(mask, "mask").mask_key(mask))
    raise TypeError  # not a mask: validated (and rejected) without the cache


def _cacheable_scale(scale: Any) -> bool:
    """True for a scale whose value its key holds: None or a Python (or NumPy float64) number."""
    return scale is None or isinstance(scale, (float, int))


def _call_key(ad, q, k, v, mask, sync, scale, layout, return_lse, backend, extras_key) -> tuple:  # noqa: ANN001
    """The dispatch cache's key of a call (see :func:`_plan`), built in one place for the planned
    path and the fast path of :func:`attention`, so that the two always find the same entry."""
    return (
        ad.call_key(q, k, v), mask if mask is None or mask.__class__ is str else _mask_key(mask),
        sync, scale, type(scale), layout, return_lse,
        type(return_lse), backend, override_state(), extras_key,
    )  # fmt: skip


def _plan(q, k, v, mask, sync, scale, layout, return_lse, backend, extras: Extras = NO_EXTRAS) -> _Plan:
    """The plan for this call signature: from the dispatch cache (so that a repeated call skips
    validation and backend choice), else validated, dispatched and cached.

    The key holds every argument that the request depends on, the types of the scalar ones
    included (``scale=1`` and ``scale=True`` hash alike, but only one is valid), so that a key
    that was cached after validation is only ever found again by arguments that validate the same.
    Arguments of which no key can be built (of the wrong type or framework) skip the cache and are
    rejected by :func:`build_request`; so does a ``scale`` array, whose value is read on every call.
    """
    ad = adapter_for(q)
    try:
        if not _cacheable_scale(scale):
            raise TypeError  # an array's value may change in place: validated on every call
        extras_key = extras.key(ad) if extras is not NO_EXTRAS else None
        key = _call_key(ad, q, k, v, mask, sync, scale, layout, return_lse, backend, extras_key)
        hit = CACHE.recent.get(key)
        if hit is None:
            hit = CACHE.get(key)
    except (TypeError, AttributeError):  # unhashable or not an array: plan without the cache
        key, hit = None, None
    if hit is not None:
        return hit
    req, ad, moved = build_request_ex(q, k, v, mask, sync, scale, layout, return_lse, extras)
    check_backend_arg(backend)
    plan = _Plan(req, ad, DISPATCHER.choose(req, backend), moved.bias is not extras.bias)
    if key is not None:
        CACHE.put(key, plan)
    return plan


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
) -> Any:
    """Exact scaled-dot-product attention (SPEC.md) on the caller's arrays.

    Returns ``out`` in the caller's framework, device, dtype and layout, or ``(out, lse)`` with
    ``return_lse=True``. ``backend="auto"`` picks the highest-priority backend able to run the
    request; a named backend that cannot raises :class:`attnhub.BackendUnsupported`.

    Score modifiers (SPEC §9): ``bias`` (additive, broadcastable to (B, Hq, Nq, Nk), differentiable),
    ``softcap`` (Gemma 2's ``softcap·tanh(t/softcap)``), ``sinks`` ((Hq,) logits of a virtual
    zero-value key). Ragged batches (SPEC §10, 1-d): ``q_lengths``/``k_lengths`` ((B,) ints) with
    ``padding_side`` "right" (valid tokens first) or "left". Offsets (SPEC §11): ``q_offset``,
    ``k_offset`` shift query and key positions (sync ``none_front``).
    """
    if (
        bias is None and softcap is None and sinks is None and q_lengths is None and k_lengths is None
        and padding_side == "right" and q_offset == 0 and k_offset == 0
    ):  # fmt: skip
        extras = NO_EXTRAS
    else:
        extras = Extras(bias, softcap, sinks, q_lengths, k_lengths, padding_side, q_offset, k_offset)
    torch = _modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        # Traced by torch.compile: through attnhub's custom ops (attnhub/glue/torch_ops.py).
        from attnhub.glue import torch_ops

        if extras is not NO_EXTRAS:
            return torch_ops.eager_call(q, k, v, mask, sync, scale, layout, backend, return_lse, extras)
        return torch_ops.attention(q, k, v, mask, sync, scale, layout, backend, return_lse)
    if extras is NO_EXTRAS and (scale is None or _cacheable_scale(scale)):
        # The fast path: one key, one dict lookup, the plan's pre-bound call (see _plan).
        try:
            key = _call_key(adapter_for(q), q, k, v, mask, sync, scale, layout, return_lse, backend, None)
            hit = CACHE.recent.get(key)
        except (TypeError, AttributeError, AttnhubError):  # planned below, which says what is wrong
            hit = None
        if hit is not None:
            return hit.call(q, k, v, mask, extras)
    return _plan(q, k, v, mask, sync, scale, layout, return_lse, backend, extras).call(q, k, v, mask, extras)


def _empty_result(
    ad: Adapter, like: Any, k: Any, v: Any, mask: Any, req: Request, extras: Extras = NO_EXTRAS
) -> Any:
    """SPEC §7: empty work returns an empty output; no keys means fully masked rows (0, -inf).

    When the caller differentiates, the output is connected to the inputs (and to a float mask)
    with zero gradients, so that ``backward`` works and no gradient is dropped."""
    out = ad.full((req.batch, req.heads_q, req.nq, req.dim_v), 0.0, req.dtype, like)
    out = from_canonical(ad, out, req)
    if req.framework in ("torch", "tensorflow"):
        from attnhub.glue import empty

        more = (extras.bias, extras.sinks) if extras.bias is not mask else (extras.sinks,)
        out = empty.connect(req, out, like, k, v, mask, *more)
    if not req.return_lse:
        return out
    lse_dtype = "float64" if req.dtype == "float64" else "float32"
    lse = ad.full((req.batch, req.heads_q, *req.seq_q), float("-inf"), lse_dtype, like)
    if req.sinks and not req.symbolic and 0 not in (req.batch, req.heads_q, req.nq):
        # SPEC §9: a row with no key attended has lse = sinks[h] (here Lk = 0).
        sinks = adapter_for(extras.sinks).to_numpy(extras.sinks).astype(np.float64)
        shape = (req.batch, req.heads_q, *req.seq_q)
        rows = np.broadcast_to(sinks.reshape((1, req.heads_q) + (1,) * req.ndim), shape)
        lse = ad.from_numpy(rows.copy(), lse_dtype, like)
    return out, lse


def passes_through(exc: BaseException) -> bool:
    """Exceptions from a backend that reach the caller unchanged: attnhub's own (a SpecError a
    backend raises is still about the request) and running out of memory, which callers catch
    by type (``MemoryError``, ``torch.OutOfMemoryError``) to retry smaller."""
    return isinstance(exc, (AttnhubError, MemoryError)) or type(exc).__name__.endswith("OutOfMemoryError")


def backend_error(name: str, req: Request | None, problem: str) -> BackendError:
    return BackendError(name, req.describe() if req is not None else "a request", problem)


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
        ex = Extras(**extras)
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
