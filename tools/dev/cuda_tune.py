"""Try (warps, keys per tile) configurations of the cuda backend's tensor-core forward on one GPU.

python tools/dev/cuda_tune.py   # prints TFLOP/s per configuration, head dim and mask
"""

from __future__ import annotations

import os

import torch

import attnhub
from attnhub_backends.cuda import compiler

CONFIGS = [(8, 64, 1), (8, 128, 1), (4, 64, 2), (4, 32, 2), (4, 128, 2), (8, 64, 2)]


def _ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))


def main() -> None:
    b, h, n = 8, 16, 4096
    print(f"{'D':>4} {'causal':6} " + " ".join(f"{w}w/{bn}/{rb}".rjust(9) for w, bn, rb in CONFIGS))
    for d in (64, 128):
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
            cells = []
            for cfg in CONFIGS:
                os.environ["ATTNHUB_CUDA_MMA"] = ",".join(map(str, cfg))
                try:
                    with torch.no_grad():
                        mask = "causal" if causal else None
                        ms = _ms(
                            lambda q=q, k=k, v=v, mask=mask: attnhub.attention(
                                q, k, v, mask=mask, backend="cuda"
                            )
                        )
                    cells.append(f"{flops / ms / 1e9:9.1f}")
                except Exception as exc:
                    cells.append(f"{type(exc).__name__[:9]:>9}")
            print(f"{d:>4} {causal!s:6} " + " ".join(cells), flush=True)
    os.environ.pop("ATTNHUB_CUDA_MMA", None)
    for key, kern in compiler._kernels.items():
        if key[0].startswith("fwd_mma") and not key[0].endswith(":obj"):
            a = kern.attributes
            print(key[0], "regs", a.num_regs, "local bytes", a.local_size_bytes)


if __name__ == "__main__":
    main()
