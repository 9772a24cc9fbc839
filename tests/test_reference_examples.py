"""The reference backend on hand-worked examples, including SPEC §2's alignment examples."""

import math

import numpy as np
import pytest

import attnhub
from attnhub.positions import axis_positions, dense_rule_mask, grid_positions
from attnhub.rules import Causal, Full, Local


@pytest.mark.parametrize(
    ("sync", "expected"),
    [
        ("scale_front", [0, 2, 4]),
        ("scale_end", [1, 3, 5]),
        ("none_front", [0, 1, 2]),
        ("none_end", [3, 4, 5]),
    ],
)
def test_spec_1d_alignment_examples(sync, expected):
    pq, pk = axis_positions(3, 6, sync)
    assert pq.tolist() == expected
    assert pk.tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("sync", "expected"), [("scale_front", [[0, 2], [8, 10]]), ("scale_end", [[5, 7], [13, 15]])]
)
def test_spec_2d_alignment_examples(sync, expected):
    _, _, fq, fk = grid_positions((2, 2), (4, 4), sync)
    assert fq.reshape(2, 2).tolist() == expected
    assert fk.tolist() == list(range(16))


def test_causal_scale_end_mask_by_hand():
    keep = dense_rule_mask(Causal(), (3,), (6,), "scale_end")
    assert keep.astype(int).tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]


def test_local_stride_window_by_hand():
    # window 2, stride 2: |delta| in {0, 2}; causal keeps only keys at or before the query.
    keep = dense_rule_mask(Local(2, log2_stride=1, causal=True), (6,), (6,), "none_front")
    expected = [[1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0],
                [0, 1, 0, 1, 0, 0], [0, 0, 1, 0, 1, 0], [0, 0, 0, 1, 0, 1]]  # fmt: skip
    assert keep.astype(int).tolist() == expected


def test_weighted_average_by_hand():
    # s = [0, ln 3] -> softmax [1/4, 3/4]; out = 1/4*4 + 3/4*8 = 7; lse = ln 4.
    q = np.array([[[[1.0]]]])
    k = np.array([[[[0.0], [math.log(3.0)]]]])
    v = np.array([[[[4.0], [8.0]]]])
    out, lse = attnhub.attention(q, k, v, scale=1.0, return_lse=True, backend="reference")
    assert out.item() == pytest.approx(7.0, rel=1e-14)
    assert lse.item() == pytest.approx(math.log(4.0), rel=1e-14)


def test_causal_first_query_sees_only_first_key():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 4, 8)) for _ in range(3))
    out = attnhub.attention(q, k, v, mask="causal", backend="reference")
    np.testing.assert_allclose(out[0, 0, 0], v[0, 0, 0], rtol=1e-14)


def test_fully_masked_rows_are_zero_with_minus_inf_lse():
    # Lq=4 none_front over Lk=2 keys with a local window 1: queries 2 and 3 have no key.
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 2, 4, 8))
    k, v = rng.standard_normal((1, 2, 2, 8)), rng.standard_normal((1, 2, 2, 8))
    out, lse = attnhub.attention(q, k, v, mask=attnhub.Local(1), return_lse=True, backend="reference")
    assert np.all(out[:, :, 2:] == 0) and np.all(np.isneginf(lse[:, :, 2:]))
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse[:, :, :2]))


def test_no_keys_gives_fully_masked_rows():
    q = np.ones((1, 2, 3, 4))
    k = np.ones((1, 2, 0, 4))
    v = np.ones((1, 2, 0, 5))
    out, lse = attnhub.attention(q, k, v, return_lse=True)
    assert out.shape == (1, 2, 3, 5) and np.all(out == 0) and np.all(np.isneginf(lse))


@pytest.mark.parametrize("shape", [(0, 2, 3, 4), (1, 0, 3, 4), (1, 2, 0, 4)])
def test_empty_work_returns_empty_output(shape):
    q = np.ones(shape)
    kv_shape = (shape[0], shape[1], 5, 4)
    out = attnhub.attention(q, np.ones(kv_shape), np.ones(kv_shape))
    assert out.shape == shape


def test_nan_propagates_to_affected_rows_only():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 1, 4, 8)) for _ in range(3))
    q[0, 0, 2, 3] = np.nan
    out = attnhub.attention(q, k, v, mask="causal", backend="reference")
    assert np.all(np.isnan(out[0, 0, 2])) and np.all(np.isfinite(out[0, 0, [0, 1, 3]]))


def test_large_logits_are_stable():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 16, 8)) for _ in range(3))
    out, lse = attnhub.attention(q * 200, k, v, return_lse=True, backend="reference")
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))


def test_full_rule_equals_no_mask_and_explicit_true_mask():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 2, 5, 8)) for _ in range(3))
    a = attnhub.attention(q, k, v, mask=None)
    b = attnhub.attention(q, k, v, mask=Full())
    c = attnhub.attention(q, k, v, mask=np.ones((5, 5), dtype=bool))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, c, rtol=1e-14)


def test_additive_minus_inf_equals_boolean_mask():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 6, 8)) for _ in range(3))
    keep = rng.random((1, 1, 6, 6)) > 0.4
    keep[..., 0] = True
    bias = np.where(keep, 0.0, -np.inf)
    a = attnhub.attention(q, k, v, mask=keep)
    b = attnhub.attention(q, k, v, mask=bias)
    np.testing.assert_allclose(a, b, rtol=1e-14)
