"""Where the host time of one small attnhub call goes on the GPU (issue 21, host overhead).

    python tools/dev/host_profile.py [--calls 2000]

For small shapes (the GPU work is shorter than the host work) prints the wall time per call of:
SDPA, ``attnhub.attention`` (auto, named triton), the triton backend's ``forward`` called directly
(no dispatch, no autograd glue), and — with ``--kvcache`` — ``attention_kvcache``; then the top
entries of a cProfile of the attnhub calls by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import attnhub


def per_call_us(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = {"decode (1,8,1,512)": (1, 8, 1, 512), "(1,8,128,128)": (1, 8, 128, 128)}
    for label, (b, h, lq, lk) in cases.items():
        q = torch.randn(b, h, lq, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(b, h, lk, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        kl = torch.full((b,), lk, dtype=torch.int32, device="cuda")
        rows = {
            "sdpa": lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v),
            "attnhub auto": lambda q=q, k=k, v=v: attnhub.attention(q, k, v),
            "attnhub triton": lambda q=q, k=k, v=v: attnhub.attention(q, k, v, backend="triton"),
            "attnhub k_lengths": lambda q=q, k=k, v=v, kl=kl: attnhub.attention(
                q, k, v, sync="none_end", k_lengths=kl, backend="triton"
            ),
            "attnhub kvcache": lambda q=q, k=k, v=v, kl=kl: attnhub.attention_kvcache(q, k, v, kl, mask=None),
        }
        print(f"== {label}")
        for name, fn in rows.items():
            try:
                print(f"  {name:20s} {per_call_us(fn, a.calls):7.1f} us/call")
            except Exception as exc:  # a row that cannot run is reported, not fatal
                print(f"  {name:20s} n/a ({type(exc).__name__}: {str(exc)[:100]})")
        for name in ("attnhub auto", "attnhub kvcache"):
            fn = rows[name]
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.calls):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            print(f"  -- cProfile {name}, {a.calls} calls, by own time")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
