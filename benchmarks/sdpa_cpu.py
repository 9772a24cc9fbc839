"""attnhub ``backend="auto"`` against torch's own SDPA on torch CPU tensors; prints one line per shape.

    python benchmarks/sdpa_cpu.py [--reps 10] [--threads N]

With the ``sdpa`` plugin installed, auto picks ``sdpa-cpu`` for torch CPU tensors; the ratio is
torch's time over attnhub's (>= 1: attnhub as fast or faster). Medians of interleaved runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import attnhub

SHAPES = [
    # (B, H, L, D, causal, grad)
    (4, 8, 1024, 64, True, False),
    (4, 8, 1024, 64, False, False),
    (4, 8, 1024, 64, True, True),
    (1, 8, 128, 64, True, False),
    (1, 1, 16, 32, True, False),
]


def _median_ms(fns, reps):
    times = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(reps):
        for i, fn in enumerate(fns):  # interleaved, so drift hits both alike
            t = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) * 1e3 for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for b, h, n, d, causal, grad in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, requires_grad=grad) for _ in range(3))
        mask = "causal" if causal else None
        chosen = attnhub.explain(q, k, v, mask=mask).chosen

        def ours(q=q, k=k, v=v, mask=mask, grad=grad):
            out = attnhub.attention(q, k, v, mask=mask)
            if grad:
                out.sum().backward()

        def theirs(q=q, k=k, v=v, causal=causal, grad=grad):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            if grad:
                out.sum().backward()

        reps = args.reps if n >= 512 else args.reps * 20
        t_ours, t_torch = _median_ms([ours, theirs], reps)
        print(
            f"B={b} H={h} L={n} D={d} {'causal' if causal else 'full'}{' fwd+bwd' if grad else ''}: "
            f"auto={chosen} {t_ours:.3f} ms, torch SDPA {t_torch:.3f} ms, ratio {t_torch / t_ours:.2f}x"
        )


if __name__ == "__main__":
    main()
