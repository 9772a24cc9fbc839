"""Peak memory of the reference backend on a long causal call (issue: 1 x 8 x 16384 x 64 float32).

Run: python benchmarks/reference_memory.py [--length 16384]
Reports the traced NumPy peak (tracemalloc) and the process's max RSS, against what a dense
Lq x Lk float64 logits matrix alone would need.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import numpy as np

import attnhub


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (1, args.heads, args.length, args.dim)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    tracemalloc.start()
    t0 = time.perf_counter()
    out = attnhub.attention(q, k, v, mask="causal", backend="reference")
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    dense = args.heads * args.length**2 * 8 / 2**30
    assert np.all(np.isfinite(out))
    print(f"shape {shape} float32 causal, reference backend: {seconds:.1f} s")
    print(f"traced peak {peak / 2**30:.3f} GiB, max RSS {rss:.3f} GiB")
    print(f"a dense float64 logits matrix alone would take {dense:.1f} GiB")


if __name__ == "__main__":
    main()
