"""Decode tiles, split counts and load path of the triton ragged kernels against SDPA cuDNN, on
benchmarks/kvcache_decode.py's cases (GQA 32/8, D 128, bf16, every sequence full): for each
(BN, warps, stages) in ``ragged_launch.TUNE`` (``decode`` and ``decode_tma`` alike), each split
count (``ATTNHUB_TRITON_SPLITS``; 0 = the launcher's choice) and both load paths
(``ATTNHUB_TRITON_TMA`` 0 and 3), the kernels' median time through ``attention_kvcache`` (do_bench, CUDA
events) and the K/V bytes per second.

    python tools/dev/decode_sweep.py [--cases 8x8192,64x4096] [--splits 0,4,8,16]
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import attnhub
from attnhub_backends.triton import ragged_launch

HQ, HKV, D = 32, 8, 128
CFGS = [(128, 4, 3), (64, 2, 3), (64, 4, 4), (128, 8, 3), (64, 4, 3), (256, 8, 2), (128, 4, 4), (32, 2, 4)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="1x8192,8x8192,64x4096")
    ap.add_argument("--splits", default="0,4,8,16,32")
    ap.add_argument("--tma", default="0,3")
    ap.add_argument("--cfgs", default="", help="BN:warps:stages,... (default: the CFGS list)")
    args = ap.parse_args()
    default = dict(ragged_launch.TUNE)
    cfgs = [tuple(int(x) for x in c.split(":")) for c in args.cfgs.split(",")] if args.cfgs else CFGS
    for case in args.cases.split(","):
        b, lk = (int(x) for x in case.split("x"))
        g = torch.Generator(device="cuda").manual_seed(b * 100003 + lk)
        q, k, v = (torch.randn(b, h, n, D, generator=g, device="cuda", dtype=torch.bfloat16)
                   for h, n in ((HQ, 1), (HKV, lk), (HKV, lk)))  # fmt: skip
        lens = torch.full((b,), lk, dtype=torch.int32, device="cuda")
        nbytes = 2 * b * HKV * lk * D * 2

        def peer():  # noqa: ANN202
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: B023

        t_peer = do_bench(peer, warmup=25, rep=100, return_mode="median")
        print(f"== B {b} Lk {lk}: cuDNN {t_peer * 1e3:.1f} us ({nbytes / t_peer / 1e9:.2f} TB/s)", flush=True)
        rows = []
        for tma, splits, cfg in itertools.product(args.tma.split(","), args.splits.split(","), cfgs):
            os.environ["ATTNHUB_TRITON_TMA"] = tma
            os.environ["ATTNHUB_TRITON_SPLITS"] = "" if splits == "0" else splits
            ragged_launch.TUNE.update(decode=cfg, decode_tma=cfg)
            ragged_launch._PLANS.clear()
            try:
                t = do_bench(lambda: attnhub.attention_kvcache(q, k, v, lens), warmup=25, rep=100,  # noqa: B023
                             return_mode="median")  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - a config that does not fit is reported
                print(f"  tma {tma} splits {splits} {cfg}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            rows.append((t, tma, splits, cfg))
            print(f"  tma {tma} splits {splits:>2} {cfg}: {t * 1e3:6.1f} us {nbytes / t / 1e9:.2f} TB/s "
                  f"cuDNN/this {t_peer / t:.3f}", flush=True)  # fmt: skip
        for t, tma, splits, cfg in sorted(rows)[:5]:
            print(f"  best: tma {tma} splits {splits} {cfg} {t * 1e3:.1f} us cuDNN/this {t_peer / t:.3f}")
        os.environ.pop("ATTNHUB_TRITON_SPLITS", None)
        os.environ.pop("ATTNHUB_TRITON_TMA", None)
        ragged_launch.TUNE.update(default)
        ragged_launch._PLANS.clear()


if __name__ == "__main__":
    main()
