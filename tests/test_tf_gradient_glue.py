"""The TensorFlow glue serves any backend: forward_for_grad's saved output and lse's gradient."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import attnhub  # noqa: E402
from attnhub import REGISTRY, Backend, hookimpl  # noqa: E402
from attnhub.request import build_request  # noqa: E402
from attnhub.rules import Causal  # noqa: E402
from attnhub_backends.reference import kernel  # noqa: E402


def _dense_probs(q, k, req):
    s = tf.matmul(q, k, transpose_b=True) * tf.constant(req.scale, q.dtype)
    if isinstance(req.rule, Causal):
        keep = tf.linalg.band_part(tf.ones((req.nq, req.nk)), -1, 0) > 0
        s = tf.where(keep, s, tf.constant(-np.inf, q.dtype))
    lse = tf.reduce_logsumexp(s, axis=-1)
    return s, lse


class DenseTFBackend(Backend):
    """What a third party might write: dense TF forward/backward, forward_for_grad, no ``run``."""

    name = "glue-dense-tf"
    priority = -1000
    frameworks = ("tensorflow",)
    dtypes = ("float32", "float64")
    features = frozenset({"1d", "full", "causal", "lse", "backward", "dlse"})

    def __init__(self):
        self.saved = []
        self.backward_outs = []

    def forward(self, q, k, v, req, mask=None, operands=None):
        s, lse = _dense_probs(q, k, req)
        p = tf.exp(s - lse[..., None])
        return tf.matmul(p, v), lse

    def forward_for_grad(self, q, k, v, req, mask=None, operands=None):
        out, lse = self.forward(q, k, v, req, mask)
        saved = tf.identity(out)
        self.saved.append(saved)
        return out, lse, saved

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        self.backward_outs.append(out)
        s, _ = _dense_probs(q, k, req)
        p = tf.exp(s - lse[..., None])
        dp = tf.matmul(dout, v, transpose_b=True)
        delta = tf.reduce_sum(dout * out, axis=-1, keepdims=True)
        if dlse is not None:
            delta = delta - dlse[..., None]
        ds = p * (dp - delta) * tf.constant(req.scale, q.dtype)
        return tf.matmul(ds, k), tf.matmul(ds, q, transpose_a=True), tf.matmul(p, dout, transpose_a=True)


class NoDlseBackend(DenseTFBackend):
    """A backend whose backward cannot fold ``dlse``: it does not declare the feature, and the glue
    never hands it one."""

    name = "glue-dense-tf-no-dlse"
    features = DenseTFBackend.features - {"dlse"}

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        assert dlse is None, "the glue gave dlse to a backend that does not declare it"
        return super().backward(q, k, v, out, lse, dout, req, mask, operands)


class Plugin:
    def __init__(self):
        self.dense, self.old = DenseTFBackend(), NoDlseBackend()

    @hookimpl
    def attnhub_backends(self):
        return [self.dense, self.old]


@pytest.fixture
def plugin():
    p = Plugin()
    REGISTRY.register_plugin(p)
    yield p
    REGISTRY.unregister_plugin(p)


def _inputs(rng, n=7, d=4):
    return [rng.standard_normal((2, 3, n, d)) for _ in range(3)]


def _reference_grads(q, k, v, wo, wl, mask):
    """The reference kernel's analytic gradient of sum(out*wo) + sum(lse*wl) (float64)."""
    req, _ = build_request(q, k, v, mask, "none_front", None, "bhsd", False)
    return kernel.backward(q, k, v, wo, req, None, wl)


def _tf_grads(q, k, v, wo, wl, mask, backend, dtype=tf.float64):
    qt, kt, vt = (tf.constant(x, dtype) for x in (q, k, v))
    with tf.GradientTape() as tape:
        tape.watch([qt, kt, vt])
        out, lse = attnhub.attention(qt, kt, vt, mask=mask, backend=backend, return_lse=True)
        loss = tf.reduce_sum(out * tf.cast(wo, dtype))
        if wl is not None:
            loss += tf.reduce_sum(lse * tf.cast(wl, lse.dtype))
    return [g.numpy() for g in tape.gradient(loss, [qt, kt, vt])]


