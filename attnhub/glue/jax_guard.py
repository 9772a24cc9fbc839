"""A float mask traced by ``jax.jit`` whose gradient no backend computes: asking for it raises.

Under ``jax.grad(jax.jit(f))`` the mask reaches attnhub as a plain jit tracer: nothing at call
time says it will be differentiated, and a backend's VJP would give it a zero cotangent. The core
passes such a mask through :func:`guard_mask`, an identity whose VJP raises, so that the gradient
is refused (SPEC §9: never dropped) while a jitted call that does not differentiate the mask (the
usual case: a constant ALiBi bias) runs unchanged. JAX only calls the VJP when the mask itself is
differentiated.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from attnhub.errors import BackendUnsupported

REASON = "cannot compute the gradient of a float mask/bias (SPEC §9)"


@functools.cache
def _guard(backend: str) -> Any:
    @jax.custom_vjp
    def guard(mask: Any) -> Any:
        return mask

    def fwd(mask: Any) -> tuple[Any, None]:
        return mask, None

    def bwd(_res: None, _ct: Any) -> tuple[Any]:
        raise BackendUnsupported(backend, [REASON + "; jax.grad asked for the mask's gradient"])

    guard.defvjp(fwd, bwd)
    return guard


def guard_mask(mask: Any, backend: str) -> Any:
    return _guard(backend)(mask)
