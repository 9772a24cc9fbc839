"""SPEC §9 "A gradient is never dropped", and empty work under autograd (SPEC §4, §7).

A request whose float mask (or bias) is differentiated goes only to backends that compute its
gradient ("dbias"); the others decline it with the SPEC §9 reason.
"""

import numpy as np
import pytest

import attnhub
from attnhub import BackendUnsupported

torch = pytest.importorskip("torch")


def tqkv(requires_grad=True, lk=5):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, lk, 8, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, lk, 8, generator=g, dtype=torch.float64)
    return [x.requires_grad_(requires_grad) for x in (q, k, v)]


def _dense_grads(q, k, v, bias):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
    out = torch.softmax(s, -1) @ v
    return torch.autograd.grad(out.sum(), (q, k, v, bias))


def test_torch_bias_that_requires_grad_gets_its_gradient_or_is_declined():
    q, k, v = tqkv()
    bias = torch.randn(1, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    attnhub.attention(q, k, v, mask=bias.detach())  # a cached plan without grad must not be reused
    for kw in ({"mask": bias}, {"bias": bias}):
        got = torch.autograd.grad(attnhub.attention(q, k, v, **kw).sum(), (q, k, v, bias))
        for g, w in zip(got, _dense_grads(q, k, v, bias)):
            assert torch.allclose(g, w, atol=1e-12)
    exp = attnhub.explain(q, k, v, mask=bias)
    chosen = attnhub.REGISTRY.backends()[exp.chosen]
    assert "dbias" in chosen.features and "bias-grad" in exp.request.describe()
    # A backend that takes a bias but not its gradient declines it, with SPEC §9's reason.
    plugin = _NoDbiasPlugin()
    attnhub.REGISTRY.register_plugin(plugin)
    try:
        declined = dict((v.name, v.reasons) for v in attnhub.explain(q, k, v, mask=bias).verdicts)
        assert any("SPEC §9" in r for r in declined["no-dbias-test"])
        with pytest.raises(BackendUnsupported, match="SPEC §9"):
            attnhub.attention(q, k, v, mask=bias, backend="no-dbias-test")
        attnhub.attention(q, k, v, mask=bias.detach(), backend="no-dbias-test")  # no grad: served
    finally:
        attnhub.REGISTRY.unregister_plugin(plugin)


class _NoDbias(attnhub.Backend):
    """Takes a bias (through torch's fused CPU kernel) but computes no gradient for it."""

    name = "no-dbias-test"
    priority = -1
    frameworks = ("torch",)
    features = frozenset({"1d", "full", "causal", "explicit_mask", "bias", "backward"})

    def run(self, q, k, v, req, mask=None, operands=None):
        bias = operands.bias if operands is not None else mask
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.detach()), None


class _NoDbiasPlugin:
    @attnhub.hookimpl
    def attnhub_backends(self):
        return [_NoDbias()]


