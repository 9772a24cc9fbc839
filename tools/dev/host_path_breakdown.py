"""Where a small attnhub call spends its host time on CUDA, part by part (issue 37: auto within
3 us of SDPA's own call at the host-bound shapes).

    python tools/dev/host_path_breakdown.py [--calls 100] [--rounds 20] [--dtype float16]

Per shape of ``benchmarks/host_overhead.py`` (causal, D 64), two figures per callable, us a call:
``enqueue`` is the host time of ``--calls`` calls with no synchronisation inside the timed region
(the GPU queue never fills at 100 calls, so this is what the host pays, whatever the kernel takes);
``loop`` is ``host_overhead.py``'s figure (synchronised after the loop: the larger of host and GPU
time). The callables: torch's SDPA, the kernels' own torch ops (what the sdpa backends' bound calls
run), attnhub auto and by name, and the pieces of attnhub's fast path alone (the call key, the
cache lookup, the plan's bound call). Last, the tuner's ``host_ms`` for each sdpa backend on the
same shape (what the shipped profile's host classes hold), to compare with ``loop``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import attnhub
from attnhub.bench.grid import Case
from attnhub.dispatch import CACHE
from attnhub.frameworks import adapter_for
from attnhub.plan import call_key
from attnhub.rules import Causal

SHAPES = [(1, 8, 1, 512), (1, 8, 128, 128), (8, 12, 512, 512)]


def timed(fns: dict, calls: int, rounds: int) -> dict:
    """Per callable (enqueue us, loop us), each the fastest of ``rounds``, interleaved."""
    best = {n: [float("inf"), float("inf")] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            best[name][0] = min(best[name][0], (t1 - t0) / calls * 1e6)
            best[name][1] = min(best[name][1], (t2 - t0) / calls * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    print(
        f"{torch.cuda.get_device_name()}, {args.dtype}; us a call: enqueue (host only) / loop (host_overhead.py's)"
    )
    for b, h, lq, lk in SHAPES:
        one_shape(b, h, lq, lk, dtype, args)
    after_cudnn(dtype, args)
    after_time_case(args.dtype)


def after_cudnn(dtype: torch.dtype, args: argparse.Namespace) -> None:
    """Host loops of sdpa-cudnn and sdpa-efficient before and after the cudnn backend (the
    frontend's own graphs) has run in the process: ``attnhub tune`` with cudnn among the backends
    read sdpa-cudnn's loop at 33-36 us a call where a process without it read 22 (2026-11-28)."""
    q = torch.randn(8, 12, 512, 64, device="cuda", dtype=dtype)
    k, v = torch.randn_like(q), torch.randn_like(q)
    fns = {
        n: (lambda n=n: attnhub.attention(q, k, v, mask="causal", backend=n))
        for n in ("sdpa-cudnn", "sdpa-efficient")
    }
    fns["torch SDPA"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    before = timed(fns, args.calls, args.rounds)
    for _ in range(3):
        attnhub.attention(q, k, v, mask="causal", backend="cudnn")
    torch.cuda.synchronize()
    after = timed(fns, args.calls, args.rounds)
    print("\nloops (us a call, enqueue / loop) before and after the cudnn backend ran, (8, 12, 512, 512):")
    for name in fns:
        print(
            f"  {name:<16} {before[name][0]:6.2f} / {before[name][1]:6.2f}  ->  {after[name][0]:6.2f} / {after[name][1]:6.2f}"
        )


def after_time_case(dtype: str) -> None:
    """``attnhub tune`` times a class with do_bench (``time_case``) and then its host loop: the
    host loop alone, then after a ``time_case`` of the same backend, after ``gc.collect()`` and
    after ``torch.cuda.empty_cache()`` (tune read twice this script's host times, 2026-11-28)."""
    import gc

    from attnhub import tuner
    from attnhub.bench.timing import time_case

    print(
        "\ntuner.host_ms in sequence (us a call): alone / after time_case / after gc.collect / after empty_cache"
    )
    for (b, h, lq, lk), name in (((1, 8, 128, 128), "sdpa-efficient"), ((8, 12, 512, 512), "sdpa-cudnn")):
        case = Case("host", b, h, h, lq, lk, 64, Causal(), "none_front", dtype, "fwd")
        alone = tuner.host_ms(name, case, "cuda") * 1e3
        time_case(name, case, tuner._runner, 25, 100, device="cuda")
        after = tuner.host_ms(name, case, "cuda") * 1e3
        gc.collect()
        collected = tuner.host_ms(name, case, "cuda") * 1e3
        torch.cuda.empty_cache()
        emptied = tuner.host_ms(name, case, "cuda") * 1e3
        print(
            f"  {name:<16} {(b, h, lq, lk)}: {alone:6.2f} / {after:6.2f} / {collected:6.2f} / {emptied:6.2f}"
        )
        timed = tuner.time_class(case, [name], "cuda:0")
        print(f"  {name:<16} tuner.time_class on cuda:0: {timed.ms[name] * 1e3:6.2f}")
        torch.cuda.set_device("cuda:0")
        print(f"  {name:<16} host_ms after set_device: {tuner.host_ms(name, case, 'cuda:0') * 1e3:6.2f}")
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for cmd in (
            [sys.executable, "-c", "from attnhub import tuner; tuner.tune('cuda', families=('host',), "
             f"dtypes=('{dtype}',), backends=['sdpa-efficient', 'sdpa-cudnn'], out='{tmp}/a.json', "
             "progress=print)"],
            ["attnhub", "tune", "--family", "host", "--dtype", dtype, "--backends", "sdpa-efficient,sdpa-cudnn",
             "--out", f"{tmp}/b.json"],
        ):  # fmt: skip
            print("  $", " ".join(cmd[-4:]))
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            print(
                "\n".join("    " + line for line in (res.stdout + res.stderr).splitlines() if "host" in line)
            )


def one_shape(b: int, h: int, lq: int, lk: int, dtype: torch.dtype, args: argparse.Namespace) -> None:
    """The breakdown at one shape (printed)."""
    q = torch.randn(b, h, lq, 64, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, h, lk, 64, device="cuda", dtype=dtype) for _ in range(2))
    auto = attnhub.explain(q, k, v, mask="causal").chosen
    ad = adapter_for(q)
    fns = {
        "torch SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "op cudnn": lambda: torch._scaled_dot_product_cudnn_attention(
            q,
            k,
            v,
            None,
            False,
            0.0,
            True,
            False,
        ),
        "op flash": lambda: torch._scaled_dot_product_flash_attention(q, k, v, 0.0, True),
        "op efficient": lambda: torch._scaled_dot_product_efficient_attention(
            q,
            k,
            v,
            None,
            False,
            0.0,
            True,
        ),
        f"attnhub auto ({auto})": lambda: attnhub.attention(q, k, v, mask="causal"),
    }
    for name in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient"):
        if attnhub.explain(q, k, v, mask="causal", backend=name).chosen is None:
            continue  # the backend declines this shape (flash: causal with Lq != Lk)
        fns[f"attnhub {name}"] = lambda n=name: attnhub.attention(q, k, v, mask="causal", backend=n)
    for fn in fns.values():
        for _ in range(3):
            fn()
    key = call_key(ad, q, k, v, "causal", "none_front", None, "bhsd", False, "auto", None)
    plan = CACHE.recent.get(key)
    fns["piece: adapter + call key"] = lambda: call_key(
        adapter_for(q),
        q,
        k,
        v,
        "causal",
        "none_front",
        None,
        "bhsd",
        False,
        "auto",
        None,
    )
    fns["piece: key + lookup"] = lambda: CACHE.recent.get(
        call_key(adapter_for(q), q, k, v, "causal", "none_front", None, "bhsd", False, "auto", None)
    )
    if plan is not None:
        fns["piece: plan.call (bound)"] = lambda: plan.call(q, k, v, None, None)
    t = timed(fns, args.calls, args.rounds)
    print(f"\n(B, H, Lq, Lk) = {(b, h, lq, lk)}")
    for name, (enq, loop) in t.items():
        print(f"  {name:<32} {enq:7.2f} / {loop:7.2f}")
    from attnhub import tuner

    case = Case("host", b, h, h, lq, lk, 64, Causal(), "none_front", args.dtype, "fwd")
    for name in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient"):
        try:
            print(f"  tuner.host_ms {name:<18} {tuner.host_ms(name, case, 'cuda') * 1e3:7.2f}")
        except Exception as exc:  # noqa: BLE001 - a declining backend: say so and go on
            print(f"  tuner.host_ms {name:<18} failed: {type(exc).__name__}: {str(exc)[:100]}")


if __name__ == "__main__":
    main()
