"""The jax backend on inputs that once gave silently wrong results (issue 36), against float64.

- gradients under ``jax.jit`` with a ones cotangent (``.sum()``), or with an operand XLA can see
  is a broadcast, at lengths that are and are not tile multiples (XLA:CPU's YNNPACK fusions
  miscompiled such dots);
- NaN stored in padded keys, padded query rows and unused rows of a paged cache (SPEC §10) never
  reaches a valid output or gradient; NaN in a valid input still propagates (SPEC §4);
- a softcap too large for the compute dtype (SPEC §9: any finite cap > 0);
- offsets (SPEC §11) at the ends of the allowed position range [-2**30, 2**30).

The reference is attnhub's NumPy float64 kernel on float64 copies of the rounded inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import attnhub  # noqa: E402
from attnhub import Causal, Full, Local  # noqa: E402
from attnhub.frameworks import numpy_dtype  # noqa: E402
from tests.robustness_oracle import (  # noqa: E402
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


# ---- item 1: gradients under jit ----------------------------------------------------------------
def _loss(rule, dout):
    """sum(out) (dout None: the ones cotangent XLA can fold) or sum(out · dout)."""

    def loss(q, k, v):
        out = attnhub.attention(q, k, v, mask=rule, backend="jax")
        return out.sum() if dout is None else (out * dout).sum()

    return loss


TRANSFORMS = {
    "grad": lambda f: jax.grad(f, argnums=(0, 1, 2)),
    "jit(grad)": lambda f: jax.jit(jax.grad(f, argnums=(0, 1, 2))),
    "grad(jit)": lambda f: jax.grad(jax.jit(f), argnums=(0, 1, 2)),
}


@pytest.mark.parametrize(
    "length,rule,tiles",
    [
        (48, Causal(), None),
        (80, Full(), None),
        (100, Local(7, causal=True), None),
        (53, Causal(), "48,48"),
        (47, Local(7, causal=True), "16,16"),
    ],
    ids=["48-causal", "80-full", "100-local7c", "53-causal-t48", "47-local7c-t16"],
)
def test_gradients_under_jit_match_reference(rng, monkeypatch, length, rule, tiles):
    """B·Hq = 8, ones and random cotangents, eager grad, jit(grad) and grad(jit)."""
    if tiles:
        monkeypatch.setenv("ATTNHUB_JAX_TILES", tiles)
    xs = [rounded(rng, (1, 8, length, 16)) for _ in range(3)]
    js = [jnp.asarray(x, jnp.float32) for x in xs]
    random_dout = rounded(rng, xs[0].shape)
    for dout in (None, random_dout):
        ref = ref_grads(xs, rule, np.ones(xs[0].shape) if dout is None else dout)
        jd = None if dout is None else jnp.asarray(dout, jnp.float32)
        for name, transform in TRANSFORMS.items():
            got = transform(_loss(rule, jd))(*js)
            for which, g, r in zip("qkv", got, ref):
                e = err(g, r)
                assert e < TOL["float32"][1], f"{name} d{which} ones={dout is None}: {e:.3g}"


def test_operand_built_from_a_constant_under_jit(rng):
    """q = jnp.full(...) inside the jitted function: XLA sees a broadcast operand."""
    xs = [np.full((1, 8, 48, 16), 0.5), rounded(rng, (1, 8, 48, 16)), rounded(rng, (1, 8, 48, 16))]

    def loss(k, v):
        q = jnp.full((1, 8, 48, 16), 0.5, jnp.float32)
        return attnhub.attention(q, k, v, mask="causal", backend="jax").sum()

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(*(jnp.asarray(x, jnp.float32) for x in xs[1:]))
    ref = ref_grads(xs, Causal(), np.ones(xs[0].shape))
    for g, r in zip(got, ref[1:]):
        assert err(g, r) < TOL["float32"][1]


# ---- item 2: NaN in padding (SPEC §10) and in valid inputs (SPEC §4) -----------------------------
@pytest.mark.parametrize("rule", [Causal(), Full(), Local(3)], ids=str)
def test_nan_in_padding_reaches_no_valid_output_or_gradient(rng, rule):
    xs, ql, kl = padded_inputs(rng)
    ref = ref_forward(xs, rule, q_lengths=ql, k_lengths=kl)
    poisoned = [x.copy() for x in xs]
    poisoned[0][0, :, 5:] = np.nan  # padded query rows of entry 0
    poisoned[1][0, :, 7:] = np.nan  # padded keys of entry 0 and entry 1
    poisoned[2][0, :, 7:] = np.nan
    poisoned[1][1, :, 11:] = np.nan
    poisoned[2][1, :, 11:] = np.nan
    js = [jnp.asarray(x, jnp.float32) for x in poisoned]
    before = [np.asarray(j) for j in js]
    dout = jnp.asarray(rounded(rng, ref.shape), jnp.float32)

    def f(q, k, v):
        return attnhub.attention(q, k, v, mask=rule, q_lengths=ql, k_lengths=kl, backend="jax")

    out = f(*js)
    assert err(out, ref) < TOL["float32"][0]
    assert np.all(np.asarray(out)[0, :, 5:] == 0)  # padded rows give 0
    grads = jax.jit(jax.grad(lambda q, k, v: (f(q, k, v) * dout).sum(), argnums=(0, 1, 2)))(*js)
    for g in grads:
        assert np.isfinite(np.asarray(g)).all()
    assert np.all(np.asarray(grads[1])[0, :, 7:] == 0) and np.all(np.asarray(grads[2])[1, :, 11:] == 0)
    for j, b in zip(js, before):  # the caller's arrays are untouched
        np.testing.assert_array_equal(np.asarray(j), b)


def test_nan_in_a_valid_query_propagates_with_lengths(rng):
    xs, ql, kl = padded_inputs(rng)
    xs[0][1, 3, 6, 2] = np.nan
    out = np.asarray(
        attnhub.attention(
            *(jnp.asarray(x, jnp.float32) for x in xs),
            mask="causal",
            q_lengths=ql,
            k_lengths=kl,
            backend="jax",
        )
    )
    assert np.isnan(out[1, 3, 6]).all()
    assert np.isnan(out).sum() == out.shape[-1]


def test_nan_in_a_valid_value_propagates_with_lengths(rng):
    """An attended key's NaN value reaches every row attending it (Full: all valid rows)."""
    xs, ql, kl = padded_inputs(rng)
    xs[2][1, 0, 4, 1] = np.nan
    out = np.asarray(
        attnhub.attention(
            *(jnp.asarray(x, jnp.float32) for x in xs), mask=Full(), q_lengths=ql, k_lengths=kl, backend="jax"
        )
    )
    assert np.isnan(out[1, :2, :, 1]).all()  # query heads 0 and 1 read kv head 0
    assert not np.isnan(out[0]).any() and not np.isnan(out[1, 2:]).any()


