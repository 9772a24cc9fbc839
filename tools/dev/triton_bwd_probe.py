"""Backward of the triton backend at one shape: every (dK/dV, dQ) candidate pair pinned, the tuned
default, and SDPA flash, in one process (the tuner's pick against the measured best).

Usage (GPU): python tools/dev/triton_bwd_probe.py [--dim 128] [--length 16384] [--causal]
"""

from __future__ import annotations

import argparse

from envvars import env_set


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()

    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attnhub
    from attnhub_backends.triton import configs

    d, n = args.dim, args.length
    b, h = max(1, 16384 // n), 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        for _ in range(3)
    )
    do = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
    mask = "causal" if args.causal else None
    flops = 2.5 * 4 * b * h * n * n * d * (0.5 if args.causal else 1.0)

    def bwd_ms(out) -> float:
        return triton.testing.do_bench(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        flash = bwd_ms(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal))
    print(f"B={b} H={h} L={n} D={d} causal={args.causal}: sdpa-flash {flash:.3f} ms")
    out = attnhub.attention(q, k, v, mask=mask, backend="triton")
    ms = bwd_ms(out)
    picked = {key[0]: cfg for key, cfg in configs.chosen().items() if key[0] in ("dkdv", "dq")}
    print(f"tuned   {ms:8.3f} ms {flops / ms / 1e9:6.1f} TF/s flash/triton {flash / ms:.2f}  {picked}")
    cands = {
        kern: configs.candidates(kern, d, 2, torch.cuda.get_device_capability()) for kern in ("dkdv", "dq")
    }
    for a in cands["dkdv"]:
        for c in cands["dq"]:
            pinned = env_set(
                ATTNHUB_TRITON_DKDV_CFG=f"{a.bm},{a.bn},{a.warps},{a.stages}",
                ATTNHUB_TRITON_DQ_CFG=f"{c.bm},{c.bn},{c.warps},{c.stages}",
            )
            try:
                with pinned:
                    out = attnhub.attention(q, k, v, mask=mask, backend="triton")
                    ms = bwd_ms(out)
            except Exception as exc:  # noqa: BLE001 - a candidate that does not fit: shown
                print(f"dkdv {a} dq {c}: {type(exc).__name__}")
                continue
            print(f"pinned  {ms:8.3f} ms {flops / ms / 1e9:6.1f} TF/s flash/triton {flash / ms:.2f}  "
                  f"dkdv {a.bm},{a.bn},{a.warps},{a.stages} dq {c.bm},{c.bn},{c.warps},{c.stages}")  # fmt: skip


if __name__ == "__main__":
    main()
