"""The conformance suite's own parts: grids, comparisons, the runner's checks, reports, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from click.testing import CliRunner

from attnhub import Causal, Full, Local
from attnhub_backends.reference.backend import ReferenceBackend
from attnhub_conformance import matrix as matrix_mod
from attnhub_conformance import report as rep
from attnhub_conformance.cases import (
    DTYPES,
    FEATURE_ROWS,
    HEAD_DIM_CLASSES,
    Case,
    full_grid,
    quick_grid,
    secondary_grid,
)
from attnhub_conformance.cli import _plugin_autoloaded, certify
from attnhub_conformance.runner import CaseFailure, Certifier, Result, compare, make_data
from tests.plugged import plugged_in

ALL = ("float32", "float64", "float16", "bfloat16")


def test_grids_have_unique_ids_and_cover_every_row():
    for grid in (quick_grid(ALL, "numpy"), full_grid(ALL, "numpy")):
        ids = [c.id for c in grid]
        assert len(ids) == len(set(ids))
        covered = {f for c in grid for f in c.features}
        # NumPy has no tracer: its grids have no traced cases (see test_conformance_traced.py)
        assert set(FEATURE_ROWS) - covered == {"randomised", "traced"} | {
            f for f in FEATURE_ROWS if f.startswith("framework")
        }
    quick = quick_grid(ALL, "numpy")
    # --quick must stay small for the slow backends: the dense cases (SPEC §4 NaN/Inf: 2 tiny ones
    # per dtype); the §9-§11 part is bounded with its cases (modifier_cases.py)
    assert len([c for c in quick if not c.modified]) <= 75
    # every dtype has a column even when declined, and frameworks without strides skip views
    assert {c.dtype for c in quick_grid(("float32",), "numpy")} == set(DTYPES)
    assert not any(c.noncontig for c in quick_grid(ALL, "jax"))


@pytest.mark.parametrize("grid", [quick_grid, full_grid])
def test_grids_hold_the_cases_each_bug_needs(grid):
    """Cases chosen from what bugs look like: a precision bug of one tile path shows only with large
    logits at that head dim; a wrong transposition only where the swapped axes have equal sizes."""
    cases = grid(ALL, "numpy")
    for dt in ALL:
        big = {max(c.dim_qk, c.dim_v) for c in cases if c.dtype == dt and c.large_logits}
        assert set(HEAD_DIM_CLASSES) <= big, (dt, big)
    for layout, axis in (("bshd", "heads"), ("bhds", "dim")):
        same = [
            c
            for c in cases
            if c.layout == layout
            and c.ndim == 1
            and c.seq_q[0] == (c.heads_q if axis == "heads" else c.dim_qk)
        ]
        assert same, layout
    assert any(c.layout == "bshd" and c.seq_k[0] == c.heads_kv and c.grad for c in cases)
    assert any(c.dim_v > c.dim_qk for c in cases) and any(c.dim_v < c.dim_qk for c in cases)
    assert any(c.dim_v > c.dim_qk and c.grad for c in cases)


def test_secondary_frameworks_get_their_own_cases():
    quick = {c.id for c in quick_grid(ALL, "numpy")}
    torch = secondary_grid(ALL, "torch")
    assert torch and all(c.framework == "torch" and c.id.endswith("-torch") for c in torch)
    assert not quick & {c.id for c in torch}
    assert {"framework torch", "backward", "layout bshd", "explicit bool mask"} <= {
        f for c in torch for f in c.features
    }
    assert {c.dtype for c in torch} == set(ALL)
    assert not any(c.noncontig for c in secondary_grid(ALL, "jax"))


def test_random_cases_describe_themselves():
    case = Case("bfloat16", (7,), (9,), Local(3, 1, True), "scale_end", 1, 4, 2, 16, 32, "bshd", 0.25,
                large_logits=True, grad=True, random_index=123)  # fmt: skip
    assert case.id == "random-123"
    text = case.describe()
    for part in ("bfloat16", "q 7 k 9", "Hq=4 Hkv=2 Dqk=16 Dv=32", "layout bshd", "rule local3s1c",
                 "sync scale_end", "scale 0.25", "large logits yes", "grad"):  # fmt: skip
        assert part in text, (part, text)


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

    def forward(self, q, k, v, req, mask=None, operands=None):
        out, lse = super().forward(q, k, v, req, mask, operands)
        return out.astype(np.float64), lse


class _Scribbler(ReferenceBackend):
    name: ClassVar[str] = "t_conf_scribble"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        out, lse = super().forward(q, k, v, req, mask, operands)
        k[...] = 0  # writes into the caller's array through the canonical view
        return out, lse


class _Flaky(ReferenceBackend):
    name: ClassVar[str] = "t_conf_flaky"
    priority: ClassVar[int] = -50
    calls = 0

    def forward(self, q, k, v, req, mask=None, operands=None):
        out, lse = super().forward(q, k, v, req, mask, operands)
        type(self).calls += 1
        return out + (type(self).calls % 2) * np.finfo(out.dtype).eps * out, lse


class _Nothing(ReferenceBackend):
    """Declines every request: certifies nothing."""

    name: ClassVar[str] = "t_conf_nothing"
    priority: ClassVar[int] = -50

    def extra_reasons(self, req):
        return ["this backend serves nothing"]


@pytest.fixture(scope="module")
def broken_backends():
    with plugged_in(_Half(), _WrongDtype(), _Scribbler(), _Flaky(), _Nothing()):
        yield


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


def test_modified_inputs_fail_their_own_row_only(broken_backends):
    """A backend writing into its inputs, results otherwise right: the "inputs unchanged" row fails,
    the case's other rows count as passing (their checks ran on rebuilt inputs and passed)."""
    cert = Certifier("t_conf_scribble", seed=2)
    case = Case("float32", (11,), (13,), Causal(), lse=True)
    with pytest.raises(CaseFailure, match="modified the caller's k"):
        cert.run(case)
    mask_case = Case("float32", (9,), (9,), "additive", grad=True)
    with pytest.raises(CaseFailure):
        cert.run(mask_case)
    results = list(cert.results.values())
    m = rep.aggregate(results)
    assert m["inputs unchanged"]["float32"]["status"] == "FAIL"
    assert m["rule causal"]["float32"]["status"] == "pass" and m["lse"]["float32"]["status"] == "pass"
    assert m["backward"]["float32"]["status"] == "pass"
    assert [s["feature"] for s in rep.suspects(results)] == ["inputs unchanged"]