def test_bias_without_grad_still_runs():
    q, k, v = tqkv()
    bias = torch.zeros(1, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        attnhub.attention(q, k, v, mask=bias)
    attnhub.attention(q, k, v, mask=bias.detach()).sum().backward()
    assert q.grad is not None
    attnhub.attention(q, k, v, mask=bias.detach() > 0)  # bool masks have no gradient


def test_patch_sdpa_computes_the_gradient_of_a_bias():
    from attnhub.torch import patch_sdpa, reset_sdpa_stats, sdpa_stats, unpatch_sdpa

    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = tqkv()
    bias = torch.randn(1, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    sdpa(q, k, v, attn_mask=bias).sum().backward()
    want = bias.grad.clone()
    bias.grad = None
    patch_sdpa()
    reset_sdpa_stats()
    try:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        out.sum().backward()
        stats = sdpa_stats()
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.detach())
        routed = sdpa_stats()
    finally:
        unpatch_sdpa()
    assert bias.grad is not None and torch.allclose(bias.grad, want)
    assert stats.get("routed") == 1 and not any(k.startswith("fallback") for k in stats)
    assert routed.get("routed") == 2


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("empty", ["lk", "lq", "batch"])
def test_empty_work_is_connected_to_autograd(empty, return_lse):
    q, k, v = tqkv(lk=0 if empty == "lk" else 5)
    if empty == "lq":
        q = q.detach()[:, :, :0].requires_grad_()
    if empty == "batch":
        q, k, v = (x.detach()[:0].requires_grad_() for x in (q, k, v))
    bias = torch.zeros(1, 2, q.shape[2], k.shape[2], dtype=torch.float64, requires_grad=True)
    for mask in (None, bias):
        if empty == "batch" and mask is not None:
            continue
        res = attnhub.attention(q, k, v, mask=mask, return_lse=return_lse)
        out = res[0] if return_lse else res
        assert out.grad_fn is not None
        out.sum().backward()
        for x in (q, k, v) if mask is None else (q, k, v, bias):
            assert x.grad is not None and x.grad.shape == x.shape and not x.grad.any()
            x.grad = None


def test_tf_empty_work_gives_zero_gradients():
    tf = pytest.importorskip("tensorflow")
    q = tf.random.normal((1, 2, 4, 8))
    k = tf.zeros((1, 2, 0, 8))
    with tf.GradientTape() as tape:
        tape.watch([q, k])
        out = attnhub.attention(q, k, k)
    dq, dk = tape.gradient(out, [q, k])
    assert dq is not None and not np.any(dq.numpy()) and dk.shape == k.shape


def test_tf_bias_watched_by_a_tape_gets_its_gradient_or_is_declined():
    tf = pytest.importorskip("tensorflow")
    q = tf.random.normal((1, 2, 4, 8), dtype=tf.float64)
    bias = tf.Variable(tf.random.normal((1, 2, 4, 4), dtype=tf.float64))
    attnhub.attention(q, q, q, mask=tf.zeros((1, 2, 4, 4), dtype=tf.float64))
    with tf.GradientTape() as tape:  # eagerly: the reference computes dbias
        out = attnhub.attention(q, q, q, mask=bias)
    got = tape.gradient(out, bias)
    with tf.GradientTape() as tape:
        want_out = tf.nn.softmax(tf.matmul(q, q, transpose_b=True) / 8**0.5 + bias) @ q
    want = tape.gradient(want_out, bias)
    assert got is not None and np.allclose(got.numpy(), want.numpy(), atol=1e-12)
    attnhub.attention(q, q, q, mask=tf.convert_to_tensor(bias))  # not watched: runs
    q = tf.cast(q, tf.float32)

    @tf.function
    def step(q, b):
        with tf.GradientTape() as tape:
            tape.watch(b)
            out = attnhub.attention(q, q, q, mask=b, backend="tf")
        return tape.gradient(out, b)

    b32 = tf.cast(bias, tf.float32)  # the tf backend computes dbias inside tf.function too
    got = step(q, b32)
    with tf.GradientTape() as tape:
        tape.watch(b32)
        want_out = tf.nn.softmax(tf.matmul(q, q, transpose_b=True) / 8**0.5 + b32) @ q
    want = tape.gradient(want_out, b32)
    assert got is not None and np.allclose(got.numpy(), want.numpy(), atol=1e-5)


def test_jax_bias_gradient_is_computed_eagerly_and_through_jit():
    """The jax backend declares "dbias": a differentiated mask/bias gets its gradient, eagerly
    and under grad of jit (before it did, both were refused, never zero)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, 2, 4, 8)).astype(np.float32))
    bias = jnp.asarray(rng.standard_normal((1, 2, 4, 4)).astype(np.float32))

    def loss(q, b):
        return (attnhub.attention(q, q, q, mask=b) ** 2).sum()

    def dense(q, b):
        p = jax.nn.softmax(q @ jnp.swapaxes(q, -1, -2) / np.sqrt(8.0) + b, axis=-1)
        return ((p @ q) ** 2).sum()

    want = jax.grad(dense, argnums=1)(q, bias)
    for got in (jax.grad(loss, argnums=1)(q, bias), jax.grad(jax.jit(loss), argnums=1)(q, bias)):
        assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
    g = jax.grad(jax.jit(loss))(q, bias)  # only q differentiated through jit: fine
    assert g.shape == q.shape
