"""The conformance suite's own parts: grids, comparisons, the runner's checks, reports, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from click.testing import CliRunner

from attnhub import Causal, Full, Local, hookimpl
from attnhub.registry import REGISTRY
from attnhub_backends.reference.backend import ReferenceBackend
from attnhub_conformance import matrix as matrix_mod
from attnhub_conformance import report as rep
from attnhub_conformance.cases import DTYPES, FEATURE_ROWS, Case, full_grid, quick_grid
from attnhub_conformance.cli import _plugin_autoloaded, certify
from attnhub_conformance.runner import CaseFailure, Certifier, Result, compare, make_data

ALL = ("float32", "float64", "float16", "bfloat16")


def test_grids_have_unique_ids_and_cover_every_row():
    for grid in (quick_grid(ALL, "numpy"), full_grid(ALL, "numpy")):
        ids = [c.id for c in grid]
        assert len(ids) == len(set(ids))
        covered = {f for c in grid for f in c.features}
        assert set(FEATURE_ROWS) - covered == {"randomised"}
    quick = quick_grid(ALL, "numpy")
    assert len(quick) <= 60  # --quick must stay small for the slow backends
    # every dtype has a column even when declined, and frameworks without strides skip views
    assert {c.dtype for c in quick_grid(("float32",), "numpy")} == set(DTYPES)
    assert not any(c.noncontig for c in quick_grid(ALL, "jax"))


def test_case_features_follow_the_rule():
    empty = Case("float32", (45,), (19,), Causal(), sync="none_end")
    assert "fully masked rows" in empty.features and "Lq != Lk" in empty.features
    full = Case("float32", (8,), (8,), Full())
    assert "fully masked rows" not in full.features
    strided = Case("float32", (4, 4), (4, 4), Local(2, 1, causal=True), heads_q=4, heads_kv=1)
    assert {"2-d", "rule local causal", "rule local strided", "GQA/MQA"} <= set(strided.features)


def test_data_is_rounded_and_seeded():
    case = Case("bfloat16", (9,), (9,), "bool", mask_empty_rows=True, large_logits=True)
    a = make_data(case, np.random.default_rng(0))
    b = make_data(case, np.random.default_rng(0))
    assert np.array_equal(a.q, b.q)
    import ml_dtypes

    assert np.array_equal(a.k.astype(ml_dtypes.bfloat16).astype(np.float64), a.k)
    assert np.abs(a.q).max() > 8  # q scaled by 8
    assert not a.mask[..., 0, :].any() and a.mask[..., 1, 1].all()


def test_compare_catches_nan_inf_and_error():
    ref = np.array([[1.0, 2.0], [3.0, 4.0]])
    compare("out", ref + 1e-7, ref, 2e-5, "float32")
    with pytest.raises(CaseFailure, match="NaN"):
        compare("out", np.where(ref > 3, np.nan, ref), ref, 2e-5, "float32")
    with pytest.raises(CaseFailure, match="infinite"):
        compare("lse", np.array([1.0, 2.0]), np.array([1.0, -np.inf]), 2e-5, "float32")
    with pytest.raises(CaseFailure, match="relative error"):
        compare("out", ref * 1.001, ref, 2e-5, "float32")


# -- backends that break one contract each, registered in-process ------------------------------
class _Half(ReferenceBackend):
    """Declines float16 honestly (via the declared dtypes)."""

    name: ClassVar[str] = "t_conf_half"
    priority: ClassVar[int] = -50
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float64")


class _WrongDtype(ReferenceBackend):
    name: ClassVar[str] = "t_conf_dtype"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None):
        out, lse = super().forward(q, k, v, req, mask)
        return out.astype(np.float64), lse


class _Scribbler(ReferenceBackend):
    name: ClassVar[str] = "t_conf_scribble"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None):
        out, lse = super().forward(q, k, v, req, mask)
        k[...] = 0  # writes into the caller's array through the canonical view
        return out, lse


class _Flaky(ReferenceBackend):
    name: ClassVar[str] = "t_conf_flaky"
    priority: ClassVar[int] = -50
    calls = 0

    def forward(self, q, k, v, req, mask=None):
        out, lse = super().forward(q, k, v, req, mask)
        type(self).calls += 1
        return out + (type(self).calls % 2) * np.finfo(out.dtype).eps * out, lse


class _Nothing(ReferenceBackend):
    """Declines every request: certifies nothing."""

    name: ClassVar[str] = "t_conf_nothing"
    priority: ClassVar[int] = -50

    def extra_reasons(self, req):
        return ["this backend serves nothing"]


class _Plugin:
    @hookimpl
    def attnhub_backends(self):
        return [_Half(), _WrongDtype(), _Scribbler(), _Flaky(), _Nothing()]


@pytest.fixture(scope="module")
def broken_backends():
    plugin = _Plugin()
    REGISTRY.register_plugin(plugin)
    yield
    REGISTRY.unregister_plugin(plugin)


def test_reference_cases_pass_and_declines_are_checked(broken_backends):
    cert = Certifier("t_conf_half", seed=1)
    res = cert.run(Case("float32", (19,), (45,), Causal(), sync="scale_end", lse=True))
    assert res.status == "pass"
    res = cert.run(Case("float16", (19,), (45,), Causal(), sync="scale_end"))
    assert res.status == "declined" and "supports dtypes" in res.reasons[0]


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("t_conf_dtype", "hygiene out"),
        ("t_conf_scribble", "inputs modified"),
        ("t_conf_flaky", "deterministic out"),
    ],
)
def test_runner_catches_contract_breaks(broken_backends, name, check):
    cert = Certifier(name, seed=2)
    case = Case("float32", (11,), (13,), Causal(), repeat=True)
    with pytest.raises(CaseFailure) as info:
        cert.run(case)
    assert info.value.check == check
    assert cert.results[case.id].status == "FAIL"
    assert cert.results[case.id].repro == f"attnhub certify {name} --case {case.id} --seed 2"


def test_torch_gradients_through_autograd():
    pytest.importorskip("torch")
    cert = Certifier("reference", seed=3, framework="torch")
    case = Case("float32", (6, 5), (6, 5), Local(2, 1, causal=True), heads_q=4, heads_kv=2, layout="bshd",
                grad=True, noncontig="sliced")  # fmt: skip
    assert cert.run(case).status == "pass"


def _results() -> list[Result]:
    return [
        Result("a", "float32", ["1-d", "rule causal", "lse"], "FAIL", check="out", message="bad"),
        Result("b", "float32", ["1-d", "rule full", "lse"], "pass"),
        Result("c", "float16", ["1-d", "rule full"], "declined", reasons=["supports dtypes float32"]),
        Result("d", "float32", ["1-d", "rule full", "backward"], "FAIL", check="dq", message="bad grad"),
    ]


def test_matrix_cells_and_suspects():
    m = rep.aggregate(_results())
    assert m["rule causal"]["float32"]["status"] == "FAIL"
    assert m["lse"]["float32"]["status"] == "pass"  # the out failure does not blame lse
    assert m["backward"]["float32"]["status"] == "FAIL"
    assert m["rule full"]["float16"]["status"] == "declined"
    assert rep.cell_text(m["rule full"]["float16"]) == "declined (supports dtypes float32)"
    assert m["2-d"]["float32"]["status"] == "untested"
    top = rep.suspects(_results())
    assert {s["feature"] for s in top} >= {"rule causal", "backward"}


def test_matrix_script_renders_reports(tmp_path):
    payload = {"backend": "reference", "mode": "quick", "seed": 1, "framework": "numpy", "device": "cpu",
               "results": [r.__dict__ for r in _results()]}  # fmt: skip
    report = rep.build_report(payload, 1.0, "attnhub certify reference --quick")
    assert not report["summary"]["certified"]
    md = rep.markdown(report)
    assert "| rule causal | FAIL (1) |" in md and "reproduce" not in md or "attnhub certify" in md
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    page = matrix_mod.render(matrix_mod.load([str(path)]))
    assert "## Overview" in page and "| rule causal | **FAIL** f32 |" in page
    assert "CPU" in page
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{matrix_mod.START}\nold table\n{matrix_mod.END}\noutro\n")
    matrix_mod.main([str(path), "--readme", str(readme)])
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old table" not in text
    assert "| rule causal | **FAIL** f32 |" in text


def _report(results: list[Result]) -> dict:
    payload = {"backend": "reference", "mode": "quick", "seed": 1, "framework": "numpy", "device": "cpu",
               "results": [r.__dict__ for r in results]}  # fmt: skip
    return rep.build_report(payload, 1.0, "attnhub certify reference --quick")


def test_report_keeps_failing_cases_in_full_and_only_counts_the_others():
    report = _report(_results())
    assert report["schema"] == rep.SCHEMA and "results" not in report
    assert report["failures"] == [
        {"id": "a", "dtype": "float32", "features": ["1-d", "rule causal", "lse"], "status": "FAIL",
         "reasons": [], "check": "out", "message": "bad", "request": "", "repro": ""},
        {"id": "d", "dtype": "float32", "features": ["1-d", "rule full", "backward"], "status": "FAIL",
         "reasons": [], "check": "dq", "message": "bad grad", "request": "", "repro": ""},
    ]  # fmt: skip
    assert report["declined_reasons"] == {"supports dtypes float32": 1}
    assert report["summary"] == {"cases": 4, "passed": 1, "failed": 2, "declined": 1, "certified": False}
    text = json.dumps(report)
    assert '"b"' not in text and '"c"' not in text  # passing and declined cases are counted, not named
    # a thousand more passing cases change counts, not the report's size
    many = _results() + [
        Result(f"p{i}-with-a-long-case-id", "float32", ["1-d", "rule full"], "pass", request="r" * 80)
        for i in range(1000)
    ]
    big = _report(many)
    assert big["matrix"]["rule full"]["float32"]["passed"] == 1001
    assert abs(len(json.dumps(big)) - len(text)) < 200


def test_matrix_reads_both_report_schemas_and_refuses_others(tmp_path):
    report = _report(_results())
    old = {**report, "schema": "attnhub-certify-report/1", "results": [r.__dict__ for r in _results()]}
    pages = []
    for name, data in (("new", report), ("old", old)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
        pages.append(matrix_mod.render(matrix_mod.load([str(tmp_path / f"{name}.json")])))
    assert pages[0] == pages[1] and "| rule causal | **FAIL** f32 |" in pages[0]
    (tmp_path / "future.json").write_text(json.dumps({**report, "schema": "attnhub-certify-report/99"}))
    with pytest.raises(SystemExit, match="schema"):
        matrix_mod.load([str(tmp_path / "future.json")])


def test_certify_unknown_and_unavailable_backends(broken_backends, monkeypatch):
    runner = CliRunner()
    res = runner.invoke(certify, ["no_such_backend", "--quick"])
    assert res.exit_code != 0 and "no backend named 'no_such_backend'" in res.output
    monkeypatch.setattr(_Half, "availability", lambda self: "needs a frobnicator")
    res = runner.invoke(certify, ["t_conf_half", "--quick"])
    assert res.exit_code != 0 and "not available on this machine: needs a frobnicator" in res.output


def test_plugin_is_inert_in_ordinary_runs(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_plain(): assert True\n")
    suite = Path(__import__("attnhub_conformance.suite").suite.__file__)
    cmd = [sys.executable, "-m", "pytest", "-q", "-c", "/dev/null", "-p", "no:cacheprovider",
           "--rootdir", str(tmp_path), str(tmp_path), str(suite)]  # fmt: skip
    if not _plugin_autoloaded():
        cmd += ["-p", "attnhub_conformance.plugin"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    # only the plain test runs; the suite skips without --attnhub-backend
    assert "1 passed" in out.stdout and "2 skipped" in out.stdout, out.stdout + out.stderr


def test_certify_reproduces_one_case(tmp_path):
    case = quick_grid(ALL, "numpy")[3]
    cmd = [sys.executable, "-m", "attnhub_conformance.cli", "reference", "--case", case.id, "--seed", "7",
           "--report", str(tmp_path / "one")]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "one.json").read_text())
    assert report["summary"]["cases"] == report["summary"]["passed"] == 1
    assert report["command"].endswith(f"--case={case.id}")
    assert (tmp_path / "one.md").read_text().startswith("# attnhub certify reference")


def test_a_backend_declining_everything_certifies_nothing(broken_backends):
    cert = Certifier("t_conf_nothing", seed=4)
    for case in quick_grid(ALL, "numpy")[:6]:
        assert cert.run(case).status == "declined"  # and declined honestly (no CaseFailure)
    payload = {"backend": "t_conf_nothing", "mode": "quick", "seed": 4, "framework": "numpy", "device": "cpu",
               "results": [r.__dict__ for r in cert.results.values()]}  # fmt: skip
    report = rep.build_report(payload, 1.0, "attnhub certify t_conf_nothing --quick")
    assert rep.verdict(report) == "certifies nothing: every case was declined"
    assert report["matrix"]["rule causal"]["float32"]["status"] == "declined"
    assert "declined (this backend serves nothing)" in rep.markdown(report)


def test_randomised_cases_replay_by_id(tmp_path):
    """Full mode draws hypothesis cases from the seed; `--case random-N --seed S` replays one alone."""
    import os

    import attnhub_conformance

    # the report counts passing cases without naming them: the ids come from the suite's results file
    suite = Path(attnhub_conformance.__file__).with_name("suite.py")
    results = tmp_path / "results.json"
    cmd = [
        sys.executable, "-m", "pytest", str(suite), "-c", os.devnull, "--rootdir", str(suite.parent),
        "-p", "no:cacheprovider", "--import-mode=importlib", "-q", "--attnhub-backend=reference",
        "--attnhub-seed=13", "--attnhub-examples=4", "--attnhub-feature=randomised",
        f"--attnhub-results={results}",
    ]  # fmt: skip
    if not _plugin_autoloaded():
        cmd += ["-p", "attnhub_conformance.plugin"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert results.exists(), out.stdout + out.stderr
    ids = [r["id"] for r in json.loads(results.read_text())["results"]]
    assert ids and all(i.startswith("random-") for i in ids)
    base = [sys.executable, "-m", "attnhub_conformance.cli", "reference", "--seed", "13", "--examples", "4"]
    out = subprocess.run(
        [*base, "--case", ids[-1], "--report", str(tmp_path / "one")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "one.json").read_text())
    assert report["summary"]["cases"] == report["summary"]["passed"] == 1
    assert sum(report["matrix"]["randomised"][d]["passed"] for d in DTYPES) == 1


def test_interrupted_jobs_report_what_they_recorded(tmp_path):
    """certify --jobs cut off: finished shards' results and running shards' .partial lines count."""
    from attnhub_conformance.parallel import _echo_partial

    row = dict(id="a", dtype="float32", features=[], status="pass", message="")
    (tmp_path / "results0.json").write_text(json.dumps({"results": [row, {**row, "id": "b"}]}))
    failing = {**row, "id": "c", "status": "FAIL", "message": "out: rel 0.3"}
    (tmp_path / "results1.json.partial").write_text(
        json.dumps(failing) + "\n" + json.dumps({**row, "id": "d"})
    )
    lines: list[str] = []
    _echo_partial(
        [tmp_path / "results0.json", tmp_path / "results1.json", tmp_path / "results2.json"], lines.append
    )
    assert lines[0].startswith("interrupted: 4 cases recorded (3 pass, 1 FAIL, 0 declined)")
    assert lines[1] == "  FAIL c: out: rel 0.3"


def test_plugin_appends_partial_results(tmp_path):
    """Each finished test appends its new results to <results>.partial (JSON lines), the same
    cases as the final results file."""
    import os

    import attnhub_conformance

    suite = Path(attnhub_conformance.__file__).with_name("suite.py")
    results = tmp_path / "results.json"
    cmd = [
        sys.executable, "-m", "pytest", str(suite), "-c", os.devnull, "--rootdir", str(suite.parent),
        "-p", "no:cacheprovider", "--import-mode=importlib", "-q", "--attnhub-backend=reference",
        "--attnhub-quick", "--attnhub-seed=4", f"--attnhub-results={results}",
    ]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    final = {r["id"] for r in json.loads(results.read_text())["results"]}
    partial = [json.loads(x)["id"] for x in Path(f"{results}.partial").read_text().splitlines()]
    assert len(final) >= 35 and sorted(partial) == sorted(final)