def test_inputs_compared_bitwise():
    from attnhub_conformance.runner import same_bits

    assert same_bits(np.array([0.0, np.nan]), np.array([0.0, np.nan]))
    assert not same_bits(np.array([0.0]), np.array([-0.0]))  # equal values, other bits
    assert not same_bits(np.zeros(2, np.float32), np.zeros(2, np.float64))


def test_a_failed_random_case_says_what_it_was(broken_backends):
    cert = Certifier("t_conf_dtype", seed=9)
    case = Case("float32", (5,), (6,), Full(), layout="bhds", scale=1.7, large_logits=True, random_index=77)
    with pytest.raises(CaseFailure):
        cert.run(case)
    msg = cert.results["random-77"].message
    assert "layout bhds" in msg and "scale 1.7" in msg and "large logits yes" in msg and "seed 9" in msg
    assert "[hygiene out]" in msg


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


def test_attribution_is_printed_when_no_row_stands_out():
    results = [
        Result(str(i), "float32", ["1-d", "rule full" if i % 2 else "rule causal"], "FAIL" if i < 2 else "pass",
               check="out", message="bad")
        for i in range(8)
    ]  # fmt: skip
    payload = {"backend": "reference", "mode": "quick", "seed": 1, "framework": "numpy", "device": "cpu",
               "results": [r.__dict__ for r in results]}  # fmt: skip
    report = rep.build_report(payload, 1.0, "attnhub certify reference --quick")
    assert report["suspects"] == []
    lines = rep.attribution(report)
    assert lines[0].startswith("Most likely broken")
    assert lines[1].startswith("- no single row stands out; failing rows: 1-d (float32 2)")
    assert "rule full (float32 1)" in lines[1] and "rule causal (float32 1)" in lines[1]
    assert lines[1] in rep.markdown(report)


