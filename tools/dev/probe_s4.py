"""Session-4 probe (H100): where the decode call's host time goes, and the SDPA direct-op path.

    python tools/dev/probe_s4.py [--part kvhost,host]

kvhost: B 4, Hq 32, Hkv 8, D 128, Lk 8k decode through ``attention_kvcache``: host loop time of the
whole call, of ``ragged_launch.forward`` with the request and operands captured from it, of the
relaunch alone, of the two output allocations; GPU time; cProfile of the whole call.
host: (8, 12, 512, 512) fp16 causal D 64: SDPA against attnhub auto (its pick) and each SDPA backend.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import attnhub


def loop_us(fn, calls: int = 200, rounds: int = 15) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def host_only_us(fn, calls: int = 200, rounds: int = 15) -> float:
    """Time to issue ``calls`` calls (no synchronize at the end): the host's share when GPU-bound
    only as long as the launch queue does not fill (200 short launches do not)."""
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def gpu_us(fn, calls: int = 200) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    s.record()
    for _ in range(calls):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / calls * 1e3


def part_kvhost() -> None:
    from attnhub_backends.triton import ragged_launch

    print("== kvhost B 4, Hq 32, Hkv 8, D 128, Lk 8k, bf16")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(4, 8, 8192, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    kl = torch.full((4,), 8192, dtype=torch.int32, device="cuda")
    full = lambda: attnhub.attention_kvcache(q, k, v, kl, mask=None, backend="triton")  # noqa: E731
    seen = {}
    real = ragged_launch.forward

    def spy(*a, **kw):
        seen["args"] = (a, kw)
        return real(*a, **kw)

    ragged_launch.forward = spy
    full()
    ragged_launch.forward = real
    a, kw = seen["args"]
    plan = next(reversed(ragged_launch._PLANS.values()))
    inner = lambda: real(*a, **kw)  # noqa: E731
    rows = {
        "attention_kvcache": full,
        "attention(k_lengths)": lambda: attnhub.attention(
            q, k, v, sync="none_end", k_lengths=kl, backend="triton"
        ),
        "ragged_launch.forward": inner,
        "_run_forward": lambda: ragged_launch._run_forward(plan, *a[:4], a[4]),
        "2 x torch.empty": lambda: (
            torch.empty((4, 32, 1, 128), dtype=torch.bfloat16, device="cuda"),
            torch.empty((4, 32, 1), dtype=torch.float32, device="cuda"),
        ),
        "sdpa cudnn gqa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    }
    for name, fn in rows.items():
        print(
            f"  {name:28s} loop {loop_us(fn):7.1f} us  issue {host_only_us(fn):7.1f} us  gpu {gpu_us(fn):7.1f} us"
        )
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        full()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


def part_host() -> None:
    print("== host (8, 12, 512, 512) and the issue's small shapes, fp16 causal D 64")
    for shape in [(1, 8, 1, 512), (1, 8, 128, 128), (8, 12, 512, 512)]:
        b, h, lq, lk = shape
        q = torch.randn(b, h, lq, 64, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(b, h, lk, 64, device="cuda", dtype=torch.float16) for _ in range(2))
        rows = {
            "sdpa": lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "attnhub auto": lambda q=q, k=k, v=v: attnhub.attention(q, k, v, mask="causal"),
        }
        for name in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient"):
            rows[f"attnhub {name}"] = lambda n=name, q=q, k=k, v=v: attnhub.attention(
                q, k, v, mask="causal", backend=n
            )
        print(f" {shape} auto: {attnhub.explain(q, k, v, mask='causal').chosen}")
        for name, fn in rows.items():
            try:
                print(
                    f"  {name:24s} loop {loop_us(fn):7.1f} us  issue {host_only_us(fn):7.1f} us  gpu {gpu_us(fn):7.1f}"
                )
            except Exception as exc:  # a declined backend
                print(f"  {name:24s} {type(exc).__name__}: {str(exc)[:100]}")


def graph_us(fn, reps: int = 50) -> float:
    """Kernel time of ``fn`` replayed from a CUDA graph (no host work per call): median of 5."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps * 1e3)
    return sorted(times)[2]


