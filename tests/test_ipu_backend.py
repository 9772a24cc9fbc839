"""The ipu backend in CPU emulation against the float64 reference, and its availability."""

from __future__ import annotations

import re
import sys
import types

import pytest
import torch

import attnhub
from attnhub import Causal, Full, Local
from tests.test_ipu_helpers import TOL, assert_close, emulate, fresh_dispatch, inputs, reference

RULES = [Full(), Causal(), Local(3), Local(2, log2_stride=1, causal=True)]
SYNCS = ["none_front", "scale_front", "scale_end", "none_end"]


_fresh = pytest.fixture(autouse=True)(fresh_dispatch)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("lens", [(70, 70), (23, 90), (90, 23)], ids=lambda x: f"{x[0]}x{x[1]}")
def test_matches_reference_float32(monkeypatch, rng, rule, sync, lens):
    emulate(monkeypatch)
    lq, lk = lens
    q, k, v = inputs(rng, (lq, 16), (lk,), 8, torch.float32, heads=(4, 2))
    _check(q, k, v, dict(mask=rule, sync=sync), torch.float32)


@pytest.mark.parametrize("big", [1.0, 8.0], ids=["normal", "large-logits"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("rule", [Causal(), Local(5, causal=True)], ids=lambda r: r.describe())
def test_dtypes_and_large_logits(monkeypatch, rng, dtype, big, rule):
    emulate(monkeypatch)
    q, k, v = inputs(rng, (160, 32), (160,), 32, dtype, heads=(2, 1), big=big)
    _check(q, k, v, dict(mask=rule, scale=0.3), dtype)


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize(
    "rule", [Causal(), Local((2, 3)), Local(2, log2_stride=1, causal=True)], ids=lambda r: r.describe()
)
def test_two_d_sequences(monkeypatch, rng, rule, sync):
    emulate(monkeypatch)
    q, k, v = inputs(rng, (6, 5, 16), (12, 10), 8, torch.float32, heads=(2, 1))
    _check(q, k, v, dict(mask=rule, sync=sync), torch.float32)


def test_fully_masked_rows_give_zero_out_neginf_lse_zero_grads(monkeypatch, rng):
    emulate(monkeypatch)
    # none_end, causal, Lq > Lk: queries 0..(Lq-Lk-1) sit before every key.
    q, k, v = inputs(rng, (100, 16), (40,), 16, torch.float32)
    out, lse = attnhub.attention(q, k, v, mask="causal", sync="none_end", backend="ipu", return_lse=True)
    masked = torch.arange(100) < 60
    be = attnhub.REGISTRY.backends()["ipu"]
    from attnhub.request import build_request

    plan = be.module(build_request(q, k, v, "causal", "none_end", None, "bhsd", True)[0], "cpu").plan
    assert any(not row for row in plan.tiles)  # a whole query chunk without keys (no tiles)
    assert torch.isneginf(lse[..., masked]).all() and torch.isfinite(lse[..., ~masked]).all()
    assert (out[:, :, masked] == 0).all()
    (out * torch.randn_like(out)).sum().backward()
    assert (q.grad[:, :, masked] == 0).all()
    for x in (out, lse, q.grad, k.grad, v.grad):
        assert not torch.isnan(x).any()
    _check(
        *[x.detach().requires_grad_() for x in (q, k, v)], dict(mask="causal", sync="none_end"), torch.float32
    )


def test_nan_input_propagates(monkeypatch, rng):
    emulate(monkeypatch)
    q, k, v = (x.detach() for x in inputs(rng, (20, 8), (20,), 8, torch.float32))
    q = q.clone()
    q[0, 0, 5, 0] = float("nan")
    out = attnhub.attention(q, k, v, mask="causal", backend="ipu")
    assert torch.isnan(out[0, 0, 5]).all()
    assert not torch.isnan(out[0, 0, :5]).any() and not torch.isnan(out[1]).any()


def test_inputs_not_modified(monkeypatch, rng):
    emulate(monkeypatch)
    q, k, v = (x.detach() for x in inputs(rng, (33, 8), (33,), 8, torch.float16))
    copies = [x.clone() for x in (q, k, v)]
    attnhub.attention(q, k, v, mask="causal", backend="ipu")
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), copies))


def test_backward_method_matches_autograd(monkeypatch, rng):
    """The contract's backward() (recompute) agrees with autograd through the graph."""
    emulate(monkeypatch)
    from attnhub.request import build_request, to_canonical

    q, k, v = inputs(rng, (40, 8), (40,), 8, torch.float32)
    req, ad = build_request(q, k, v, Causal(), "none_front", None, "bhsd", False)
    be = attnhub.REGISTRY.backends()["ipu"]
    out, lse = be.forward(q, k, v, req)
    dout = torch.randn_like(out)
    dq, dk, dv = be.backward(q.detach(), k.detach(), v.detach(), out, lse, dout, req)
    ga = torch.autograd.grad(out, (q, k, v), dout)
    for a, b in zip((dq, dk, dv), ga):
        torch.testing.assert_close(a, b)
    assert to_canonical(ad, q, "bhsd") is not None


