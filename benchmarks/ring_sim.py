"""Simulated ring attention on one GPU: the per-rank schedule of N virtual ranks in one process.

For each N, every virtual rank runs its block calls and lse merges exactly as
``attnhub.distributed.ring`` would (without the messages). The sum over ranks of their compute
time, against one ``attnhub.attention`` call on the whole sequence, measures what splitting the
sequence costs in kernel efficiency (smaller blocks, merges) and what the schedule skips:

    python benchmarks/ring_sim.py --seq 32768 --heads 16 --dim 128 --dtype bfloat16 --worlds 2 4 8

A ratio of 1.0 means no loss; on N GPUs the wall time per rank is about (sum / N) plus what
communication the compute does not hide (docs/distributed.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import attnhub
from attnhub.distributed import simulate
from attnhub.distributed.schedule import classify


def timed(fn, repeat: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeat`` runs after one warm-up (CUDA events on a
    GPU, the wall clock on the CPU)."""
    fn()
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        if gpu:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def pair_counts(sets) -> dict[str, int]:
    """How many (query chunk, key chunk) pairs are full, partial (diagonal) or skipped (empty)."""
    counts = {"full": 0, "partial": 0, "empty": 0}
    for s in sets:
        geo = s.geo
        for t in range(geo.world):
            src = s.source(t)
            for p in geo.q_starts(s.rank):
                for r in geo.k_starts(src):
                    counts[classify(s.rule, p, geo.cq, r, geo.ck)] += 1
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mask", default="causal")
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    dtype = getattr(torch, a.dtype)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    shape = (1, a.heads, a.seq, a.dim)
    q, k, v, do = (torch.randn(shape, generator=g, device=dev, dtype=dtype) for _ in range(4))
    be = a.backend
    flops = 4 * a.seq * a.seq * a.dim * a.heads * (0.5 if a.mask == "causal" else 1.0)
    res: dict = {
        "args": vars(a),
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "worlds": {},
    }

    single = {"fwd_ms": timed(lambda: attnhub.attention(q, k, v, mask=a.mask, backend=be), a.repeat)}
    try:
        chosen = attnhub.explain(q, k, v, mask=a.mask, backend=be).chosen
        res["backend"] = getattr(chosen, "name", str(chosen))
    except Exception as exc:  # the name only labels the output
        res["backend"] = f"{be} ({type(exc).__name__})"
    ref = attnhub.attention(q, k, v, mask=a.mask, backend=be)
    if not a.no_backward:
        ql, kl, vl = (x.clone().requires_grad_(True) for x in (q, k, v))

        def fwd_bwd():
            out = attnhub.attention(ql, kl, vl, mask=a.mask, backend=be)
            torch.autograd.grad(out, (ql, kl, vl), do)

        single["fwd_bwd_ms"] = timed(fwd_bwd, a.repeat)
        single["bwd_ms"] = single["fwd_bwd_ms"] - single["fwd_ms"]
    single["fwd_tflops"] = flops / single["fwd_ms"] / 1e9
    res["single"] = single
    print(f"{res['device']} backend={res['backend']} L={a.seq} H={a.heads} D={a.dim} {a.dtype} {a.mask}")
    print(f"single call: fwd {single['fwd_ms']:.2f} ms ({single['fwd_tflops']:.0f} TFLOP/s)"
          + (f", bwd {single['bwd_ms']:.2f} ms" if "bwd_ms" in single else ""))  # fmt: skip

    for world in a.worlds:
        sets = simulate.setups(q, k, world, mask=a.mask, backend=be)
        qs, ks, vs, dos = (simulate.shards(x, world, "zigzag") for x in (q, k, v, do))
        row: dict = {"pairs": pair_counts(sets), "steps": sets[0].steps}
        row["calls_per_rank"] = [sum(len(s.calls(t)) for t in range(s.steps)) for s in sets]
        row["fwd_ms"] = timed(lambda: simulate.forward(qs, ks, vs, sets), a.repeat)  # noqa: B023
        row["fwd_rank_ms"] = [
            timed(lambda: simulate.forward([qs[r]], ks, vs, [sets[r]]), a.repeat)  # noqa: B023
            for r in range(world)
        ]
        fwd = simulate.forward(qs, ks, vs, sets)
        out = simulate.unshard_local([out for out, _, _ in fwd], load_balance="zigzag")
        row["max_abs_diff_vs_single"] = float((out.float() - ref.float()).abs().max())
        row["fwd_ratio"] = row["fwd_ms"] / single["fwd_ms"]
        line = (f"N={world}: fwd {row['fwd_ms']:.2f} ms = {row['fwd_ratio']:.3f}x single, per rank "
                f"{min(row['fwd_rank_ms']):.2f}-{max(row['fwd_rank_ms']):.2f} ms, pairs {row['pairs']}")  # fmt: skip
        if not a.no_backward:
            row["bwd_ms"] = timed(lambda: simulate.backward(qs, ks, vs, fwd, dos, sets), a.repeat)  # noqa: B023
            row["bwd_ratio"] = row["bwd_ms"] / single["bwd_ms"]
            line += f"; bwd {row['bwd_ms']:.2f} ms = {row['bwd_ratio']:.3f}x single"
        print(line, flush=True)
        res["worlds"][str(world)] = row
        if a.json:  # after every N, so that a run cut short keeps what it measured
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
