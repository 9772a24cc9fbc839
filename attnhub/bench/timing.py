"""Timing one runner on one case: median of ``triton.testing.do_bench`` after warm-up, random data."""

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

    def to_json(self) -> dict:
        return {
            "backend": self.name,
            **self.case.to_json(),
            "ms": self.ms,
            "tflops": self.tflops,
            "error": self.error,
        }


def time_case(name: str, case: Case, make: Callable[[str, Case], Callable], warmup: int, rep: int) -> Result:
    """Time ``make(name, case)`` forward (or backward through autograd) on fresh random inputs."""
    import torch
    from triton.testing import do_bench

    from attnhub.bench.runners import Unsupported, make_inputs

    try:
        fn = make(name, case)
        q, k, v, do = make_inputs(case)
        if case.direction == "fwd":
            with torch.no_grad():
                fn(q, k, v)  # compile / tune outside the timed region

                def step() -> Any:
                    return fn(q, k, v)

                ms = do_bench(step, warmup=warmup, rep=rep, return_mode="median")
        else:
            out = fn(q, k, v)
            out.backward(do, retain_graph=True)

            def step() -> Any:
                return out.backward(do, retain_graph=True)

            ms = do_bench(step, warmup=warmup, rep=rep, grad_to_none=[q, k, v], return_mode="median")
    except Unsupported as exc:
        return Result(name, case, error=str(exc))
    except Exception as exc:  # noqa: BLE001 - reported per cell, the run goes on
        msg = str(exc).strip().splitlines()
        return Result(name, case, error=f"{type(exc).__name__}: {msg[0] if msg else ''}"[:200])
    finally:
        torch.cuda.empty_cache()
    return Result(name, case, ms=float(ms), tflops=flops(case) / (ms * 1e-3) / 1e12)
