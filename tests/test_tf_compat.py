"""attnhub.tf: tf_flash_attention's six functions equal attnhub.attention on the same rule, and
their l and m mean what the CUDA kernel's do (max scaled logit, sum of exp(logit - m))."""

from __future__ import annotations

import numpy as np
import pytest

import attnhub
from attnhub import Causal, Full, Local, SpecError
from attnhub.positions import dense_rule_mask

tf = fa = None  # imported by the fixture below, not at collection (see test_tf_backend.py)


@pytest.fixture(autouse=True, scope="module")
def _tensorflow():
    global tf, fa
    tf = pytest.importorskip("tensorflow")
    import attnhub.tf as fa


def _dense_l_m(Q, K, rule, sync, ndim):
    """(l, m) by the definition, from the dense masked logits (NumPy float64, small sizes)."""
    q = np.asarray(Q, np.float64)
    k = np.asarray(K, np.float64)
    c = q.shape[-ndim - 1]
    sq, sk = q.shape[-ndim:], k.shape[-ndim:]
    qf = q.reshape(*q.shape[: -ndim - 1], c, -1)
    kf = k.reshape(*k.shape[: -ndim - 1], c, -1)
    s = np.einsum("...cq,...ck->...qk", qf, kf) / np.sqrt(c)
    keep = dense_rule_mask(rule, tuple(sq), tuple(sk), sync)
    s = np.where(keep, s, -np.inf)
    m = s.max(-1)
    with np.errstate(invalid="ignore"):
        l = np.where(np.isneginf(m), 0.0, np.exp(s - np.where(np.isneginf(m), 0, m)[..., None]).sum(-1))
    shape = q.shape[: -ndim - 1] + tuple(sq)
    return l.reshape(shape), m.reshape(shape)


CALLS = [
    ("full_1d", 1, Full(), {}),
    ("causal_1d", 1, Causal(), {}),
    ("local_1d", 1, Local(4, 1, True), {"window_size": 4, "log2_stride_size": 1, "is_causal": True}),
    ("full_2d", 2, Full(), {}),
    ("causal_2d", 2, Causal(), {}),
    ("local_2d", 2, Local(2), {"window_size": 2, "log2_stride_size": 0, "is_causal": False}),
]


