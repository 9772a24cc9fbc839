"""Decode through ``attention_kvcache`` against SDPA's cuDNN kernel, time per call as a model sees it.

    python benchmarks/kvcache_decode.py [--calls 320] [--rounds 15] [--cases 1x8192,8x8192,8x32768,64x4096]

One new query per sequence, GQA 32/8, D 128, bf16, every sequence at the cache's full length
(SDPA takes no per-sequence lengths: this is the request both can serve). A loop of ``--calls``
calls is one decoding step per 32 calls, as a 32-layer model makes them: the lengths tensor is
bumped in place (``add_(0)``, a new version with the same values) every 32 calls, so attnhub sees a
new lengths tensor version per step exactly as in generation. Host and GPU time together: the
clock runs from before the loop to after a synchronize at its end; the fastest of ``--rounds``
interleaved rounds. ``GPU`` columns time the kernels alone with CUDA events (``do_bench``), and
``TB/s`` counts the K and V bytes read once.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attnhub

HQ, HKV, D = 32, 8, 128


def _loop_us(fns: dict, calls: int, rounds: int) -> dict:
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    return best


def _case(b: int, lk: int, calls: int, rounds: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(b * 100003 + lk)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16)

    q, k, v = rnd(b, HQ, 1, D), rnd(b, HKV, lk, D), rnd(b, HKV, lk, D)
    lens = torch.full((b,), lk, dtype=torch.int32, device="cuda")
    count = [0]

    def attnhub_step() -> object:
        count[0] += 1
        if count[0] % 32 == 0:
            lens.add_(0)  # the next decoding step's lengths: a new version of the same tensor
        return attnhub.attention_kvcache(q, k, v, lens)

    def sdpa() -> object:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    fns = {"attnhub": attnhub_step, "sdpa-cudnn": sdpa}
    if attnhub.explain(q, k, v, k_lengths=lens, mask="causal", sync="none_end", backend="cudnn").chosen:
        fns["attnhub[cudnn]"] = lambda: attnhub.attention_kvcache(q, k, v, lens, backend="cudnn")
        fns["attnhub[triton]"] = lambda: attnhub.attention_kvcache(q, k, v, lens, backend="triton")
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    for name, fn in fns.items():
        err = (fn().double() - ref).abs().max().item()
        if err > 2e-2:
            raise SystemExit(f"{name} at B {b} Lk {lk}: max error {err:.3g} against float64")
    for fn in fns.values():
        for _ in range(64):
            fn()
    t = _loop_us(fns, calls, rounds)
    gpu = {n: do_bench(fn, warmup=25, rep=100) * 1e3 for n, fn in fns.items()}
    nbytes = 2 * b * HKV * lk * D * 2
    chosen = attnhub.explain(q, k, v, k_lengths=lens, mask="causal", sync="none_end").chosen
    print(
        f"B {b:>3} Lk {lk:>6}  loop attnhub {t['attnhub']:7.1f} us  sdpa-cudnn {t['sdpa-cudnn']:7.1f} us  "
        f"ratio {t['sdpa-cudnn'] / t['attnhub']:.2f}x   GPU attnhub {gpu['attnhub']:7.1f} us "
        f"({nbytes / gpu['attnhub'] / 1e6:.2f} TB/s)  sdpa-cudnn {gpu['sdpa-cudnn']:7.1f} us "
        f"({nbytes / gpu['sdpa-cudnn'] / 1e6:.2f} TB/s)   [{chosen}]",
        flush=True,
    )
    for name in fns:
        if name.startswith("attnhub["):
            print(f"    {name}: loop {t[name]:7.1f} us, GPU {gpu[name]:7.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=320)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cases", default="1x8192,8x8192,8x32768,64x4096", help="BxLk, comma separated")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, Hq {HQ} Hkv {HKV} D {D}")
    print("ratio = sdpa-cudnn time / attnhub time (> 1: attnhub faster)")
    for case in args.cases.split(","):
        b, lk = (int(x) for x in case.split("x"))
        _case(b, lk, args.calls, args.rounds)


if __name__ == "__main__":
    main()
