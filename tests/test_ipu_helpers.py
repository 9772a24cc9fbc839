"""Shared helpers of the ipu tests (no tests here): emulation on, comparisons with the reference."""

from __future__ import annotations

import numpy as np
import torch

import attnhub

#: SPEC §6 tolerances (forward, gradients).
TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (2e-3, 8e-3)}


def errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative L2 error, max error / max |ref|) of ``got`` against float64 ``ref``."""
    g, r = got.detach().double(), ref.detach().double()
    e = g - r
    rn, rm = float(r.norm()), float(r.abs().max()) if r.numel() else 0.0
    if rm < 1e-9:  # a mathematically zero reference (float64 round-off only): absolute error
        return float(e.abs().max()) if e.numel() else 0.0, float(e.abs().max()) if e.numel() else 0.0
    return float(e.norm()) / rn, float(e.abs().max()) / rm


def assert_close(got: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    rel, mx = errors(got, ref)
    assert rel < tol and mx < tol, f"{what}: relative {rel:.3g}, max {mx:.3g} (tolerance {tol:g})"


def inputs(rng: np.random.Generator, shape_q, shape_k, dv: int, dtype, heads=(2, 2), big=1.0):
    """Fresh N(0, 1) q, k, v (q times ``big``) rounded to ``dtype``, with grad."""
    b = 2
    hq, hkv = heads
    d = shape_q[-1]
    q = rng.standard_normal((b, hq, *shape_q[:-1], d)) * big
    k = rng.standard_normal((b, hkv, *shape_k, d))
    v = rng.standard_normal((b, hkv, *shape_k, dv))
    return [torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q, k, v)]


def reference(q, k, v, **kw):
    """Forward, lse and gradients of the float64 reference on the same (rounded) values."""
    leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
    out, lse = attnhub.attention(*leaves, backend="reference", return_lse=True, **kw)
    return out, lse, leaves


def emulate(monkeypatch) -> None:
    """Turn emulation on for this test; cached call plans are dropped (see ``fresh_dispatch``)."""
    monkeypatch.setenv("ATTNHUB_IPU_EMULATE", "1")
    attnhub.REGISTRY.reload()


def fresh_dispatch():
    """A fixture body: cached plans are forgotten before and after the test.

    ``ATTNHUB_IPU_EMULATE`` is read when a call signature is first planned, so a test that flips
    it must not see (or leave) plans made under the other setting.
    """
    attnhub.REGISTRY.reload()
    yield
    attnhub.REGISTRY.reload()
