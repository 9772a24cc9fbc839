"""The plan of a call signature: everything ``attnhub.attention`` decides once for a given set of
argument types, shapes and keywords (the request, the backend, the layout moves, the bound fast
call), kept in the dispatch cache so that a repeated call skips validation and backend choice."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from attnhub import fastpath
from attnhub.backend import Backend
from attnhub.dispatch import CACHE, DISPATCHER, override_state
from attnhub.errors import backend_error, passes_through
from attnhub.extras import NONE as NO_EXTRAS
from attnhub.extras import Extras, operands_for
from attnhub.frameworks import Adapter, adapter_for
from attnhub.glue.run import runner
from attnhub.request import Request, build_request_ex, check_backend_arg, from_canonical, to_canonical
from attnhub.results import check_result
from attnhub.rules import Causal, ExplicitMask, Full, Local


class Plan:
    """Everything decided once per call signature: the request, the backend, the layout moves."""

    __slots__ = (
        "req", "ad", "backend", "run", "reshape_in", "reshape_out", "lse_shape", "out_shape",
        "lse_dtype", "guard_bias", "empty", "mask_array", "operands", "bias_from_mask", "call",
    )  # fmt: skip

    def __init__(self, req: Request, ad: Adapter, backend: Backend, bias_from_mask: bool = False) -> None:
        self.req, self.ad, self.backend = req, ad, backend
        #: A float mask moved into ``bias`` by validation (redone on a cache hit without validating).
        self.bias_from_mask = bias_from_mask
        #: The request uses §9-§11 arguments: their arrays travel as ``operands``.
        self.operands = req.modified
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
        #: The backend's forward, wrapped in the framework's autograd glue where a gradient may be
        #: asked for (decided once for the request the call passes: attnhub/glue/run.py).
        self.run = runner(backend, req)
        #: What a call with this signature runs: ``call(q, k, v, mask, extras)`` returns what
        #: :meth:`execute` returns. A plain request (canonical 1-d bhsd arrays, a rule, no §9-§11
        #: argument, no lse) gets a pre-bound callable (:func:`attnhub.fastpath.bind`).
        self.call = self.execute
        if not (
            self.reshape_in or self.empty or self.mask_array or self.guard_bias or bias_from_mask
            or req.return_lse or req.modified
        ):  # fmt: skip
            self.call = fastpath.bind(self)

    def execute(self, q: Any, k: Any, v: Any, mask: Any, extras: Extras = NO_EXTRAS) -> Any:
        req, ad = self.req, self.ad
        if self.bias_from_mask:
            extras = dataclasses.replace(extras, bias=mask)
        if self.empty:
            return empty_result(ad, q, k, v, mask, req, extras)
        if self.reshape_in:
            q, k, v = (to_canonical(ad, x, req.layout) for x in (q, k, v))
        mask = adapter_for(mask).reshape(mask, req.rule.shape) if self.mask_array else None  # type: ignore[union-attr]
        if self.guard_bias:
            from attnhub.glue.jax_guard import guard_mask

            extras = dataclasses.replace(extras, bias=guard_mask(extras.bias, self.backend.name))
        try:
            ops = operands_for(extras, ad, q, req) if self.operands else None
            out, lse = self.run(q, k, v, req, mask, ops)
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


def mask_key(mask: Any) -> Any:
    """The dispatch key of a ``mask`` argument: a rule as it is, an array by its metadata."""
    if mask is None or isinstance(mask, (str, Full, Causal, Local)):
        return mask
    if hasattr(mask, "shape") and hasattr(mask, "dtype"):
        return ("array", adapter_for(mask, "mask").mask_key(mask))
    raise TypeError  # not a mask: validated (and rejected) without the cache


def cacheable_scale(scale: Any) -> bool:
    """True for a scale whose value its key holds: None or a Python (or NumPy float64) number."""
    return scale is None or isinstance(scale, (float, int))


def call_key(ad, q, k, v, mask, sync, scale, layout, return_lse, backend, extras_key) -> tuple:  # noqa: ANN001
    """The dispatch cache's key of a call (see :func:`plan_for`), built in one place for the planned
    path and the fast path of :func:`attention`, so that the two always find the same entry."""
    return (
        ad.call_key(q, k, v), mask if mask is None or mask.__class__ is str else mask_key(mask),
        sync, scale, type(scale), layout, return_lse,
        type(return_lse), backend, override_state(), extras_key,
    )  # fmt: skip


def plan_for(q, k, v, mask, sync, scale, layout, return_lse, backend, extras: Extras = NO_EXTRAS) -> Plan:
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
        if not cacheable_scale(scale):
            raise TypeError  # an array's value may change in place: validated on every call
        extras_key = extras.key(ad) if extras is not NO_EXTRAS else None
        key = call_key(ad, q, k, v, mask, sync, scale, layout, return_lse, backend, extras_key)
        hit = CACHE.recent.get(key)
        if hit is None:
            hit = CACHE.get(key)
    except (TypeError, AttributeError):  # unhashable or not an array: plan without the cache
        key, hit = None, None
    if hit is not None:
        return hit
    req, ad, moved = build_request_ex(q, k, v, mask, sync, scale, layout, return_lse, extras)
    check_backend_arg(backend)
    plan = Plan(req, ad, DISPATCHER.choose(req, backend), moved.bias is not extras.bias)
    if key is not None:
        CACHE.put(key, plan)
    return plan


def empty_result(
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
