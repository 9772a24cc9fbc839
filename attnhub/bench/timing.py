"""Timing one runner on one case: median of ``triton.testing.do_bench`` after warm-up, random data
(on the CPU: the median of wall-clock repetitions, :func:`cpu_bench`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnhub.bench.grid import Case, flops


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

    def to_json(self) -> dict:
        return {
            "backend": self.name,
            **self.case.to_json(),
            "ms": self.ms,
            "tflops": self.tflops,
            "tbps": self.tbps,
            "error": self.error,
        }


def cpu_bench(fn: Callable[[], Any], warmup: int, rep: int, grad_to_none: list | None = None) -> float:
    """Median wall-clock milliseconds of ``fn`` run for about ``rep`` ms after ``warmup`` ms."""
    import time

    def once() -> float:
        for x in grad_to_none or ():
            x.grad = None
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    first = once()
    spent = first
    while spent < warmup:
        spent += once()
    times = [once() for _ in range(max(3, min(1000, int(rep / max(first, 1e-3)))))]
    times.sort()
    return times[len(times) // 2]


def time_case(
    name: str, case: Case, make: Callable[[str, Case], Callable], warmup: int, rep: int, device: str = "cuda"
) -> Result:
    """Time ``make(name, case)`` forward (or backward through autograd; direction "fwdbwd": forward
    and backward together) on fresh random inputs, on ``device`` ("cuda" or "cpu")."""
    import torch

    from attnhub.bench import workloads
    from attnhub.bench.runners import Unsupported, make_inputs

    if device == "cpu":
        do_bench = cpu_bench
    else:
        from triton.testing import do_bench
    try:
        fn = make(name, case)
        inputs = workloads.make_inputs if case.family in workloads.FAMILIES else make_inputs
        q, k, v, do = inputs(case, device)
        if case.direction == "fwdbwd":
            fn(q, k, v).backward(do)  # compile / tune outside the timed region

            def step() -> Any:
                return fn(q, k, v).backward(do)

            ms = do_bench(step, warmup=warmup, rep=rep, grad_to_none=[q, k, v], **_median(device))
        elif case.direction == "fwd":
            with torch.no_grad():
                fn(q, k, v)  # compile / tune outside the timed region

                def step() -> Any:
                    return fn(q, k, v)

                ms = do_bench(step, warmup=warmup, rep=rep, **_median(device))
        else:
            out = fn(q, k, v)
            out.backward(do, retain_graph=True)

            def step() -> Any:
                return out.backward(do, retain_graph=True)

            ms = do_bench(step, warmup=warmup, rep=rep, grad_to_none=[q, k, v], **_median(device))
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
        tbps=nbytes / (ms * 1e-3) / 1e12 if nbytes else None,
    )  # fmt: skip


def _median(device: str) -> dict:
    return {} if device == "cpu" else {"return_mode": "median"}
