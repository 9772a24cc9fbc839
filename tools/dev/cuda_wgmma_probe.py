"""Check and time the cuda backend's Hopper (wgmma) forward against its mma.sync forward and SDPA.

    python tools/dev/cuda_wgmma_probe.py [--configs 2,128 1,128 ...] [--lengths 4096 ...] [--json FILE]
    python tools/dev/cuda_wgmma_probe.py --bwd [--bwd-modes wgmma:1 wgmma:2 fused split] [...]

Each tile config (``ATTNHUB_CUDA_WGMMA=warpgroups,keys``; ``+p`` adds the pipelined loop,
``ATTNHUB_CUDA_WGMMA_PIPE=1``; ``:tiles`` or ``:heads`` the grid order ``ATTNHUB_CUDA_FWD_ORDER``) is first checked against the float64 reference
backend (odd lengths; Full, Causal, Local(causal), 2-d, GQA, Dqk != Dv, q x 8 for large logits), then
timed with the mma.sync kernel (``ATTNHUB_CUDA_FWD=mma``), SDPA flash and cuDNN in the same process on the
``attnhub bench`` grid (bf16, B = 16384 / L, H = 2048 / D). Median of ``triton.testing.do_bench``; FLOPs
4·B·H·L²·D, halved for causal. ``--bwd``: the backward kernels instead (``ATTNHUB_CUDA_BWD`` mode, and
``ATTNHUB_CUDA_BWD_WG`` warpgroups for wgmma), gradients checked against float64 autograd of the dense
masked softmax, timed as ``torch.autograd.grad`` against SDPA flash and cuDNN (FLOPs 2.5x the forward's).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnhub

sys.path.insert(0, str(Path(__file__).resolve().parent))
from envvars import env_set  # noqa: E402

from attnhub.positions import dense_rule_mask  # noqa: E402
from attnhub.rules import Causal, Full  # noqa: E402


def _ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _sdpa_ms(kind: SDPBackend, q, k, v, causal: bool) -> float:
    with sdpa_kernel([kind]):
        return _ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))


def _cuda_ms(q, k, v, mask, **env: str) -> float:
    with env_set(**env):
        return _ms(lambda: attnhub.attention(q, k, v, mask=mask, backend="cuda"))


def _fwd_env(cfg: str) -> dict[str, str | None]:
    """``warpgroups,keys[+p][:tiles|heads]`` to the forward's switches (``+p``: the pipelined loop)."""
    tile, _, order = cfg.partition(":")
    tile, plus, _ = tile.partition("+")
    return {
        "ATTNHUB_CUDA_FWD": "wgmma",
        "ATTNHUB_CUDA_WGMMA": tile,
        "ATTNHUB_CUDA_FWD_ORDER": order or None,
        "ATTNHUB_CUDA_WGMMA_PIPE": "1" if plus else None,
    }


def check(dtype: torch.dtype = torch.bfloat16) -> float:
    """Largest |cuda - reference| / (1 + |reference|) over odd-length requests (float64 oracle)."""
    worst = 0.0
    g = torch.Generator(device="cpu").manual_seed(7)
    cases = [
        ((2, 3, 333, 64), (2, 3, 333, 64), None, 1.0),
        ((2, 3, 333, 128), (2, 3, 200, 128), "causal", 1.0),  # Lq > Lk: rows fully masked
        ((1, 4, 257, 64), (1, 4, 300, 128), attnhub.Local(window=40, causal=True), 1.0),
        ((1, 4, 190, 128), (1, 2, 190, 64), "causal", 8.0),  # GQA, Dqk != Dv, large logits
        ((2, 2, 15, 20, 64), (2, 2, 15, 20, 64), attnhub.Local(window=(5, 7)), 1.0),  # 2-d
    ]
    for qshape, kshape, mask, qmul in cases:
        dqk = qshape[-1]
        q = torch.randn(qshape, generator=g) * qmul
        k = torch.randn(*kshape[:-1], dqk, generator=g)
        v = torch.randn(kshape, generator=g)
        q, k, v = (x.to(dtype) for x in (q, k, v))
        kw = {"mask": mask, "sync": "none_end" if qshape[2] != kshape[2] else "none_front"}
        ref = attnhub.attention(*(x.double().numpy() for x in (q, k, v)), backend="reference", **kw)
        got = attnhub.attention(*(x.cuda() for x in (q, k, v)), backend="cuda", **kw)
        torch.cuda.synchronize()
        got = got.double().cpu().numpy()
        if not np.isfinite(got).all():
            return float("inf")
        worst = max(worst, float((np.abs(got - ref) / (1 + np.abs(ref))).max()))
    return worst


