"""The reference's analytic backward against central finite differences in float64."""

import numpy as np
import pytest

from attnhub.rules import Causal, Full, Local
from attnhub.shapes import request_from_shapes
from attnhub_backends.reference import kernel

CASES = [
    ((1, 2, 5, 4), (1, 1, 7, 4), (1, 1, 7, 3), Causal(), "scale_end"),
    ((2, 2, 6, 3), (2, 2, 6, 3), (2, 2, 6, 5), Full(), "none_front"),
    ((1, 4, 3, 3, 4), (1, 2, 3, 3, 4), (1, 2, 3, 3, 2), Local(2, log2_stride=0, causal=True), "none_front"),
    ((1, 1, 6, 4), (1, 1, 3, 4), (1, 1, 3, 4), Local(1), "none_front"),  # rows 3.. fully masked
]


def loss_and_grads(q, k, v, w, req):
    out, _ = kernel.forward(q, k, v, req)
    grads = kernel.backward(q, k, v, w, req)
    return float((out * w).sum()), grads


@pytest.mark.parametrize(("qs", "ks", "vs", "rule", "sync"), CASES)
def test_backward_matches_finite_differences(qs, ks, vs, rule, sync, rng):
    req = request_from_shapes(qs, ks, vs, dtype="float64", mask=rule, sync=sync)
    flat = lambda x: x.reshape(x.shape[0], x.shape[1], -1, x.shape[-1])  # noqa: E731
    q, k, v = (flat(rng.standard_normal(s)) for s in (qs, ks, vs))
    w = rng.standard_normal((req.batch, req.heads_q, req.nq, req.dim_v))
    _, grads = loss_and_grads(q, k, v, w, req)
    eps = 1e-6
    for which, x in enumerate((q, k, v)):
        numeric = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            orig = x[idx]
            x[idx] = orig + eps
            plus = (kernel.forward(q, k, v, req)[0] * w).sum()
            x[idx] = orig - eps
            minus = (kernel.forward(q, k, v, req)[0] * w).sum()
            x[idx] = orig
            numeric[idx] = (plus - minus) / (2 * eps)
        err = np.abs(grads[which] - numeric).max() / max(np.abs(numeric).max(), 1.0)
        assert err < 1e-7, (which, err)


def test_fully_masked_rows_have_zero_gradient(rng):
    qs, ks = (1, 1, 6, 4), (1, 1, 3, 4)
    req = request_from_shapes(qs, ks, ks, dtype="float64", mask=Local(1))
    q, k, v = rng.standard_normal(qs), rng.standard_normal(ks), rng.standard_normal(ks)
    dq, dk, dv = kernel.backward(q, k, v, rng.standard_normal(qs), req)
    assert np.all(dq[:, :, 3:] == 0) and np.all(np.isfinite(dq)) and np.all(np.isfinite(dk))


def test_torch_autograd_glue_gradcheck():
    torch = pytest.importorskip("torch")
    import attnhub

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(1, 1, 6, 4, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(1, 1, 6, 3, dtype=torch.float64, generator=g, requires_grad=True)
    fn = lambda q, k, v: attnhub.attention(q, k, v, mask="causal", sync="none_end", backend="reference")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_tensorflow_gradient_glue():
    tf = pytest.importorskip("tensorflow")
    import attnhub

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in ((1, 2, 5, 4), (1, 1, 6, 4), (1, 1, 6, 3))]
    q, k, v = (tf.constant(a) for a in arrays)
    w = rng.standard_normal((1, 2, 5, 3))
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = attnhub.attention(q, k, v, mask="causal", backend="reference")
        loss = tf.reduce_sum(out * w)
    got = tape.gradient(loss, [q, k, v])
    req = request_from_shapes(*(a.shape for a in arrays), dtype="float64", mask="causal")
    want = kernel.backward(*arrays, w, req)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.reshape(a.shape), rtol=1e-12, atol=1e-12)
