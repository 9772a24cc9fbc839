"""Property-based checks: the reference equals a pair-by-pair brute force over shapes, rules, syncs, GQA, dtypes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import attnhub
from attnhub.frameworks import numpy_dtype
from attnhub.positions import dense_rule_mask
from attnhub.rules import Causal, Full, Local
from tests.brute import dense_attention, dense_mask

SYNCS = ["none_front", "scale_front", "scale_end", "none_end"]
TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@st.composite
def rules(draw, ndim):
    kind = draw(st.sampled_from(["full", "causal", "local"]))
    if kind == "full":
        return Full()
    if kind == "causal":
        return Causal()
    if ndim == 2 and draw(st.booleans()):
        window = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    else:
        window = draw(st.integers(1, 6))
    return Local(window, log2_stride=draw(st.integers(0, 3)), causal=draw(st.booleans()))


@st.composite
def requests(draw):
    ndim = draw(st.sampled_from([1, 2]))
    hi = 9 if ndim == 1 else 4
    seq_q = tuple(draw(st.integers(1, hi)) for _ in range(ndim))
    seq_k = tuple(draw(st.integers(1, hi)) for _ in range(ndim))
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.sampled_from([1, 2, 3]))
    return dict(
        ndim=ndim, seq_q=seq_q, seq_k=seq_k, hq=hq, hkv=hkv, b=draw(st.integers(1, 2)),
        dqk=draw(st.sampled_from([1, 4, 8])), dv=draw(st.sampled_from([2, 8])),
        rule=draw(rules(ndim)), sync=draw(st.sampled_from(SYNCS)),
        dtype=draw(st.sampled_from(list(TOL))), seed=draw(st.integers(0, 2**31)),
    )  # fmt: skip


@settings(max_examples=120, deadline=None)
@given(requests())
def test_masks_match_brute_force(r):
    fast = dense_rule_mask(r["rule"], r["seq_q"], r["seq_k"], r["sync"])
    slow = dense_mask(r["rule"], r["sync"], r["seq_q"], r["seq_k"])
    np.testing.assert_array_equal(fast, slow)


@settings(max_examples=80, deadline=None)
@given(requests())
def test_reference_matches_brute_force(r):
    rng = np.random.default_rng(r["seed"])
    dt = numpy_dtype(r["dtype"])
    q = rng.standard_normal((r["b"], r["hq"], *r["seq_q"], r["dqk"])).astype(dt)
    k = rng.standard_normal((r["b"], r["hkv"], *r["seq_k"], r["dqk"])).astype(dt)
    v = rng.standard_normal((r["b"], r["hkv"], *r["seq_k"], r["dv"])).astype(dt)
    copies = [x.copy() for x in (q, k, v)]
    out, lse = attnhub.attention(
        q, k, v, mask=r["rule"], sync=r["sync"], return_lse=True, backend="reference"
    )
    for x, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(x, c)
    assert out.dtype == dt and out.shape == (r["b"], r["hq"], *r["seq_q"], r["dv"])
    assert lse.dtype == (np.float64 if r["dtype"] == "float64" else np.float32)

    keep = dense_mask(r["rule"], r["sync"], r["seq_q"], r["seq_k"])
    flat = [x.astype(np.float64).reshape(x.shape[0], x.shape[1], -1, x.shape[-1]) for x in (q, k, v)]
    ref_out, ref_lse = dense_attention(*flat, keep, 1 / np.sqrt(r["dqk"]))
    got = out.astype(np.float64).reshape(ref_out.shape)
    scale = max(np.abs(ref_out).max(), 1e-300)
    assert np.abs(got - ref_out).max() / scale <= TOL[r["dtype"]]
    masked = np.isneginf(ref_lse)
    np.testing.assert_array_equal(np.isneginf(lse.reshape(ref_lse.shape)), masked)
    np.testing.assert_allclose(lse.reshape(ref_lse.shape)[~masked], ref_lse[~masked], rtol=1e-5, atol=1e-5)
    assert np.all(got[masked] == 0)


@settings(max_examples=30, deadline=None)
@given(requests(), st.sampled_from(["bshd", "bhds"]))
def test_layouts_agree_with_bhsd(r, layout):
    rng = np.random.default_rng(r["seed"])
    q = rng.standard_normal((r["b"], r["hq"], *r["seq_q"], r["dqk"]))
    k = rng.standard_normal((r["b"], r["hkv"], *r["seq_k"], r["dqk"]))
    v = rng.standard_normal((r["b"], r["hkv"], *r["seq_k"], r["dv"]))
    base = attnhub.attention(q, k, v, mask=r["rule"], sync=r["sync"])
    n = r["ndim"]

    def move(x):
        if layout == "bshd":
            return np.moveaxis(x, 1, n + 1)
        return np.moveaxis(x, -1, 2)

    out = attnhub.attention(*(move(x) for x in (q, k, v)), mask=r["rule"], sync=r["sync"], layout=layout)
    np.testing.assert_allclose(out, move(base), rtol=1e-12, atol=1e-12)
