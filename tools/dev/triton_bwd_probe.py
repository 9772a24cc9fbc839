"""Backward of the triton backend at one shape: every (dK/dV, dQ) candidate pair pinned (plus any
``--extra`` configs, e.g. FlexAttention's own H100 choice), the tuned default, SDPA flash and
FlexAttention (with the same ALiBi ``score_mod`` when ``--alibi``), in one process.

Usage (GPU): python tools/dev/triton_bwd_probe.py [--dim 128] [--length 16384] [--batch B]
    [--heads H] [--causal] [--alibi] [--extra dkdv:64,128,8,3 --extra dq:128,64,8,3]
"""

from __future__ import annotations

import argparse

from envvars import env_set


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=0, help="default: 16384 // length")
    ap.add_argument("--heads", type=int, default=0, help="default: 2048 // dim")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--alibi", action="store_true", help="ALiBi slopes in the kernel (and in Flex)")
    ap.add_argument("--extra", action="append", default=[], help="KERNEL:bm,bn,warps,stages")
    ap.add_argument(
        "--pair", action="append", default=[], help="only these: DKDV_CFG/DQ_CFG (a,b,c,d/e,f,g,h)"
    )
    args = ap.parse_args()

    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attnhub
    from attnhub.modifiers.alibi import alibi_slopes
    from attnhub_backends.triton import configs

    d, n = args.dim, args.length
    b, h = args.batch or max(1, 16384 // n), args.heads or 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        for _ in range(3)
    )
    do = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
    mask = "causal" if args.causal else None
    slopes = torch.tensor(alibi_slopes(h), device="cuda") if args.alibi else None
    flops = 2.5 * 4 * b * h * n * n * d * (0.5 if args.causal else 1.0)

    def bwd_ms(out) -> float:
        return triton.testing.do_bench(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))

    def ours():
        return attnhub.attention(q, k, v, mask=mask, alibi_slopes=slopes, backend="triton")

    title = f"B={b} H={h} L={n} D={d} causal={args.causal} alibi={args.alibi}:"
    if not args.alibi:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            flash = bwd_ms(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal))
        title += f" sdpa-flash {flash:.3f} ms"
    print(title, f"flex {_flex_ms(q, k, v, do, slopes, args.causal):.3f} ms", flush=True)
    ms = bwd_ms(ours())
    picked = {key[0]: cfg for key, cfg in configs.chosen().items() if key[0] in ("dkdv", "dq")}
    print(f"tuned   {ms:8.3f} ms {flops / ms / 1e9:6.1f} TF/s  {picked}", flush=True)
    cap = torch.cuda.get_device_capability()
    cands = {kern: list(configs.candidates(kern, d, 2, cap)) for kern in ("dkdv", "dq")}
    for spec in args.extra:
        kern, _, nums = spec.partition(":")
        cands[kern].append(_cfg(nums))
    pairs = [(a, c) for a in cands["dkdv"] for c in cands["dq"]]
    if args.pair:
        pairs = [tuple(_cfg(half) for half in p.split("/")) for p in args.pair]
    for a, c in pairs:
        pinned = env_set(
            ATTNHUB_TRITON_DKDV_CFG=f"{a.bm},{a.bn},{a.warps},{a.stages}",
            ATTNHUB_TRITON_DQ_CFG=f"{c.bm},{c.bn},{c.warps},{c.stages}",
        )
        try:
            with pinned:
                ms = bwd_ms(ours())
        except Exception as exc:  # noqa: BLE001 - a candidate that does not fit: shown
            print(f"dkdv {a} dq {c}: {type(exc).__name__}")
            continue
        print(f"pinned  {ms:8.3f} ms {flops / ms / 1e9:6.1f} TF/s  "
              f"dkdv {a.bm},{a.bn},{a.warps},{a.stages} dq {c.bm},{c.bn},{c.warps},{c.stages}", flush=True)  # fmt: skip


def _cfg(text: str):
    """``bm,bn,warps,stages`` as a triton ``Cfg``."""
    from attnhub_backends.triton import configs

    return configs.Cfg(*(int(x) for x in text.split(",")))


def _flex_ms(q, k, v, do, slopes, causal: bool) -> float:
    """FlexAttention's compiled backward at the same call (ALiBi as a ``score_mod``)."""
    import torch
    import triton.testing
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n = q.shape[2]
    bm = None
    if causal:
        bm = create_block_mask(lambda bb, hh, qi, ki: qi >= ki, None, None, n, n, device="cuda")
    mod = None
    if slopes is not None:

        def mod(score, bb, hh, qi, ki):
            return score - slopes[hh] * (qi - ki).abs()

    torch._functorch.config.donated_buffer = False  # the backward is timed repeatedly (retain_graph)
    flex = torch.compile(flex_attention)
    out = flex(q, k, v, score_mod=mod, block_mask=bm)
    return triton.testing.do_bench(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))


if __name__ == "__main__":
    main()