@pytest.mark.parametrize("mask", [None, "causal"])
def test_any_backend_gets_gradients_through_lse(plugin, mask):
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng)
    wo, wl = rng.standard_normal((2, 3, 7, 4)), rng.standard_normal((2, 3, 7))
    want = _reference_grads(q, k, v, wo, wl, mask)
    got = _tf_grads(q, k, v, wo, wl, mask, "glue-dense-tf")
    for name, g, w in zip("qkv", got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10, err_msg=f"d{name}")
    # The lse term matters: without it the gradient differs.
    without = _reference_grads(q, k, v, wo, np.zeros_like(wl), mask)
    assert not np.allclose(got[0], without[0])


def test_backward_receives_forward_for_grads_saved_output(plugin):
    rng = np.random.default_rng(2)
    q, k, v = _inputs(rng)
    wo = rng.standard_normal((2, 3, 7, 4))
    _tf_grads(q, k, v, wo, None, None, "glue-dense-tf")
    assert len(plugin.dense.saved) == 1 and len(plugin.dense.backward_outs) == 1
    assert plugin.dense.backward_outs[0] is plugin.dense.saved[0]


def test_gradients_through_lse_in_tf_function(plugin):
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng)
    wo, wl = rng.standard_normal((2, 3, 7, 4)), rng.standard_normal((2, 3, 7))

    @tf.function
    def grads(qt, kt, vt):
        with tf.GradientTape() as tape:
            tape.watch([qt, kt, vt])
            out, lse = attnhub.attention(qt, kt, vt, mask="causal", backend="glue-dense-tf", return_lse=True)
            loss = tf.reduce_sum(out * wo) + tf.reduce_sum(lse * wl)
        return tape.gradient(loss, [qt, kt, vt])

    got = grads(*(tf.constant(x) for x in (q, k, v)))
    want = _reference_grads(q, k, v, wo, wl, "causal")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-9, atol=1e-10)


def test_backend_without_dlse_still_gets_output_gradients(plugin):
    assert "dlse" in plugin.dense.features and "dlse" not in plugin.old.features
    rng = np.random.default_rng(4)
    q, k, v = _inputs(rng)
    wo = rng.standard_normal((2, 3, 7, 4))
    got = _tf_grads(q, k, v, wo, None, "causal", "glue-dense-tf-no-dlse")
    want = _reference_grads(q, k, v, wo, np.zeros((2, 3, 7)), "causal")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("backend", ["tf", "reference"])
def test_shipped_backends_gradients_through_lse(backend):
    """The tf backend (no ``run`` override) and the reference backend take dlse through the glue."""
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, n=9)
    wo, wl = rng.standard_normal((2, 3, 9, 4)), rng.standard_normal((2, 3, 9))
    want = _reference_grads(q, k, v, wo, wl, "causal")
    got = _tf_grads(q, k, v, wo, wl, "causal", backend)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10)


def test_tf_backend_has_no_run_of_its_own():
    """Its gradients come from attnhub's tf.custom_gradient glue (attnhub/glue/run.py)."""
    from attnhub_backends.tf.backend import TFBackend

    assert not hasattr(TFBackend, "run")
    assert "dlse" in TFBackend.features


def test_backend_without_dlse_fails_when_the_loss_uses_lse(plugin):
    """SPEC §5: lse's gradient is never dropped: a backend that cannot take it fails the gradient
    (eagerly and in a tf.function) instead of leaving lse's term out."""
    rng = np.random.default_rng(6)
    q, k, v = _inputs(rng)
    wo, wl = rng.standard_normal((2, 3, 7, 4)), rng.standard_normal((2, 3, 7))
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot differentiate lse"):
        _tf_grads(q, k, v, wo, wl, "causal", "glue-dense-tf-no-dlse")

    @tf.function
    def grads(qt, kt, vt):
        with tf.GradientTape() as tape:
            tape.watch([qt, kt, vt])
            out, lse = attnhub.attention(qt, kt, vt, backend="glue-dense-tf-no-dlse", return_lse=True)
            loss = tf.reduce_sum(out * wo) + tf.reduce_sum(lse * wl)
        return tape.gradient(loss, [qt, kt, vt])

    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot differentiate lse"):
        grads(*(tf.constant(x) for x in (q, k, v)))
