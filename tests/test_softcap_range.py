"""Softcaps far beyond the logits (SPEC §9): the same as no cap, in every dtype, on every backend.

A cap of 1e300 held in float32 is inf, and inf·tanh(t/inf) is NaN (tf, jax, triton and cuda
returned NaN); the core drops a cap that no input of the dtype can make matter
(``attnhub.modifiers.softcap.effective_softcap``), and a backend whose tanh loses small t/softcap declines
the caps it cannot compute within SPEC §6 (triton above 128 in float32).
"""

from __future__ import annotations

import numpy as np
import pytest

import attnhub
from attnhub.modifiers.softcap import effective_softcap


def test_a_cap_no_input_can_reach_is_dropped_below_float64():
    assert effective_softcap(1e300, "float32", 0.125, 64) is None
    assert effective_softcap(1e300, "bfloat16", 0.125, 64) is None
    assert effective_softcap(1e300, "float16", 0.125, 64) is None
    assert effective_softcap(1e300, "float64", 0.125, 64) == 1e300  # float64 kernels compute it
    assert effective_softcap(1e30, "float32", 0.125, 64) == 1e30  # float32 logits can reach 1e77
    assert effective_softcap(1e30, "float16", 0.125, 64) is None  # float16 logits stay below 3e11
    assert effective_softcap(50.0, "float32", 0.125, 64) == 50.0


@pytest.mark.parametrize("cap", [1e300, 1e39, 3e38, 1e30, 1e3])
def test_huge_caps_equal_no_cap_on_the_reference(cap):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 9, 16)).astype(np.float32) for _ in range(3))
    want = attnhub.attention(*(x.astype(np.float64) for x in (q, k, v)), backend="reference")
    got = attnhub.attention(q, k, v, softcap=cap, backend="reference")
    assert np.all(np.isfinite(got))
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < (2e-5 if cap > 1e10 else 1e-3), err


def test_triton_declines_caps_its_tanh_cannot_keep():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    from attnhub.request import build_request_ex
    from attnhub_backends.triton import modifiers

    q = torch.randn(1, 2, 8, 16)
    for cap, dtype, declined in ((1e3, torch.float32, True), (100.0, torch.float32, False),
                                 (1e3, torch.bfloat16, False), (1e5, torch.bfloat16, True)):  # fmt: skip
        x = q.to(dtype)
        req, _, _ = build_request_ex(
            x, x, x, None, "none_front", None, "bhsd", False, attnhub.extras.Extras(softcap=cap)
        )
        assert bool(modifiers.reasons(req)) == declined, (cap, dtype)
