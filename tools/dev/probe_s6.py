"""Session-6 probe (H100): the backward with dq added atomically by the dk/dv kernel.

    python tools/dev/probe_s6.py --part atomic [--cfgs "64,128,8,2 128,64,8,2"] [--families ...]

atomic: backward times (autograd, ``attnhub.bench.timing.time_case``) of backend="triton" on the
real-model bench cases (padding, varlen, softcap, sinks; the bias fwd+bwd keeps the dq kernel for
dS) and dense D 64/128 causal/full at L 4k and 16k, with ``ATTNHUB_TRITON_ATOMIC_DQ=0`` (the dq
kernel) and ``=1`` for each dk/dv config in ``--cfgs`` (dense: ``ATTNHUB_TRITON_DKDV_CFG``;
ragged and varlen: ``ragged_launch.TUNE["dkdv_atomic"]``; "default" leaves both alone). Each
atomic variant's gradients are compared with the dq-kernel ones on the same inputs (relative
L2 of the difference, which should sit at bf16 rounding).
"""

from __future__ import annotations

import argparse
import os

import torch

from attnhub.bench.grid import Case
from attnhub.bench.timing import time_case
from attnhub.bench.workloads import attnhub_runner, make_inputs, model_grid
from attnhub.rules import Causal, Full


def _grads(case: Case) -> list[torch.Tensor]:
    torch.manual_seed(0)
    q, k, v, do = make_inputs(case, "cuda")
    out = attnhub_runner("triton", case)(q, k, v)
    return list(torch.autograd.grad(out, (q, k, v), do))


def _set(atomic: str, cfg: str) -> None:
    from attnhub_backends.triton import ragged_launch

    os.environ["ATTNHUB_TRITON_ATOMIC_DQ"] = atomic
    if cfg == "default":
        os.environ.pop("ATTNHUB_TRITON_DKDV_CFG", None)
        ragged_launch.TUNE["dkdv_atomic"] = None
    else:
        os.environ["ATTNHUB_TRITON_DKDV_CFG"] = cfg
        ragged_launch.TUNE["dkdv_atomic"] = tuple(int(x) for x in cfg.split(","))[:4]


def _dense(d: int, n: int, causal: bool) -> Case:
    return Case("dense", 16384 // n, 2048 // d, 2048 // d, n, n, d, Causal() if causal else Full(), direction="bwd")


def part_atomic(cfgs: list[str], families: list[str]) -> None:
    cases = [c for c in model_grid() if c.family in families and c.direction == "bwd"]
    if "dense" in families:
        cases += [_dense(d, n, c) for d in (128,) for n in (4096, 16384) for c in (True, False)]
    for case in cases:
        label = f"{case.family} B{case.batch} H{case.heads_q} L{case.len_q} D{case.dim} {case.rule}"
        _set("0", "default")
        base = time_case("triton", case, attnhub_runner, 25, 100)
        ref = _grads(case)
        print(f"{label}: dq kernel {base.ms:.3f} ms" if base.ms else f"{label}: {base.error}", flush=True)
        for cfg in cfgs:
            _set("1", cfg)
            res = time_case("triton", case, attnhub_runner, 25, 100)
            if res.ms is None:
                print(f"  atomic {cfg}: {res.error}", flush=True)
                continue
            got = _grads(case)
            diffs = [float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(got, ref)]
            print(
                f"  atomic {cfg}: {res.ms:.3f} ms ({base.ms / res.ms:.3f}x)  rel diff dq/dk/dv "
                + " ".join(f"{x:.1e}" for x in diffs),
                flush=True,
            )
        _set("0", "default")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="atomic")
    ap.add_argument("--cfgs", default="default")
    ap.add_argument("--families", default="padding,varlen,softcap,sinks,dense")
    a = ap.parse_args()
    if a.part == "atomic":
        part_atomic(a.cfgs.split(), a.families.split(","))


if __name__ == "__main__":
    main()
