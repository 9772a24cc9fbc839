"""Where does the head-parallel variant's time go on packed documents (kernels, all-to-alls, copies)?

Issue 40: on 4 H200s the head-parallel step on 256k packed tokens (Hq = Hkv = 16) ran at 0.83 of
one GPU's ``attention_varlen`` per GPU. This profiles a few steps on each rank and prints rank 0's
CUDA time by kernel. Usage: ``torchrun --nproc-per-node=4 tools/dev/cp_heads_profile.py``.
"""

from __future__ import annotations

import argparse
import os
import random

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from attnhub.distributed import context_parallel_attention, shard


def packed(total: int, lo: int, hi: int, seed: int) -> list[int]:
    rng, cu = random.Random(seed), [0]
    while cu[-1] < total:
        cu.append(min(total, cu[-1] + rng.randint(lo, hi)))
    return cu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=262144)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--method", default="heads")
    a = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    docs = packed(a.tokens, 1024, 32768, 40)
    g = torch.Generator(device="cuda").manual_seed(9)
    q, k, v, do = (
        torch.randn(1, a.heads, a.tokens, 128, generator=g, device="cuda").to(torch.bfloat16)
        for _ in range(4)
    )
    sh = [shard(x, rank, world) for x in (q, k, v, do)]

    def step() -> None:
        leaves = [x.detach().requires_grad_(True) for x in sh[:3]]
        out = context_parallel_attention(
            *leaves, mask="causal", backend="triton", method=a.method, cu_seqlens=docs
        )
        torch.autograd.grad(out, leaves, sh[3])

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    if rank == 0:
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
