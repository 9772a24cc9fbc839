"""SPEC §9 ``softcap``: ``t = softcap · tanh(t / softcap)`` (Gemma 2's logit soft-capping)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from attnhub.errors import SpecError
from attnhub.modifiers.base import Call, ScoreModifier

#: The largest finite value of each input dtype below float64.
_DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}


def softcap_float(x: Any) -> float | None:
    """``softcap`` as a finite float > 0, or None."""
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise SpecError("softcap", "None or a finite float > 0", x)
    value = float(x)
    if not math.isfinite(value) or value <= 0:
        raise SpecError("softcap", "None or a finite float > 0", x)
    return value


def effective_softcap(cap: float | None, dtype: str, scale: float, dim_qk: int) -> float | None:
    """``cap``, or None where no input of ``dtype`` can make it change a logit (SPEC §9).

    With every element at most M (the dtype's largest value), ``|t| = |scale·q·k| <= |scale|·Dqk·M²``,
    and ``c·tanh(t/c) = t·(1 − (t/c)²/3 + …)``: once ``c >= 2**13`` times that bound every logit, and
    every difference of two, changes by a relative 2**-26 at most (the probabilities of a row by
    less than 1e-6), below float32's tolerance. Such a cap is dropped, so that kernels computing in
    float32 never meet a cap they cannot hold (1e300 gave NaN in tf, jax, triton and cuda: inf·0).
    float64 requests keep every cap: their kernels compute it in float64."""
    if cap is None or dtype not in _DTYPE_MAX:
        return cap
    bound = abs(scale) * dim_qk * _DTYPE_MAX[dtype] ** 2
    return None if cap >= 2.0**13 * bound else cap


class Softcap(ScoreModifier):
    """Built in: the request keeps ``softcap`` (a float, or None once
    :func:`effective_softcap` drops it); no operand."""

    name = "softcap"
    feature = "softcap"
    missing = "does not apply softcap"

    def signature(self, value: Any, call: Call) -> float | None:
        return softcap_float(value)

    def key(self, value: Any) -> Any:
        return (value, type(value))

    def used(self, req: Any) -> bool:
        return req.softcap is not None

    def describe(self, req: Any) -> str:
        return f"softcap={req.softcap:g}"


MODIFIER = Softcap()
