"""What ``auto`` chooses for one dense class before and after its first-use measurement, and why.

    python tools/dev/first_use_choice.py [--hide-shipped] [--dim 128] [--len 16384] [--causal] [--grad]

Prints ``attnhub.explain`` before any call (the prior or the shipped profile), makes one call
(which measures the class on first use where ``ATTNHUB_AUTOTUNE=auto`` says so), prints
``explain`` again with the measured times, and times auto, cudnn and sdpa-cudnn with do_bench on
the same inputs. Question: on the H200 bf16 grid (2026-11-28) the cudnn backend ran fwd D 128
L 16k 1.1x faster than sdpa-cudnn, yet auto ran at sdpa-cudnn's speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

import attnhub

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from auto_dispatch import hide_shipped_profiles  # noqa: E402  (a device never seen, as the bench)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hide-shipped", action="store_true")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--len", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--grad", action="store_true")
    args = ap.parse_args()
    if args.hide_shipped:
        hide_shipped_profiles()
    n, d = args.len, args.dim
    b, h = 16384 // n, 2048 // d
    q, k, v = (
        torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=args.grad)
        for _ in range(3)
    )
    mask = "causal" if args.causal else None
    print("== before the first call\n" + str(attnhub.explain(q, k, v, mask=mask)), flush=True)
    attnhub.attention(q, k, v, mask=mask)
    torch.cuda.synchronize()
    print("== after it\n" + str(attnhub.explain(q, k, v, mask=mask)), flush=True)
    for name in ("auto", "cudnn", "sdpa-cudnn"):
        ms = do_bench(
            lambda name=name: attnhub.attention(q, k, v, mask=mask, backend=name), warmup=25, rep=100
        )
        print(f"{name:12s} {ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
