"""Certify runs forward and gradients through the frameworks' tracers (jax.jit, tf.function,
torch.compile), with a ones and a random cotangent: a backend whose gradient is wrong only when
traced fails the "traced" row and passes the same case run eagerly."""

from __future__ import annotations

from typing import ClassVar

import pytest

from attnhub import Causal
from attnhub_backends.jax.backend import JaxBackend
from attnhub_backends.tf.backend import TFBackend
from attnhub_conformance import report as rep
from attnhub_conformance.cases import Case, quick_grid, secondary_grid, traced_cases
from attnhub_conformance.runner import CaseFailure, Certifier
from tests.plugged import plugged_in

ALL = ("float32", "float64", "float16", "bfloat16")
#: The shape of the known jitted-gradient bug: lengths no tile divides, B·Hq = 8, ones cotangent.
TRACED_ONES = Case(
    "float32", (48,), (48,), Causal(), batch=1, heads_q=8, heads_kv=8, dim_qk=16, dim_v=16, grad=True,
    traced=True, cotangent="ones",
)  # fmt: skip
TRACED_RANDOM = Case(
    "float32", (80,), (80,), Causal(), heads_q=4, heads_kv=2, grad=True, lse=True, traced=True
)


def _under_jit(x) -> bool:
    """Whether ``x`` is traced by jax.jit (an eager jax.vjp/grad tracer has a concrete primal)."""
    import jax

    while isinstance(x, jax.core.Tracer):
        primal = getattr(x, "primal", None)
        if primal is None:
            return True
        x = primal
    return False


class JaxJitGradWrong(JaxBackend):
    """dq is off by 0.5·dout, but only under jax.jit; eager jax.grad is right."""

    name: ClassVar[str] = "t_traced_jax_bad"
    priority: ClassVar[int] = -50

    def run(self, q, k, v, req, mask=None, operands=None):
        import jax

        out, lse = super().run(q, k, v, req, mask, operands)
        if _under_jit(q):
            out = out + 0.5 * (q - jax.lax.stop_gradient(q))  # same value, extra gradient
        return out, lse


class TfFunctionGradWrong(TFBackend):
    """dq is 1.5 times too large, but only inside tf.function (graph tensors: ``req.symbolic``)."""

    name: ClassVar[str] = "t_traced_tf_bad"
    priority: ClassVar[int] = -50

    def backward(self, q, k, v, out, lse, dout, req, *args, **kwargs):
        grads = super().backward(q, k, v, out, lse, dout, req, *args, **kwargs)
        if not req.symbolic:
            return grads
        return (grads[0] * 1.5, *grads[1:])


@pytest.fixture(scope="module")
def traced_backends():
    with plugged_in(JaxJitGradWrong(), TfFunctionGradWrong()):
        yield


def test_grids_hold_traced_cases_for_frameworks_with_a_tracer():
    for fw in ("jax", "tensorflow", "torch"):
        quick = [c for c in quick_grid(ALL, fw) if c.traced]
        assert {c.cotangent for c in quick} == {"", "ones"}
        assert any(
            c.nq % 32 and c.batch * c.heads_q >= 8 for c in quick
        )  # lengths 32-wide tiles leave ragged
        assert any(c.traced for c in secondary_grid(ALL, fw))
        assert "traced" in TRACED_ONES.features and "grad of sum" in TRACED_ONES.features
    assert not any(c.traced for c in quick_grid(ALL, "numpy"))
    lengths = {c.nq for c in traced_cases("float32", full=True)}
    assert {48, 80, 100} <= lengths


def test_numpy_inputs_decline_traced_cases():
    res = Certifier("reference", seed=1).run(TRACED_ONES)
    assert res.status == "declined" and "no tracer" in res.reasons[0]


@pytest.mark.parametrize(
    ("name", "framework"), [("t_traced_jax_bad", "jax"), ("t_traced_tf_bad", "tensorflow")]
)
def test_gradient_wrong_only_when_traced_fails_the_traced_row(traced_backends, name, framework):
    cert = Certifier(name, seed=5)
    eager = Case("float32", (48,), (48,), Causal(), batch=1, heads_q=8, heads_kv=8, dim_qk=16, dim_v=16,
                 grad=True, cotangent="ones")  # fmt: skip
    assert cert.run(eager).status == "pass"  # the bug hides from eager calls
    for case in (TRACED_ONES, TRACED_RANDOM):
        with pytest.raises(CaseFailure) as info:
            cert.run(case)
        assert info.value.check == "dq"
    matrix = rep.aggregate(list(cert.results.values()))
    assert matrix["traced"]["float32"]["status"] == "FAIL"
    assert matrix["grad of sum"]["float32"]["status"] == "FAIL"  # the traced ones case
    assert matrix["lse"]["float32"]["status"] != "FAIL"  # a gradient failure does not mark lse


@pytest.mark.parametrize("name", ["jax", "tf"])
def test_correct_backends_pass_traced_cases(name):
    """The real backends on the same traced cases."""
    cert = Certifier(name, seed=5)
    for case in (TRACED_ONES, TRACED_RANDOM):
        assert cert.run(case).status == "pass"
