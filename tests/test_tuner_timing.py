"""The tuner persists only timings it can trust (issue 36): steady-state CPU times after a warm-up by
count, enough repetitions, a robust statistic (the fastest call); a class whose fastest backend is not the declared-priority one
is re-timed, and the priority order is kept unless the re-timing confirms the faster backend.

No test here times real kernels for long: slow first calls are simulated by sleeps of a few ms,
and the re-timing tests script the times."""

from __future__ import annotations

import json
import time
from collections import Counter

from click.testing import CliRunner

from attnhub import tuner
from attnhub.bench import timing
from attnhub.bench.grid import Case
from attnhub.cli import main
from attnhub.rules import Causal

SLOW_CALLS, SLOW_S = 4, 0.02  # the first calls sleep 20 ms each; later ones return at once


def slow_at_first(slow_calls: int = SLOW_CALLS):
    """A callable whose first ``slow_calls`` calls sleep ``SLOW_S``: a kernel that warms up slowly."""
    calls = Counter()

    def fn(*qkv):
        calls["n"] += 1
        if calls["n"] <= slow_calls:
            time.sleep(SLOW_S)
        return qkv[0] * 1.0 if qkv else None  # a tensor with q's shape (and graph, for backward)

    return fn, calls


def test_cpu_bench_reports_the_steady_state_after_slow_first_calls():
    fn, calls = slow_at_first()
    ms = timing.cpu_bench(fn, warmup=5, rep=20)
    assert ms < 1.0, ms  # the steady state (microseconds), not the 20 ms of the first calls
    assert calls["n"] >= SLOW_CALLS + 10


def test_cpu_timing_warms_up_by_count_and_repeats_enough():
    fn, calls = slow_at_first(slow_calls=1)
    res = timing.cpu_timing(fn, warmup=0, rep=0)  # no time budget: the minimum counts still apply
    assert res.warmup_calls >= timing.CPU_WARMUP_CALLS and res.calls >= timing.CPU_MIN_CALLS
    assert calls["n"] == res.warmup_calls + res.calls
    assert res.ms <= res.median_ms < 1.0
    assert "fastest of" in res.describe() and str(res.calls) in res.describe()


def entries_of(path) -> list[dict]:
    return json.loads(path.read_text())["entries"]


def test_tune_records_the_steady_state_of_a_backend_slow_at_first(cache_dir, tmp_path, monkeypatch):
    """A backend whose first calls are slow (lazy set-up, caches) is recorded at its steady time."""
    monkeypatch.setattr(tuner, "candidates", lambda req, only=None: ["warming"])
    monkeypatch.setattr(tuner, "_runner", lambda name, case: slow_at_first()[0])
    out = tmp_path / "p.json"
    tuner.tune("cpu", quick=True, out=out)
    entries = entries_of(out)
    assert len(entries) == 4
    for e in entries:
        assert 0 < e["ms"]["warming"] < 1.0, e
        assert "fastest of" in e["how"]["warming"], e


class Scripted:
    """``time_case`` with scripted times: the n-th timing of a backend on a case gets ``script[name][n]``."""

    def __init__(self, script: dict[str, list[float | None]]):
        self.script = script
        self.count: Counter = Counter()

    def __call__(self, name, case, *args, **kwargs):
        n = self.count[name, case.label()]
        self.count[name, case.label()] += 1
        ms = self.script[name][n]
        return timing.Result(name, case, ms=ms, error=None if ms is not None else "boom", how="scripted")


CASE = Case("dense", 1, 1, 1, 64, 64, 32, Causal(), "none_front", "float32", "fwd")