def _dense_grads(q, k, v, dout, rule, sync):
    """Float64 autograd of softmax(q k^T scale + mask) v on the GPU (GQA by repeating k, v)."""
    x = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    rep = q.shape[1] // k.shape[1]
    kk, vv = (t.repeat_interleave(rep, dim=1) for t in x[1:])
    keep = torch.from_numpy(dense_rule_mask(rule, (q.shape[2],), (k.shape[2],), sync)).cuda()
    s = (x[0] @ kk.transpose(-1, -2)) / q.shape[-1] ** 0.5
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    out = p @ vv
    return torch.autograd.grad(out, x, dout.double())


def check_bwd(dtype: torch.dtype = torch.bfloat16) -> float:
    """Largest |grad - reference| / (1 + max |reference|) per gradient over odd-length requests."""
    worst = 0.0
    g = torch.Generator(device="cpu").manual_seed(11)
    cases = [
        ((2, 3, 333, 64), (2, 3, 333, 64), Full(), "none_front", 1.0),
        ((2, 2, 300, 128), (2, 2, 211, 128), Causal(), "none_end", 1.0),
        ((1, 4, 257, 64), (1, 2, 300, 128), attnhub.Local(window=40, causal=True), "none_end", 1.0),
        ((1, 4, 190, 128), (1, 2, 190, 64), Causal(), "none_front", 8.0),
    ]
    for qshape, kshape, rule, sync, qmul in cases:
        dqk = qshape[-1]
        q = (torch.randn(qshape, generator=g) * qmul).to(dtype).cuda().requires_grad_(True)
        k = torch.randn(*kshape[:-1], dqk, generator=g).to(dtype).cuda().requires_grad_(True)
        v = torch.randn(kshape, generator=g).to(dtype).cuda().requires_grad_(True)
        dout = torch.randn(*qshape[:-1], kshape[-1], generator=g).to(dtype).cuda()
        out = attnhub.attention(q, k, v, mask=rule, sync=sync, backend="cuda")
        got = torch.autograd.grad(out, (q, k, v), dout)
        ref = _dense_grads(q, k, v, dout, rule, sync)
        for a, r in zip(got, ref):
            if not torch.isfinite(a).all():
                return float("inf")
            worst = max(worst, float((a.double() - r).abs().max() / (1 + r.abs().max())))
    return worst


def _bwd_env(mode: str) -> dict[str, str | None]:
    """``kind[:warpgroups[:m<blocks>][:o][:tiles|heads]]`` to the backend's switches: ATTNHUB_CUDA_BWD,
    _BWD_WG, and for wgmma _BWD_MINB (register cap for that many blocks per SM), _BWD_OVERLAP (o) and
    _BWD_ORDER (grid order)."""
    kind, *rest = mode.split(":")
    env: dict[str, str | None] = {"ATTNHUB_CUDA_BWD": kind, "ATTNHUB_CUDA_BWD_WG": None}
    env.update(ATTNHUB_CUDA_BWD_MINB=None, ATTNHUB_CUDA_BWD_OVERLAP=None, ATTNHUB_CUDA_BWD_ORDER=None)
    for part in rest:
        if part.startswith("m"):
            env["ATTNHUB_CUDA_BWD_MINB"] = part[1:]
        elif part == "o":
            env["ATTNHUB_CUDA_BWD_OVERLAP"] = "1"
        elif part in ("tiles", "heads"):
            env["ATTNHUB_CUDA_BWD_ORDER"] = part
        elif part:
            env["ATTNHUB_CUDA_BWD_WG"] = part
    return env


