"""Which kernels run, and for how long, when torch's SDPA and attnhub (auto and each SDPA backend by
name) serve one host-bound shape: torch.profiler over a loop of calls, CUDA time per call by kernel
name, and the loop's wall time per call.

    python tools/dev/host_shape_kernels.py [--shape 8,12,512,512] [--dtype float16]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import attnhub


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8,12,512,512")
    ap.add_argument("--dtype", default="float16,bfloat16")
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args()
    b, h, lq, lk = (int(x) for x in args.shape.split(","))
    for dtype in args.dtype.split(","):
        dt = getattr(torch, dtype)
        q = torch.randn(b, h, lq, 64, device="cuda", dtype=dt)
        k, v = (torch.randn(b, h, lk, 64, device="cuda", dtype=dt) for _ in range(2))
        fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}  # noqa: B023
        for name in ("auto", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "cudnn"):
            fns[name] = lambda name=name: attnhub.attention(q, k, v, mask="causal", backend=name)  # noqa: B023
        print(f"== {dtype} (B, H, Lq, Lk) = {(b, h, lq, lk)}, D 64, causal; auto takes "
              f"{attnhub.explain(q, k, v, mask='causal').chosen}")  # fmt: skip
        for name, fn in fns.items():
            try:
                for _ in range(20):
                    fn()
            except Exception as exc:  # noqa: BLE001
                print(f"  {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / args.calls * 1e6
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    fn()
                torch.cuda.synchronize()
            kernels: dict[str, float] = defaultdict(float)
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[ev.name[:90]] += ev.device_time_total / args.calls
            total = sum(kernels.values())
            print(f"  {name:>15}: loop {wall:6.1f} us a call; kernels {total:6.1f} us a call")
            for kname, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:3]:
                print(f"      {us:6.1f} us  {kname}")


if __name__ == "__main__":
    main()