def part_decodecfg() -> None:
    """Split-KV decode tile configs and fill, kernel time from CUDA graphs, at Lk 4k to 32k; then
    the shipped choice."""
    import itertools

    from attnhub_backends.triton import ragged_launch

    print("== decodecfg B 4, Hq 32, Hkv 8, D 128, bf16: kernel us (CUDA graph) and TB/s")
    shipped = dict(ragged_launch.TUNE)

    def ours(q, k, v, kl):
        return lambda: attnhub.attention_kvcache(q, k, v, kl, mask=None, backend="triton")

    for lk in (4096, 8192, 16384, 32768):
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (
            torch.randn(4, 8, lk, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2)
        )
        kl = torch.full((4,), lk, dtype=torch.int32, device="cuda")
        gb = 2 * k.numel() * 2 / 1e9
        cud = graph_us(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        print(f" Lk {lk}: SDPA default {cud:6.1f} us {gb / cud * 1e3:5.2f} TB/s")
        rows = []
        for cfg, fill in itertools.product([(128, 4, 3), (128, 4, 2), (64, 2, 3), (128, 8, 2), (256, 8, 2)],
                                           [2, 4, 8]):  # fmt: skip
            ragged_launch.TUNE.update(decode=cfg, decode_tma=cfg, fill=fill)
            ragged_launch._PLANS.clear()
            try:
                t = graph_us(ours(q, k, v, kl))
            except Exception as exc:  # noqa: BLE001
                print(f"  {cfg} fill {fill}: {type(exc).__name__} {str(exc)[:80]}")
                continue
            rows.append((t, cfg, fill))
        for t, cfg, fill in sorted(rows)[:5]:
            print(f"  {cfg} fill {fill}: {t:6.1f} us {gb / t * 1e3:5.2f} TB/s")
        ragged_launch.TUNE.update(shipped)
        ragged_launch._PLANS.clear()
        t = graph_us(ours(q, k, v, kl))
        print(f"  shipped: {t:6.1f} us {gb / t * 1e3:5.2f} TB/s")


def part_d64() -> None:
    """The ragged forward at head dim 64 (the Llama benchmark's prefill: B 4, H 32, L 4k, causal,
    padded as lengths): tile configs with pointer loads and with TMA forced
    (ATTNHUB_TRITON_TMA=3), forward ms (do_bench medians)."""
    import os

    import triton.testing as tt

    from attnhub.bench import workloads
    from attnhub.bench.grid import Case
    from attnhub.rules import Causal
    from attnhub_backends.triton import ragged_launch

    case = Case("padding", 4, 32, 32, 4096, 4096, 64, Causal())
    q, k, v, _ = workloads.make_inputs(case, "cuda")
    fn = workloads.attnhub_runner("triton", case)
    print("== ragged forward at D 64 (B 4, H 32, L 4k, padded causal), ms")
    for tma in ("", "3"):
        os.environ["ATTNHUB_TRITON_TMA"] = tma
        for cfg in [None, (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 3), (64, 128, 4, 3),
                    (128, 32, 4, 3), (64, 32, 4, 4)]:  # fmt: skip
            ragged_launch.TUNE["fwd"] = cfg
            ragged_launch._PLANS.clear()
            try:
                t = tt.do_bench(lambda: fn(q, k, v), rep=150)
                plan = next(reversed(ragged_launch._PLANS.values()))
                print(f"  tma={tma or 'default'} cfg {str(cfg):18s} {t:.3f} ms (plan tma {plan.tma})")
            except Exception as exc:  # noqa: BLE001
                print(f"  tma={tma or 'default'} cfg {cfg}: {type(exc).__name__} {str(exc)[:80]}")
    os.environ.pop("ATTNHUB_TRITON_TMA", None)
    ragged_launch.TUNE["fwd"] = None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="kvhost,host,decodecfg")
    args = ap.parse_args()
    for part in args.part.split(","):
        globals()[f"part_{part}"]()


if __name__ == "__main__":
    main()
