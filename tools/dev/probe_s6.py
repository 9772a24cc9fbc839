"""Session-6 probe (H100): the ragged backward's tile configs after hoisting its address arithmetic.

    python tools/dev/probe_s6.py --part ragbwd [--dkdv "64,64,4,2 ..."] [--dq "64,64,4,2 ..."]

profile: per-kernel CUDA times (torch.profiler, 10 backward calls) of the padding and varlen cases at
the default tiles and with dk/dv (64, 128, 8, 2), and of a dense causal B 4 L 4k call for scale.

padlen: the padding case's backward as the mask kernels run it (``ATTNHUB_TRITON_DKDV_CFG`` /
``ATTNHUB_TRITON_DQ_CFG`` over ``--dkdv`` / ``--dq``) and as lengths (the ragged kernels), profiled.

tmadq: backward times of dense causal/full (B 4 L 4k, B 1 L 16k; H 16, D 128) and the padding,
softcap 4k and sinks cases with ``ATTNHUB_TRITON_ATOMIC_DQ`` 0 (the dq kernel) and 2 (dq added by the
dk/dv kernel with TMA reduce-adds into float32), for each ``--dkdv`` config (``default``: as chosen);
the gradients' relative difference from the dq kernel's. The TMA path lives at commit 6e052dc
(reverted by the next: 0.90-1.08x the dq kernel); on later trees both modes run the dq kernel.

ragbwd: backward times (autograd, ``attnhub.bench.timing.time_case``, median) of backend="triton"
on the padding and varlen bench cases (B 8 L 4k padded causal; 16k packed tokens, causal; H 16,
D 128, bf16) for each dk/dv config in ``--dkdv`` (dq at the default) and each dq config in ``--dq``
(dk/dv at the default), set through ``ragged_launch.TUNE``; FlexAttention (the bench's peer) in
the same process.
"""

from __future__ import annotations

import argparse

from attnhub.bench.timing import time_case
from attnhub.bench.workloads import attnhub_runner, model_grid, peer_runner


def _cfg(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def part_ragbwd(dkdvs: list[str], dqs: list[str]) -> None:
    from attnhub_backends.triton import ragged_launch

    cases = [c for c in model_grid() if c.family in ("padding", "varlen") and c.direction == "bwd"]
    for case in cases:
        label = f"{case.family} B{case.batch} H{case.heads_q} L{case.len_q} D{case.dim}"
        flex = time_case("flex", case, peer_runner, 25, 100)
        print(f"{label}: flex {flex.ms:.3f} ms" if flex.ms else f"{label}: flex {flex.error}", flush=True)
        if case.family == "varlen":
            va = time_case("varlen_attn", case, peer_runner, 25, 100)
            print(f"  varlen_attn {va.ms:.3f} ms" if va.ms else f"  varlen_attn {va.error}", flush=True)
        ragged_launch.TUNE.update(dkdv=None, dq=None)
        base = time_case("triton", case, attnhub_runner, 25, 100)
        print(f"  triton default {base.ms:.3f} ms" if base.ms else f"  default: {base.error}", flush=True)
        pairs = [(d, "64,64,4,2") for d in dkdvs] + [("64,64,4,2", q) for q in dqs]
        for dk, dq in pairs:
            ragged_launch.TUNE.update(dkdv=_cfg(dk), dq=_cfg(dq))
            res = time_case("triton", case, attnhub_runner, 25, 100)
            text = f"{res.ms:.3f} ms" if res.ms else res.error
            print(f"  dkdv {dk} / dq {dq}: {text}", flush=True)
        ragged_launch.TUNE.update(dkdv=None, dq=None)


def _profile(label: str, fn) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 10 / 1e3) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    print(f"{label}: total {sum(t for _, t in rows):.3f} ms/call", flush=True)
    for name, t in rows[:6]:
        print(f"    {t:.3f} ms  {name[:90]}", flush=True)


def part_profile() -> None:
    import torch

    import attnhub
    from attnhub.bench.workloads import make_inputs
    from attnhub_backends.triton import ragged_launch

    cases = [c for c in model_grid() if c.family in ("padding", "varlen") and c.direction == "bwd"]
    for case in cases:
        q, k, v, do = make_inputs(case, "cuda")
        fn = attnhub_runner("triton", case)
        for cfg in (None, (64, 128, 8, 2)):
            ragged_launch.TUNE.update(dkdv=cfg, dq=(64, 64, 4, 2) if cfg else None)
            out = fn(q, k, v)
            _profile(
                f"{case.family} dkdv {cfg}",
                lambda out=out, ins=(q, k, v), do=do: torch.autograd.grad(out, ins, do, retain_graph=True),
            )
        ragged_launch.TUNE.update(dkdv=None, dq=None)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
    )
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attnhub.attention(q, k, v, mask="causal", backend="triton")
    _profile("dense causal B4 L4k", lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))


