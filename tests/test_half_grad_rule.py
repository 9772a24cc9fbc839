"""SPEC §6's rule for half-precision gradients: the table, or twice the error of the formula in the dtype.

The rule must admit what every half-precision kernel inherits from storing its tensors (here: the
backward fed the output rounded to bfloat16, as SDPA's kernels do), and still fail a wrong
gradient. The rounded formula itself must be accurate where nothing cancels, or the bound it sets
would be loose.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from attnhub_conformance import oracle
from attnhub_conformance.rounded import rounded_backward
from attnhub_conformance.runner import TOLERANCES, CaseFailure, compare_grad, errors
from tests.test_peaked_row_gradients import peaked_case

HALF = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def rnd(x: np.ndarray, dtype: str) -> np.ndarray:
    return x.astype(HALF[dtype]).astype(np.float64)


def problem(rng, dtype: str, *, nq=24, nk=40, d=16, hq=4, hkv=2, q_scale=1.0, **mods) -> oracle.Problem:
    q = rnd(rng.standard_normal((2, hq, nq, d)) * q_scale, dtype)
    k = rnd(rng.standard_normal((2, hkv, nk, d)), dtype)
    v = rnd(rng.standard_normal((2, hkv, nk, d)), dtype)
    keep = np.tril(np.ones((nq, nk), dtype=bool), k=nk - nq)[None, None]
    return oracle.Problem(q, k, v, keep, d**-0.5, **mods)


def peaked() -> tuple[oracle.Problem, np.ndarray]:
    """tests/test_peaked_row_gradients.py's bfloat16 row with ~98 % of its mass on key 0 (dq cancels)."""
    q, k, v, dout, _ = peaked_case()
    return oracle.Problem(q, k, v, np.ones((1, 1, 1, k.shape[2]), dtype=bool), q.shape[-1] ** -0.5), dout


def dq_with_rounded_out(p: oracle.Problem, dout: np.ndarray, dtype: str) -> np.ndarray:
    """dq of an otherwise exact backward that forms rowsum(dO·O) from O rounded to ``dtype``."""
    out, _ = oracle.forward(p)
    s = p.scale * (p.q @ np.swapaxes(p.k, -1, -2))
    prob = np.exp(s - s.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    dp = dout @ np.swapaxes(p.v, -1, -2)
    delta = (dout * rnd(out, dtype)).sum(-1, keepdims=True)
    return p.scale * ((prob * (dp - delta)) @ p.k)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "mods", [{}, {"softcap": 5.0}, {"sinks": np.array([0.5, -1.0, 2.0, 0.0])}, {"bias": "full"}]
)
def test_rounded_formula_is_accurate_where_nothing_cancels(dtype, mods):
    rng = np.random.default_rng(1)
    if mods.get("bias") == "full":
        mods = {"bias": rnd(rng.standard_normal((2, 4, 24, 40)), dtype)}
    p = problem(rng, dtype, **mods)
    dout = rnd(rng.standard_normal((2, 4, 24, 16)), dtype)
    ref, mag = oracle.backward(p, dout)
    got = rounded_backward(p, dout, dtype)
    tol = TOLERANCES[dtype][1]
    for key in ("dq", "dk", "dv", "dbias", "dsinks"):
        if getattr(ref, key) is None:
            continue
        rel, mx = errors(getattr(got, key), getattr(ref, key), getattr(mag, key))
        assert rel < tol / 2 and mx < tol, (key, rel, mx)


def test_rounded_output_fails_the_table_but_passes_the_rule():
    p, dout = peaked()
    ref, mag = oracle.backward(p, dout)
    got = dq_with_rounded_out(p, dout, "bfloat16")
    with pytest.raises(CaseFailure):  # the table alone rejects what storing O in bfloat16 costs
        compare_grad("dq", got, ref.dq, TOLERANCES["bfloat16"][1], "bfloat16", mag.dq)
    base = rounded_backward(p, dout, "bfloat16").dq
    compare_grad("dq", got, ref.dq, TOLERANCES["bfloat16"][1], "bfloat16", mag.dq, base)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("q_scale", [1.0, 8.0])
@pytest.mark.parametrize("bug", ["scaled", "no_delta", "wrong_key"])
def test_wrong_gradients_still_fail(dtype, q_scale, bug):
    rng = np.random.default_rng(2)
    p = problem(rng, dtype, q_scale=q_scale)
    dout = rnd(rng.standard_normal((2, 4, 24, 16)), dtype)
    ref, mag = oracle.backward(p, dout)
    base = rounded_backward(p, dout, dtype)
    if bug == "scaled":
        got = ref.dq * 1.15
    elif bug == "no_delta":  # dS = P·dP: the softmax Jacobian's row term dropped
        pr = oracle._parts(p)[1]
        dp = dout @ np.swapaxes(np.repeat(p.v, 2, axis=1), -1, -2)
        got = p.scale * ((pr * dp) @ np.repeat(p.k, 2, axis=1))
    else:  # every query differentiates against the next key
        got = np.roll(ref.dq, 1, axis=2)
    with pytest.raises(CaseFailure):
        compare_grad("dq", got, ref.dq, TOLERANCES[dtype][1], dtype, mag.dq, base.dq)


def test_float32_keeps_the_table():
    p, dout = peaked()
    ref, mag = oracle.backward(p, dout)
    got = dq_with_rounded_out(p, dout, "bfloat16")
    with pytest.raises(CaseFailure):  # a rounded-formula baseline is ignored outside half types
        compare_grad("dq", got, ref.dq, TOLERANCES["float32"][1], "float32", mag.dq, got)
