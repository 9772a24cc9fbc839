"""A gradient through the returned lse is never dropped by the torch glue: a backend declaring
"dlse" gets it (checked against finite differences), any other raises a BackendError naming what
to do; a loss that does not use lse (or detaches it) is unaffected."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnhub  # noqa: E402
from attnhub.backend import Backend  # noqa: E402
from attnhub.errors import BackendError  # noqa: E402
from tests.plugged import plugged_in  # noqa: E402


class NoDlseTorch(Backend):
    """Dense torch attention with a backward that cannot fold dlse (no "dlse" feature)."""

    name = "t_no_dlse"
    priority = -1000
    frameworks = ("torch",)
    features = frozenset({"1d", "full", "causal", "lse", "backward"})

    def forward(self, q, k, v, req, mask=None, operands=None):
        s = req.scale * q @ k.transpose(-1, -2)
        lse = torch.logsumexp(s, -1)
        return torch.softmax(s, -1) @ v, lse

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        assert dlse is None
        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
            o, _ = self.forward(*leaves, req)
            return torch.autograd.grad(o, leaves, dout)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3)]


def test_reference_folds_the_lse_gradient():
    q, k, v = _inputs()
    w = torch.arange(5.0, dtype=torch.float64)

    def loss(qq):
        out, lse = attnhub.attention(qq, k, v, mask="causal", return_lse=True, backend="reference")
        return out.sum() + (lse * w).sum()

    loss(q).backward()
    eps, num = 1e-6, np.zeros(q.shape)
    base = q.detach()
    for idx in np.ndindex(*q.shape):
        hi, lo = base.clone(), base.clone()
        hi[idx] += eps
        lo[idx] -= eps
        with torch.no_grad():
            num[idx] = (loss(hi) - loss(lo)).item() / (2 * eps)
    np.testing.assert_allclose(q.grad.numpy(), num, atol=1e-7)


def test_a_backend_without_dlse_raises_instead_of_dropping_it():
    q, k, v = _inputs(1)
    with plugged_in(NoDlseTorch()):
        out, lse = attnhub.attention(q, k, v, return_lse=True, backend="t_no_dlse")
        with pytest.raises(BackendError, match="cannot differentiate lse"):
            (out.sum() + lse.sum()).backward()
        # the same loss without lse (or with lse detached) differentiates as before
        out, lse = attnhub.attention(q, k, v, return_lse=True, backend="t_no_dlse")
        (out.sum() + lse.detach().sum()).backward()
        want = [x.grad.clone() for x in (q, k, v)]
        for x in (q, k, v):
            x.grad = None
        attnhub.attention(q, k, v, backend="reference").sum().backward()
        for g, w in zip(want, (q.grad, k.grad, v.grad)):
            torch.testing.assert_close(g, w)


def test_only_lse_in_the_loss():
    q, k, v = _inputs(2)
    out, lse = attnhub.attention(q, k, v, return_lse=True, backend="reference")
    lse.sum().backward()  # dout is None: zeros stand in for it
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert torch.count_nonzero(q.grad) > 0
