"""The pre-bound call of a plain request: what a repeated ``attnhub.attention`` call runs after its
one dict lookup (issue 21: at host-bound sizes a vendor kernel must cost at most its own host time
plus a few microseconds).

A plan (:class:`attnhub.plan.Plan`) is made once per call signature: the arrays' types, shapes,
dtypes, devices, ``requires_grad`` and layouts, torch's grad mode, every keyword and the dispatch
overrides (``use_backend``, ``ATTNHUB_BACKEND``, ``ATTNHUB_DISABLE``) are its cache key, so the
validation outcome and the backend choice are functions of the key. What a call with that key
runs is decided here once:

- a backend with a ``bind(req)`` method (torch's SDPA kernels, ``attnhub_backends.sdpa``) gives a
  callable ``fn(q, k, v, mask) -> (out, lse)`` that does exactly what its ``run(q, k, v, req,
  mask)`` does for that request, with every decision that depends on the request alone taken at
  bind time; anything that depends on the arrays' values or strides is still checked per call
  inside it;
- any other backend is called through the plan's ``run`` (the backend's ``forward``, or its
  ``run`` with the framework's autograd glue when gradients are needed), as :meth:`Plan.execute`
  calls it.

Only plain requests are bound: canonical 1-d ``bhsd`` arrays (no layout move), a rule (no mask
array), no SPEC §9-§11 argument, no lse, not empty. Every other request runs
:meth:`Plan.execute`. The result is checked like every call's (:func:`attnhub.results.check_result`),
and a backend's exception is named as in ``execute``. A bound callable marked ``fixed_result =
True`` (a framework op whose result type, shape, dtype and device follow from the inputs' ones,
which the plan's key fixes) has its result checked on the plan's first call only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def bind(plan: Any) -> Callable[..., Any]:
    """``call(q, k, v, mask, extras)`` for a plain request's plan: its result as ``plan.execute``'s."""
    from attnhub.errors import backend_error, passes_through
    from attnhub.results import check_result

    req, ad, backend = plan.req, plan.ad, plan.backend
    name, shape = backend.name, plan.out_shape
    fn, problem = _backend_call(plan), ad.result_problem

    def unchecked(q: Any, k: Any, v: Any, mask: Any, extras: Any = None) -> Any:
        try:
            return fn(q, k, v, None)[0]
        except Exception as exc:
            if passes_through(exc):
                raise
            raise backend_error(name, req, f"raised {type(exc).__name__}: {exc}") from exc

    def call(q: Any, k: Any, v: Any, mask: Any, extras: Any = None) -> Any:
        out = unchecked(q, k, v, mask, extras)
        if problem(out, shape, None, q) is not None:  # what check_result asks first
            check_result(ad, name, req, out, None, shape, False, q)
        return out

    def first(q: Any, k: Any, v: Any, mask: Any, extras: Any = None) -> Any:
        out = call(q, k, v, mask, extras)
        plan.call = unchecked  # checked once: later calls of this key give the same kind of result
        return out

    chosen = first if getattr(fn, "fixed_result", False) else call
    for f in (call, unchecked, first):
        f.plan = plan  # type: ignore[attr-defined]  # for tests and explain-style introspection
    return chosen


def _backend_call(plan: Any) -> Callable[[Any, Any, Any, Any], Any]:
    """``fn(q, k, v, mask) -> (out, lse)``: the backend's bound call, or its plan's ``run``."""
    req, backend, run = plan.req, plan.backend, plan.run
    binder = getattr(backend, "bind", None)
    # Bound only where the plan calls the backend's own run (a framework that differentiates the
    # forward itself), as since issue 21; a backend without one (cudnn, whose bind is therefore not
    # used here) runs its forward or attnhub's glue through the plan's run.
    if binder is not None and run == getattr(backend, "run", None):
        bound = binder(req)
        if bound is not None:
            return bound

    def fn(q: Any, k: Any, v: Any, mask: Any) -> Any:
        return run(q, k, v, req, mask, None)

    return fn