def bwd_main(args) -> list[dict]:
    rows = []
    for mode in args.bwd_modes:
        with env_set(**_bwd_env(mode)):
            try:
                print(
                    f"check bwd {mode}: bf16 {check_bwd():.2e} f16 {check_bwd(torch.float16):.2e}", flush=True
                )
            except Exception as exc:
                print(f"check bwd {mode}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    for d in args.dims:
        for n in args.lengths:
            b, h = max(1, 16384 // n), 2048 // d
            q, k, v = (
                torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3)
            )
            dout = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
            for causal in (False, True):
                flops = 2.5 * 4 * b * h * n * n * d / (2 if causal else 1)
                times = {}
                for kind, name in (
                    (SDPBackend.FLASH_ATTENTION, "flash"),
                    (SDPBackend.CUDNN_ATTENTION, "cudnn"),
                ):
                    with sdpa_kernel([kind]):
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        times[name] = _grad_ms(out, (q, k, v), dout)
                for mode in args.bwd_modes:
                    with env_set(**_bwd_env(mode)):
                        try:
                            out = attnhub.attention(
                                q, k, v, mask="causal" if causal else None, backend="cuda"
                            )
                            times[mode] = _grad_ms(out, (q, k, v), dout)
                        except Exception as exc:
                            print(f"{mode} D={d}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                tf = {kk: flops / t / 1e9 for kk, t in times.items()}
                rows.append({"d": d, "L": n, "causal": causal, "ms": times, "tflops": tf})
                ratios = " ".join(f"{kk} {tf[kk]:.0f} ({tf[kk] / tf['flash']:.2f}x fl)" for kk in tf)
                print(f"bwd D={d} L={n} causal={int(causal)}: {ratios}", flush=True)
    return rows


def _grad_ms(out, inputs, dout) -> float:
    return _ms(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="*", default=["2,128"])
    ap.add_argument("--lengths", nargs="*", type=int, default=[4096, 16384])
    ap.add_argument("--dims", nargs="*", type=int, default=[64, 128])
    ap.add_argument("--bwd", action="store_true", help="the backward kernels instead of the forward")
    ap.add_argument("--bwd-modes", nargs="*", default=["wgmma:1", "fused", "split"])
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.bwd:
        rows = bwd_main(args)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    rows = []
    with env_set(ATTNHUB_CUDA_FWD="mma"):
        print(f"check mma.sync: {check():.2e}", flush=True)
    for cfg in args.configs:
        with env_set(**_fwd_env(cfg)):
            try:
                print(f"check wgmma {cfg}: bf16 {check():.2e} f16 {check(torch.float16):.2e}", flush=True)
            except Exception as exc:
                print(f"check wgmma {cfg}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    for d in args.dims:
        for n in args.lengths:
            b, h = max(1, 16384 // n), 2048 // d
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                mask = "causal" if causal else None
                times = {
                    "flash": _sdpa_ms(SDPBackend.FLASH_ATTENTION, q, k, v, causal),
                    "cudnn": _sdpa_ms(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
                    "mma": _cuda_ms(q, k, v, mask, ATTNHUB_CUDA_FWD="mma"),
                }
                for cfg in args.configs:
                    try:
                        times[f"wg{cfg}"] = _cuda_ms(q, k, v, mask, **_fwd_env(cfg))
                    except Exception as exc:  # a tile that does not build for this head dim
                        print(f"wg{cfg} D={d}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                tf = {kk: flops / t / 1e9 for kk, t in times.items()}
                row = {"d": d, "L": n, "causal": causal, "ms": times, "tflops": tf}
                rows.append(row)
                ratios = " ".join(
                    f"{kk} {tf[kk]:.0f} ({tf[kk] / tf['flash']:.2f}x fl, {tf[kk] / tf['cudnn']:.2f}x cu)"
                    for kk in tf
                )
                print(f"D={d} L={n} causal={int(causal)}: {ratios}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