def test_suspects_find_a_bug_of_one_dtype():
    """Large logits fail in bfloat16 only: few of all large-logit cases, most of bfloat16's."""
    results = [Result(f"{d}{i}", d, ["1-d", "large logits"], "pass") for d in ALL for i in range(3)]
    results += [Result(f"{d}x{i}", d, ["1-d"], "pass") for d in ALL for i in range(3)]
    results[9].status, results[10].status = "FAIL", "FAIL"  # two of bfloat16's three
    (top,) = rep.suspects(results)
    assert (top["feature"], top["dtype"]) == ("large logits", "bfloat16")
    assert rep.suspect_text(top).startswith("large logits (bfloat16): 2/3 accepted bfloat16 cases")


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


def _cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "attnhub_conformance.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def test_every_declared_framework_runs_and_the_seed_is_recorded(tmp_path):
    """Without --framework every declared framework gets cases (the report says which ran); without
    --seed one is drawn, printed first and last, and stored; --framework F says what did not run."""
    out = _cli("reference", "--quick", "--feature", "rule local strided", "--report", str(tmp_path / "all"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "all.json").read_text())
    seed = report["seed"]
    lines = out.stdout.strip().splitlines()
    assert f"seed {seed} " in lines[0] and f"seed {seed};" in lines[-1]
    assert f"--seed {seed}" in report["command"]
    assert report["frameworks_run"] == ["numpy", "torch", "tensorflow", "jax"]
    assert report["frameworks_not_run"] == {}
    for fw in ("torch", "tensorflow", "jax"):
        assert sum(c["passed"] for c in report["matrix"][f"framework {fw}"].values()) > 0, fw
        assert any(c["status"] == "pass" for c in report["matrix"][f"framework {fw}"].values()), fw
    assert "frameworks run: numpy, torch, tensorflow, jax" in out.stdout

    again = _cli("reference", "--quick", "--feature", "rule local strided", "--seed", str(seed),
                 "--framework", "numpy", "--report", str(tmp_path / "numpy"))  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    only = json.loads((tmp_path / "numpy.json").read_text())
    assert only["frameworks_run"] == ["numpy"] and set(only["frameworks_not_run"]) == {
        "torch",
        "tensorflow",
        "jax",
    }
    assert "NOT run: torch (--framework numpy runs that framework only)" in again.stdout
    assert "NOT run: torch" in (tmp_path / "numpy.md").read_text()
    # the numpy cases are the same ones, with the same outcomes, alone or beside the other frameworks
    assert only["matrix"]["framework numpy"] == report["matrix"]["framework numpy"]


def test_certify_prints_no_warnings(tmp_path):
    """Installed as a wheel (not editable), pytest would mark attnhub's already imported modules
    for assertion rewriting and warn (PytestAssertRewriteWarning) on every run: certify runs it
    with --assert=plain."""
    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    src.mkdir()
    for name in ("attnhub", "attnhub_backends", "attnhub_conformance"):
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(root / name, src / name)
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "--target", str(site), str(src)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    env = dict(os.environ, PYTHONPATH=str(site))
    case = quick_grid(ALL, "numpy")[0]
    out = _cli("reference", "--case", case.id, "--seed", "3", "--framework", "numpy", env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "reference: certified" in out.stdout
    assert "warning" not in (out.stdout + out.stderr).lower()
