"""Timing one runner on one case: median of ``triton.testing.do_bench`` after warm-up, random data
(on the CPU: the fastest of many wall-clock repetitions, :func:`cpu_timing`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnhub.bench.grid import Case, flops

#: CPU timing: warm-up calls at least (besides the warm-up time), timed calls at least and at most
#: (besides the repetition time). A first call can outlast the whole warm-up time (lazy set-up,
#: allocator and thread-pool start): only counts make sure such calls stay out of the timed ones.
CPU_WARMUP_CALLS, CPU_MIN_CALLS, CPU_MAX_CALLS = 5, 20, 1000


@dataclass
class Result:
    """A runner's time on a case; ``ms`` is None with ``error`` set when it could not run."""

    name: str
    case: Case
    ms: float | None = None
    tflops: float | None = None
    error: str | None = None
    #: Decode families: TB/s of the valid K and V rows read.
    tbps: float | None = None
    #: How ``ms`` was measured (timer, statistic, calls), for the profiles that keep it.
    how: str | None = None

    def to_json(self) -> dict:
        return {
            "backend": self.name,
            **self.case.to_json(),
            "ms": self.ms,
            "tflops": self.tflops,
            "tbps": self.tbps,
            "error": self.error,
        }


@dataclass(frozen=True)
class CpuTiming:
    """Wall-clock times of ``calls`` timed calls, after ``warmup_calls`` untimed ones: the fastest
    (``ms``, the figure used) and the median (kept to show how much other work disturbed them)."""

    ms: float
    median_ms: float
    calls: int
    warmup_calls: int

    def describe(self) -> str:
        return (
            f"wall clock, fastest of {self.calls} calls (median {self.median_ms:.4g} ms) "
            f"after {self.warmup_calls} warm-up calls"
        )


