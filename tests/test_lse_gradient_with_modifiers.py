"""Certify checks the gradient through the returned lse on SPEC §9-§11 cases too (SPEC §5): a
backend whose modified kernels leave lse's term out fails, however right its other gradients are.

Before 2026-11-29 the modifier runner differentiated ``out`` only, so both backends below were
certified."""

from __future__ import annotations

from attnhub_backends.reference.backend import ReferenceBackend
from attnhub_conformance.modifier_cases import quick_cases
from attnhub_conformance.runner import Certifier
from tests.plugged import plugged_in, run_all


def _lse_grad_cases() -> list:
    return [c for c in quick_cases("float32") if c.grad and c.lse and not getattr(c, "expect_spec_error", "")]


class DropsDlseWhenModified(ReferenceBackend):
    """Right everywhere but in the lse term of a modified call's backward (a bias, sinks, lengths,
    packing or ALiBi), which it leaves out: a kernel variant that never received ``dlse``."""

    name = "t_drops_dlse_modified"
    priority = -1000

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        if operands is not None:
            dlse = None
        return super().backward(q, k, v, out, lse, dout, req, mask, operands, dlse)


class DropsDlseInDbias(ReferenceBackend):
    """dq, dk, dv right; the bias's and sinks' gradients computed without lse's term."""

    name = "t_drops_dlse_dbias"
    priority = -1000

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        full = super().backward(q, k, v, out, lse, dout, req, mask, operands, dlse)
        if dlse is None or len(full) < 5:
            return full
        part = super().backward(q, k, v, out, lse, dout, req, mask, operands, None)
        return (*full[:3], *part[3:])


def _statuses(backend) -> dict[str, str]:
    cases = _lse_grad_cases()
    with plugged_in(backend):
        results = run_all(Certifier(backend.name, seed=11, framework="numpy"), cases)
    return {r.id: r.status for r in results}


def test_the_cases_exist():
    ids = [c.id for c in _lse_grad_cases()]
    assert any("bias" in i or "sinks" in i for i in ids) and any("varlen" in i for i in ids), ids


def test_certify_fails_a_backend_that_drops_lse_term_in_modified_kernels():
    got = _statuses(DropsDlseWhenModified())
    failed = [i for i, s in got.items() if s == "FAIL"]
    passed = [i for i, s in got.items() if s == "pass"]
    assert len(failed) >= 5, got
    assert not passed, passed  # every case here has a modifier operand and an lse gradient


def test_certify_fails_a_backend_that_drops_lse_term_from_dbias_and_dsinks():
    got = _statuses(DropsDlseInDbias())
    failed = [i for i, s in got.items() if s == "FAIL"]
    assert failed, got
    # only the cases whose bias or sinks are differentiated can show it
    assert all(("bias" in i or "sinks" in i) for i in failed), failed


def test_the_reference_passes_them():
    got = _statuses(ReferenceBackend())
    assert set(got.values()) == {"pass"}, got
