"""SPEC §9's softcap ``t = c·tanh(t / c)`` for every finite cap ``c > 0``, in float32 or float64.

Written naively, a cap beyond the compute dtype's range becomes ``inf`` and ``inf·tanh(t/inf)`` is
NaN (a cap of 1e300 with float32 inputs); and ``t/c`` is subnormal for large caps, which
TensorFlow's CPU kernels flush to 0 (``c·tanh(0) = 0``, not ``t``). Here, with ``x = t/c``:

- ``|x| < sqrt(eps)/2`` gives ``t`` itself: ``c·tanh(x) = t·(1 − x²/3 + …)`` differs from ``t`` by
  less than ``eps/12`` relatively, under half an ulp, so ``t`` is the correctly rounded value
  (also where ``x`` was flushed to 0);
- a float32 computation with a cap above ``2**MAX_EXP`` evaluates the softcap in float64, where
  the cap and ``t/c`` are normal numbers (such caps are rare; the cost is a float64 pass over the
  tile's logits);
- a cap of at least ``2**SHIFT`` times the compute dtype's max is the identity: every finite ``t``
  has ``|x| < 2**-SHIFT``, below ``sqrt(eps)/2`` for float32 and float64 (the first rule).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

#: Caps up to ``2**MAX_EXP`` are used in the compute dtype (their reciprocal is a normal float32).
MAX_EXP = 64
#: Caps of at least ``2**SHIFT`` times the compute dtype's max are the identity.
SHIFT = 13


def is_identity(cap: float, dtype: tf.DType) -> bool:
    """True when ``cap·tanh(t/cap)`` rounds to ``t`` for every finite ``t`` of ``dtype``."""
    return cap >= 2.0**SHIFT * float(np.finfo(dtype.as_numpy_dtype).max)


def _tiny(dtype: tf.DType) -> float:
    """Below this ``|t/c|`` the softcap rounds to ``t`` itself (see the module docstring)."""
    return 0.5 * math.sqrt(float(np.finfo(dtype.as_numpy_dtype).eps))


def apply(t: tf.Tensor, cap: float) -> tuple[tf.Tensor, Any]:
    """(``cap·tanh(t/cap)``, ``tanh(t/cap)`` for the backward's ``1 − tanh²``; None where the cap
    is the identity) for float32 or float64 logits ``t``, in their dtype."""
    dtype = t.dtype
    if is_identity(cap, dtype):
        return t, None
    wide = dtype if cap <= 2.0**MAX_EXP else tf.float64
    tw = tf.cast(t, wide)
    c = tf.constant(cap, wide)
    x = tw / c
    th = tf.tanh(x)
    capped = tf.where(tf.abs(x) < _tiny(wide), tw, c * th)
    return tf.cast(capped, dtype), tf.cast(th, dtype)
