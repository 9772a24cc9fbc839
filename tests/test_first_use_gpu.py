"""First-use measurement on a GPU with no profile for the device (issue 37): the first ``auto`` call
of a class long enough to time measures its candidates once, records the class, and every later
call (and a new process, read from the user's profile) reuses it."""

from __future__ import annotations

import pytest

import attnhub
from attnhub import profile, tuner

pytestmark = pytest.mark.gpu


def test_first_use_measures_once_per_class_and_reuses_it(cache_dir, monkeypatch):
    """``cache_dir`` (tests/conftest.py): no shipped profile, an empty user cache: a device never
    measured."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU: run `make gpu-test` on the device machine")
    monkeypatch.setattr(tuner, "_tried", set())  # no class tried before in this process
    timed = []
    real = tuner.time_class

    def counting(case, names, device, *a, **kw):
        timed.append((case.label(), tuple(names)))
        return real(case, names, device, *a, **kw)

    monkeypatch.setattr(tuner, "time_class", counting)
    q, k, v = (torch.randn(2, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    assert attnhub.explain(q, k, v, mask="causal").basis == "prior"
    first = attnhub.attention(q, k, v, mask="causal")
    assert len(timed) == 1 and len(timed[0][1]) >= 2, timed
    exp = attnhub.explain(q, k, v, mask="causal")
    assert exp.basis == "first-use measurement" and exp.measured is not None, str(exp)
    again = attnhub.attention(q, k, v, mask="causal")
    q2 = torch.randn(2, 16, 4000, 128, device="cuda", dtype=torch.bfloat16)  # the same class
    attnhub.attention(q2, q2, q2, mask="causal")
    assert len(timed) == 1, timed
    assert torch.equal(first, again)
    profile.reload()  # as a new process: the class is read back from the user's profile
    monkeypatch.setattr(tuner, "_tried", set())
    attnhub.attention(q, k, v, mask="causal")
    assert len(timed) == 1 and attnhub.explain(q, k, v, mask="causal").basis == "first-use measurement"
    small = torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
    attnhub.attention(small, small, small, mask="causal")  # host-bound: the prior, never timed
    assert len(timed) == 1 and attnhub.explain(small, small, small, mask="causal").basis == "prior"
