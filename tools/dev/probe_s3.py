"""Session-3 probe (H100): where three missed targets lose their time.

    python tools/dev/probe_s3.py [--part host,kvcache,padding]

host: (8, 12, 512, 512) fp16 causal, loop time and GPU time of SDPA (default and each kernel
forced) against attnhub with each SDPA backend named; the kernels each call launches.
kvcache: B 4, Hq 32, Hkv 8, D 128, Lk 8k decode; loop and GPU time, cProfile of the host path.
padding: the padded causal bool-mask case (B 8, H 16, L 4k, D 128): triton with the mask against
the same attention as lengths, dense causal, and FlexAttention; kernel list of the mask call.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnhub


def loop_us(fn, calls: int = 200, rounds: int = 10) -> float:
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


def kernels(fn, label: str) -> None:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    print(f"  kernels of {label} (5 calls):")
    for ev in p.key_averages():
        if ev.device_time_total > 0:
            print(f"    {ev.count:3d} x {ev.device_time_total / ev.count:8.1f} us  {ev.key[:110]}")


def forced(kind):
    def fn(q, k, v):
        with sdpa_kernel(kind):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return fn


def part_host() -> None:
    print("== host (8, 12, 512, 512) fp16 causal D 64")
    q, k, v = (torch.randn(8, 12, 512, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    rows = {
        "sdpa default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "attnhub auto": lambda: attnhub.attention(q, k, v, mask="causal"),
    }
    for name in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "triton"):
        rows[f"attnhub {name}"] = lambda n=name: attnhub.attention(q, k, v, mask="causal", backend=n)
    for kind in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        f = forced(kind)
        rows[f"sdpa forced {kind.name}"] = lambda f=f: f(q, k, v)
    print("  chosen:", attnhub.explain(q, k, v, mask="causal").chosen)
    for name, fn in rows.items():
        print(f"  {name:32s} loop {loop_us(fn):7.1f} us  gpu {gpu_us(fn):7.1f} us")
    kernels(rows["sdpa default"], "sdpa default")
    kernels(rows["attnhub sdpa-flash"], "attnhub sdpa-flash")
    kernels(rows["attnhub auto"], "attnhub auto")
    prof = cProfile.Profile()
    fn = rows["attnhub auto"]
    prof.enable()
    for _ in range(2000):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


def part_kvcache() -> None:
    print("== kvcache B 4, Hq 32, Hkv 8, D 128, Lk 8k")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(4, 8, 8192, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    kl = torch.full((4,), 8192, dtype=torch.int32, device="cuda")
    rows = {
        "sdpa cudnn gqa": forced_gqa(q, k, v),
        "attnhub kvcache": lambda: attnhub.attention_kvcache(q, k, v, kl, mask=None, backend="triton"),
        "attnhub attention k_lengths": lambda: attnhub.attention(
            q, k, v, sync="none_end", k_lengths=kl, backend="triton"
        ),
        "attnhub attention dense": lambda: attnhub.attention(q, k, v, backend="triton"),
    }
    for name, fn in rows.items():
        print(f"  {name:32s} loop {loop_us(fn):7.1f} us  gpu {gpu_us(fn):7.1f} us")
    kernels(rows["attnhub kvcache"], "attnhub kvcache")
    prof = cProfile.Profile()
    fn = rows["attnhub kvcache"]
    prof.enable()
    for _ in range(2000):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def forced_gqa(q, k, v):
    def fn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    return fn


def part_padding() -> None:
    import triton.testing as tt
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    print("== padding B 8, H 16, L 4k, D 128 causal bool mask")
    B, H, L, D = 8, 16, 4096, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    n_list = torch.randint(L // 4, L + 1, (B,), generator=torch.Generator().manual_seed(1))
    n = n_list.to("cuda")
    i = torch.arange(L, device="cuda")[:, None]
    j = torch.arange(L, device="cuda")[None, :]
    mask = (j <= i) & (i < n[:, None, None, None]) & (j < n[:, None, None, None])
    n32 = n.to(torch.int32)
    compiled = torch.compile(flex_attention, dynamic=False)

    def padded(b, h, qi, kj):
        return (kj <= qi) & (qi < n[b]) & (kj < n[b])

    bm = create_block_mask(padded, B, None, L, L, device="cuda")
    rows = {
        "triton mask": lambda: attnhub.attention(q, k, v, mask=mask, backend="triton"),
        "triton lengths": lambda: attnhub.attention(
            q, k, v, mask="causal", q_lengths=n32, k_lengths=n32, backend="triton"
        ),
        "triton causal dense": lambda: attnhub.attention(q, k, v, mask="causal", backend="triton"),
        "flex": lambda: compiled(q, k, v, block_mask=bm),
    }
    a = rows["triton mask"]()
    b = rows["triton lengths"]()
    print("  mask vs lengths max |diff|:", (a.float() - b.float()).abs().max().item())
    for name, fn in rows.items():
        print(f"  {name:24s} {tt.do_bench(fn, warmup=50, rep=300):8.3f} ms")
    kernels(rows["triton mask"], "triton mask")
    kernels(rows["triton lengths"], "triton lengths")
    # backward
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    do = torch.randn_like(q)
    for name, call in {
        "triton mask": lambda: attnhub.attention(qg, kg, vg, mask=mask, backend="triton"),
        "triton lengths": lambda: attnhub.attention(
            qg, kg, vg, mask="causal", q_lengths=n32, k_lengths=n32, backend="triton"
        ),
        "flex": lambda: compiled(qg, kg, vg, block_mask=bm),
    }.items():
        out = call()
        t = tt.do_bench(
            lambda out=out: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True), rep=300
        )
        print(f"  bwd {name:20s} {t:8.3f} ms")


def part_cudnn() -> None:
    """Why SDPA pinned to cuDNN loops slower than SDPA's own choice (which is cuDNN) at this shape."""
    import attnhub_backends.sdpa.backend as sb

    print("== cudnn pin (8, 12, 512, 512) fp16 causal D 64")
    q, k, v = (torch.randn(8, 12, 512, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    sdpa = torch._C._nn.scaled_dot_product_attention
    flags = sb._flags("CUDNN_ATTENTION")
    pinned = flags.around(lambda q, k, v: sdpa(q, k, v, None, 0.0, True, scale=0.125, enable_gqa=False))
    saved = flags.pin()
    rows = {
        "F.sdpa default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "C sdpa default, scale": lambda: sdpa(q, k, v, None, 0.0, True, scale=0.125),
        "C sdpa default, gqa False": lambda: sdpa(q, k, v, None, 0.0, True, scale=0.125, enable_gqa=False),
        "pinned around": lambda: pinned(q, k, v),
    }
    flags.restore(saved)
    op = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
    if op is not None:
        rows["aten cudnn op (no lse)"] = lambda: op(q, k, v, None, False, 0.0, True, False, scale=0.125)
        rows["aten cudnn op (lse)"] = lambda: op(q, k, v, None, True, 0.0, True, False, scale=0.125)
    for name, fn in rows.items():
        print(f"  {name:28s} loop {loop_us(fn):7.1f} us  gpu {gpu_us(fn):7.1f} us")
    # every flag pinned to cuDNN for the whole loop (no per-call pin): is it the pin or the kernel?
    saved = flags.pin()
    try:
        fn = rows["C sdpa default, scale"]
        print(f"  {'flags pinned outside loop':28s} loop {loop_us(fn):7.1f} us  gpu {gpu_us(fn):7.1f} us")
        kernels(fn, "pinned outside loop")
    finally:
        flags.restore(saved)
    kernels(rows["pinned around"], "pinned around")


def part_maskcfg() -> None:
    """The padded bool-mask forward under the config ATTNHUB_TRITON_FWD_CFG pins (one per process)."""
    import os

    import triton.testing as tt

    B, H, L, D = 8, 16, 4096, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    n = torch.randint(L // 4, L + 1, (B,), generator=torch.Generator().manual_seed(1)).to("cuda")
    i = torch.arange(L, device="cuda")[:, None]
    j = torch.arange(L, device="cuda")[None, :]
    mask = (j <= i) & (i < n[:, None, None, None]) & (j < n[:, None, None, None])
    cfg = "/".join(os.environ.get(f"ATTNHUB_TRITON_{k}_CFG", "-") for k in ("FWD", "DKDV", "DQ"))
    t_mask = tt.do_bench(lambda: attnhub.attention(q, k, v, mask=mask, backend="triton"), rep=200)
    t_causal = tt.do_bench(lambda: attnhub.attention(q, k, v, mask="causal", backend="triton"), rep=200)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    out = attnhub.attention(qg, kg, vg, mask=mask, backend="triton")
    do = torch.randn_like(out)
    t_bwd = tt.do_bench(lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True), rep=200)
    print(f"  cfg {cfg:30s} mask fwd {t_mask:7.3f} ms  bwd {t_bwd:7.3f} ms  causal fwd {t_causal:7.3f} ms")


def part_merge() -> None:
    """GPU time per decode call (CUDA graph of 20 calls, so no host time) at the MERGE_BLOCK the
    environment's MB sets: contiguous 8k and 32k, paged (block 16 and 64) 32k."""
    import os

    from attnhub_backends.triton import ragged_launch

    ragged_launch.MERGE_BLOCK = int(os.environ.get("MB", ragged_launch.MERGE_BLOCK))
    g = torch.Generator(device="cuda").manual_seed(0)
    row = []
    for lk, block in ((8192, 0), (32768, 0), (32768, 16), (32768, 64)):
        q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (
            torch.randn(4, 8, lk, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2)
        )
        kl = torch.full((4,), lk, dtype=torch.int32, device="cuda")
        table = None
        if block:
            k, v = (
                x.permute(0, 2, 1, 3).reshape(4 * lk // block, block, 8, 128).contiguous() for x in (k, v)
            )
            table = torch.arange(4 * lk // block, dtype=torch.int32, device="cuda").reshape(4, -1)

        def call(q=q, k=k, v=v, kl=kl, table=table):
            return attnhub.attention_kvcache(q, k, v, kl, block_table=table, mask=None, backend="triton")

        call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                call()
        us = gpu_us(graph.replay, 10) / 20
        row.append(f"{'paged' + str(block) if block else 'contig'} {lk // 1024}k {us:6.1f} us")
    print(f"  MERGE_BLOCK {ragged_launch.MERGE_BLOCK:5d}: " + ", ".join(row))


def part_raggedcfg() -> None:
    """The ragged forward's tile config (ragged_launch.TUNE["fwd"]) on the bench's padded mask case
    (run as lengths) and its packed varlen case: forward ms per config."""
    import triton.testing as tt

    from attnhub.bench import workloads
    from attnhub.bench.grid import Case
    from attnhub.rules import Causal
    from attnhub_backends.triton import ragged_launch

    cases = {
        "padding": Case("padding", 8, 16, 16, 4096, 4096, 128, Causal()),
        "varlen": Case("varlen", 1, 16, 16, 16384, 16384, 128, Causal()),
    }
    runs = {}
    for name, case in cases.items():
        q, k, v, _ = workloads.make_inputs(case, "cuda")
        runs[name] = (workloads.attnhub_runner("triton", case), q, k, v)
    for cfg in [None, (64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2), (64, 32, 4, 3), (64, 64, 8, 3),
                (64, 128, 4, 2), (32, 64, 4, 3), (128, 64, 8, 3)]:  # fmt: skip
        ragged_launch.TUNE["fwd"] = cfg
        row = []
        for name, (fn, q, k, v) in runs.items():
            try:
                row.append(f"{name} {tt.do_bench(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v), rep=150):7.3f} ms")
            except Exception as exc:  # a config that does not fit is reported
                row.append(f"{name} n/a ({type(exc).__name__})")
        print(f"  ragged fwd cfg {str(cfg):20s} " + ", ".join(row))


def part_pin() -> None:
    """Which part of attnhub's pinned cuDNN call costs host time at (8, 12, 512, 512) fp16 causal:
    the flags pinned per call or once, the scale given or not, enable_gqa given or not; rounds
    interleaved in a fresh process."""
    import attnhub_backends.sdpa.backend as sb

    q, k, v = (torch.randn(8, 12, 512, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    sdpa = torch._C._nn.scaled_dot_product_attention
    flags = sb._flags("CUDNN_ATTENTION")
    per_call = flags.around(lambda q, k, v: sdpa(q, k, v, None, 0.0, True, scale=0.125, enable_gqa=False))
    per_call_plain = flags.around(lambda q, k, v: sdpa(q, k, v, None, 0.0, True))
    rows = {
        "F.sdpa default": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "C default": lambda: sdpa(q, k, v, None, 0.0, True),
        "C default scale": lambda: sdpa(q, k, v, None, 0.0, True, scale=0.125),
        "C default scale gqa=False": lambda: sdpa(q, k, v, None, 0.0, True, scale=0.125, enable_gqa=False),
        "pinned per call (attnhub)": lambda: per_call(q, k, v),
        "pinned per call, plain": lambda: per_call_plain(q, k, v),
    }
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(8):
        for name, fn in rows.items():
            best[name] = min(best[name], loop_us(fn, 200, 1))
    saved = flags.pin()
    try:
        once = {"pinned once, C plain": rows["C default"], "pinned once, scale": rows["C default scale"]}
        for name, fn in once.items():
            best[name] = loop_us(fn, 200, 8)
    finally:
        flags.restore(saved)
    for name, us in best.items():
        print(f"  {name:30s} loop {us:7.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="host,kvcache,padding")
    parts = ap.parse_args().part.split(",")
    for p in parts:
        try:
            globals()[f"part_{p}"]()
        except Exception as exc:  # one part failing must not lose the others
            import traceback

            print(f"part {p} failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()


if __name__ == "__main__":
    main()
