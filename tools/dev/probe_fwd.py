"""Forward probe for the device machine: correctness of each K/V load path, then timings of load
paths x pinned configs against the peers (SDPA cuDNN, FlexAttention), all in one process.

``python3 tools/dev/probe_fwd.py [check] [dense] [local] [tuned] [checkband]
[band] [causalband] [ncu]``; results are
printed as lines ``RES <case> <variant> <ms> <TFLOP/s>`` and a per-case summary at the end.
Variants are set through ``ATTNHUB_TRITON_TMA`` and ``ATTNHUB_TRITON_FWD_CFG`` (see attnhub_backends/triton/launch.py).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from attnhub.bench.grid import Case
from attnhub.bench.runners import runner
from attnhub.bench.timing import time_case
from attnhub.rules import Causal, Full, Local

DENSE = [
    Case("dense", 4, 16, 16, 4096, 4096, 128, Full()),
    Case("dense", 2, 16, 16, 8192, 8192, 128, Full()),
    Case("dense", 1, 16, 16, 16384, 16384, 128, Full()),
    Case("dense", 4, 16, 16, 4096, 4096, 128, Causal()),
    Case("dense", 1, 16, 16, 16384, 16384, 128, Causal()),
]
LOCAL = [
    Case("local", 1, h, h, 16384, 16384, d, Local(w, causal=True), "none_end")
    for d, h in ((64, 32), (128, 16))
    for w in (256, 1024)
]
DENSE_CFGS = ["128,128,8,3", "128,64,8,3", "128,64,4,3", "128,128,8,2"]
LOCAL_CFGS = ["64,64,4,3", "128,64,4,3", "128,64,8,3", "64,32,4,3", "128,128,8,3"]
# Band walk (Cfg.band): one loop over the contiguous key tiles, the rule only outside the full run.
BAND_CFGS = [
    "64,64,4,3", "64,32,4,3", "64,64,4,3,0,1", "64,32,4,3,0,1", "64,128,4,3,0,1",
    "128,128,8,3,0,1", "128,128,8,2,0,1", "128,64,8,3,0,1", "128,64,4,3,0,1",
]  # fmt: skip
# Second round: stages, register caps and key-tile widths around the best band configs.
BAND2_CFGS = [
    "64,64,4,3,0,1", "64,64,4,2,0,1", "64,64,4,4,0,1", "64,64,4,3,128,1", "64,32,4,4,0,1",
    "64,32,4,3,0,1",
]  # fmt: skip
CAUSAL_BAND = [c for c in DENSE if isinstance(c.rule, Causal)] + [
    Case("dense", 1, 32, 32, 16384, 16384, 64, Causal()),
]
DENSE64 = [
    Case("dense", 4, 32, 32, 4096, 4096, 64, Full()),
    Case("dense", 1, 32, 32, 16384, 16384, 64, Full()),
    Case("dense", 4, 32, 32, 4096, 4096, 64, Causal()),
    Case("dense", 1, 32, 32, 16384, 16384, 64, Causal()),
]
DENSE64_CFGS = ["64,64,4,3", "64,64,4,3,0,1", "128,64,4,3", "128,64,4,3,0,1"]
CAUSAL_BAND_CFGS = ["128,128,8,3", "128,128,8,3,0,1", "128,64,4,3", "128,64,4,3,0,1"]
RESULTS: dict[str, dict[str, float]] = {}


def _label(c: Case) -> str:
    return f"L={c.len_q} D={c.dim} {c.rule.describe()}"


def _set(tma: str | None, cfg: str | None) -> None:
    for name, val in (("ATTNHUB_TRITON_TMA", tma), ("ATTNHUB_TRITON_FWD_CFG", cfg)):
        if val is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = val


def _time(name: str, case: Case, variant: str) -> None:
    t0 = time.time()
    r = time_case(name, case, runner, 25, 100)
    ms = r.ms if r.ms is not None else float("nan")
    print(f"RES {_label(case):40s} {variant:28s} {ms:8.4f} ms {r.tflops or 0:6.0f} TF/s "
          f"({time.time() - t0:.1f}s) {r.error or ''}")  # fmt: skip
    if r.ms is not None:
        RESULTS.setdefault(_label(case), {})[variant] = r.ms


def check() -> None:
    import torch

    from tests.triton_check import check as chk

    for mode in ("0", "3"):
        _set(mode, None)
        try:
            chk(torch, device="cuda", dtype="bfloat16", seq_q=(1000,), seq_k=(1000,), rule=Causal(), b=2,
                hq=4, hkv=2, dqk=128, dv=128, grad=False)  # fmt: skip
            chk(torch, device="cuda", dtype="bfloat16", seq_q=(700,), seq_k=(900,), rule=Local(100, causal=True),
                sync="none_end", b=2, hq=8, hkv=2, dqk=64, dv=64, layout="bshd", grad=False)  # fmt: skip
            chk(torch, device="cuda", dtype="float16", seq_q=(333,), seq_k=(333,), rule=Full(), b=1, hq=2,
                hkv=2, dqk=64, dv=64, grad=False)  # fmt: skip
            print(f"CHECK tma={mode} ok")
        except Exception:  # noqa: BLE001
            print(f"CHECK tma={mode} FAIL\n{traceback.format_exc()[-1500:]}")
    _set(None, None)


def check_band() -> None:
    """The band walk against the float64 reference on the GPU (bf16 and fp16, both load paths)."""
    import torch

    from tests.triton_check import check as chk

    for mode in ("0", "3"):
        for cfg in ("64,64,4,3,0,1", "128,128,8,3,0,1", "128,64,4,3,0,1"):
            _set(mode, cfg)
            try:
                chk(torch, device="cuda", dtype="bfloat16", seq_q=(1500,), seq_k=(1500,), b=2, hq=4, hkv=2,
                    rule=Local(300, causal=True), sync="none_end", dqk=128, dv=128, grad=False)  # fmt: skip
                chk(torch, device="cuda", dtype="float16", seq_q=(700,), seq_k=(900,), b=2, hq=8, hkv=2,
                    rule=Local(100, causal=True), sync="none_end", dqk=64, dv=64, layout="bshd",
                    logit_boost=8.0, grad=False)  # fmt: skip
                chk(torch, device="cuda", dtype="bfloat16", seq_q=(1000,), seq_k=(1000,), b=2, hq=4,
                    hkv=4, rule=Causal(), dqk=64, dv=64, grad=False)  # fmt: skip
                chk(torch, device="cuda", dtype="bfloat16", seq_q=(600,), seq_k=(300,), b=1, hq=4,
                    hkv=4, rule=Causal(), dqk=128, dv=128, grad=False)  # fmt: skip
                chk(torch, device="cuda", dtype="bfloat16", seq_q=(777,), seq_k=(777,), b=1, hq=2,
                    hkv=2, rule=Local(64), sync="none_end", dqk=128, dv=128, grad=False)  # fmt: skip
                print(f"CHECK band tma={mode} {cfg} ok")
            except Exception:  # noqa: BLE001
                print(f"CHECK band tma={mode} {cfg} FAIL\n{traceback.format_exc()[-1500:]}")
    _set(None, None)


WIN_DEFAULT = "0:0:64,64,4,3,128,1;0:0:64,64,4,2,128,1;3:3:64,64,4,3,0,1"


def _win_items() -> list[tuple[Case, str, str]]:
    """``PROBE_WIN="case:tma:cfg;..."`` as (LOCAL case, load path, config) triples."""
    items = [x.split(":") for x in os.environ.get("PROBE_WIN", WIN_DEFAULT).split(";")]
    return [(LOCAL[int(idx)], mode, cfg) for idx, mode, cfg in items]


def win() -> None:
    """Pinned sliding-window timings of the ``PROBE_WIN`` items, FlexAttention first on each case."""
    items = _win_items()
    for case in dict.fromkeys(case for case, _, _ in items):
        _time("flex", case, "flex")
    for case, mode, cfg in items:
        _set(mode, cfg)
        _time("triton", case, f"tma{mode} {cfg}")
    _set(None, None)


def check_win() -> None:
    """The window configs of ``win`` at their cases' head dim against the float64 reference (bf16
    with large logits, fp16 bshd GQA, a non-causal window)."""
    import torch

    from tests.triton_check import check as chk

    for mode, cfg, d in dict.fromkeys((mode, cfg, case.dim) for case, mode, cfg in _win_items()):
        _set(mode, cfg)
        try:
            chk(torch, device="cuda", dtype="bfloat16", seq_q=(1500,), seq_k=(1500,), b=2, hq=4, hkv=2,
                rule=Local(300, causal=True), sync="none_end", dqk=d, dv=d, logit_boost=8.0, grad=False)  # fmt: skip
            chk(torch, device="cuda", dtype="float16", seq_q=(700,), seq_k=(900,), b=2, hq=8, hkv=2,
                rule=Local(100, causal=True), sync="none_end", dqk=d, dv=d, layout="bshd", grad=False)  # fmt: skip
            chk(torch, device="cuda", dtype="bfloat16", seq_q=(777,), seq_k=(777,), b=1, hq=2,
                hkv=2, rule=Local(64), sync="none_end", dqk=d, dv=d, grad=False)  # fmt: skip
            print(f"CHECK win tma={mode} {cfg} ok")
        except Exception:  # noqa: BLE001
            print(f"CHECK win tma={mode} {cfg} FAIL\n{traceback.format_exc()[-1500:]}")
    _set(None, None)


def ncu_calls() -> None:
    """Two calls of each ``index:cfg`` pair of ``PROBE_NCU`` (LOCAL cases), for Nsight Compute."""
    import torch

    for item in os.environ.get("PROBE_NCU", "1:64,64,4,3,128,0,1;3:64,64,4,3,0,1").split(";"):
        idx, cfg = item.split(":")
        _set("3", cfg)
        fn, (q, k, v) = _warm(LOCAL[int(idx)])
        with torch.no_grad():
            fn(q, k, v)
        torch.cuda.synchronize()
        print("NCU", _label(LOCAL[int(idx)]), cfg)
    _set(None, None)


DECODE_8K = Case("decode", 8, 32, 8, 1, 8192, 128, Full(), "none_end")


def _warm(case: Case) -> tuple:
    """The triton runner of ``case`` and its inputs, after one synchronised call (compile, tune)."""
    import torch

    from attnhub.bench.runners import make_inputs

    fn = runner("triton", case)
    q, k, v, _ = make_inputs(case)
    with torch.no_grad():
        fn(q, k, v)
    torch.cuda.synchronize()
    return fn, (q, k, v)


def host() -> None:
    """Where a short call's time goes: CPU per call, kernel time (profiler), do_bench as the bench
    times it, and do_bench over a CUDA graph of the same call (no host work between launches)."""
    import torch
    from triton.testing import do_bench, do_bench_cudagraph

    _set(None, None)
    for case in LOCAL + [DECODE_8K]:
        fn, (q, k, v) = _warm(case)
        with torch.no_grad():
            t0 = time.perf_counter()
            for _ in range(200):
                fn(q, k, v)
            cpu_us = (time.perf_counter() - t0) / 200 * 1e6
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn(q, k, v)
                torch.cuda.synchronize()
            kern = [e for e in prof.key_averages() if "fwd_kernel" in e.key or "combine" in e.key]
            dev_us = (
                sum(getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0) for e in kern) / 20
            )
            bench_ms = do_bench(lambda f=fn, a=(q, k, v): f(*a), warmup=25, rep=100, return_mode="median")
            graph_ms = do_bench_cudagraph(lambda f=fn, a=(q, k, v): f(*a), rep=100, return_mode="median")
        print(f"HOST {_label(case):40s} cpu/call {cpu_us:6.1f} us  kernel {dev_us:7.1f} us  "
              f"do_bench {bench_ms * 1e3:7.1f} us  graph {graph_ms * 1e3:7.1f} us")  # fmt: skip


def hostprof() -> None:
    """cProfile of 300 calls of a short window case (D = 128, TMA) and of decode: the host path."""
    import cProfile
    import pstats

    import torch

    _set(None, None)
    for case in (LOCAL[2], DECODE_8K):
        fn, (q, k, v) = _warm(case)
        with torch.no_grad():
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(300):
                fn(q, k, v)
            prof.disable()
            torch.cuda.synchronize()
        print(f"PROFILE {_label(case)}")
        pstats.Stats(prof).sort_stats("tottime").print_stats(28)


def sweep(cases: list[Case], cfgs: list[str], modes: tuple[str, ...], peer: str) -> None:
    for case in cases:
        _time(peer, case, peer)
    for mode in modes:
        for cfg in cfgs:
            _set(mode, cfg)
            for case in cases:
                _time("triton", case, f"tma{mode} {cfg}")
    _set(None, None)


def tuned(cases: list[Case]) -> None:
    _set(None, None)
    for case in cases:
        _time("triton", case, "tuned-default")
    from attnhub_backends.triton import configs

    for k, v in configs.chosen().items():
        print("TUNED", " ".join(map(str, k)), v)


def summary() -> None:
    print("\nSUMMARY (peer / variant time; best first)")
    for label, res in RESULTS.items():
        peer = next((v for k, v in res.items() if not k.startswith(("tma", "tuned"))), None)
        ranked = sorted((v, k) for k, v in res.items() if k.startswith(("tma", "tuned")))
        top = ", ".join(f"{k}={v:.4f} ({peer / v:.2f}x)" if peer else f"{k}={v:.4f}" for v, k in ranked[:4])
        print(f"{label:40s} peer={peer}  {top}")


def main() -> None:
    steps = sys.argv[1:] or ["check", "dense", "local", "tuned"]
    for step in steps:
        t0 = time.time()
        if step == "check":
            check()
        elif step == "dense":
            sweep(DENSE, DENSE_CFGS, ("0", "3"), "sdpa-cudnn")
        elif step == "local":
            sweep(LOCAL, LOCAL_CFGS, ("0", "3"), "flex")
        elif step == "hostprof":
            hostprof()
        elif step == "host":
            host()
        elif step == "checkband":
            check_band()
        elif step == "band":
            sweep(LOCAL, BAND_CFGS, ("0", "3"), "flex")
        elif step == "band2":
            sweep(LOCAL[:2], BAND2_CFGS, ("0", "3"), "flex")
            sweep(LOCAL[2:], BAND2_CFGS, ("3",), "flex")
        elif step == "win":
            win()
        elif step == "checkwin":
            check_win()
        elif step == "ncu":
            ncu_calls()
        elif step == "dense64":
            sweep(DENSE64, DENSE64_CFGS, ("0",), "sdpa-cudnn")
        elif step == "causalband":
            sweep(CAUSAL_BAND, CAUSAL_BAND_CFGS, ("3",), "sdpa-cudnn")
        elif step == "tuned":
            tuned(DENSE + LOCAL)
        print(f"STEP {step} {time.time() - t0:.0f}s")
        summary()


if __name__ == "__main__":
    main()
