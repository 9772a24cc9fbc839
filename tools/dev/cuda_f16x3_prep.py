"""Where the time of the cuda backend's float32 (3xFP16) forward goes: per-kernel GPU time from the
torch profiler (zeroing, attn_absmax, attn_split, attn_fwd_f16x3) and the whole call's median with
triton's do_bench, for the ``attnhub bench`` float32 shapes (L = 4096, B = 4, H = 2048 / D).

    python tools/dev/cuda_f16x3_prep.py

Then small calls (B = 1, H = 8, L = 128 .. 2048) against the 3xTF32 kernel, where launches count.
"""

from __future__ import annotations

import collections
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import attnhub


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    for d in (64, 128):
        for causal in (False, True):
            b, h, n = 4, 2048 // d, 4096
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=g) for _ in range(3))
            mask = "causal" if causal else None

            def call(q=q, k=k, v=v, mask=mask):
                return attnhub.attention(q, k, v, mask=mask, backend="cuda")

            call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    call()
                torch.cuda.synchronize()
            per = collections.defaultdict(float)
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    name = ev.name if ev.name.startswith("attn_") else "other (zeroing, ...)"
                    per[name] += ev.device_time_total / 10 / 1e3  # ms per call
            ms = do_bench(call, warmup=10, rep=100, return_mode="median")
            flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
            parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
            print(
                f"D={d} causal={causal}: call {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s); GPU ms per call: {parts}"
            )
            del q, k, v
            torch.cuda.empty_cache()


def small() -> None:
    """Small calls, where launches dominate: 3xFP16 (four kernels and a memset) against 3xTF32 (one
    kernel): do_bench median and host wall time per call over 200 back-to-back calls."""
    for d in (64, 128):
        for n in (128, 512, 2048):
            q, k, v = (torch.randn(1, 8, n, d, device="cuda") for _ in range(3))
            cells = []
            for kern in ("f16x3", "tf32"):
                os.environ["ATTNHUB_CUDA_F32"] = kern

                def call(q=q, k=k, v=v):
                    return attnhub.attention(q, k, v, backend="cuda")

                call()
                torch.cuda.synchronize()
                ms = do_bench(call, warmup=10, rep=50, return_mode="median")
                t0 = time.perf_counter()
                for _ in range(200):
                    call()
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) / 200 * 1e3
                cells.append(f"{kern} {ms * 1e3:.0f} us (wall {wall * 1e3:.0f} us)")
            os.environ.pop("ATTNHUB_CUDA_F32")
            print(f"small D={d} B=1 H=8 L={n}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
    small()
