"""Is the NCCL ring bitwise repeatable, and if not, which tensor differs and does a host sync fix it?

Issue 40: on 4 H200s at --seq 8192 "causal zigzag ring, large logits" (Hq = Hkv = 8) was within
tolerance but not bitwise repeatable, while the one-process simulation of the same steps was.
This runs the ring ``--repeat`` times per variant and reports, per tensor (out, lse, dq, dk, dv),
how many elements differ from the first run on any rank. Variants patch the exchange:
``base`` as shipped; ``sync_issue``: ``torch.cuda.synchronize()`` before each exchange is issued
(so NCCL cannot start before compute that reads or writes its buffers ends); ``sync_wait``: a
host sync after each wait (so compute cannot start before a message has landed).
``--blocks``: also keep every block call's inputs and outputs (``block.forward``) and report, for
the first call whose output differs between runs, whether its inputs differed too.
Usage: ``torchrun --nproc-per-node=4 tools/dev/cp_ring_repeatability.py [--seqs 8192 16384]``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from attnhub.distributed import comm, context_parallel_attention, shard, steps

KEYS = ("out", "lse", "dq", "dk", "dv")


def run(q, k, v, do, backend: str, forward_only: bool = False) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    sh = [shard(x, rank, world, load_balance="zigzag") for x in (q, k, v, do)]
    leaves = [x.detach().clone().requires_grad_(True) for x in sh[:3]]
    out, lse = context_parallel_attention(
        *leaves, mask="causal", load_balance="zigzag", backend=backend, return_lse=True, method="ring"
    )
    grads = (out, out, out) if forward_only else torch.autograd.grad(out, leaves, sh[3])
    torch.cuda.synchronize()
    return dict(zip(KEYS, (out, lse, *grads)))


class Recorder:
    """Wraps ``block.forward`` (as the ring's steps call it) to keep each call's q, k, v and result."""

    def __init__(self, light: bool) -> None:
        self.calls: list[tuple] = []
        self.light = light  # keep float64 sums, not copies (less traffic to perturb the timing)
        self.original = steps.block.forward

    def __enter__(self):
        def fwd(q, k, v, call, *rest):
            o, lse = self.original(q, k, v, call, *rest)
            keep = (lambda x: x.detach().double().sum()) if self.light else (lambda x: x.detach().clone())
            self.calls.append((call, *(keep(x) for x in (q, k, v, o, lse))))
            return o, lse

        steps.block.forward = fwd
        return self

    def __exit__(self, *exc) -> None:
        steps.block.forward = self.original


def first_divergence(records: list[list[tuple]]) -> str:
    """Where the runs' block calls first differ: in inputs (q, k, v) or only in outputs."""
    base = records[0]
    for run, rec in enumerate(records[1:], 2):
        for i, (a, b) in enumerate(zip(base, rec)):
            ins = [not torch.equal(x, y) for x, y in zip(a[1:4], b[1:4])]
            outs = [not torch.equal(x, y) for x, y in zip(a[4:], b[4:])]
            if any(ins) or any(outs):
                return f"run {run} call {i} ({a[0]}): inputs differ q/k/v {ins}, outputs differ o/lse {outs}"
    return "all block calls equal"


def patched(variant: str):
    exchange, wait = comm.exchange, comm.wait

    def ex(*a, **kw):
        if variant in ("sync_issue", "sync_both"):
            torch.cuda.synchronize()
        return exchange(*a, **kw)

    def wt(reqs):
        wait(reqs)
        if variant in ("sync_wait", "sync_both"):
            torch.cuda.synchronize()

    return ex, wt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--heads", type=lambda s: tuple(int(x) for x in s.split(":")), nargs="+",
                    default=[(8, 8), (8, 2)], help="Hq:Hkv pairs")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=["base", "sync_issue", "sync_wait"])
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--blocks", choices=["copies", "sums"], help="locate the first differing block call")
    ap.add_argument("--forward-only", action="store_true")
    a = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    saved = comm.exchange, comm.wait
    for L in a.seqs:
        for hq, hkv in a.heads:
            for big in (True, False):
                g = torch.Generator(device="cuda").manual_seed(101)
                q = torch.randn(1, hq, L, 128, generator=g, device="cuda") * (8.0 if big else 1.0)
                k, v = (torch.randn(1, hkv, L, 128, generator=g, device="cuda") for _ in range(2))
                do = torch.randn(1, hq, L, 128, generator=g, device="cuda")
                q, k, v, do = (x.to(torch.bfloat16) for x in (q, k, v, do))
                for variant in a.variants:
                    comm.exchange, comm.wait = patched(variant)
                    runs, records = [], []
                    for _ in range(a.repeat):
                        if a.blocks:
                            with Recorder(a.blocks == "sums") as rec:
                                runs.append(run(q, k, v, do, a.backend, a.forward_only))
                            records.append(rec.calls)
                        else:
                            runs.append(run(q, k, v, do, a.backend, a.forward_only))
                    comm.exchange, comm.wait = saved
                    diff = torch.tensor(
                        [sum(int((r[key] != runs[0][key]).sum()) for r in runs[1:]) for key in KEYS],
                        device="cuda", dtype=torch.float64,
                    )  # fmt: skip
                    dist.all_reduce(diff)
                    if rank == 0:
                        counts = " ".join(f"{key} {int(n)}" for key, n in zip(KEYS, diff.tolist()))
                        print(f"L {L} Hq {hq} Hkv {hkv} {'large' if big else 'normal'} logits, {variant}: "
                              f"elements differing from run 1: {counts}", flush=True)  # fmt: skip
                    if a.blocks:
                        print(f"  rank {rank}: {first_divergence(records)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
