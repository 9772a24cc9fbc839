"""The SPEC §9-§11 conformance rows: the reference passes them, broken backends fail the right row,
and a backend without a feature shows it declined."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import numpy as np
import pytest

from attnhub import Causal, Local
from attnhub_backends.reference.backend import ReferenceBackend
from attnhub_conformance import matrix as matrix_mod
from attnhub_conformance import report as rep
from attnhub_conformance.cases import FEATURE_ROWS, Case
from attnhub_conformance.modifier_cases import kvcache, quick_cases, secondary_cases, varlen
from attnhub_conformance.runner import CaseFailure, Certifier
from tests.plugged import plugged_in, run_all


class _NoBias(ReferenceBackend):
    """Declares the bias but drops it."""

    name: ClassVar[str] = "t_mod_nobias"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        req = dataclasses.replace(req, bias=None, bias_grad=False)
        return super().forward(q, k, v, req, mask, dataclasses.replace(operands, bias=None))


class _NoDsinks(ReferenceBackend):
    """Right forward; the sinks' gradient is missing."""

    name: ClassVar[str] = "t_mod_nodsinks"
    priority: ClassVar[int] = -50

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        grads = super().backward(q, k, v, out, lse, dout, req, mask, operands, dlse)
        if len(grads) == 5 and grads[4] is not None:
            return (*grads[:4], grads[4] * 0)
        return grads


class _PaddedKeys(ReferenceBackend):
    """Ignores k_lengths: attends the padded keys."""

    name: ClassVar[str] = "t_mod_padkeys"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        if req.k_lengths and not req.paged:
            req = dataclasses.replace(req, k_lengths=False)
            operands = dataclasses.replace(operands, k_lengths=None)
        return super().forward(q, k, v, req, mask, operands)


class _Leaky(ReferenceBackend):
    """Leaves 1e-30 in padded query rows (right padding) instead of exact zeros."""

    name: ClassVar[str] = "t_mod_leaky"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        out, lse = super().forward(q, k, v, req, mask, operands)
        if operands is not None and operands.q_lengths is not None:
            for b, n in enumerate(np.asarray(operands.q_lengths)):
                out[b, :, n:] += 1e-30
        return out, lse


class _OperandScribbler(ReferenceBackend):
    """Right results, but writes into the operands it was given (bias, sinks, lengths, tables)."""

    name: ClassVar[str] = "t_mod_scribble"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        out = super().forward(q, k, v, req, mask, operands)
        for f in dataclasses.fields(operands or ()):
            x = getattr(operands, f.name)
            if isinstance(x, np.ndarray) and x.flags.writeable:
                x.reshape(-1)[0] += 1
        return out


class _NoSinks(ReferenceBackend):
    """Honestly declines sinks (the feature is not declared)."""

    name: ClassVar[str] = "t_mod_nosinks"
    priority: ClassVar[int] = -50
    features = ReferenceBackend.features - {"sinks"}


@pytest.fixture(scope="module")
def broken():
    with plugged_in(_NoBias(), _NoDsinks(), _PaddedKeys(), _Leaky(), _OperandScribbler(), _NoSinks()):
        yield


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_reference_passes_the_quick_modifier_cases(framework):
    cases = quick_cases("float32") if framework == "numpy" else secondary_cases("float32")
    cert = Certifier("reference", seed=4, framework=framework)
    results = run_all(cert, cases)
    bad = [(r.id, r.message) for r in results if r.status != "pass"]
    assert not bad, bad


def test_reference_passes_float64_combinations():
    cases = [
        Case("float64", (7,), (9,), Causal(), "scale_end", bias="b11k", softcap=5.0, sinks=True, grad=True,
             bias_grad=True, q_lengths=(7, 3), k_lengths=(2, 9), padding_side="left", large_logits=True, lse=True),
        Case("float64", (5,), (8,), Local(2, 1, causal=True), q_offset=4, k_offset=1, bias="1hqk", sinks=True,
             grad=True, bias_grad=True, lse=True),
        varlen("float64", Local(2), "none_end", (2, 4, 0), (5, 0, 3), sinks=True, softcap=30.0, grad=True, lse=True),
        kvcache("float64", Local(3, causal=True), 2, 64, (9, 64), paged=64, sinks=True, lse=True),
    ]  # fmt: skip
    results = run_all(Certifier("reference", seed=5), cases)
    bad = [(r.id, r.message) for r in results if r.status != "pass"]
    assert not bad, bad


