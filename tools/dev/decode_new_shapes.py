"""Host time of decode steps as transformers' generate() makes them (GQA 32/8, D 64, bf16, one new
query, the cache one key longer every step and contiguous, as DynamicCache's torch.cat makes it,
so every step is a new request shape): auto and each
candidate by name against torch's SDPA, microseconds per call over ``--steps`` steps of
``--layers`` calls; and what auto chose, with explain's reasons, at one step.

    python tools/dev/decode_new_shapes.py [--batch 1,8] [--steps 64] [--layers 16]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import attnhub


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--start", type=int, default=512)
    args = ap.parse_args()
    names = ["auto", "triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "cudnn", "sdpa"]
    for b in (int(x) for x in args.batch.split(",")):
        n_max = args.start + (len(names) + 1) * args.steps  # each backend its own new shapes
        kc = torch.randn(b, 8, n_max, 64, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn(b, 8, n_max, 64, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(b, 32, 1, 64, device="cuda", dtype=torch.bfloat16)
        k0, v0 = kc[:, :, : args.start], vc[:, :, : args.start]
        print(f"== B {b}: {attnhub.explain(q, k0, v0, mask='causal', sync='none_end')}", flush=True)
        for i, name in enumerate(names):

            def call(k, v, name=name, q=q):  # noqa: ANN001, ANN202
                if name == "sdpa":
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                return attnhub.attention(q, k, v, mask="causal", sync="none_end", backend=name)

            try:
                call(k0, v0)
            except Exception as exc:  # noqa: BLE001 - a backend that declines is reported
                print(f"  {name:>15}: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
                continue
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for s in range(args.steps):
                n = args.start + (i + 1) * args.steps + s  # shapes no earlier run cached
                k, v = kc[:, :, :n].contiguous(), vc[:, :, :n].contiguous()  # a new cache, as torch.cat
                for _ in range(args.layers):
                    call(k, v)
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / (args.steps * args.layers) * 1e6
            print(f"  {name:>15}: {us:8.1f} us a call (new shape every {args.layers} calls)", flush=True)


if __name__ == "__main__":
    main()
