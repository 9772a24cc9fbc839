"""SPEC §4 (changed 2026-11-29): an Inf in an attended value may come back NaN on the rows it
reaches (SDPA's efficient kernel does so in float32); a finite value there still fails certify."""

from __future__ import annotations

import numpy as np

from attnhub_backends.reference.backend import ReferenceBackend
from attnhub_conformance.cases import nonfinite_cases
from attnhub_conformance.runner import Certifier
from tests.plugged import plugged_in, run_all


def _inf_cases() -> list:
    return [c for c in nonfinite_cases("float32", full=True) if c.nonfinite == "inf"]


class _Rewrites(ReferenceBackend):
    priority = -1000
    value = np.nan

    def forward(self, q, k, v, req, mask=None, operands=None):
        out, lse = super().forward(q, k, v, req, mask, operands)
        out = np.where(np.isinf(out), self.value, out)
        return out, lse


class InfAsNaN(_Rewrites):
    """Every ±Inf of out comes back NaN (as SDPA's efficient kernel in float32)."""

    name = "t_inf_as_nan"


class InfAsZero(_Rewrites):
    """Every ±Inf of out comes back 0: the Inf silently replaced."""

    name = "t_inf_as_zero"
    value = 0.0


def _statuses(backend) -> dict[str, str]:
    with plugged_in(backend):
        results = run_all(Certifier(backend.name, seed=3, framework="numpy"), _inf_cases())
    return {r.id: r.status for r in results}


def test_inf_coming_back_nan_is_certified():
    got = _statuses(InfAsNaN())
    assert got and set(got.values()) <= {"pass", "declined"} and "pass" in got.values(), got


def test_inf_replaced_by_a_finite_value_fails():
    got = _statuses(InfAsZero())
    assert "FAIL" in got.values(), got
