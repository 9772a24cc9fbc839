"""certify checks the gradient through a returned lse (SPEC §5): a backend that declares "dlse"
but leaves lse's term out of its backward, under NumPy or under torch's glue, FAILs the
"grad lse" check; the reference passes it, and a backend that cannot take it raises (no FAIL)."""

from __future__ import annotations

import numpy as np
import pytest

from attnhub_backends.reference.backend import ReferenceBackend
from attnhub_conformance.cases import full_grid
from attnhub_conformance.runner import Certifier
from tests.plugged import plugged_in, run_all


class DropsDlse(ReferenceBackend):
    """Declares "dlse" (the reference does) and ignores it: lse's gradient silently dropped."""

    name = "t_drops_dlse"
    priority = -1000

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        return super().backward(q, k, v, out, lse, dout, req, mask, operands, None)


def _lse_grad_cases(framework: str, n: int = 4):
    cases = [c for c in full_grid(("float32",), framework) if c.lse and c.grad and not c.modified]
    cases = [c for c in cases if not c.traced and not c.nonfinite]
    assert cases, "the full grid has plain cases with lse and gradients"
    return cases[:n]


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_a_backend_dropping_lse_gradient_fails_and_the_reference_passes(framework):
    if framework == "torch":
        pytest.importorskip("torch")
    cases = _lse_grad_cases(framework)
    with plugged_in(DropsDlse()):
        broken = run_all(Certifier("t_drops_dlse", seed=41, framework=framework), cases)
    assert broken and all(r.status == "FAIL" for r in broken), [(r.id, r.status, r.message) for r in broken]
    assert all("grad lse" in (r.check or "") for r in broken), [r.check for r in broken]
    good = run_all(Certifier("reference", seed=41, framework=framework), cases)
    assert all(r.status == "pass" for r in good), [(r.id, r.message) for r in good]


def test_the_oracle_lse_gradient_matches_finite_differences():
    from attnhub_conformance.oracle import Problem, backward, forward

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 4, 3)) for _ in range(3))
    keep = np.tril(np.ones((4, 4), bool))[None, None].repeat(2, 1)
    w = rng.standard_normal((1, 2, 4))
    g = backward(Problem(q, k, v, keep, 0.7), np.zeros((1, 2, 4, 3)), w)[0]
    eps, num = 1e-6, np.zeros_like(q)
    for idx in np.ndindex(*q.shape):
        hi, lo = q.copy(), q.copy()
        hi[idx] += eps
        lo[idx] -= eps
        num[idx] = (
            (forward(Problem(hi, k, v, keep, 0.7))[1] - forward(Problem(lo, k, v, keep, 0.7))[1]) * w
        ).sum() / (2 * eps)
    np.testing.assert_allclose(g.dq, num, atol=1e-7)
