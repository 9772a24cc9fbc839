"""Host time per call: attnhub (auto and a named backend) against torch's SDPA.

Run: python benchmarks/host_overhead.py [--calls 200] [--rounds 20] [--backend triton]

Method: a loop of ``--calls`` calls at each shape, wall clock from before the first call to after
the loop, ``torch.cuda.synchronize()`` only before the loop starts and after it ends; the fastest
of ``--rounds`` rounds (the least disturbed), the columns' rounds interleaved so that a disturbance
hits them alike. The shapes are the issue's small ones, where the
kernels take a few microseconds: as long as the host issues launches slower than the GPU runs
them, the loop's time is host time. Where a row's GPU time per call (printed beside it, measured
with CUDA events) is close to its host time, the GPU is the bottleneck and the row is no host
measure. On a machine without CUDA the same loops run on CPU tensors (said in the header): the
kernels' own time is then included and only the differences between columns mean anything.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import attnhub

SHAPES = [(1, 8, 1, 512), (1, 8, 128, 128), (8, 12, 512, 512)]  # (B, H, Lq, Lk), D = 64


def loop_us(fns: dict, calls: int, rounds: int, cuda: bool) -> dict:
    """Per function, the fastest of ``rounds`` loops of ``calls`` calls (us per call), interleaved."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            if cuda:
                torch.cuda.synchronize()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    return best


def gpu_us(fn, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls * 1e3


def _calls(q, k, v, named: str) -> dict:
    """The three calls, each causal with the mask aligned top-left (SDPA's and attnhub's default)."""
    return {
        "auto": lambda: attnhub.attention(q, k, v, mask="causal"),
        "named": lambda: attnhub.attention(q, k, v, mask="causal", backend=named),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--backend", default=None, help="the named backend (default: what auto picks)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    shapes = SHAPES
    if not cuda:  # the float64 reference on (8, 12, 512, 512) takes seconds a call
        shapes = SHAPES[:2]
        args.calls, args.rounds = min(args.calls, 20), min(args.rounds, 10)
    print(f"device: {torch.cuda.get_device_name() if cuda else 'CPU (no CUDA: kernels included; (8, 12, 512, 512) left out)'}; "
          f"{args.calls} calls a loop, best of {args.rounds}; us per call")  # fmt: skip
    head = f"{'(B, H, Lq, Lk)':<20} {'attnhub auto':>12} {'attnhub named':>14} {'SDPA':>8} {'auto-SDPA':>10}"
    print(head + (f" {'GPU attnhub':>12} {'GPU SDPA':>9} {'GPU named':>11}" if cuda else ""))
    for b, h, lq, lk in shapes:
        q = torch.randn(b, h, lq, 64, device=dev, dtype=dtype)
        k, v = (torch.randn(b, h, lk, 64, device=dev, dtype=dtype) for _ in range(2))
        named = args.backend or attnhub.explain(q, k, v, mask="causal").chosen
        if attnhub.explain(q, k, v, mask="causal", backend=named).chosen is None:
            print(f"{str((b, h, lq, lk)):<20} {named} declines this call: the named column runs auto's pick")
            named = attnhub.explain(q, k, v, mask="causal").chosen
        fns = _calls(q, k, v, named)
        for fn in fns.values():  # compile, autotune, fill the caches
            for _ in range(3):
                fn()
        t = loop_us(fns, args.calls, args.rounds, cuda)
        row = f"{str((b, h, lq, lk)):<20} {t['auto']:>12.1f} {t['named']:>14.1f} {t['sdpa']:>8.1f}"
        row += f" {t['auto'] - t['sdpa']:>10.1f}"
        if cuda:
            row += f" {gpu_us(fns['auto'], args.calls):>12.1f} {gpu_us(fns['sdpa'], args.calls):>9.1f}"
            row += f" {gpu_us(fns['named'], args.calls):>11.1f}"
        print(row + f"   ({named})")


if __name__ == "__main__":
    main()
