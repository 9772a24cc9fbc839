"""Dispatch overhead: an auto call with a cache hit minus a direct call of the chosen backend's forward.

Run: python benchmarks/dispatch_overhead.py [--framework numpy|torch]
Tiny inputs, so that the backend's own work is small and the difference is the dispatcher's cost.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import attnhub
from attnhub.plan import plan_for
from attnhub.request import to_canonical


def per_call_us(fns, n: int, rounds: int = 40) -> list[float]:
    """For each function, the fastest of ``rounds`` interleaved rounds of ``n`` calls, in us per call.

    The minimum is the least disturbed by other processes on a busy machine; interleaving the
    functions round by round exposes them to the same conditions.
    """
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / n * 1e6)
    return best


class NullBackend(attnhub.Backend):
    """Returns preallocated outputs: its forward costs almost nothing, so auto - direct is dispatch alone."""

    name = "null-benchmark"
    priority = 1000
    vendor = True  # first in the prior's order for this plain request too
    frameworks = ("numpy", "torch")

    def __init__(self) -> None:
        self.result = None

    def forward(self, q, k, v, req, mask=None):
        return self.result


class NullPlugin:
    def __init__(self) -> None:
        self.backend = NullBackend()

    @attnhub.hookimpl
    def attnhub_backends(self):
        return [self.backend]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--framework", default="numpy", choices=["numpy", "torch"])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument(
        "--null",
        action="store_true",
        help="time against a backend whose forward does no work (isolates dispatch)",
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 4, 8)).astype(np.float32) for _ in range(3))
    if args.framework == "torch":
        import torch

        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    if args.null:
        plugin = NullPlugin()
        attnhub.REGISTRY.register_plugin(plugin)
        plugin.backend.result = (q, q[..., 0])
    plan = plan_for(q, k, v, "causal", "none_front", None, "bhsd", False, "auto")
    req, ad = plan.req, plan.ad
    backend = attnhub.REGISTRY.backends()[attnhub.explain(q, k, v, mask="causal").chosen]
    qc, kc, vc = (to_canonical(ad, x, "bhsd") for x in (q, k, v))

    def auto() -> None:
        attnhub.attention(q, k, v, mask="causal")

    def direct() -> None:
        backend.forward(qc, kc, vc, req, None)

    auto()  # fills the caches
    t_auto, t_direct = per_call_us([auto, direct], args.calls)
    print(f"framework={args.framework} backend={backend.name}")
    print(f"auto call (cache hit): {t_auto:8.2f} us")
    print(f"direct forward:        {t_direct:8.2f} us")
    print(f"dispatch overhead:     {t_auto - t_direct:8.2f} us")


if __name__ == "__main__":
    main()
