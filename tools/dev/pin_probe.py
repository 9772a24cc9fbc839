"""Host cost of sdpa-flash's bound call (SDPA's flags pinned around torch's SDPA) against calling
SDPA directly, on CPU tensors (the flash flag also picks torch's CPU flash kernel)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from attnhub import REGISTRY
from attnhub.plan import plan_for
from attnhub_backends import sdpa as plugin
from attnhub_backends.sdpa import backend as sb


def main() -> None:
    if "sdpa-cpu" not in REGISTRY.backends():
        REGISTRY.register_plugin(plugin)
    torch.set_num_threads(1)
    q, k, v = (torch.randn(1, 1, 16, 32) for _ in range(3))
    sb.SdpaFlash._gqa_mode = lambda self, req: "none"  # no CUDA probe on this machine
    req = plan_for(q, k, v, "causal", "none_front", None, "bhsd", False, "sdpa-cpu").req
    bound = sb.SdpaFlash().bind(req)
    fns = {
        "F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "bound sdpa-flash": lambda: bound(q, k, v, None),
        "general sdpa-flash": lambda: sb.SdpaFlash()._compute(q, k, v, req, None),
    }
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(30):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            for _ in range(300):
                fn()
            best[name] = min(best[name], (time.perf_counter_ns() - t0) / 300 / 1e3)
    print({n: round(t, 2) for n, t in best.items()})


if __name__ == "__main__":
    main()
