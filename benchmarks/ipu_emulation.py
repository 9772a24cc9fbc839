"""The ``ipu`` backend's chunked graph in CPU emulation: what tile skipping saves, next to torch SDPA.

Run: ``ATTNHUB_IPU_EMULATE=1 .venv/bin/python benchmarks/ipu_emulation.py [--lengths 1024 4096]
[--repeats 5] [--threads N]``.
This times the torch graph on the CPU only; it says nothing about speed on an IPU (none was
available). For each rule it reports the chunk counts the memory model picks, the chunk pairs
computed out of all pairs, and the fastest of ``--repeats`` interleaved calls of the emulated graph
and of ``torch.nn.functional.scaled_dot_product_attention`` (torch's CPU kernel) on the same float32
inputs, forward and forward+backward. FLOPs as FlashAttention counts them (attended pairs only).
"""

from __future__ import annotations

import argparse
import os
import time

B, H, D = 1, 4, 64


def _rule(name: str):
    from attnhub import Causal, Full, Local

    return {"full": Full(), "causal": Causal(), "local128": Local(128)}[name]


def main() -> None:
    os.environ.setdefault("ATTNHUB_IPU_EMULATE", "1")
    import torch
    import torch.nn.functional as F

    import attnhub
    from attnhub.positions import dense_rule_mask
    from attnhub_backends.ipu.plan import choose_chunks, make_plan

    p = argparse.ArgumentParser()
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={B} H={H} D={D} float32")
    print(
        "| L | rule | chunks q x kv | pairs computed | ipu fwd | SDPA fwd | ipu fwd+bwd | SDPA fwd+bwd | ipu fwd GFLOP/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.lengths:
        q, k, v = (torch.randn(B, H, n, D, requires_grad=True) for _ in range(3))
        for name in ("full", "causal", "local128"):
            rule = _rule(name)
            cq, ck = choose_chunks(n, n, D)
            plan = make_plan(rule, (n,), (n,), "none_front", cq, ck)
            keep = torch.from_numpy(dense_rule_mask(rule, (n,), (n,), "none_front"))
            attended = int(keep.sum())
            sdpa_mask = None if name == "full" else keep

            def ipu(grad: bool, rule=rule, q=q, k=k, v=v):
                out = attnhub.attention(q, k, v, mask=rule, backend="ipu")
                if grad:
                    out.sum().backward()

            def sdpa(grad: bool, sdpa_mask=sdpa_mask, q=q, k=k, v=v):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask)
                if grad:
                    out.sum().backward()

            best = {}
            for grad in (False, True):
                for label in ("ipu", "sdpa"):
                    best[(label, grad)] = float("inf")
                for _ in range(args.repeats):
                    for label, fn in (("ipu", ipu), ("sdpa", sdpa)):
                        with torch.set_grad_enabled(grad):
                            t0 = time.perf_counter()
                            fn(grad)
                            best[(label, grad)] = min(best[(label, grad)], time.perf_counter() - t0)
            flops = 4 * B * H * attended * D
            total = len(plan.q_bounds) * len(plan.k_bounds)
            print(
                f"| {n} | {name} | {cq} x {ck} | {plan.num_pairs}/{total} | "
                f"{best[('ipu', False)] * 1e3:.1f} ms | {best[('sdpa', False)] * 1e3:.1f} ms | "
                f"{best[('ipu', True)] * 1e3:.1f} ms | {best[('sdpa', True)] * 1e3:.1f} ms | "
                f"{flops / best[('ipu', False)] / 1e9:.1f} |"
            )


if __name__ == "__main__":
    main()
