"""The float64 yardstick of tests/test_jax_robustness.py and tests/test_tf_robustness.py: SPEC §6's
tolerances and error, rounded random inputs, and the reference's output and gradients."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

import attnhub
from attnhub.frameworks import numpy_dtype
from attnhub.request import build_request
from attnhub.rules import Causal, Full, Local
from attnhub_backends.reference import kernel

#: SPEC §6 (forward, gradient) tolerances.
TOL = {"float64": (1e-10, 1e-9), "float32": (2e-5, 1e-4), "float16": (2e-3, 8e-3), "bfloat16": (1.6e-2, 4e-2)}


#: Offsets (SPEC §11) at the ends of the position range [-2**30, 2**30), for every rule kind: the
#: queries far ahead of or behind the keys, and both at the top and at the bottom of the range.
EDGE_RULES = (Causal(), Full(), Local(3), Local(40, causal=True))
EDGE_OFFSETS = (
    (2**30 - 100, -(2**30) + 5),
    (-(2**30) + 5, 2**30 - 100),
    (2**30 - 100, 2**30 - 90),
    (-(2**30), -(2**30) + 7),
)
EDGE_IDS = ("far-ahead", "far-behind", "top", "bottom")


def err(got, ref) -> float:
    """max(relative L2 error, max error / max |ref|) of SPEC §6; the NaN patterns must agree."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), "NaN pattern differs from the reference"
    ok = ~np.isnan(ref)
    if not ok.any():
        return 0.0
    e = got[ok] - ref[ok]
    nr, mr = np.linalg.norm(ref[ok]), np.abs(ref[ok]).max()
    return max(np.linalg.norm(e) / (nr or 1.0), np.abs(e).max() / (mr or 1.0))


def rounded(rng, shape, dtype="float32", scale=1.0) -> np.ndarray:
    """N(0, scale²) values rounded to ``dtype``, as float64."""
    return (rng.standard_normal(shape) * scale).astype(numpy_dtype(dtype)).astype(np.float64)


def ref_forward(xs, rule, **kw) -> np.ndarray:
    """The reference backend's output on float64 NumPy inputs (any §9-§11 keyword)."""
    return attnhub.attention(*xs, mask=rule, backend="reference", **kw)


def ref_grads(xs, rule, dout, softcap=None) -> tuple[np.ndarray, ...]:
    """(dq, dk, dv) of the float64 reference kernel for the cotangent ``dout``."""
    req, _ = build_request(*xs, rule, "none_front", None, "bhsd", False)
    return kernel.backward(*xs, dout, replace(req, softcap=softcap))


def padded_inputs(rng):
    """(float64 inputs, q_lengths, k_lengths) of a right-padded batch of 2 entries."""
    xs = [rounded(rng, (2, 4, 12, 8)), rounded(rng, (2, 2, 12, 8)), rounded(rng, (2, 2, 12, 8))]
    return xs, np.array([5, 12]), np.array([7, 11])
