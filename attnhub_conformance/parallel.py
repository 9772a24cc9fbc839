"""``attnhub certify --jobs N``: the suite in N processes, one shard of the cases each, merged.

Why: on GPUs most of a full run is compiling one kernel (Triton) or XLA program (JAX) per case
signature, which is single-threaded per process. Shards split the grid round-robin and the
randomised draws by draw number (``--attnhub-shard i/N``), so every case runs exactly once with the
same seed and data as in a single process; the shards' results are merged into one report.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_PROGRESS_EVERY_S = 15.0


def _recorded(results: Path) -> list[dict[str, Any]]:
    """The cases a shard has recorded: its results file once it ended, else the ``.partial`` JSON
    lines the plugin appends after each test (none yet: empty)."""
    try:
        if results.exists():
            return json.loads(results.read_text(encoding="utf-8"))["results"]
        lines = Path(f"{results}.partial").read_text(encoding="utf-8").splitlines()
        return [json.loads(x) for x in lines if x.strip()]
    except (OSError, ValueError, KeyError):
        return []


def _kill(procs: list[tuple[subprocess.Popen, Path, Path]]) -> None:
    for proc, _, _ in procs:
        if proc.poll() is None:
            proc.kill()


def _echo_partial(results: list[Path], echo: Any) -> None:
    """What an interrupted run recorded (finished shards' results, the others' ``.partial`` lines):
    counts and failures, and that this is no verdict."""
    seen = {r["id"]: r for path in results for r in _recorded(path)}
    counts = {s: sum(r["status"] == s for r in seen.values()) for s in ("pass", "FAIL", "declined")}
    echo(
        f"interrupted: {len(seen)} cases recorded ({counts['pass']} pass, {counts['FAIL']} FAIL, "
        f"{counts['declined']} declined); an unfinished run certifies nothing"
    )
    for r in seen.values():
        if r["status"] == "FAIL":
            echo(f"  FAIL {r['id']}: {r['message']}")


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _wait(procs: list[tuple[subprocess.Popen, Path, Path]], echo: Any) -> dict[int, int]:
    """Wait for every shard, echoing each end and the cases done every 15 s; their exit codes."""
    jobs = len(procs)
    t0 = time.perf_counter()
    last = t0
    running = set(range(jobs))
    codes: dict[int, int] = {}
    while running:
        time.sleep(0.5)
        for i in sorted(running):
            rc = procs[i][0].poll()
            if rc is not None:
                running.discard(i)
                codes[i] = rc
                echo(f"  shard {i + 1}/{jobs} finished (exit {rc}) after {time.perf_counter() - t0:.0f} s")
        if running and time.perf_counter() - last >= _PROGRESS_EVERY_S:
            last = time.perf_counter()
            done = sum(len(_recorded(res)) for _, res, _ in procs)
            echo(f"  {done} cases done, {len(running)} shard(s) running, {last - t0:.0f} s")
    return codes


def run_sharded(pytest_args: list[str], jobs: int, tmp: Path, echo: Any) -> tuple[int, dict[str, Any]]:
    """Run ``pytest_args`` in ``jobs`` shards; returns (worst exit status, merged results payload).

    ``pytest_args`` must not name ``--attnhub-results``; each shard writes its own file in ``tmp``.
    ``echo`` prints a progress line (each shard's end, and the cases done every 15 s).
    """
    procs: list[tuple[subprocess.Popen, Path, Path]] = []
    for i in range(jobs):
        results, log = tmp / f"results{i}.json", tmp / f"shard{i}.log"
        cmd = [sys.executable, "-m", "pytest", *pytest_args, f"--attnhub-shard={i}/{jobs}"]
        cmd.append(f"--attnhub-results={results}")
        fh = open(log, "w", encoding="utf-8")  # noqa: SIM115 - closed when the shard ends
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # N processes on one GPU: JAX must not take 75 % of its memory in each.
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        procs.append((subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env), results, log))
        fh.close()
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        codes = _wait(procs, echo)
    except BaseException:  # interrupted (Ctrl-C, SIGTERM from a time limit): no shard outlives it
        _kill(procs)
        _echo_partial([res for _, res, _ in procs], echo)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    merged: dict[str, Any] | None = None
    for i, (_, results, log) in enumerate(procs):
        if not results.exists():
            tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-20:])
            raise RuntimeError(
                f"shard {i + 1}/{jobs} did not run (exit {codes[i]}); its output ends:\n{tail}"
            )
        payload = json.loads(results.read_text(encoding="utf-8"))
        if merged is None:
            merged = payload
        else:
            merged["results"].extend(payload["results"])
            merged["random_examples"] = max(merged["random_examples"], payload["random_examples"])
    assert merged is not None
    worst = max(codes.values(), key=lambda rc: (rc not in (0, 5), rc))
    return worst, merged
