"""Split-KV decode tiles and fill factor of the triton ragged kernels (issue 23), on the bench's own
decode cases: for each (BN, warps, stages) and fill factor in ``ragged_launch.TUNE``, the median
time of ``attention_kvcache`` through the public API (as `attnhub bench` times it), against SDPA
cuDNN in the same process.

    python tools/dev/decode_sweep.py
"""

from __future__ import annotations

import itertools

import torch
from triton.testing import do_bench

from attnhub.bench import workloads
from attnhub_backends.triton import ragged_launch

CFGS = [(128, 4, 3), (64, 4, 4), (128, 8, 3), (64, 2, 4), (256, 8, 2)]
FILLS = [2, 4, 8]


def main() -> None:
    cases = [c for c in workloads.model_grid() if c.family in ("kvcache", "ragged-decode")]
    for case in cases:
        q, k, v, _ = workloads.make_inputs(case, "cuda")
        peer = workloads.peer_runner("sdpa-cudnn", case)
        mine = workloads.attnhub_runner("triton", case)
        gb = workloads.work(case)[1] / 1e9
        try:
            t_peer = do_bench(lambda: peer(q, k, v), warmup=25, rep=100, return_mode="median")  # noqa: B023
        except Exception as exc:  # noqa: BLE001
            t_peer = float("nan")
            print("peer failed:", exc)
        print(f"== {case.family} B={case.batch} Lk={case.len_k}: cuDNN {t_peer * 1e3:.1f} us")
        best = None
        for cfg, fill in itertools.product(CFGS, FILLS):
            ragged_launch.TUNE.update(decode=cfg, decode_tma=cfg, fill=fill)
            ragged_launch._PLANS.clear()
            try:
                t = do_bench(lambda: mine(q, k, v), warmup=25, rep=100, return_mode="median")  # noqa: B023
            except Exception as exc:  # noqa: BLE001
                print(f"  {cfg} fill {fill}: failed {type(exc).__name__}")
                continue
            print(
                f"  {cfg} fill {fill}: {t * 1e3:7.1f} us  {gb / t * 1e3:.2f} TB/s  cuDNN/this {t_peer / t:.3f}"
            )
            if best is None or t < best[0]:
                best = (t, cfg, fill)
        print(f"  best {best}")
        ragged_launch.TUNE.update(decode=(128, 4, 3), decode_tma=(64, 2, 3), fill=4)
        ragged_launch._PLANS.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