def test_auto_with_emulation_prefers_ipu_over_reference_only(monkeypatch, rng):
    emulate(monkeypatch)
    q, k, v = (x.detach() for x in inputs(rng, (8, 8), (8,), 8, torch.float32))
    exp = attnhub.explain(q, k, v, mask="causal")
    verdicts = {v.name: v for v in exp.verdicts}
    assert not verdicts["ipu"].reasons
    better = [v.name for v in exp.verdicts if not v.reasons and v.priority > verdicts["ipu"].priority]
    assert exp.chosen == (better[0] if better else "ipu")
    q64 = q.double()
    assert "float16, float32" in " ".join(attnhub.explain(q64, k.double(), v.double()).verdicts[0].reasons
                                          + [r for v in attnhub.explain(q64, k.double(), v.double()).verdicts
                                             if v.name == "ipu" for r in v.reasons])  # fmt: skip


def test_unavailable_without_poptorch(monkeypatch):
    monkeypatch.delenv("ATTNHUB_IPU_EMULATE", raising=False)
    monkeypatch.setitem(sys.modules, "poptorch", None)  # make sure no poptorch is found
    rec = {r.name: r for r in attnhub.backends()}["ipu"]
    assert not rec.available
    assert "poptorch is not installed; it ships with the Poplar SDK" in rec.reason
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(attnhub.BackendUnsupported, match="poptorch is not installed"):
        attnhub.attention(q, q, q, backend="ipu")


def test_attnhub_info_shows_reason_and_emulation(monkeypatch):
    from click.testing import CliRunner

    from attnhub.cli import main

    monkeypatch.delenv("ATTNHUB_IPU_EMULATE", raising=False)
    monkeypatch.setitem(sys.modules, "poptorch", None)
    runner = CliRunner()
    res = runner.invoke(main, ["info", "--no-errors"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    text = re.sub(r"\s+", " ", res.output)
    assert "poptorch is not installed; it ships with the Poplar SDK" in text
    res = runner.invoke(main, ["info", "--no-errors"], env={"COLUMNS": "400", "ATTNHUB_IPU_EMULATE": "1"})
    assert res.exit_code == 0, res.output
    assert re.search(r"ipu .*cpu-emulation \(torch ", re.sub(r"\s+", " ", res.output))


def test_with_a_stand_in_poptorch_module(monkeypatch):
    """With poptorch importable the backend is available for ipu tensors and reports its version.

    (A stand-in module: no IPU exists here; see docs/gpu-runs.md, section IPU.)
    """
    fake = types.ModuleType("poptorch")
    fake.__version__ = "3.3.0"
    fake.__spec__ = importlib_spec("poptorch")
    monkeypatch.setitem(sys.modules, "poptorch", fake)
    monkeypatch.delenv("ATTNHUB_IPU_EMULATE", raising=False)
    be = attnhub.REGISTRY.backends()["ipu"]
    assert be.availability() is None
    assert be.version() == "poptorch 3.3.0"
    assert be.device_types == ("ipu",)
    fake.isRunningOnIpu = lambda: True  # as while PopTorch traces a model
    assert be.device_types == ("cpu", "ipu")
    fake.isRunningOnIpu = lambda: False
    assert be.device_types == ("ipu",)
    monkeypatch.setenv("ATTNHUB_IPU_EMULATE", "1")
    assert be.version().startswith("poptorch 3.3.0 + cpu-emulation (torch ")
    assert be.device_types == ("cpu", "ipu")


def importlib_spec(name: str):
    import importlib.machinery

    return importlib.machinery.ModuleSpec(name, loader=None)


def _check(q, k, v, kw, dtype):
    tol_f, tol_g = TOL[dtype]
    out, lse = attnhub.attention(q, k, v, backend="ipu", return_lse=True, **kw)
    assert out.dtype == dtype and lse.dtype == torch.float32 and out.shape[:-1] == q.shape[:-1]
    ref_out, ref_lse, leaves = reference(q, k, v, **kw)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert_close(out, ref_out, tol_f, "out")
    fin = torch.isfinite(ref_lse)
    assert_close(lse[fin], ref_lse[fin], tol_f, "lse")
    dout = torch.randn_like(ref_out)
    grads = torch.autograd.grad(out, (q, k, v), dout.to(dtype))
    ref_grads = torch.autograd.grad(ref_out, leaves, dout)
    for name, g, r in zip("qkv", grads, ref_grads):
        assert g.dtype == dtype and not torch.isnan(g).any()
        assert_close(g, r, tol_g, f"d{name}")


def test_declines_gradients_under_torch_compile(monkeypatch):
    """Its backward runs torch autograd, which a compiled graph's backward op cannot: certify's
    traced case failed with 'element 0 of tensors does not require grad'; now it is declined."""
    emulate(monkeypatch)
    from attnhub_conformance.cases import Case
    from attnhub_conformance.runner import Certifier

    case = Case("float32", (48,), (48,), Causal(), batch=1, heads_q=8, heads_kv=8, dim_qk=16, dim_v=16,
                grad=True, traced=True, cotangent="ones")  # fmt: skip
    res = Certifier("ipu", seed=1).run(case)
    assert res.status == "declined", (res.status, res.message)
    assert any("torch autograd" in r for r in res.reasons), res.reasons
