"""Decode-shaped forward (Lq = 1, GQA 32/8, D = 128, bf16): triton variants next to SDPA, one process.

Why: the issue's decode target (>= 0.8x the best SDPA backend) moved between commits; this times the
default and pinned variants (tile config, split-KV factor, K/V load path, tuner off) in one process
so that their ratios are comparable. Every variant is checked against SDPA's output first.

Usage (GPU): python tools/dev/triton_decode_probe.py [--lengths 8192,32768] [--batch 8]
"""

from __future__ import annotations

import argparse

from envvars import env_set

VARIANTS = {
    "default": {},
    "tune=0": {"ATTNHUB_TRITON_TUNE": "0"},
    "cfg 16,128,4,3": {"ATTNHUB_TRITON_FWD_CFG": "16,128,4,3"},
    "cfg 16,64,4,4": {"ATTNHUB_TRITON_FWD_CFG": "16,64,4,4"},
    "cfg 16,64,4,3": {"ATTNHUB_TRITON_FWD_CFG": "16,64,4,3"},
    "cfg 16,64,4,6": {"ATTNHUB_TRITON_FWD_CFG": "16,64,4,6"},
    "cfg 16,32,4,6": {"ATTNHUB_TRITON_FWD_CFG": "16,32,4,6"},
    "cfg 16,64,8,4": {"ATTNHUB_TRITON_FWD_CFG": "16,64,8,4"},
    "cfg 16,128,8,2": {"ATTNHUB_TRITON_FWD_CFG": "16,128,8,2"},
    "splits 4": {"ATTNHUB_TRITON_SPLITS": "4"},
    "splits 8": {"ATTNHUB_TRITON_SPLITS": "8"},
    "splits 16": {"ATTNHUB_TRITON_SPLITS": "16"},
    "splits 32": {"ATTNHUB_TRITON_SPLITS": "32"},
    "tma 3": {"ATTNHUB_TRITON_TMA": "3"},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()

    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attnhub
    from attnhub_backends.triton import launch

    sdpa = torch.nn.functional.scaled_dot_product_attention
    for lk in (int(x) for x in args.lengths.split(",")):
        g = torch.Generator(device="cuda").manual_seed(lk)
        q = torch.randn(args.batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (
            torch.randn(args.batch, 8, lk, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in "kv"
        )
        ref = sdpa(q.double(), k.double(), v.double(), enable_gqa=True)
        times = {}
        for name, be in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION)):  # fmt: skip

            def fn(be=be, q=q, k=k, v=v):
                with sdpa_kernel([be]):
                    return sdpa(q, k, v, enable_gqa=True)

            try:
                fn()
                times[name] = triton.testing.do_bench(fn, warmup=50, rep=300)
            except RuntimeError as exc:
                print(f"{name}: n/a ({str(exc).splitlines()[0][:80]})")
        best = min(times.values())
        bytes_moved = 2 * k.numel() * k.element_size()
        for name, ms in times.items():
            print(f"Lk={lk} {name:16s} {ms:.4f} ms  {bytes_moved / ms / 1e9:.0f} GB/s")
        _overhead(lambda q=q, k=k, v=v: attnhub.attention(q, k, v, backend="triton"), f"Lk={lk} triton")
        _overhead(lambda q=q, k=k, v=v: sdpa(q, k, v, enable_gqa=True), f"Lk={lk} sdpa (default)")
        for name, env in VARIANTS.items():
            with env_set(**env):

                def fn(q=q, k=k, v=v):
                    return attnhub.attention(q, k, v, backend="triton")

                try:
                    out = fn()
                except RuntimeError as exc:
                    print(f"Lk={lk} triton {name:16s} n/a ({str(exc)[:60]})")
                    continue
                # every variant's environment is a new call signature: its launch is the newest
                used = next(reversed(launch._FWD_LAUNCHES.values()))
                err = ((out.double() - ref).norm() / ref.norm()).item()
                ms = triton.testing.do_bench(fn, warmup=50, rep=300)
                print(f"Lk={lk} triton {name:16s} {ms:.4f} ms  {bytes_moved / ms / 1e9:.0f} GB/s  "
                      f"best-sdpa/triton {best / ms:.2f}  rel.err {err:.1e}  cfg {used.cfg} splits {used.splits}")  # fmt: skip


def _overhead(fn, label: str) -> None:
    """CPU time per call (200 calls issued without waiting) against the GPU's own time per call
    (the same calls queued behind a long sleep kernel, timed with events): when the first exceeds the
    second, a timing that waits on each call measures the CPU, not the kernels."""
    import cProfile
    import pstats
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        fn()
    cpu_ms = (time.perf_counter() - t0) / 200 * 1e3
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time: every launch below queues behind it
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        fn()
    end.record()
    end.synchronize()
    print(
        f"{label}: CPU {cpu_ms * 1e3:.0f} us per call, GPU {start.elapsed_time(end) / 200 * 1e3:.0f} us per call"
    )
    if "triton" in label:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
