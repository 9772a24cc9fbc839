"""Shared check for the triton backend tests: one case against the float64 reference (SPEC §6).

The test modules never import triton themselves at collection time: importing it into a pytest
process that has loaded TensorFlow can abort LLVM, so kernels are only loaded by the tests that run.
"""

from __future__ import annotations

import numpy as np

import attnhub
from attnhub.request import build_request, to_canonical
from attnhub_backends.reference import kernel as ref

FWD_TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
GRAD_TOL = {"float32": 1e-4, "float16": 8e-3, "bfloat16": 4e-2}


def _errors(got, want: np.ndarray) -> tuple[float, float]:
    g = got.detach().double().cpu().numpy().reshape(want.shape)
    assert not np.isnan(g).any(), "NaN in a result"
    e = g - want
    denom = max(np.linalg.norm(want), 1e-300)
    return float(np.linalg.norm(e) / denom), float(np.abs(e).max() / max(np.abs(want).max(), 1e-300))


def check(
    torch,
    *,
    device: str,
    dtype: str,
    seq_q: tuple[int, ...],
    seq_k: tuple[int, ...],
    rule,
    sync: str = "none_front",
    b: int = 1,
    hq: int = 2,
    hkv: int = 2,
    dqk: int = 32,
    dv: int = 32,
    layout: str = "bhsd",
    scale: float | None = None,
    logit_boost: float = 1.0,
    grad: bool = True,
    seed: int = 0,
) -> dict:
    """Run ``attnhub.attention(..., backend="triton")`` and assert SPEC §6 against the reference."""
    g = torch.Generator().manual_seed(seed)
    tdt = getattr(torch, dtype)

    def make(h: int, seq: tuple[int, ...], d: int, boost: float = 1.0):
        x = (torch.randn(b, h, *seq, d, generator=g, dtype=torch.float64) * boost).to(tdt)
        if layout == "bshd":
            x = x.movedim(1, -2).contiguous()
        return x.to(device).requires_grad_(grad)

    q = make(hq, seq_q, dqk, logit_boost)
    k, v = make(hkv, seq_k, dqk), make(hkv, seq_k, dv)
    copies = [x.detach().clone() for x in (q, k, v)]
    out, lse = attnhub.attention(
        q, k, v, mask=rule, sync=sync, scale=scale, layout=layout, backend="triton", return_lse=True
    )
    for x, c in zip((q, k, v), copies, strict=True):
        assert torch.equal(x.detach(), c), "the caller's input was modified"
    req, ad = build_request(q, k, v, rule, sync, scale, layout, True)

    def canon(x):
        return to_canonical(ad, x.detach().cpu(), layout).double().numpy()

    qn, kn, vn = canon(q), canon(k), canon(v)
    want_out, want_lse = ref.forward(qn, kn, vn, req)
    got_out = to_canonical(ad, out.detach().cpu(), layout)
    rel, mx = _errors(got_out, want_out)
    tol = FWD_TOL[dtype]
    assert rel < tol and mx < tol, f"out error {rel:.2e}/{mx:.2e} >= {tol} ({req.describe()})"
    got_lse = lse.detach().cpu().double().numpy().reshape(want_lse.shape)
    masked = np.isneginf(want_lse)
    assert (np.isneginf(got_lse) == masked).all(), "lse -inf pattern differs from the reference"
    assert np.allclose(got_lse[~masked], want_lse[~masked], rtol=1e-4, atol=1e-4 * max(1.0, logit_boost**2))
    assert (want_out[masked] == 0).all() and (got_out.double().numpy()[masked] == 0).all()
    result = {"out": rel, "rows_masked": int(masked.sum())}
    if grad:
        dout = torch.randn(out.shape, generator=g, dtype=torch.float64).to(tdt).to(device)
        out.backward(dout)
        want = ref.backward(qn, kn, vn, canon(dout), req)
        for name, x, w in zip("qkv", (q, k, v), want, strict=True):
            got = to_canonical(ad, x.grad.detach().cpu(), layout)
            rel, mx = _errors(got, w)
            tol = GRAD_TOL[dtype]
            assert rel < tol and mx < tol, f"d{name} error {rel:.2e}/{mx:.2e} >= {tol} ({req.describe()})"
            result[f"d{name}"] = rel
    return result
