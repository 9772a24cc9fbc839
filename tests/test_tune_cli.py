"""``attnhub tune``: the CPU grid writes a profile that auto then follows; shipped profiles are valid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import attnhub
from attnhub import profile
from attnhub.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_tune_cpu_quick_writes_a_profile_auto_follows(cache_dir):
    import torch

    res = CliRunner().invoke(main, ["tune", "--device", "cpu", "--quick"])
    assert res.exit_code == 0, res.output
    key = profile.device_key("cpu")
    path = profile.user_profile_path(key)
    assert f"wrote {path}" in res.output and "4 request classes measured" in res.output
    data = json.loads(path.read_text())
    assert data["schema"] == profile.SCHEMA and data["device"] == key
    assert len(data["entries"]) == 4
    grads = set()
    for e in data["entries"]:
        assert e["class"]["framework"] == "torch" and e["class"]["device_type"] == "cpu"
        assert e["ms"]["reference"] > 0
        grads.add(e["class"]["grad"])
    assert grads == {True, False}
    q = torch.randn(1, 1, 64, 32)
    exp = attnhub.explain(q, q, q, mask="causal")
    assert exp.measured is not None and exp.measured.exact
    assert "CHOSEN (measured" in str(exp)


def test_tune_out_writes_elsewhere(cache_dir, tmp_path):
    out = tmp_path / "ship" / "cpu.json"
    result = attnhub.tune("cpu", quick=True, dtypes=("float32",), out=out, rep=1, warmup=1)
    assert result.path == out and out.exists()
    assert not profile.user_profile_path(profile.device_key("cpu")).exists()
    assert len(result.classes) == 4 and all(t["reference"] for _, t in result.classes)


def test_tune_out_directory_names_the_file_by_device(cache_dir, tmp_path):
    res = CliRunner().invoke(
        main, ["tune", "--device", "cpu", "--quick", "--rep", "1", "--out", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    path = tmp_path / f"{profile.slug(profile.device_key('cpu'))}.json"
    assert f"wrote {path}" in res.output and json.loads(path.read_text())["entries"]


def test_tune_only_named_backends(cache_dir):
    result = attnhub.tune("cpu", quick=True, backends=["no_such_backend"], rep=1, warmup=1)
    assert result.classes == []


def test_tune_on_cuda_without_a_gpu_says_so(cache_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    res = CliRunner().invoke(main, ["tune", "--quick"])
    assert res.exit_code != 0 and "needs a CUDA GPU" in res.output


def test_tuner_modules_import_no_framework():
    code = (
        "import sys, attnhub, attnhub.profile, attnhub.tuner, attnhub.cli.tune;"
        "attnhub.profile.device_key('cpu');"
        "print([m for m in ('torch', 'tensorflow', 'jax', 'triton') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_shipped_profiles_are_package_data_and_valid():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "profiles/*.json" in conf["tool"]["setuptools"]["package-data"]["attnhub"]
    for path in sorted(profile.SHIPPED_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        assert data["schema"] == profile.SCHEMA, path
        assert path.name == f"{profile.slug(data['device'])}.json", path
        assert data["entries"], path
        for e in data["entries"]:
            profile.class_from_json(e["class"])
            assert any(t is not None for t in e["ms"].values()), (path, e)


@pytest.mark.gpu
def test_tune_cuda_decode_auto_picks_the_fastest_measured(cache_dir):
    """On a GPU: a quick tune of the decode class, then auto follows it: the fastest measured (ties
    within ``MEASURED_TIE`` in the prior's order) among the backends that build no plan per shape,
    which a decode step puts last whatever they measured (each step has a new cache length:
    ``dispatch.DECODE_ROWS``; the H200 of 2026-11-29 measured cudnn fastest here, auto correctly
    chose sdpa-flash, and this test, older than that rule, failed)."""
    import torch

    from attnhub.dispatch import MEASURED_TIE

    result = attnhub.tune("cuda", quick=True, dtypes=("bfloat16",), families=("decode",), warmup=5, rep=20)
    assert len(result.classes) == 1, result.classes
    ((_, times),) = result.classes
    measured = {n: t for n, t in times.items() if t is not None}
    assert measured, times
    q = torch.randn(8, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(8, 8, 8192, 128, device="cuda", dtype=torch.bfloat16)
    exp = attnhub.explain(q, k, k, sync="none_end")
    assert exp.measured is not None and exp.measured.exact, str(exp)
    table = attnhub.REGISTRY.backends()
    steady = {n: t for n, t in measured.items() if not getattr(table[n], "builds_per_shape", False)}
    assert steady, measured
    assert exp.chosen in steady, str(exp)
    assert steady[exp.chosen] <= min(steady.values()) * (1 + MEASURED_TIE), (steady, str(exp))
    assert "CHOSEN (measured" in str(exp)


def test_tune_grid_holds_the_host_bound_classes_sized():
    from attnhub import tuner
    from attnhub.bench.grid import HOST_SHAPES

    cases = tuner.tune_grid("cuda", quick=True, dtypes=("float16",), families=("host",))
    assert [(c.batch, c.heads_q, c.len_q, c.len_k) for c in cases] == list(HOST_SHAPES)
    assert all(c.direction == "fwd" and c.dim == 64 and c.dtype == "float16" for c in cases)
    assert {c.family for c in tuner.tune_grid("cuda", quick=True)} == set(tuner.FAMILIES)
    for c in tuner.tune_grid("cuda", quick=True, dtypes=("bfloat16",)):
        cls = tuner.case_class(c, tuner.case_request(c, "cuda:0"))
        assert len(cls) == (4 if c.family == "host" else 3), c


def test_a_candidates_cost_is_the_slower_of_gpu_and_host_time(monkeypatch):
    """On CUDA: max(GPU time, host time of a back-to-back loop); no loop where the GPU time is long."""
    from attnhub import tuner
    from attnhub.bench import timing
    from attnhub.bench.grid import host_grid

    gpu = {"fast-gpu": 0.01, "slow-gpu": 2.0, "broken": None}
    monkeypatch.setattr(
        timing, "time_case", lambda name, case, *a, **kw: timing.Result(name, case, ms=gpu[name])
    )
    looped = []

    def host(name, case, device):
        looped.append(name)
        return 0.05

    monkeypatch.setattr(tuner, "host_ms", host)
    monkeypatch.setattr(
        tuner, "host_loops", lambda names, case, device: {n: host(n, case, device) for n in names}
    )
    case = host_grid("float16")[0]
    times, _ = tuner.time_candidates(case, list(gpu), "cuda:0")
    assert times == {"fast-gpu": 0.05, "slow-gpu": 2.0, "broken": None}
    assert looped == ["fast-gpu"]
    times, _ = tuner.time_candidates(case, ["fast-gpu"], "cpu")  # wall clock already holds both
    assert times == {"fast-gpu": 0.01} and looped == ["fast-gpu"]


def test_host_bound_cases_are_timed_by_their_loop_alone(monkeypatch):
    """The host family stands for loops of small calls: its cost is the loop's time per call even
    where the flushed-cache GPU time is longer; other cases keep max(GPU, loop)."""
    from dataclasses import replace

    from attnhub import tuner
    from attnhub.bench import timing
    from attnhub.bench.grid import host_grid

    monkeypatch.setattr(timing, "time_case", lambda name, case, *a, **kw: timing.Result(name, case, ms=0.04))
    monkeypatch.setattr(tuner, "host_ms", lambda name, case, device: 0.025)
    monkeypatch.setattr(tuner, "host_loops", lambda names, case, device: dict.fromkeys(names, 0.025))
    case = host_grid("float16")[0]
    assert case.family == "host"
    assert tuner.time_candidates(case, ["k"], "cuda")[0] == {"k": 0.025}
    assert tuner.time_candidates(replace(case, family="dense"), ["k"], "cuda")[0] == {"k": 0.04}


def test_host_ms_times_a_loop_of_calls():
    pytest.importorskip("torch")
    from attnhub import tuner
    from attnhub.bench.grid import Case
    from attnhub.rules import Causal

    case = Case("host", 1, 1, 1, 4, 4, 8, Causal(), "none_front", "float32", "fwd")
    ms = tuner.host_ms("reference", case, "cpu", calls=3, rounds=2)
    assert 0 < ms < 1000


@pytest.mark.gpu
def test_tune_cuda_host_classes_apply_to_small_requests_only(cache_dir):
    """On a GPU: the host-bound classes, tuned, decide auto at their sizes, and not at big ones."""
    import torch

    result = attnhub.tune("cuda", dtypes=("float16",), families=("host",), warmup=5, rep=20)
    assert len(result.classes) == 3, result.classes
    for (b, h, lq, lk), (_, times) in zip(
        [(1, 8, 1, 512), (1, 8, 128, 128), (8, 12, 512, 512)], result.classes
    ):
        measured = {n: t for n, t in times.items() if t is not None}
        q = torch.randn(b, h, lq, 64, device="cuda", dtype=torch.float16)
        k = torch.randn(b, h, lk, 64, device="cuda", dtype=torch.float16)
        exp = attnhub.explain(q, k, k, mask="causal")
        assert exp.measured is not None and exp.measured.exact and len(exp.measured.cls) == 4, str(exp)
        assert exp.chosen == min(measured, key=measured.get), str(exp)
    big = torch.randn(64, 32, 512, 64, device="cuda", dtype=torch.float16)
    exp = attnhub.explain(big, big, big, mask="causal")
    assert exp.measured is None or len(exp.measured.cls) == 3, str(exp)


def test_tune_enters_every_backends_tuning_context(monkeypatch):
    """`attnhub tune` runs its timings inside each backend's ``tuning()`` (Backend's hook; the
    triton backend tunes its kernel configs there): the CLI names no backend."""
    import contextlib

    from attnhub import Backend, tuner
    from tests.plugged import plugged_in

    events = []

    class Tuned(Backend):
        name = "t_tune_hook"
        priority = -90
        frameworks = ("numpy",)
        device_types = ("cpu",)
        dtypes = ("float64",)
        features = frozenset({"1d", "full"})

        @contextlib.contextmanager
        def tuning(self):
            events.append("enter")
            try:
                yield
            finally:
                events.append("exit")

    def fake_tune(device, **kwargs):
        events.append("timing")
        raise RuntimeError("stopped here")

    monkeypatch.setattr(tuner, "tune", fake_tune)
    with plugged_in(Tuned()):
        result = CliRunner().invoke(main, ["tune", "--device", "cpu"])
    assert "stopped here" in result.output
    assert events == ["enter", "timing", "exit"]