@pytest.mark.parametrize("name,ndim,rule,extra", CALLS, ids=[c[0] for c in CALLS])
@pytest.mark.parametrize("sync", ["none_front", "scale_front", "scale_end"])
def test_compat_equals_attention_and_l_m_definition(name, ndim, rule, extra, sync):
    rng = np.random.default_rng(0)
    batch = (2, 3)  # batch_shape of rank 2 (heads included)
    sq, sk = ((24,), (36,)) if ndim == 1 else ((4, 6), (8, 6))
    Q = rng.standard_normal((*batch, 8, *sq))
    K = rng.standard_normal((*batch, 8, *sk))
    V = rng.standard_normal((*batch, 5, *sk))
    fn = getattr(fa, name)
    args = dict(extra, sync_mode=sync)
    O = fn(tf.constant(Q), tf.constant(K), tf.constant(V), **args)
    O2, l, m = fn(tf.constant(Q), tf.constant(K), tf.constant(V), returning_l_m=True, **args)
    assert tuple(O.shape) == (*batch, 5, *sq) and tuple(l.shape) == (*batch, *sq) == tuple(m.shape)
    np.testing.assert_array_equal(O.numpy(), O2.numpy())
    # same rule through attnhub.attention, layout bhds with batch_shape flattened into B
    flat = lambda x: tf.constant(x.reshape(6, 1, *x.shape[2:]))  # noqa: E731
    want = attnhub.attention(flat(Q), flat(K), flat(V), mask=rule, sync=sync, layout="bhds")
    np.testing.assert_allclose(O.numpy().reshape(want.shape), want.numpy(), rtol=1e-12, atol=1e-12)
    dl, dm = _dense_l_m(Q, K, rule, sync, ndim)
    np.testing.assert_array_equal(np.isneginf(m.numpy()), np.isneginf(dm))
    fin = np.isfinite(dm)
    np.testing.assert_allclose(m.numpy()[fin], dm[fin], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(l.numpy(), dl, rtol=1e-10, atol=1e-12)


def test_float16_dtypes_and_default_sync():
    rng = np.random.default_rng(1)
    Q, K, V = (tf.constant(rng.standard_normal((4, 16, 40)), tf.float16) for _ in range(3))
    O, l, m = fa.full_1d(Q, K, V, returning_l_m=True)  # sync_mode defaults to none_front
    assert O.dtype == tf.float16 and l.dtype == tf.float32 and m.dtype == tf.float16
    want = attnhub.attention(Q[:, None], K[:, None], V[:, None], layout="bhds")[:, 0]
    np.testing.assert_allclose(O.numpy().astype(np.float32), want.numpy().astype(np.float32), atol=2e-3)


def test_gradient_flows_through_O_only():
    rng = np.random.default_rng(2)
    Q, K, V = (tf.constant(rng.standard_normal((2, 4, 10))) for _ in range(3))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([Q, K, V])
        O, l, m = fa.causal_1d(Q, K, V, "none_front", returning_l_m=True)
        lm = tf.reduce_sum(l) + tf.reduce_sum(m)
        total = tf.reduce_sum(O)
    assert all(g is None for g in tape.gradient(lm, [Q, K, V]))
    dq, dk, dv = tape.gradient(total, [Q, K, V])
    with tf.GradientTape() as tape2:
        tape2.watch([Q, K, V])
        ref = tf.reduce_sum(
            attnhub.attention(Q[:, None], K[:, None], V[:, None], mask="causal", layout="bhds")
        )
    for a, b in zip((dq, dk, dv), tape2.gradient(ref, [Q, K, V])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)


def test_fully_masked_rows_give_l_zero_m_neg_inf():
    rng = np.random.default_rng(3)
    # scale_front, Lq=4 on an 8-grid: queries at 0,2,4,6; keys at 4..7 (Lk=4, none_end-like via local)
    Q = tf.constant(rng.standard_normal((1, 4, 8)))
    K = tf.constant(rng.standard_normal((1, 4, 4)))
    V = tf.constant(rng.standard_normal((1, 3, 4)))
    # none_front, stride 2, window 1: query i attends key j only when i == j; queries 4..7 see nothing
    O, l, m = fa.local_1d(Q, K, V, 1, 1, False, "none_front", returning_l_m=True)
    assert np.all(O.numpy()[..., 4:] == 0) and np.all(l.numpy()[..., 4:] == 0)
    assert np.all(np.isneginf(m.numpy()[..., 4:])) and np.all(np.isfinite(m.numpy()[..., :4]))


def test_bad_batch_shapes_raise_spec_error():
    Q = tf.zeros((2, 3, 4, 10))
    with pytest.raises(SpecError, match="batch shape of K"):
        fa.full_1d(Q, tf.zeros((2, 4, 4, 10)), tf.zeros((2, 3, 4, 10)))
    with pytest.raises(SpecError, match="window"):
        fa.local_2d(
            tf.zeros((1, 4, 3, 3)), tf.zeros((1, 4, 3, 3)), tf.zeros((1, 4, 3, 3)), 0, 0, False, "none_front"
        )


@pytest.mark.parametrize("jit", [False, True])
def test_compat_inside_tf_function(jit):
    rng = np.random.default_rng(4)
    Q, K, V = (tf.constant(rng.standard_normal((2, 8, 6, 5)), tf.float32) for _ in range(3))
    f = tf.function(lambda Q, K, V: fa.local_2d(Q, K, V, 2, 0, True, "scale_end", True), jit_compile=jit)
    for got, want in zip(f(Q, K, V), fa.local_2d(Q, K, V, 2, 0, True, "scale_end", True)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