def cpu_timing(
    fn: Callable[[], Any], warmup: float, rep: float, grad_to_none: list | None = None
) -> CpuTiming:
    """Time ``fn`` by the wall clock: warm up for at least :data:`CPU_WARMUP_CALLS` calls and
    ``warmup`` ms, then time at least :data:`CPU_MIN_CALLS` calls and ``rep`` ms (at most
    :data:`CPU_MAX_CALLS` calls). The figure is the fastest call: other processes only ever add
    time (on a loaded machine a multi-threaded kernel can wait tens of ms for a descheduled worker
    thread on most calls, making even the median a measure of the load, not of the kernel)."""
    import time

    def once() -> float:
        for x in grad_to_none or ():
            x.grad = None
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    warmup_calls, spent = 0, 0.0
    while warmup_calls < CPU_WARMUP_CALLS or spent < warmup:
        spent += once()
        warmup_calls += 1
    times: list[float] = []
    total = 0.0
    while len(times) < CPU_MAX_CALLS and (len(times) < CPU_MIN_CALLS or total < rep):
        times.append(once())
        total += times[-1]
    times.sort()
    return CpuTiming(times[0], times[len(times) // 2], len(times), warmup_calls)


def cpu_bench(fn: Callable[[], Any], warmup: float, rep: float, grad_to_none: list | None = None) -> float:
    """Wall-clock milliseconds of ``fn``'s fastest call (:func:`cpu_timing`), as ``do_bench`` returns it."""
    return cpu_timing(fn, warmup, rep, grad_to_none).ms


def time_case(
    name: str, case: Case, make: Callable[[str, Case], Callable], warmup: int, rep: int, device: str = "cuda"
) -> Result:
    """Time ``make(name, case)`` forward (or backward through autograd; direction "fwdbwd": forward
    and backward together) on fresh random inputs, on ``device`` ("cuda" or "cpu")."""
    import torch

    from attnhub.bench import workloads
    from attnhub.bench.support import Unsupported

    bench = _timer(device, warmup, rep)
    try:
        step, grads = prepare_step(name, case, make, device)
        ms, how = bench(step, grads)
    except Unsupported as exc:
        return Result(name, case, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - reported per cell, the run goes on
        msg = str(exc).strip().splitlines()
        return Result(name, case, error=f"{type(exc).__name__}: {msg[0] if msg else ''}"[:200])
    finally:
        if device != "cpu":
            torch.cuda.empty_cache()
    nbytes = workloads.work(case)[1] if case.family in workloads.FAMILIES else 0.0
    return Result(
        name, case, ms=float(ms), tflops=flops(case) / (ms * 1e-3) / 1e12,
        tbps=nbytes / (ms * 1e-3) / 1e12 if nbytes else None, how=how,
    )  # fmt: skip


def prepare_step(
    name: str, case: Case, make: Callable[[str, Case], Callable], device: str = "cuda"
) -> tuple[Callable[[], Any], list]:
    """``(step, grads)``: one call of ``make(name, case)`` as :func:`time_case` times it (forward
    under no_grad, forward and backward, or backward alone through a retained graph) on fresh
    random inputs, called once already (compiling, tuning, first-use measurement happen here), and
    the arrays whose ``.grad`` to clear before each call. Raises what the runner raises."""
    import torch

    from attnhub.bench import workloads
    from attnhub.bench.runners import make_inputs

    fn = make(name, case)
    inputs = workloads.make_inputs if case.family in workloads.FAMILIES else make_inputs
    q, k, v, do = inputs(case, device)
    if case.direction == "fwdbwd":

        def step() -> Any:
            return fn(q, k, v).backward(do)

        grads = [q, k, v]
    elif case.direction == "fwd":

        @torch.no_grad()
        def step() -> Any:
            return fn(q, k, v)

        grads = []
    else:
        out = fn(q, k, v)

        def step() -> Any:
            return out.backward(do, retain_graph=True)

        grads = [q, k, v]
    step()
    return step, grads


def interleaved_cuda_ms(steps: dict[str, tuple[Callable[[], Any], list]], reps: int) -> dict[str, float]:
    """Median GPU milliseconds per call of each ``(step, grads)``, the steps called in turn, one
    call each per round (the round's first step rotating), for ``reps`` rounds: clock and thermal
    drift hit every step alike, where timing each for 100 ms in a row (do_bench) lets two timings of
    one kernel differ by up to 10% on an H200. The L2 cache is flushed before each call, as
    do_bench does; CUDA events bracket the call alone."""
    import torch

    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    names = list(steps)
    events: dict[str, list] = {n: [] for n in names}
    for _ in range(2):  # warm-up rounds, untimed
        for step, _grads in steps.values():
            step()
    for r in range(reps):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            step, grads = steps[name]
            for x in grads:
                x.grad = None
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    out = {}
    for name, pairs in events.items():
        times = sorted(s.elapsed_time(e) for s, e in pairs)
        out[name] = times[len(times) // 2]
    return out


#: Bytes zeroed before each timed call to flush the L2 cache: what ``triton.testing.do_bench``
#: allocates for it (256 MB).
FLUSH_BYTES = 256 * 10**6


def _timer(device: str, warmup: float, rep: float) -> Callable[..., tuple[float, str]]:
    """``(step, grad_to_none) -> (ms, how)``: :func:`cpu_timing` on the CPU, else triton's
    ``do_bench`` median (CUDA events, L2 flushed between calls)."""
    if device == "cpu":

        def on_cpu(step: Callable[[], Any], grad_to_none: list | None = None) -> tuple[float, str]:
            res = cpu_timing(step, warmup, rep, grad_to_none)
            return res.ms, res.describe()

        return on_cpu
    from triton.testing import do_bench

    def on_gpu(step: Callable[[], Any], grad_to_none: list | None = None) -> tuple[float, str]:
        ms = do_bench(step, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median")
        return ms, f"do_bench median (CUDA events, L2 flushed; {warmup} ms warm-up, {rep} ms of calls)"

    return on_gpu