def test_a_faster_backend_the_retiming_does_not_confirm_keeps_the_prior(monkeypatch):
    # "prior" is first (highest priority); "fluke" looked 2x faster once, then was slower.
    scripted = Scripted({"prior": [1.0, 1.1], "fluke": [0.5, 1.3], "slow": [3.0]})
    monkeypatch.setattr(timing, "time_case", scripted)
    res = tuner.time_class(CASE, ["prior", "fluke", "slow"], "cpu")
    assert scripted.count == {
        ("prior", CASE.label()): 2,
        ("fluke", CASE.label()): 2,
        ("slow", CASE.label()): 1,
    }
    assert min(res.ms, key=lambda n: (res.ms[n] is None, res.ms[n] or 0.0)) == "prior"
    assert res.ms["fluke"] >= res.ms["prior"] and res.ms["slow"] == 3.0
    assert "not confirmed" in res.how["fluke"] and "re-timed" in res.how["prior"]


def test_a_faster_backend_the_retiming_confirms_wins(monkeypatch):
    scripted = Scripted({"prior": [1.0, 1.2], "fast": [0.5, 0.6]})
    monkeypatch.setattr(timing, "time_case", scripted)
    res = tuner.time_class(CASE, ["prior", "fast"], "cpu")
    assert res.ms == {"prior": 1.0, "fast": 0.5}
    assert "confirmed" in res.how["fast"] and "not confirmed" not in res.how["fast"]


def test_a_faster_backend_that_fails_its_retiming_is_not_kept(monkeypatch):
    monkeypatch.setattr(timing, "time_case", Scripted({"prior": [1.0, 1.0], "flaky": [0.5, None]}))
    res = tuner.time_class(CASE, ["prior", "flaky"], "cpu")
    assert res.ms["flaky"] is None and res.errors["flaky"] == "boom" and res.ms["prior"] == 1.0


def test_no_retiming_when_the_prior_is_fastest(monkeypatch):
    scripted = Scripted({"prior": [0.5], "other": [1.0]})
    monkeypatch.setattr(timing, "time_case", scripted)
    res = tuner.time_class(CASE, ["prior", "other"], "cpu")
    assert res.ms == {"prior": 0.5, "other": 1.0} and sum(scripted.count.values()) == 2


def test_tune_writes_the_prior_over_an_unconfirmed_winner(cache_dir, tmp_path, monkeypatch):
    """End to end: the profile `tune` writes keeps the priority order where re-timing disagrees,
    and says per backend how each figure was measured."""
    monkeypatch.setattr(tuner, "candidates", lambda req, only=None: ["prior", "fluke"])
    monkeypatch.setattr(timing, "time_case", Scripted({"prior": [1.0, 1.0] * 4, "fluke": [0.1, 2.0] * 4}))
    out = tmp_path / "p.json"
    tuner.tune("cpu", quick=True, out=out)
    for e in entries_of(out):
        assert e["ms"]["fluke"] >= e["ms"]["prior"], e
        assert set(e["how"]) == {"prior", "fluke"}, e


def test_tune_help_describes_each_devices_grid():
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["tune", "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "cuda:" in text and "cpu:" in text
    assert "L=64" in text  # the CPU quick grid
    assert "L in 1k/4k" in text  # the CUDA quick grid


def test_host_loops_take_turns_so_a_slow_stretch_weighs_on_every_backend(monkeypatch):
    """The host family's loops run backend by backend in rounds, not one backend's loops and then
    the next one's: a process whose calls slow down partway (seen in `attnhub tune` on an H200,
    22 us then 36 for the same loop) would otherwise rank the backends by when they ran."""
    order: list[str] = []

    def runner(name, case):
        def fn(q, k, v):
            order.append(name)
            return q

        return fn

    monkeypatch.setattr(tuner, "_runner", runner)
    case = Case("host", 1, 1, 1, 4, 4, 8, Causal(), "none_front", "float32", "fwd")
    best = tuner.host_loops(["a", "b", "c"], case, "cpu", calls=3, rounds=4)
    assert set(best) == {"a", "b", "c"} and all(0 < t < float("inf") for t in best.values())
    # Per loop, `calls` consecutive calls of one backend; the loops themselves alternate.
    loops = order[::3]
    assert len(loops) == 3 * 5  # a warm-up round and 4 timed rounds of three loops
    for r in range(5):
        assert sorted(loops[3 * r : 3 * r + 3]) == ["a", "b", "c"]
    assert loops[:3] != loops[3:6]  # each round starts with the next backend
