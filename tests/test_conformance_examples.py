"""Proof that certify can fail: the third-party example package certifies, each broken variant fails
on the feature it breaks.

The package (examples/toy_backend) is pip-installed, as a third party would, into a temporary
``--target`` directory (``--no-deps --no-build-isolation``: nothing is downloaded and the project's
venv is left untouched; it builds with the venv's setuptools, hence ``setuptools>=70.1`` in the
``dev`` extra); ``attnhub certify`` then runs in a subprocess with that directory on
PYTHONPATH, so the backends are found through the ``attnhub`` entry-point group.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "toy_backend"

#: variant -> (the matrix row it breaks, the check that catches it, a row it leaves passing)
#: The last four were certified by the grids before they chose cases from what each bug looks like.
BROKEN = {
    "toy_causal_off_by_one": ("rule causal", "out", "rule full"),
    "toy_sync_confused": ("sync scale_end", "out", "sync scale_front"),
    "toy_scale_ignored": ("custom scale", "out", "rule full"),
    "toy_lse_wrong": ("lse", "lse", "backward"),
    "toy_masked_row_nan": ("fully masked rows", "out", "rule full"),
    "toy_grad_wrong": ("backward", "dq", "lse"),
    "toy_mask_ignored": ("explicit additive mask", "out", "rule causal"),
    "toy_bf16_in_f16": ("large logits", "out", "rule local"),
    "toy_bshd_ignored": ("layout bshd", "out", "layout bhds"),
    "toy_dv_gt_dqk": ("Dv > Dqk", "out", "Dv < Dqk"),
    "toy_modifies_inputs": ("inputs unchanged", "inputs modified", "rule full"),
    "toy_nan_to_num": ("NaN/Inf propagate", "out", "rule full"),
    "toy_zero_nan_rows": ("NaN/Inf propagate", "out", "rule full"),
}
#: variants whose bug lives in one dtype: the row fails there and passes in the others
ONE_DTYPE = {"toy_bf16_in_f16": "bfloat16"}


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory) -> Path:
    """examples/toy_backend installed with pip into a fresh target directory."""
    work = tmp_path_factory.mktemp("toy")
    src = work / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = work / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--no-index", "--target", str(site), str(src)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    assert (site / "attnhub_toy").is_dir()
    return site


def certify(
    site: Path, name: str, report: Path, extra: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    )
    cmd = [
        sys.executable,
        "-m",
        "attnhub_conformance.cli",
        name,
        "--quick",
        "--seed",
        "11",
        "--report",
        str(report),
        *extra,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    data = json.loads(report.with_suffix(".json").read_text()) if report.with_suffix(".json").exists() else {}
    return out, data


def test_toy_backend_certifies(toy_site, tmp_path):
    out, report = certify(toy_site, "toy", tmp_path / "toy")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert report["summary"]["certified"] and report["summary"]["failed"] == 0
    assert report["summary"]["passed"] >= 35
    assert "toy: certified" in out.stdout


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_broken_variant_fails_on_its_feature(toy_site, tmp_path, variant):
    row, check, untouched = BROKEN[variant]
    out, report = certify(toy_site, variant, tmp_path / variant)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    matrix = report["matrix"]
    assert any(c["status"] == "FAIL" for c in matrix[row].values()), f"{row} does not show FAIL"
    if variant in ONE_DTYPE:
        assert {d for d, c in matrix[row].items() if c["status"] == "FAIL"} == {ONE_DTYPE[variant]}
        assert any(c["status"] == "pass" for c in matrix[row].values())
    assert row in [s["feature"] for s in report["suspects"][:2]], report["suspects"]
    assert check in {f["check"] for f in report["failures"]}
    # a feature the variant does not touch still passes: the failure is named, not smeared
    assert all(c["status"] != "FAIL" for c in matrix[untouched].values()), (untouched, matrix[untouched])
    assert any(c["status"] == "pass" for c in matrix[untouched].values())
    # each failure prints the one command that reproduces it alone
    first = report["failures"][0]
    assert first["repro"] == f"attnhub certify {variant} --case {first['id']} --seed 11"
    assert first["repro"] in out.stdout
    # the attribution block is printed, and the run ends with its seed
    assert "Most likely broken" in out.stdout
    assert out.stdout.rstrip().splitlines()[-1].startswith(f"{variant}: FAILED (quick mode, seed 11")


def test_jobs_run_the_same_cases_as_one_process(toy_site, tmp_path):
    """``--jobs 2`` shards the cases over two processes: same ids, same verdicts, one report."""
    _, one = certify(toy_site, "toy", tmp_path / "one")
    out, two = certify(toy_site, "toy", tmp_path / "two", ("--jobs", "2"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "shard 2/2 finished" in out.stdout
    # the report counts cases per feature x dtype and keeps failures in full: all of it must agree
    verdicts = lambda r: (r["summary"], r["matrix"], r["declined_reasons"], r["failures"])  # noqa: E731
    assert verdicts(one) == verdicts(two) and one["summary"]["cases"] >= 35


def test_jobs_keep_a_failure(toy_site, tmp_path):
    """A broken backend still fails when its failing case runs in another shard than the first."""
    out, report = certify(toy_site, "toy_causal_off_by_one", tmp_path / "broken", ("-j", "3"))
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert any(c["status"] == "FAIL" for c in report["matrix"]["rule causal"].values())