@pytest.mark.parametrize(
    ("name", "case", "check", "row"),
    [
        ("t_mod_nobias", quick_cases("float32")[0], "out", "bias"),
        ("t_mod_nodsinks", quick_cases("float32")[4], "dsinks", "dsinks"),
        (
            "t_mod_padkeys",
            Case("float32", (9,), (13,), Causal(), "none_end", k_lengths=(5, 9)),
            "out",
            "k_lengths",
        ),
        ("t_mod_padkeys", quick_cases("float32")[8], "out", "kvcache contiguous"),
    ],
    ids=["bias dropped", "dsinks zero", "padded keys attended", "padded cache rows attended"],
)
def test_broken_backends_fail_their_row(broken, name, case, check, row):
    cert = Certifier(name, seed=6)
    with pytest.raises(CaseFailure) as info:
        cert.run(case)
    assert info.value.check == check
    m = rep.aggregate(list(cert.results.values()))
    assert m[row]["float32"]["status"] == "FAIL"
    if check == "dsinks":  # a gradient of its own: the backward row is not blamed
        assert m["backward"]["float32"]["status"] != "FAIL" and m["sinks"]["float32"]["status"] == "FAIL"


def test_a_backend_without_sinks_shows_them_declined(broken):
    cert = Certifier("t_mod_nosinks", seed=7)
    results = run_all(cert, quick_cases("float32"))
    assert all(r.status in ("pass", "declined") for r in results), [r.message for r in results]
    m = rep.aggregate(results)
    assert m["sinks"]["float32"]["status"] == "declined"
    assert "sinks" in m["sinks"]["float32"]["reason"]
    assert m["bias"]["float32"]["status"] == "pass"


def test_padded_query_rows_must_be_exactly_zero(broken):
    case = quick_cases("float32")[5]  # q_lengths (7, 0), right padding
    assert {"q_lengths", "zero lengths", "fully masked rows"} <= set(case.features)
    assert Certifier("reference", seed=8).run(case).status == "pass"
    with pytest.raises(CaseFailure, match="exactly 0"):
        Certifier("t_mod_leaky", seed=8).run(case)


def test_operands_written_into_fail_the_inputs_row_only(broken):
    """Bias, lengths and block tables are the caller's arrays too: writing into them is caught, in
    the call and in backend.forward before backend.backward (whose gradients stay right)."""
    cert = Certifier("t_mod_scribble", seed=9)
    cases = [quick_cases("float32")[i] for i in (0, 2, 5, 9)]  # bias+dbias, sinks, lengths, paged
    results = run_all(cert, cases)
    assert all(r.status == "FAIL" and r.check == "inputs modified" for r in results), [
        r.message for r in results
    ]
    m = rep.aggregate(results)
    assert m["inputs unchanged"]["float32"]["status"] == "FAIL"
    assert m["dbias"]["float32"]["status"] == "pass" and m["kvcache paged"]["float32"]["status"] == "pass"


def test_matrix_overview_keeps_old_reports_without_the_new_rows(tmp_path):
    payload = {"backend": "reference", "mode": "quick", "seed": 1, "framework": "numpy", "device": "cpu",
               "results": []}  # fmt: skip
    new = rep.build_report(payload, 1.0, "attnhub certify reference --quick")
    old = dict(new, features=[f for f in new["features"] if f not in ("softcap", "varlen")])
    old["matrix"] = {f: new["matrix"][f] for f in old["features"]}
    paths = []
    for i, r in enumerate((old, new)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(r))
    page = matrix_mod.render(matrix_mod.load([str(p) for p in paths]))
    assert "| softcap | - | - |" in page and "| varlen | - | - |" in page
    assert matrix_mod.feature_rows([old, new]) == list(FEATURE_ROWS)


def test_ids_name_every_modifier():
    c = quick_cases("float32")
    assert c[2].id.endswith("-biasfullg-softcap30-sinks")
    assert "varlen3.0.5.2_4.2.6.0" in c[7].id and "kvcache-paged16" in c[9].id
    assert "off8.2" in c[10].id
    assert len({x.id for x in c}) == len(c)
    assert np.all([x.modified for x in c])
