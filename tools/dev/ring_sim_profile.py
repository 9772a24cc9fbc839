"""Where the simulated ring's time goes (issue 25): CUDA kernel time per kernel name, and the wall
time, for one attnhub call on the whole sequence and for the simulated ring of N virtual ranks.

    python tools/dev/ring_sim_profile.py --seq 32768 --heads 16 --worlds 2 4 [--backend triton]

Prints, per case: wall ms (CUDA events), summed kernel ms, kernel ms by kind (attention blocks,
lse merges, other glue: gradient sums, copies, fills, casts), and the kernels taking most time.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import attnhub
from attnhub.distributed import simulate


def wall_ms(fn, repeat=5) -> float:
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(repeat):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / repeat


ATTENTION = ("fwd_kernel", "dkdv_kernel", "dq_kernel", "bwd_prep", "combine_kernel", "attn", "flash")


def category(name: str) -> str:
    """'attention' (the block kernels), 'merge' (the fused lse merge) or 'glue' (the rest:
    gradient sums, copies, fills, casts)."""
    if "_merge" in name:
        return "merge"
    if any(a in name for a in ATTENTION):
        return "attention"
    return "glue"


def kernels(fn, top=8) -> None:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    per: dict = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:90]][0] += ev.device_time / 1e3
            per[ev.name[:90]][1] += 1
    total = sum(t for t, _ in per.values())
    print(f"    kernels {total:.3f} ms in {sum(n for _, n in per.values())} launches")
    cats: dict = defaultdict(lambda: [0.0, 0])
    for name, (t, n) in per.items():
        cats[category(name)][0] += t
        cats[category(name)][1] += n
    print("    by kind: " + ", ".join(f"{c} {t:.3f} ms x{n}" for c, (t, n) in sorted(cats.items())))
    for name, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"      {t:8.3f} ms  x{n:3d}  {name}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--backend", default="triton")
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, a.heads, a.seq, a.dim)
    q, k, v, do = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    be = a.backend
    ql, kl, vl = (x.clone().requires_grad_(True) for x in (q, k, v))

    def single_fwd():
        attnhub.attention(q, k, v, mask="causal", backend=be)

    def single_step():
        out = attnhub.attention(ql, kl, vl, mask="causal", backend=be)
        torch.autograd.grad(out, (ql, kl, vl), do)

    for name, fn in (("single fwd", single_fwd), ("single fwd+bwd", single_step)):
        print(f"{name}: wall {wall_ms(fn):.3f} ms")
        kernels(fn)
    for world in a.worlds:
        sets = simulate.setups(q, k, world, mask="causal", backend=be)
        qs, ks, vs, dos = (simulate.shards(x, world, "zigzag") for x in (q, k, v, do))
        for r in range(world):
            print(
                f"  N={world} rank {r} calls: {[c for t in range(sets[r].steps) for c in sets[r].calls(t)]}"
            )

        def fwd(qs=qs, ks=ks, vs=vs, sets=sets):
            return simulate.forward(qs, ks, vs, sets)

        res = fwd()

        def bwd(qs=qs, ks=ks, vs=vs, sets=sets, res=res, dos=dos):
            simulate.backward(qs, ks, vs, res, dos, sets)

        for name, fn in (("fwd", fwd), ("bwd", bwd)):
            print(f"N={world} sim {name}: wall {wall_ms(fn):.3f} ms")
            kernels(fn)


if __name__ == "__main__":
    main()
