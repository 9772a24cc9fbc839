"""The tf backend on inputs that give other backends silently wrong results (issue 36).

- a softcap too large for the compute dtype (SPEC §9: any finite cap > 0), forward and gradients,
  eagerly and under XLA;
- NaN stored in padded keys, padded query rows and unused rows of a paged cache (SPEC §10)
  never reaches a valid output or gradient; NaN in a valid input still propagates (SPEC §4);
- offsets (SPEC §11) at the ends of the allowed position range [-2**30, 2**30).

The reference is attnhub's NumPy float64 kernel on float64 copies of the rounded inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnhub
from attnhub import Causal, Full, Local
from attnhub_backends.tf import tiles
from tests.robustness_oracle import (
    EDGE_IDS,
    EDGE_OFFSETS,
    EDGE_RULES,
    TOL,
    err,
    padded_inputs,
    ref_forward,
    ref_grads,
    rounded,
)

tf = None  # imported by the fixture below, not at collection (TensorFlow before triton aborts)


@pytest.fixture(autouse=True, scope="module")
def _tensorflow():
    global tf
    tf = pytest.importorskip("tensorflow")


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Small tiles so that short test sequences cross several tiles."""
    monkeypatch.setattr(tiles, "BLOCK_Q", 16)
    monkeypatch.setattr(tiles, "BLOCK_K", 24)


def tf_dtype(dtype: str):
    return getattr(tf, dtype)


