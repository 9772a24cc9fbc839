"""SPEC §4: NaN and Inf inputs propagate to exactly the affected outputs, and certify checks it.

The comparison must flag a finite value where the reference is NaN (it used to skip every element
non-finite in the reference); the NaN/Inf cases' expected output is checked here against a
brute-force dense oracle written from SPEC §4 (out[i] = Σ over attended j of softmax · v[j])."""

from __future__ import annotations

import numpy as np
import pytest

from attnhub import Causal, Full, Local
from attnhub.positions import dense_rule_mask
from attnhub.request import build_request
from attnhub_conformance.cases import DTYPES, Case, full_grid, nonfinite_cases, quick_grid
from attnhub_conformance.runner import CaseFailure, compare, expected_forward, make_data, nonfinite_sites


def test_compare_flags_a_finite_value_where_the_reference_is_nan():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 3, 5, 4))
    ref[1, 2, 3, :] = np.nan
    got = np.nan_to_num(ref, nan=0.0)  # a backend replacing NaN by 0
    with pytest.raises(CaseFailure, match="not NaN where the reference is NaN"):
        compare("out", got, ref, 2e-5, "float32")
    compare("out", ref.copy(), ref, 2e-5, "float32")  # NaN where the reference has NaN passes


@pytest.mark.parametrize("where", ["got", "ref"])
def test_compare_flags_an_inf_mismatch_in_both_directions(where):
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((1, 2, 4, 4))
    got = ref.copy()
    (got if where == "got" else ref)[0, 1, 2, 3] = np.inf
    with pytest.raises(CaseFailure, match="infinite"):
        compare("out", got, ref, 2e-5, "float32")


def test_every_declared_dtype_gets_nan_and_inf_cases():
    for dtypes in (DTYPES, ("float16", "float32")):
        for grid in (quick_grid(dtypes, "numpy"), full_grid(dtypes, "numpy")):
            kinds = {(c.dtype, c.nonfinite) for c in grid if c.nonfinite}
            assert kinds == {(d, k) for d in dtypes for k in ("nan", "inf")}
            assert all("NaN/Inf propagate" in c.features for c in grid if c.nonfinite)


def _brute(q, k, v, keep, scale):
    """SPEC §4 row by row: softmax over the attended keys only; a row attending none gives 0."""
    b, hq, nq, _ = q.shape
    g = hq // k.shape[1]
    out = np.zeros((b, hq, nq, v.shape[-1]))
    with np.errstate(invalid="ignore", over="ignore"):
        for bi in range(b):
            for h in range(hq):
                for i in range(nq):
                    js = np.flatnonzero(keep[i])
                    if js.size == 0:
                        continue
                    s = scale * (k[bi, h // g, js] @ q[bi, h, i])
                    w = np.exp(s - s.max())
                    w = w / w.sum()
                    out[bi, h, i] = sum(wj * v[bi, h // g, j] for wj, j in zip(w, js))
    return out


@pytest.mark.parametrize(
    "case",
    [c for c in nonfinite_cases("float64", full=True) if not isinstance(c.rule, str) and c.layout == "bhsd"],
    ids=lambda c: c.id,
)
def test_expected_output_is_spec_4_literally(case):
    data = make_data(case, np.random.default_rng(7))
    req, _ = build_request(data.q, data.k, data.v, case.mask, case.sync, case.scale, "bhsd", False)
    ref, _ = expected_forward(data, req, case)
    keep = dense_rule_mask(req.rule, req.seq_q, req.seq_k, req.sync)
    brute = _brute(data.q, data.k, data.v, keep, req.scale)
    assert np.array_equal(np.isnan(ref), np.isnan(brute))
    assert np.array_equal(np.isinf(ref), np.isinf(brute))
    fin = np.isfinite(brute)
    np.testing.assert_allclose(ref[fin], brute[fin], rtol=1e-12, atol=1e-12)
    # the value in v reaches column d of the rows attending key j, nothing else of its entry
    b, h, j, d = nonfinite_sites(case)["v"]
    heads = slice(h * req.group, (h + 1) * req.group)
    hit = ~np.isfinite(ref[b, heads])
    assert hit.any() and not hit[..., [c for c in range(case.dim_v) if c != d]].any()
    assert np.array_equal(hit[..., d], np.broadcast_to(keep[:, j], hit[..., d].shape))
    # fully masked rows stay exactly 0 whatever k and v hold
    empty = ~keep.any(axis=1)
    assert np.all(ref[:, :, empty] == 0)


def test_nonfinite_cases_need_three_batch_entries_and_no_grad():
    with pytest.raises(ValueError, match="batch >= 3"):
        Case("float32", (5,), (5,), Full(), batch=2, nonfinite="nan")
    with pytest.raises(ValueError, match="no grad"):
        Case("float32", (5,), (5,), Local(2), batch=3, grad=True, nonfinite="inf")
    assert Case("float32", (5,), (5,), Causal(), batch=3, nonfinite="nan").id.endswith("-nan")
