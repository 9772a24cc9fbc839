"""Host time per call of the ragged entry points, with the kernels' launches made no-ops.

Under ``TRITON_INTERPRET=1`` the triton backend serves CPU tensors; :class:`Relauncher` (every
forward launch of the dense and the ragged paths goes through one) is patched here to return at
once, so what is timed is attnhub's Python path per call: validation, the plan cache, operands,
the lengths' host reads, the launch plans and the output allocations. Decode shapes of the H100
report (B=4, Hq=32, Hkv=8, Lq=1, D=128) with a small Lk.

With ``--device cuda`` (on a GPU) nothing is patched: the time per call of N back-to-back calls
with the same arrays (a model's layers), synchronised once at the end, with the given ``--lk``
and bfloat16; a host read per call would show as the kernel's time plus the host's.

    .venv/bin/python tools/dev/host_path_bench.py [--calls 2000] [--profile NAME] [--only a,b]
    python tools/dev/host_path_bench.py --device cuda --lk 8192 --calls 500 [--batch 1]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections.abc import Callable

CUDA = "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cuda"
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

import attnhub  # noqa: E402
from attnhub_backends.triton.relaunch import Relauncher  # noqa: E402

B, HQ, HKV, D, BLOCK = 4, 32, 8, 128, 16


def _no_launch(self, fn, grid, args, kwargs) -> None:  # noqa: ANN001
    """Stands in for a kernel launch: the outputs stay as allocated."""


def cases(LK: int = 256, device: str = "cpu") -> dict[str, Callable[[], object]]:  # noqa: N803
    """The calls timed, each a closure over its inputs (one lengths tensor reused, as in a loop
    over layers)."""
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float16

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device, dtype)

    q = rnd(B, HQ, 1, D)
    kc, vc = rnd(B, HKV, LK, D), rnd(B, HKV, LK, D)
    lens = torch.tensor([LK, LK - 3, LK // 2, 1][:B], dtype=torch.int32, device=device)
    nblk = LK // BLOCK
    kp, vp = rnd(B * nblk, BLOCK, HKV, D), rnd(B * nblk, BLOCK, HKV, D)
    table = torch.randperm(B * nblk, generator=g).to(device, torch.int32).reshape(B, nblk)
    qd, kd, vd = rnd(B, HQ, 1, D), rnd(B, HKV, LK, D), rnd(B, HKV, LK, D)
    seqs = [LK, LK - 3, LK // 2, 1][:B]
    cu = torch.tensor([0, *torch.tensor(seqs).cumsum(0).tolist()], dtype=torch.int32, device=device)
    tk = sum(seqs)
    cuq = torch.arange(B + 1, dtype=torch.int32, device=device)
    qv, kv, vv = rnd(B, HQ, D), rnd(tk, HKV, D), rnd(tk, HKV, D)
    calls = [0]

    def kvcache_steps() -> object:
        """A decoding loop of 32 layers: the lengths change in place once per step."""
        calls[0] += 1
        if calls[0] % 32 == 0:
            lens.add_(0)
        return attnhub.attention_kvcache(q, kc, vc, lens, backend="triton")

    return {
        "dense": lambda: attnhub.attention(qd, kd, vd, backend="triton"),
        "kvcache_32": kvcache_steps,
        "kvcache": lambda: attnhub.attention_kvcache(q, kc, vc, lens, backend="triton"),
        "paged": lambda: attnhub.attention_kvcache(q, kp, vp, lens, block_table=table, backend="triton"),
        "lengths": lambda: attnhub.attention(
            q, kc, vc, k_lengths=lens, sync="none_end", mask="causal", backend="triton"
        ),
        "varlen": lambda: attnhub.attention_varlen(
            qv, kv, vv, cuq, cu, mask="causal", sync="none_end", backend="triton"
        ),
        "varlen_max": lambda: attnhub.attention_varlen(
            qv,
            kv,
            vv,
            cuq,
            cu,
            max_seqlen_q=1,
            max_seqlen_k=LK,
            mask="causal",
            sync="none_end",
            backend="triton",
        ),  # fmt: skip
    }


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    """Least of 7 runs of ``calls`` calls, in µs per call (the machine is shared: the least is the
    run least disturbed)."""
    for _ in range(50):
        fn()
    runs = []
    for _ in range(7):
        if CUDA:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if CUDA:
            torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return min(runs)


def reads_per_call(fn: Callable[[], object], calls: int = 32) -> float:
    """Host reads (``Tensor.cpu()``, the device-to-host copy on a GPU) per call over ``calls``
    calls with the same arguments: a model's layers in one decoding step."""
    count = [0]
    real = torch.Tensor.cpu

    def counted(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003
        count[0] += 1
        return real(self, *a, **kw)

    torch.Tensor.cpu = counted  # type: ignore[method-assign]
    try:
        for _ in range(calls):
            fn()
    finally:
        torch.Tensor.cpu = real  # type: ignore[method-assign]
    return count[0] / calls


def main() -> None:
    global B
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--lk", type=int, default=256)
    ap.add_argument("--batch", type=int, default=B, choices=(1, 2, 3, 4))
    ap.add_argument("--profile", default="", help="a case name: cProfile it (top 25 by tottime)")
    ap.add_argument("--sort", default="tottime")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--only", default="", help="comma-separated case names")
    args = ap.parse_args()
    B = args.batch
    if not CUDA:
        Relauncher.__call__ = _no_launch  # type: ignore[method-assign]
        torch.set_num_threads(1)
    all_cases = cases(args.lk, args.device)
    names = args.only.split(",") if args.only else list(all_cases)
    if args.profile:
        fn = all_cases[args.profile]
        for _ in range(50):
            fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        pstats.Stats(prof).sort_stats(args.sort).print_stats(args.top)
        return
    for name in names:
        fn = all_cases[name]
        us = per_call_us(fn, args.calls)
        print(f"{name:11s} {us:8.1f} us/call {reads_per_call(fn):6.3f} host reads/call", flush=True)


if __name__ == "__main__":
    main()
