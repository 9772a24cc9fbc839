"""The suite's dense oracle (attnhub_conformance/oracle.py) keeps SPEC §4's NaN rule: a NaN in q
reaches its row's out and lse (never 0 or −inf), with or without a bias; a −inf bias still
excludes a pair, and a row it fully excludes gives out 0 and lse −inf.

Certify judges every section against this oracle, so an oracle that turned a NaN row into an
"empty" one would pass a backend that zeroes NaN rows."""

import numpy as np
import pytest

from attnhub_conformance import oracle
from attnhub_conformance.oracle import Problem


def _problem(rng, bias: bool) -> Problem:
    b, h, nq, nk, d = 2, 3, 5, 7, 4
    q, k, v = (rng.standard_normal((b, h, n, d)) for n in (nq, nk, nk))
    q[1, 2, 3, 0] = np.nan
    keep = np.ones((b, h, nq, nk), dtype=bool)
    bias_arr = None
    if bias:
        bias_arr = rng.standard_normal((b, h, nq, nk))
        bias_arr[0, 1, 2, :] = -np.inf  # row (0, 1, 2) attends no key
    return Problem(q, k, v, keep, 0.5, bias=bias_arr)


@pytest.mark.parametrize("bias", [False, True])
def test_nan_in_q_reaches_its_row(bias):
    p = _problem(np.random.default_rng(0), bias)
    out, lse = oracle.forward(p)
    assert np.isnan(out[1, 2, 3]).all() and np.isnan(lse[1, 2, 3])
    others = np.ones(lse.shape, dtype=bool)
    others[1, 2, 3] = False
    if bias:
        others[0, 1, 2] = False
    assert np.isfinite(out[others]).all() and np.isfinite(lse[others]).all()
    assert not oracle.empty_rows(p)[1, 2, 3]


def test_a_minus_inf_bias_row_is_empty():
    p = _problem(np.random.default_rng(1), True)
    out, lse = oracle.forward(p)
    assert (out[0, 1, 2] == 0).all() and lse[0, 1, 2] == -np.inf
    assert oracle.empty_rows(p)[0, 1, 2]


def test_a_plus_inf_logit_row_is_nan():
    """SPEC §4: +Inf in q makes its row's logits +Inf; out is NaN (Inf/Inf) and lse NaN (Inf − Inf),
    which the suite also accepts as +Inf (runner.inf_logit_lse)."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 4, 3)) for _ in range(3))
    k[0, 1, :, 0] = np.abs(k[0, 1, :, 0])
    q[0, 1, 2, 0] = np.inf
    out, lse = oracle.forward(Problem(q, k, v, np.ones((1, 2, 4, 4), bool), 0.5))
    assert np.isnan(out[0, 1, 2]).all() and np.isnan(lse[0, 1, 2])
    assert np.isfinite(lse[0, 0]).all() and np.isfinite(out[0, 0]).all()
