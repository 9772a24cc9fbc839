"""Host time per call of attnhub.attention against torch SDPA on tiny CPU tensors (issue 21 item 4).

    python tools/dev/fast_path_probe.py [--profile]

Prints, per shape and grad mode, the fastest-of-rounds µs per call of: torch SDPA, the aten CPU
kernel sdpa-cpu calls, attnhub auto and attnhub backend="sdpa-cpu". ``--profile`` adds a cProfile
of 2000 auto calls per case.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import attnhub


def best_us(fns: dict, n: int = 300, rounds: int = 30) -> dict:
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter_ns() - t0) / n / 1e3)
    return best


def _calls(q, k, v, aten) -> dict:
    d = q.shape[-1]
    return {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "aten": lambda: aten(q, k, v, 0.0, True, scale=d**-0.5),
        "auto": lambda: attnhub.attention(q, k, v, mask="causal"),
        "sdpa-cpu": lambda: attnhub.attention(q, k, v, mask="causal", backend="sdpa-cpu"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    aten = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    for b, h, n, d in [(1, 1, 16, 32), (1, 8, 128, 64)]:
        for grad in (False, True):
            fns = _calls(*(torch.randn(b, h, n, d, requires_grad=grad) for _ in range(3)), aten)
            for fn in fns.values():
                fn()
            t = best_us(fns, 300 if n < 100 else 60, 30 if n < 100 else 15)
            row = " ".join(f"{k}={v:7.2f}" for k, v in t.items())
            print(f"({b},{h},{n},{d}) grad={grad!s:5}: {row}  auto-sdpa={t['auto'] - t['sdpa']:6.2f} us")
            if args.profile:
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(2000):
                    fns["auto"]()
                pr.disable()
                pstats.Stats(pr).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
