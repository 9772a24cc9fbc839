"""Where the first call of a new signature on the triton backend spends its time (issue 21, compile latency).

    python tools/dev/first_call_profile.py [--nq 4096 --nk 4096 --causal] [--cold]

A fresh process: CUDA context and one torch kernel first (outside the timing), then cProfile of the
first ``attnhub.attention(..., backend="triton")`` call; prints its wall time and the top entries by
cumulative time (Triton's stages: ttir/ttgir/llir/ptx/cubin, the launcher build, attnhub's plan).
``--cold`` points TRITON_CACHE_DIR at an empty directory first.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nq", type=int, default=4096)
    ap.add_argument("--nk", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--grad", action="store_true")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    if args.cold:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
    import torch

    import attnhub

    torch.zeros(1, device="cuda").add_(1)
    q = torch.randn(1, 16, args.nq, 128, device="cuda", dtype=torch.bfloat16, requires_grad=args.grad)
    k = torch.randn(1, 16, args.nk, 128, device="cuda", dtype=torch.bfloat16, requires_grad=args.grad)
    v = torch.randn(1, 16, args.nk, 128, device="cuda", dtype=torch.bfloat16, requires_grad=args.grad)
    mask = "causal" if args.causal else None
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    out = attnhub.attention(q, k, v, mask=mask, backend="triton")
    if args.grad:
        out.sum().backward()
    torch.cuda.synchronize()
    prof.disable()
    print(
        f"first call {time.perf_counter() - t:.3f} s (nq={args.nq} nk={args.nk} causal={args.causal} cold={args.cold})"
    )
    pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
