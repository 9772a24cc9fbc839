"""SPEC §9's softcap ``t = c·tanh(t / c)`` for every finite cap ``c > 0``, in float32 or float64.

Written naively, a cap beyond the compute dtype's range becomes ``inf`` and ``inf·tanh(t/inf)`` is
NaN (a cap of 1e300 with float32 inputs); and XLA:CPU divides by a constant as a product with its
reciprocal, which is subnormal, so flushed to 0, for caps above ~1e38 (``c·tanh(0) = 0``, not
``t``). Here, with ``x = t/c``:

- ``|x| < sqrt(eps)/2`` gives ``t`` itself: ``c·tanh(x) = t·(1 − x²/3 + …)`` differs from ``t`` by
  less than ``eps/12`` relatively, under half an ulp, so ``t`` is the correctly rounded value
  (also where ``x`` was flushed to 0);
- a cap above ``2**MAX_EXP`` is stored as ``c'·2**e`` with ``c' < 2**MAX_EXP``:
  ``x = ldexp(t/c', −e)`` and the result ``ldexp(c'·tanh(x), e)`` are exact scalings, and
  ``1/c'`` is a normal number (ldexp costs a few operations per logit; such caps are rare, and
  the Pallas kernel leaves them to the blockwise path);
- a cap of at least ``2**SHIFT`` times the dtype's max is the identity: every finite ``t`` has
  ``|x| < 2**-SHIFT``, below ``sqrt(eps)/2`` for float32 and float64 (the first rule).
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

#: Caps up to ``2**MAX_EXP`` are used as they are (their reciprocal is a normal float32).
MAX_EXP = 64
#: Caps of at least ``2**SHIFT`` times the compute dtype's max are the identity.
SHIFT = 13


def split(cap: float, dtype: Any) -> tuple[float, int] | None:
    """(c', e) with ``cap = c'·2**e`` and ``c' <= 2**MAX_EXP``; None where the cap is the identity."""
    if cap >= 2.0**SHIFT * float(np.finfo(dtype).max):
        return None
    e = max(0, math.frexp(cap)[1] - MAX_EXP)
    return math.ldexp(cap, -e), e


def tiny(dtype: Any) -> float:
    """Below this ``|t/c|`` the softcap rounds to ``t`` itself (see the module docstring)."""
    return 0.5 * math.sqrt(float(np.finfo(dtype).eps))


def apply(t: Any, cap: float, dtype: Any) -> tuple[Any, Any]:
    """(``cap·tanh(t/cap)``, ``tanh(t/cap)`` for the backward's ``1 − tanh²``; None where the cap
    is the identity) for logits ``t`` of the float dtype ``dtype``."""
    parts = split(cap, dtype)
    if parts is None:
        return t, None
    c, e = parts
    cc = jnp.asarray(c, dtype)
    if e:  # ldexp, not products with 2**±e: XLA would fold those into 1/cap again
        x = jnp.ldexp(t / cc, -e)
        th = jnp.tanh(x)
        capped = jnp.ldexp(cc * th, e)
    else:
        x = t / cc
        th = jnp.tanh(x)
        capped = cc * th
    return jnp.where(jnp.abs(x) < tiny(dtype), t, capped), th