# ---- softcap beyond the compute dtype's range ---------------------------------------------------
@pytest.mark.parametrize(
    "dtype,cap",
    [
        ("float32", 1e300),
        ("float32", 1e39),
        ("float32", 3e38),
        ("float16", 1e30),
        ("bfloat16", 1e300),
        ("float64", 1e300),
        ("float32", 20.0),
    ],
)
@pytest.mark.parametrize("xla", [False, True], ids=["eager", "xla"])
def test_huge_softcap_is_exact(rng, dtype, cap, xla):
    """Forward and gradients against the float64 reference with the same cap."""
    xs = [rounded(rng, (1, 4, 19, 8), dtype, 4.0) for _ in range(3)]
    ts = [tf.constant(x, tf_dtype(dtype)) for x in xs]
    dout = rounded(rng, xs[0].shape, dtype)

    def run(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = attnhub.attention(q, k, v, mask="causal", softcap=cap, backend="tf")
            loss = tf.reduce_sum(tf.cast(out, tf.float64) * dout)
        return (out, *tape.gradient(loss, [q, k, v]))

    got = tf.function(run, jit_compile=True)(*ts) if xla else run(*ts)
    fwd, bwd = TOL[dtype]
    assert err(tf.cast(got[0], tf.float64), ref_forward(xs, Causal(), softcap=cap)) < fwd
    for g, r in zip(got[1:], ref_grads(xs, Causal(), dout, softcap=cap)):
        assert err(tf.cast(g, tf.float64), r) < bwd


@pytest.mark.parametrize("cap", [1e39, 3e38, 1e20])
def test_softcap_on_logits_near_float32_max(cap):
    """Logits of 1e38: c·tanh(t/c) differs from t by 0.3 % (1e39) to saturation (1e20)."""
    q = np.zeros((1, 1, 2, 1))
    q[0, 0, :, 0] = [1e19, -1e19]
    k = np.zeros((1, 1, 3, 1))
    k[0, 0, :, 0] = [1e19, 0.5e19, 0.0]
    v = rounded(np.random.default_rng(3), (1, 1, 3, 4))
    ref_out, ref_lse = ref_forward([q, k, v], Full(), softcap=cap, scale=1.0, return_lse=True)
    assert abs(ref_lse[0, 0, 0] / 1e38 - 1) > 1e-3  # the cap matters here
    ts = [tf.constant(x, tf.float32) for x in (q, k, v)]
    out, lse = attnhub.attention(*ts, softcap=cap, scale=1.0, return_lse=True, backend="tf")
    assert err(out, ref_out) < TOL["float32"][0]
    assert err(lse, ref_lse) < TOL["float32"][0]


# ---- NaN in padding (SPEC §10) and in valid inputs (SPEC §4) -------------------------------------
@pytest.mark.parametrize("rule", [Causal(), Full(), Local(3)], ids=str)
def test_nan_in_padding_reaches_no_valid_output_or_gradient(rng, rule):
    xs, ql, kl = padded_inputs(rng)
    ref = ref_forward(xs, rule, q_lengths=ql, k_lengths=kl)
    poisoned = [x.copy() for x in xs]
    poisoned[0][0, :, 5:] = np.nan
    for x in poisoned[1:]:
        x[0, :, 7:] = np.nan
        x[1, :, 11:] = np.nan
    ts = [tf.constant(x, tf.float32) for x in poisoned]
    dout = rounded(rng, ref.shape)
    with tf.GradientTape() as tape:
        tape.watch(ts)
        out = attnhub.attention(*ts, mask=rule, q_lengths=ql, k_lengths=kl, backend="tf")
        loss = tf.reduce_sum(tf.cast(out, tf.float64) * dout)
    grads = tape.gradient(loss, ts)
    assert err(out, ref) < TOL["float32"][0]
    assert np.all(out.numpy()[0, :, 5:] == 0)
    for g in grads:
        assert np.isfinite(g.numpy()).all()
    assert np.all(grads[1].numpy()[0, :, 7:] == 0) and np.all(grads[2].numpy()[1, :, 11:] == 0)
    for t, x in zip(ts, poisoned):  # the caller's tensors are untouched
        np.testing.assert_array_equal(t.numpy(), x.astype(np.float32))


def test_nan_in_a_valid_query_propagates_with_lengths(rng):
    xs, ql, kl = padded_inputs(rng)
    xs[0][1, 3, 6, 2] = np.nan
    ts = [tf.constant(x, tf.float32) for x in xs]
    out = attnhub.attention(*ts, mask="causal", q_lengths=ql, k_lengths=kl, backend="tf").numpy()
    assert np.isnan(out[1, 3, 6]).all()
    assert np.isnan(out).sum() == out.shape[-1]


def test_nan_in_unused_paged_cache_rows(rng):
    b, hq, hkv, d, bs = 2, 4, 2, 8, 4
    q = rounded(rng, (b, hq, 2, d))
    kc, vc = rounded(rng, (8, bs, hkv, d)), rounded(rng, (8, bs, hkv, d))
    table = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    klens = np.array([6, 10])
    ref = attnhub.attention_kvcache(q, kc, vc, klens, block_table=table, backend="reference")
    for cache in (kc, vc):
        cache[1, 2:] = np.nan
        cache[5, 2:] = np.nan
        cache[2] = np.nan
        cache[6:] = np.nan
    ts = [tf.constant(x, tf.float32) for x in (q, kc, vc)]
    out = attnhub.attention_kvcache(*ts, tf.constant(klens), block_table=tf.constant(table), backend="tf")
    assert err(out, ref) < TOL["float32"][0]


# ---- offsets at the ends of the position range (SPEC §11) ---------------------------------------
@pytest.mark.parametrize("rule", EDGE_RULES, ids=str)
@pytest.mark.parametrize("qo,ko", EDGE_OFFSETS, ids=EDGE_IDS)
@pytest.mark.parametrize("lengths", [False, True], ids=["dense", "lengths"])
def test_offsets_at_the_ends_of_the_range(rng, rule, qo, ko, lengths):
    xs = [rounded(rng, (2, 2, 40, 8)), rounded(rng, (2, 2, 50, 8)), rounded(rng, (2, 2, 50, 8))]
    kw = {"q_lengths": np.array([40, 33]), "k_lengths": np.array([50, 41])} if lengths else {}
    ref = ref_forward(xs, rule, q_offset=qo, k_offset=ko, **kw)
    ts = [tf.constant(x, tf.float32) for x in xs]
    out = attnhub.attention(*ts, mask=rule, q_offset=qo, k_offset=ko, backend="tf", **kw)
    assert err(out, ref) < TOL["float32"][0]
