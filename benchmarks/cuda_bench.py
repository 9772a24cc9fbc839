"""Time the cuda backend against torch SDPA (flash and math) on one GPU; prints a table and JSON lines.

    python benchmarks/cuda_bench.py [--quick] [--out results.jsonl]

FLOPs as FlashAttention counts them: forward 4·B·H·L²·D (halved for causal), backward 2.5× that.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import attnhub


def _timer(fn, reps: int = 20) -> float:
    """Median milliseconds of ``fn`` over ``reps`` runs, timed with CUDA events after warm-up."""
    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    except ImportError:
        pass
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def bench_case(dtype, b, h, n, d, causal, backward, others):
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dt, requires_grad=backward) for _ in range(3))
    mask = "causal" if causal else None
    fns = {"cuda": lambda: attnhub.attention(q, k, v, mask=mask, backend="cuda")}
    for name, fn in others.items():
        fns[name] = lambda fn=fn: fn(q, k, v, causal)
    flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
    res = {}
    for name, fn in fns.items():
        try:
            if backward:
                out = fn()
                dout = torch.randn_like(out)
                ms = _timer(
                    lambda out=out, dout=dout: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                )
                f = 2.5 * flops
            else:
                with torch.no_grad():
                    ms = _timer(fn)
                f = flops
            res[name] = (ms, f / ms / 1e9)
        except Exception as exc:  # a baseline may be unavailable for this shape/dtype
            res[name] = (float("nan"), float("nan"))
            print(f"  {name}: {type(exc).__name__}: {str(exc)[:120]}")
    return res


def main() -> None:
    from torch.nn.attention import SDPBackend

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    flash = {"sdpa_flash": _sdpa(SDPBackend.FLASH_ATTENTION)}
    math_ = {"sdpa_math": _sdpa(SDPBackend.MATH)}
    cases = []
    for d in (64, 128):
        for n in (4096, 8192) if not args.quick else (4096,):
            for causal in (False, True):
                b, h = (16384 // n) * 2, 16
                cases.append(("bfloat16", b, h, n, d, causal, False, flash))
                cases.append(("bfloat16", b, h, n, d, causal, True, flash))
    for d in (64, 128):
        cases.append(("float32", 1, 8, 4096, d, False, False, math_))
        cases.append(("float32", 1, 8, 4096, d, True, False, math_))
    rows = []
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for dtype, b, h, n, d, causal, bwd, others in cases:
        res = bench_case(dtype, b, h, n, d, causal, bwd, others)
        base = next(iter(others))
        ratio = res[base][0] / res["cuda"][0] if res["cuda"][0] == res["cuda"][0] else float("nan")
        row = dict(
            dtype=dtype, B=b, H=h, L=n, D=d, causal=causal, pass_="bwd" if bwd else "fwd", baseline=base,
            cuda_ms=res["cuda"][0], cuda_tflops=res["cuda"][1], base_ms=res[base][0],
            base_tflops=res[base][1], speed_ratio=ratio,
        )  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(
        f"\n{'dtype':8} {'pass':4} {'D':>3} {'L':>5} {'causal':6} {'cuda TF/s':>9} {'base':>10} {'base TF/s':>9} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['dtype']:8} {r['pass_']:4} {r['D']:>3} {r['L']:>5} {r['causal']!s:6} {r['cuda_tflops']:9.1f} "
            f"{r['baseline']:>10} {r['base_tflops']:9.1f} {r['speed_ratio']:6.2f}"
        )


if __name__ == "__main__":
    main()
