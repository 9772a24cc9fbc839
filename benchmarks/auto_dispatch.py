"""``backend="auto"`` against every candidate it could have picked, on the dense bench grid (issue 21).

Run (GPU): python benchmarks/auto_dispatch.py [--dtype bfloat16,float16] [--reps 30] [--json out.json]
[--hide-shipped]

For each dense grid case (D = 64 and 128, full and causal, L = 1k..16k, forward and backward) the
runners are: ``auto``; each attnhub backend by name (``triton``, ``sdpa-cudnn``, ``sdpa-flash``,
``sdpa-efficient`` and, where nvidia-cudnn-frontend is installed, ``cudnn``: the candidates auto
chooses among; a backend that declines the request, such as
the SDPA backends for bfloat16 gradients, is no candidate); and torch's raw cuDNN SDPA for context
(``peer:sdpa-cudnn``, not a candidate where attnhub declines it). Each runner is set up and called
once (compiling, first-use measurement), then the runners are called in turn, one call each per
round for ``--reps`` rounds (``attnhub.bench.timing.interleaved_cuda_ms``: CUDA events around each
call, the L2 cache flushed before it), and each keeps its median: clock and thermal drift hit them
alike (timing each for 100 ms in a row, as the earlier rounds of do_bench did, read the same cuDNN
kernel 5-10% apart between two runners on the H200).
Printed per case: auto's time, the fastest candidate, and their ratio (fastest candidate time /
auto time; the target is >= 0.97).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from attnhub.bench.grid import default_grid
from attnhub.bench.runners import attnhub_forward, runner
from attnhub.bench.timing import interleaved_cuda_ms, prepare_step

CANDIDATES = ("triton", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "cudnn")


def hide_shipped_profiles() -> None:
    """Run as on a device attnhub has never seen: no shipped profile, an empty user cache (so
    first-use measurements start from nothing and land in a temporary directory)."""
    import os
    import tempfile

    from attnhub import profile

    tmp = tempfile.mkdtemp(prefix="attnhub-unseen-")
    os.environ["ATTNHUB_CACHE_DIR"] = os.path.join(tmp, "cache")
    profile.SHIPPED_DIR = Path(tmp) / "shipped"
    profile.reload()


def make(name: str, case):  # noqa: ANN001, ANN201 - time_case's factory signature
    if name.startswith("peer:"):
        return runner(name.removeprefix("peer:"), case)
    return attnhub_forward(name, case)


def _label(case) -> str:  # noqa: ANN001
    return f"{case.direction} D={case.dim} L={case.len_q} {case.rule}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtype", default="bfloat16,float16")
    ap.add_argument("--reps", type=int, default=30, help="timed calls of each runner per case")
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--only", default="", help="keep cases whose label contains this, e.g. 'fwd D=128 L=8192 Full'"
    )
    ap.add_argument(
        "--hide-shipped",
        action="store_true",
        help="no shipped profile and an empty cache: a device never seen",
    )
    args = ap.parse_args()
    if args.hide_shipped:
        hide_shipped_profiles()
    import attnhub

    present = {b.name for b in attnhub.backends() if b.available}
    names = ("auto", *(c for c in CANDIDATES if c in present), "peer:sdpa-cudnn")
    rows = []
    for dtype in args.dtype.split(","):
        cases = [
            c for c in default_grid(False, dtype) if c.family == "dense" and c.direction in ("fwd", "bwd")
        ]
        cases = [c for c in cases if args.only in _label(c)]
        worst = math.inf
        for n, case in enumerate(cases, 1):
            steps, errors = {}, {}
            for name in names:
                try:
                    steps[name] = prepare_step(name, case, make)
                except Exception as exc:  # noqa: BLE001 - a declining backend is no candidate
                    errors[name] = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
            best = interleaved_cuda_ms(steps, args.reps)
            del steps
            torch.cuda.empty_cache()
            cands = {k: v for k, v in best.items() if k in CANDIDATES}
            top = min(cands, key=cands.get)
            ratio = cands[top] / best["auto"]
            worst = min(worst, ratio)
            peer = best.get("peer:sdpa-cudnn")
            label = _label(case)
            print(
                f"[{n}/{len(cases)}] {dtype} {label:32s} auto {best['auto']:.3f} ms; fastest candidate "
                f"{top} {cands[top]:.3f} ms; ratio {ratio:.3f}"
                + (f"; raw cuDNN SDPA {peer:.3f} ms" if peer else ""),
                flush=True,
            )
            rows.append({"dtype": dtype, "case": label, "ms": best, "declined": errors, "ratio": ratio})
        print(f"{dtype}: lowest ratio {worst:.3f} over {len(cases)} cases")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
