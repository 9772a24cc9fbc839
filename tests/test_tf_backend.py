"""The ``tf`` backend against the float64 reference: rules, sync modes, 1-d/2-d, GQA, dtypes, masks,
tf.function and XLA, gradients (reference backward and tf.test.compute_gradient), tiling plan."""

from __future__ import annotations

import numpy as np
import pytest

import attnhub
from attnhub import Causal, Full, Local, SpecError
from attnhub.operands import Operands
from attnhub.request import build_request
from attnhub_backends.reference import kernel as ref
from attnhub_backends.tf import tiles

tf = None  # imported by the fixture below, not at collection: TensorFlow loaded before triton
# makes triton's LLVM abort the process ("Option ... registered more than once")


@pytest.fixture(autouse=True, scope="module")
def _tensorflow():
    global tf
    tf = pytest.importorskip("tensorflow")


SYNCS = ("none_front", "scale_front", "scale_end", "none_end")
FWD_TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
GRAD_TOL = {"float64": 1e-9, "float32": 1e-4, "float16": 8e-3, "bfloat16": 4e-2}


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Small tiles so that short test sequences cross many tiles (and skip some)."""
    monkeypatch.setattr(tiles, "BLOCK_Q", 16)
    monkeypatch.setattr(tiles, "BLOCK_K", 24)


def _inputs(rng, b, hq, hkv, sq, sk, dqk, dv, dtype="float64", big=False):
    q = rng.standard_normal((b, hq, *sq, dqk)) * (8.0 if big else 1.0)
    k = rng.standard_normal((b, hkv, *sk, dqk))
    v = rng.standard_normal((b, hkv, *sk, dv))
    np_dtype = tf.dtypes.as_dtype(dtype).as_numpy_dtype
    q, k, v = (x.astype(np_dtype) for x in (q, k, v))  # rounded to the test dtype
    return q, k, v


def _flat(x):
    return np.asarray(x, np.float64).reshape(x.shape[0], x.shape[1], -1, x.shape[-1])


def _reference(q, k, v, rule, sync, dout=None, mask=None):
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    req, _ = build_request(q64, k64, v64, rule if mask is None else mask, sync, None, "bhsd", False)
    m = (
        None
        if mask is None
        else np.asarray(mask).reshape(req.bias if req.bias is not None else req.rule.shape)
    )
    # A float mask is the bias (SPEC §9): it travels as an operand, a boolean one as the mask.
    ops = Operands(bias=m) if req.bias is not None else None
    m = None if ops is not None else m
    out, lse = ref.forward(_flat(q64), _flat(k64), _flat(v64), req, m, ops)
    grads = None
    if dout is not None:
        d = _flat(np.asarray(dout, np.float64))
        grads = ref.backward(_flat(q64), _flat(k64), _flat(v64), d, req, m, None, ops)[:3]
    return out, lse.reshape(req.batch, req.heads_q, -1), grads


def _errs(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(np.abs(want).max(), 1e-30)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30), np.abs(got - want).max() / scale


def _assert_close(got, want, tol, what=""):
    rel, mx = _errs(got, want)
    assert rel < tol and mx < tol, f"{what}: rel {rel:.2e} max {mx:.2e} tol {tol:.0e}"


def _check_lse(lse, ref_lse, tol):
    lse = np.asarray(lse, np.float64).reshape(ref_lse.shape)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    if fin.any():
        _assert_close(lse[fin], ref_lse[fin], tol, "lse")


CASES = [
    ((40,), (56,), Full()),
    ((50,), (50,), Causal()),
    ((70,), (35,), Causal()),
    ((64,), (96,), Local(5)),
    ((64,), (96,), Local(4, 1, True)),
    ((9, 7), (6, 14), Causal()),
    ((10, 8), (10, 8), Local((3, 2))),
    ((12, 10), (6, 5), Local(2, 1, True)),
]


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("sq,sk,rule", CASES, ids=[f"{a}-{b}-{r.describe()}" for a, b, r in CASES])
def test_forward_float64_matches_reference(sq, sk, rule, sync):
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng, 2, 4, 2, sq, sk, 8, 5)
    out, lse = attnhub.attention(
        *map(tf.constant, (q, k, v)), mask=rule, sync=sync, backend="tf", return_lse=True
    )
    ro, rl, _ = _reference(q, k, v, rule, sync)
    assert out.dtype == tf.float64 and lse.dtype == tf.float64
    assert tuple(out.shape) == (2, 4, *sq, 5) and tuple(lse.shape) == (2, 4, *sq)
    _assert_close(_flat(out.numpy()), ro, FWD_TOL["float64"], "out")
    _check_lse(lse.numpy(), rl, FWD_TOL["float64"])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("big", [False, True])
def test_forward_low_precision(dtype, big):
    rng = np.random.default_rng(2)
    rule = Local(6, causal=True)
    q, k, v = _inputs(rng, 1, 4, 1, (80,), (80,), 16, 16, dtype, big)
    tq, tk, tv = (tf.constant(x) for x in (q, k, v))
    out, lse = attnhub.attention(tq, tk, tv, mask=rule, backend="tf", return_lse=True)
    assert out.dtype == tf.as_dtype(dtype) and lse.dtype == tf.float32
    ro, rl, _ = _reference(q, k, v, rule, "none_front")
    _assert_close(_flat(out.numpy()), ro, FWD_TOL[dtype], "out")
    _check_lse(lse.numpy(), rl, FWD_TOL[dtype])


def test_fully_masked_rows_zero_out_neg_inf_lse_zero_grads():
    rng = np.random.default_rng(3)
    # none_end, Lq=40 > Lk=20: queries 0..19 sit before every key, so causal masks them fully
    q, k, v = _inputs(rng, 1, 2, 2, (40,), (20,), 8, 8)
    tq, tk, tv = (tf.constant(x) for x in (q, k, v))
    with tf.GradientTape() as tape:
        tape.watch([tq, tk, tv])
        out, lse = attnhub.attention(
            tq, tk, tv, mask="causal", sync="none_end", backend="tf", return_lse=True
        )
        loss = tf.reduce_sum(out * out)
    dq, dk, dv = tape.gradient(loss, [tq, tk, tv])
    assert np.all(out.numpy()[:, :, :20] == 0) and np.all(np.isneginf(lse.numpy()[:, :, :20]))
    assert np.all(np.isfinite(out.numpy())) and np.all(np.isfinite(lse.numpy()[:, :, 20:]))
    assert np.all(dq.numpy()[:, :, :20] == 0)
    for g in (dq, dk, dv):
        assert np.all(np.isfinite(g.numpy()))
    ro, rl, _ = _reference(q, k, v, Causal(), "none_end")
    _assert_close(_flat(out.numpy()), ro, 1e-10)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_explicit_masks(kind):
    rng = np.random.default_rng(4)
    q, k, v = _inputs(rng, 2, 4, 2, (30,), (50,), 8, 6)
    if kind == "bool":
        mask = rng.random((2, 1, 30, 50)) < 0.3
        mask[:, :, 3] = False  # a fully masked row
    else:
        mask = rng.standard_normal((1, 4, 30, 50))
        mask[..., 5, :] = -np.inf
    out, lse = attnhub.attention(
        *map(tf.constant, (q, k, v)), mask=tf.constant(mask), backend="tf", return_lse=True
    )
    ro, rl, _ = _reference(q, k, v, None, "none_front", mask=mask)
    _assert_close(_flat(out.numpy()), ro, 1e-10)
    _check_lse(lse.numpy(), rl, 1e-10)


@pytest.mark.parametrize("jit", [False, True])
def test_tf_function_and_xla_match_eager(jit):
    rng = np.random.default_rng(5)
    q, k, v = (tf.constant(x) for x in _inputs(rng, 1, 4, 2, (8, 9), (8, 9), 8, 8, "float32"))
    rule = Local(3, causal=True)

    @tf.function(jit_compile=jit)
    def f(q, k, v):
        return attnhub.attention(q, k, v, mask=rule, return_lse=True)

    out, lse = f(q, k, v)
    eo, el = attnhub.attention(q, k, v, mask=rule, backend="tf", return_lse=True)
    np.testing.assert_allclose(out.numpy(), eo.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse.numpy(), el.numpy(), rtol=1e-5, atol=1e-6)


def test_auto_dispatch_picks_tf_inside_tf_function():
    q = tf.constant(np.random.default_rng(6).standard_normal((1, 2, 10, 4)))
    assert attnhub.explain(q, q, q).chosen == "tf"

    @tf.function
    def f(x):
        return attnhub.explain(x, x, x).chosen

    assert f.python_function(q) == "tf"


def test_unknown_dims_raise_actionable_error():
    @tf.function(input_signature=[tf.TensorSpec((None, 2, 10, 4), tf.float32)])
    def f(x):
        return attnhub.attention(x, x, x, backend="tf")

    # autograph may wrap the SpecError in a StagingError that carries its message
    with pytest.raises(Exception, match="fully known static shape") as info:
        f.get_concrete_function()
    assert isinstance(info.value, SpecError) or "SpecError" in str(info.value)


def _grads(q, k, v, dout, rule, sync, jit=None, mask=None):
    tq, tk, tv = (tf.constant(x) for x in (q, k, v))

    def step(tq, tk, tv):
        with tf.GradientTape() as tape:
            tape.watch([tq, tk, tv])
            out = attnhub.attention(tq, tk, tv, mask=rule if mask is None else mask, sync=sync, backend="tf")
        return tape.gradient(out, [tq, tk, tv], output_gradients=tf.constant(dout))

    if jit is not None:
        step = tf.function(step, jit_compile=jit)
    return step(tq, tk, tv)


GRAD_CASES = [
    ((40,), (56,), Full(), "none_front"),
    ((60,), (30,), Causal(), "scale_end"),
    ((64,), (64,), Local(5, 1, True), "none_end"),
    ((9, 7), (6, 14), Local((2, 3)), "scale_front"),
]


@pytest.mark.parametrize("sq,sk,rule,sync", GRAD_CASES, ids=[c[2].describe() for c in GRAD_CASES])
@pytest.mark.parametrize("jit", [None, True])
def test_gradients_float64_match_reference(sq, sk, rule, sync, jit):
    rng = np.random.default_rng(7)
    q, k, v = _inputs(rng, 2, 4, 2, sq, sk, 8, 5)
    dout = rng.standard_normal((2, 4, *sq, 5))
    got = _grads(q, k, v, dout, rule, sync, jit)
    _, _, want = _reference(q, k, v, rule, sync, dout)
    for name, g, w in zip("qkv", got, want):
        _assert_close(_flat(g.numpy()), w, GRAD_TOL["float64"], f"d{name}")


def test_gradients_with_explicit_mask_and_float32():
    rng = np.random.default_rng(8)
    q, k, v = _inputs(rng, 1, 2, 1, (33,), (41,), 8, 8, "float32")
    mask = rng.random((1, 1, 33, 41)) < 0.5
    dout = rng.standard_normal((1, 2, 33, 8)).astype(np.float32)
    got = _grads(q, k, v, dout, None, "none_front", mask=tf.constant(mask))
    _, _, want = _reference(q, k, v, None, "none_front", dout, mask=mask)
    for name, g, w in zip("qkv", got, want):
        _assert_close(_flat(g.numpy()), w, GRAD_TOL["float32"], f"d{name}")


def test_compute_gradient_including_lse():
    """tf.test.compute_gradient (finite differences) on out and lse together."""
    rng = np.random.default_rng(9)
    q, k, v = (tf.constant(x) for x in _inputs(rng, 1, 2, 1, (20,), (30,), 4, 3))
    wo = tf.constant(rng.standard_normal((1, 2, 20, 3)))
    wl = tf.constant(rng.standard_normal((1, 2, 20)))
    rule = Local(4, causal=True)

    def f(q, k, v):
        out, lse = attnhub.attention(q, k, v, mask=rule, sync="scale_front", backend="tf", return_lse=True)
        return tf.reduce_sum(out * wo) + tf.reduce_sum(tf.where(tf.math.is_finite(lse), lse, 0.0) * wl)

    theoretical, numerical = tf.test.compute_gradient(f, [q, k, v])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-7)


def test_plan_skips_masked_tiles_and_bounds_work():
    big = np.zeros((1, 1, 8192, 64), np.float32)
    req, _ = build_request(big, big, big, Local(128), "none_front", None, "bhsd", False)
    plan = tiles.plan_for(req, 256, 512)
    assert plan.computed_pairs <= 8192 * 8192 / 8
    req, _ = build_request(big, big, big, Causal(), "none_front", None, "bhsd", False)
    plan = tiles.plan_for(req, 256, 512)
    assert plan.computed_pairs <= 0.55 * 8192 * 8192
    # only diagonal tiles need an element mask
    partial = sum(not t.full for b in plan.blocks for t in b.tiles)
    assert partial == 8192 // 256  # one diagonal tile per row block


@pytest.mark.parametrize("rule", [Causal(), Local(3), Local(2, 1, True), Local((2, 4), 2)])
@pytest.mark.parametrize("sync", SYNCS)
def test_plan_classification_is_exact(rule, sync):
    """Skipped tiles hold no attended pair, full tiles no masked one (against the dense mask)."""
    from attnhub.positions import dense_rule_mask

    sq, sk = (12, 9), (6, 18)
    q = np.zeros((1, 1, *sq, 2))
    k = np.zeros((1, 1, *sk, 2))
    req, _ = build_request(q, k, k, rule, sync, None, "bhsd", False)
    plan = tiles.plan_for(req, 7, 11)
    dense = dense_rule_mask(rule, sq, sk, sync)
    seen = np.zeros_like(dense)
    for blk in plan.blocks:
        for t in blk.tiles:
            seen[blk.q0 : blk.q1, t.k0 : t.k1] = True
            if t.full:
                assert dense[blk.q0 : blk.q1, t.k0 : t.k1].all()
    assert not (dense & ~seen).any()


@pytest.mark.parametrize("jit", [None, True])
def test_nan_stays_in_its_row(jit):
    """SPEC §4: NaN propagates to the affected outputs only (blocks are chained through data)."""
    rng = np.random.default_rng(10)
    q, k, v = _inputs(rng, 1, 2, 2, (64,), (64,), 8, 8, "float32")
    q[0, 0, 5, 0] = np.nan

    def f(q, k, v):
        return attnhub.attention(q, k, v, mask="causal", backend="tf")

    if jit is not None:
        f = tf.function(f, jit_compile=jit)
    out = f(*map(tf.constant, (q, k, v))).numpy()
    assert np.isnan(out[0, 0, 5]).all()
    nan_rows = np.isnan(out).any(axis=-1)
    nan_rows[0, 0, 5] = False
    assert not nan_rows.any()