def part_padlen(dkdvs: list[str], dqs: list[str]) -> None:
    import os

    import torch

    import attnhub
    from attnhub.bench.workloads import lengths, make_inputs

    case = next(c for c in model_grid() if c.family == "padding" and c.direction == "bwd")
    q, k, v, do = make_inputs(case, "cuda")
    n = torch.tensor(lengths(case), dtype=torch.int32, device="cuda")
    by_mask = attnhub_runner("triton", case)

    def by_lengths(q, k, v):
        return attnhub.attention(q, k, v, mask="causal", q_lengths=n, k_lengths=n, backend="triton")

    for label, fn in (("mask", by_mask), ("lengths", by_lengths)):
        out = fn(q, k, v)
        _profile(
            f"padding as {label}", lambda out=out: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        )
    ref = torch.autograd.grad(by_mask(q, k, v), (q, k, v), do)
    got = torch.autograd.grad(by_lengths(q, k, v), (q, k, v), do)
    print(
        "  lengths vs mask grads rel diff",
        [float((a - b).float().norm() / b.float().norm()) for a, b in zip(got, ref)],
    )
    pairs = [(d, None) for d in dkdvs] + [(None, x) for x in dqs]
    for dk, dq in pairs:
        for name, val in (("ATTNHUB_TRITON_DKDV_CFG", dk), ("ATTNHUB_TRITON_DQ_CFG", dq)):
            if val:
                os.environ[name] = val
            else:
                os.environ.pop(name, None)
        res = time_case("triton", case, attnhub_runner, 25, 100)
        print(
            f"  mask kernels dkdv {dk} dq {dq}: {res.ms:.3f} ms" if res.ms else f"  {dk} {dq}: {res.error}",
            flush=True,
        )
    os.environ.pop("ATTNHUB_TRITON_DKDV_CFG", None)
    os.environ.pop("ATTNHUB_TRITON_DQ_CFG", None)


def part_tmadq(dkdvs: list[str]) -> None:
    import os

    import torch
    from triton.testing import do_bench

    import attnhub
    from attnhub.bench.workloads import make_inputs

    def dense(b, n, causal):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (
            torch.randn(b, 16, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
        )
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        return (q, k, v, do), lambda q, k, v: attnhub.attention(
            q, k, v, mask="causal" if causal else None, backend="triton"
        )

    runs = [
        (f"dense B{b} L{n} {'causal' if c else 'full'}", *dense(b, n, c))
        for b, n in ((4, 4096), (1, 16384))
        for c in (True, False)
    ]
    for case in model_grid():
        if case.direction == "bwd" and (
            case.family in ("padding", "sinks") or (case.family == "softcap" and case.len_q == 4096)
        ):
            runs.append(
                (
                    f"{case.family} B{case.batch} L{case.len_q}",
                    make_inputs(case, "cuda"),
                    attnhub_runner("triton", case),
                )
            )
    for label, (q, k, v, do), fn in runs:
        out = fn(q, k, v)
        results = []
        for mode, cfg in [("0", "default")] + [("2", c) for c in dkdvs]:
            os.environ["ATTNHUB_TRITON_ATOMIC_DQ"] = mode
            if cfg == "default":
                os.environ.pop("ATTNHUB_TRITON_DKDV_CFG", None)
            else:
                os.environ["ATTNHUB_TRITON_DKDV_CFG"] = cfg
            try:
                grads = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
                ms = do_bench(
                    lambda out=out, ins=(q, k, v), do=do: torch.autograd.grad(
                        out, ins, do, retain_graph=True
                    ),
                    warmup=25,
                    rep=100,
                    return_mode="median",
                )
            except Exception as exc:  # noqa: BLE001
                print(f"{label} mode {mode} {cfg}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            if not results:
                ref, base = grads, ms
            diffs = " ".join(
                f"{float((a - b).float().norm() / b.float().norm()):.1e}" for a, b in zip(grads, ref)
            )
            results.append(ms)
            print(f"{label} mode {mode} {cfg}: {ms:.3f} ms ({base / ms:.3f}x) diff {diffs}", flush=True)
    os.environ.pop("ATTNHUB_TRITON_ATOMIC_DQ", None)
    os.environ.pop("ATTNHUB_TRITON_DKDV_CFG", None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="ragbwd")
    ap.add_argument("--dkdv", default="64,128,8,2 64,128,8,3 32,128,4,2 128,64,8,2 64,64,4,3")
    ap.add_argument("--dq", default="128,64,8,2 64,128,8,2 64,64,4,3 128,32,4,2")
    a = ap.parse_args()
    if a.part == "padlen":
        part_padlen(a.dkdv.split(), a.dq.split())
    if a.part == "tmadq":
        part_tmadq(a.dkdv.split())
    if a.part == "profile":
        part_profile()
    if a.part == "ragbwd":
        part_ragbwd(a.dkdv.split(), a.dq.split())


if __name__ == "__main__":
    main()
