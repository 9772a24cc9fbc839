"""Context-parallel causal attention over a torch.distributed group, checked against one call.

On N GPUs (NCCL):    torchrun --nproc-per-node=N examples/context_parallel.py
On the CPU (gloo):   torchrun --nproc-per-node=2 examples/context_parallel.py --seq 256
Packed documents:    torchrun --nproc-per-node=2 examples/context_parallel.py --seq 256 --docs 5

Every rank builds the same global q, k, v (same seed), keeps its zigzag shard, runs
``context_parallel_attention`` forward and backward, and compares its shard of the output and
of the gradients with ``attnhub.attention`` on the whole sequence (``--docs D``: D documents of
random lengths packed into the sequence, against ``attnhub.attention_varlen``).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import attnhub
from attnhub.distributed import context_parallel_attention, shard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--method", default="auto", choices=["auto", "ring", "allgather", "heads"])
    ap.add_argument("--docs", type=int, default=0, help="pack this many documents (cu_seqlens)")
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, a.heads, a.seq, a.dim, generator=g)
    k, v = (torch.randn(1, a.kv_heads, a.seq, a.dim, generator=g) for _ in range(2))
    do = torch.randn(1, a.heads, a.seq, a.dim, generator=g)
    q, k, v, do = (x.to(device, dtype) for x in (q, k, v, do))

    # This rank's shard (chunks r and 2N-1-r of 2N), as leaves of the autograd graph.
    ql, kl, vl = (shard(x, rank, world).requires_grad_(True) for x in (q, k, v))
    cu = None
    if a.docs:  # global offsets of the packed documents, the same on every rank
        cuts = torch.randperm(a.seq - 1, generator=g)[: a.docs - 1] + 1
        cu = [0, *sorted(cuts.tolist()), a.seq]
    out = context_parallel_attention(ql, kl, vl, mask="causal", method=a.method, cu_seqlens=cu)
    out.backward(shard(do, rank, world))

    # The same on the whole sequence, in one process.
    qf, kf, vf = (x.clone().requires_grad_(True) for x in (q, k, v))
    if cu is None:
        ref = attnhub.attention(qf, kf, vf, mask="causal")
    else:
        cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
        thd = [x[0].transpose(0, 1) for x in (qf, kf, vf)]
        ref = attnhub.attention_varlen(*thd, cu_t, cu_t, mask="causal").transpose(0, 1).unsqueeze(0)
    ref.backward(do)
    for name, got, want in (("out", out, ref), ("dq", ql.grad, qf.grad), ("dk", kl.grad, kf.grad),
                            ("dv", vl.grad, vf.grad)):  # fmt: skip
        want = shard(want, rank, world)
        err = float((got.detach().float() - want.detach().float()).norm() / want.detach().float().norm())
        print(f"rank {rank}/{world} {name}: relative error {err:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