def test_nan_in_unused_paged_cache_rows(rng):
    """Rows past k_lengths[b] inside a block in use, and blocks no entry reads, hold NaN."""
    b, hq, hkv, d, bs = 2, 4, 2, 8, 4
    q = rounded(rng, (b, hq, 2, d))
    kc, vc = rounded(rng, (8, bs, hkv, d)), rounded(rng, (8, bs, hkv, d))
    table = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    klens = np.array([6, 10])
    ref = attnhub.attention_kvcache(q, kc, vc, klens, block_table=table, backend="reference")
    for cache in (kc, vc):
        cache[1, 2:] = np.nan  # entry 0: keys 6, 7 (block 1 is in use)
        cache[5, 2:] = np.nan  # entry 1: key 10, 11
        cache[2] = np.nan  # entry 0's third block: past its length
        cache[6:] = np.nan  # never referenced
    js = [jnp.asarray(x, jnp.float32) for x in (q, kc, vc)]
    out = attnhub.attention_kvcache(*js, jnp.asarray(klens), block_table=jnp.asarray(table), backend="jax")
    assert err(out, ref) < TOL["float32"][0]


# ---- item 4: softcap beyond the compute dtype's range ------------------------------------------
@pytest.mark.parametrize(
    "dtype,cap",
    [
        ("float32", 1e300),
        ("float32", 1e39),  # above float32's max, below 2**12 times it: not the identity
        ("float32", 3e38),
        ("float16", 1e30),
        ("bfloat16", 1e300),
        ("float64", 1e300),
        ("float32", 20.0),
    ],
)
def test_huge_softcap_is_exact(rng, dtype, cap):
    """Forward and gradients against the float64 reference with the same cap."""
    with jax.enable_x64(dtype == "float64"):
        xs = [rounded(rng, (1, 4, 19, 8), dtype, 4.0) for _ in range(3)]
        js = [jnp.asarray(x, numpy_dtype(dtype)) for x in xs]
        dout = rounded(rng, xs[0].shape, dtype)

        def f(q, k, v):
            return attnhub.attention(q, k, v, mask="causal", softcap=cap, backend="jax")

        out = f(*js)
        grads = jax.grad(
            lambda *a: (
                f(*a).astype(jnp.float32 if dtype != "float64" else jnp.float64) * jnp.asarray(dout)
            ).sum(),
            argnums=(0, 1, 2),
        )(*js)
        got = [
            np.asarray(x.astype(jnp.float64 if dtype == "float64" else jnp.float32)) for x in (out, *grads)
        ]
    fwd, bwd = TOL[dtype]
    assert err(got[0], ref_forward(xs, Causal(), softcap=cap)) < fwd
    for g, r in zip(got[1:], ref_grads(xs, Causal(), dout, softcap=cap)):
        assert err(g, r) < bwd


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
    out, lse = attnhub.attention(
        *(jnp.asarray(x, jnp.float32) for x in (q, k, v)),
        softcap=cap,
        scale=1.0,
        return_lse=True,
        backend="jax",
    )
    assert err(out, ref_out) < TOL["float32"][0]
    assert err(lse, ref_lse) < TOL["float32"][0]


# ---- item 3: offsets at the ends of the position range (SPEC §11) ------------------------------
@pytest.mark.parametrize("rule", EDGE_RULES, ids=str)
@pytest.mark.parametrize("qo,ko", EDGE_OFFSETS, ids=EDGE_IDS)
def test_offsets_at_the_ends_of_the_range(rng, monkeypatch, rule, qo, ko):
    monkeypatch.setenv("ATTNHUB_JAX_TILES", "16,16")
    xs = [rounded(rng, (1, 2, 64, 8)), rounded(rng, (1, 2, 80, 8)), rounded(rng, (1, 2, 80, 8))]
    ref = ref_forward(xs, rule, q_offset=qo, k_offset=ko)
    out = attnhub.attention(
        *(jnp.asarray(x, jnp.float32) for x in xs), mask=rule, q_offset=qo, k_offset=ko, backend="jax"
    )
    assert err(out, ref) < TOL["float32"][0]
