"""Sweep variants of the cuda backend's bf16 tensor-core kernels on one GPU, checked and timed.

    python tools/dev/cuda_sweep.py [--old REV | --old-dir DIR] [--quick] [--no-fwd] [--no-bwd] [--tiles D:W,BN,RB ...] [--json FILE]

Forward: each (kernel source, tile, extra defines) variant is first checked against the float64
reference backend (odd lengths, Full / Causal / Local(causal) rules, q x 8 for large logits), then
timed against torch SDPA flash and cuDNN in the same process on the ``attnhub bench`` grid's L = 4096
shapes (B = 4, H = 2048 / D). ``--old REV`` adds the forward (fwd_mma.cu with its mma.cuh) of git
revision REV for a same-run before/after; ``--old-dir DIR`` takes those two files from DIR (a tree
without git history). Backward: the fused and split kernels (``ATTNHUB_CUDA_BWD``) and the (KB_Q, QB_N[, KRB]) settings of bwd_mma.cu
(``ATTNHUB_CUDA_BWD_STEPS``), timed as ``torch.autograd.grad`` against SDPA flash. Median of
``triton.testing.do_bench``; FLOPs as FlashAttention counts them (forward 4·B·H·L²·D, halved for
causal; backward 2.5x).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnhub
from attnhub_backends.cuda import variants as cuda_variants

FWD_TILES = {64: [(4, 128, 2)], 128: [(4, 64, 2)]}
# "mode steps [wN]": ATTNHUB_CUDA_BWD (fused: one kernel, dQ by atomics; split: dK/dV and dQ kernels),
# ATTNHUB_CUDA_BWD_STEPS and ATTNHUB_CUDA_BWD_WARPS (default 4).
BWD_STEPS = {
    64: ["split 64,64", "fused 64,64", "split 64,64 w8", "fused 64,64 w8"],
    128: ["split 64,64", "fused 64,64", "split 64,64 w8", "fused 64,64 w8"],
}


def _ms(fn, *args, **kwargs) -> float:
    """Median ms of ``fn(*args, **kwargs)``."""
    from triton.testing import do_bench

    return float(do_bench(lambda: fn(*args, **kwargs), warmup=25, rep=100, return_mode="median"))


def _grad(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout, retain_graph=True)


def _patch(old_dir: str | None, extra: tuple[tuple[str, int], ...]) -> None:
    """Make the backend build its forward plus ``extra`` defines; from ``old_dir``'s fwd_mma.cu and
    mma.cuh when given (absolute paths: the package's kernel directory is never written)."""
    base = _ORIG_MMA_VARIANT

    def variant(*a, **kw):
        v = base(*a, **kw)
        keep = tuple(x for x in v.defines if x[0] not in dict(extra))
        if old_dir is None:
            return dataclasses.replace(v, defines=keep + extra)
        source = os.path.join(old_dir, "fwd_mma.cu")
        headers = ("common.cuh", os.path.join(old_dir, "mma.cuh"))
        return dataclasses.replace(v, source=source, defines=keep + extra, headers=headers)

    cuda_variants.mma_variant = variant


_ORIG_MMA_VARIANT = cuda_variants.mma_variant


def _check(d: int) -> float:
    """Largest |cuda - reference| over a few odd-length requests (bf16 inputs, float64 oracle)."""
    worst = 0.0
    g = torch.Generator(device="cpu").manual_seed(d)
    cases = [(None, 1.0), ("causal", 1.0), (attnhub.Local(window=40, causal=True), 1.0), ("causal", 8.0)]
    for mask, qmul in cases:
        q, k, v = (torch.randn(2, 3, 333, d, generator=g) for _ in range(3))
        q = q * qmul
        q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
        ref = attnhub.attention(*(x.double().numpy() for x in (q, k, v)), mask=mask, backend="reference")
        got = attnhub.attention(*(x.cuda() for x in (q, k, v)), mask=mask, backend="cuda")
        torch.cuda.synchronize()
        got = got.double().cpu().numpy()
        if not np.isfinite(got).all():
            return float("inf")
        worst = max(worst, float(np.abs(got - ref).max()))
    return worst


def _sdpa(kind, q, k, v, causal):
    with sdpa_kernel([kind]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sweep_forward(variants, quick: bool) -> list[dict]:
    rows = []
    for d in (64, 128):
        b, h, n = 4, 2048 // d, 4096
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
            mask = "causal" if causal else None
            peers = {
                "flash": _ms(_sdpa, SDPBackend.FLASH_ATTENTION, q, k, v, causal),
                "cudnn": _ms(_sdpa, SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
            }
            for name, old_dir, extra, tiles in variants:
                for tile in tiles.get(d, []) if isinstance(tiles, dict) else tiles:
                    _patch(old_dir, extra)
                    if tile:
                        os.environ["ATTNHUB_CUDA_MMA"] = ",".join(map(str, tile))
                    else:
                        os.environ.pop("ATTNHUB_CUDA_MMA", None)
                    label = f"{name} {tile or 'default'}"
                    try:
                        err = _check(d) if not causal else None
                        with torch.no_grad():
                            ms = _ms(attnhub.attention, q, k, v, mask=mask, backend="cuda")
                    except Exception as exc:  # a variant that does not compile or launch: shown, not fatal
                        print(
                            f"D={d} causal={causal} {label}: {type(exc).__name__}: {str(exc)[:200]}",
                            flush=True,
                        )
                        continue
                    row = {
                        "pass": "fwd", "D": d, "causal": causal, "variant": label, "ms": ms,
                        "tflops": flops / ms / 1e9, "max_abs_err": err,
                        **{f"{p}_ms": t for p, t in peers.items()},
                        **{f"vs_{p}": t / ms for p, t in peers.items()},
                    }  # fmt: skip
                    rows.append(row)
                    e = "" if err is None else f" err {err:.4f}"
                    print(
                        f"fwd D={d:3d} causal={causal!s:5} {label:34s} {ms:7.3f} ms {row['tflops']:6.1f} TF/s "
                        f"flash {row['vs_flash']:.2f}x cudnn {row['vs_cudnn']:.2f}x{e}",
                        flush=True,
                    )
                    if quick:
                        break
    os.environ.pop("ATTNHUB_CUDA_MMA", None)
    cuda_variants.mma_variant = _ORIG_MMA_VARIANT
    return rows


def sweep_backward(steps, quick: bool) -> list[dict]:
    rows = []
    for d in (64, 128):
        b, h, n = 4, 2048 // d, 4096
        q, k, v = (
            torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        do = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        for causal in (False, True):
            flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
            mask = "causal" if causal else None
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                fo = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                flash = _ms(_grad, fo, (q, k, v), do)
            ref = torch.autograd.grad(fo, (q, k, v), do, retain_graph=True)
            for st in steps[d] if isinstance(steps, dict) else steps:
                mode, st_env, *warps = st.split()
                os.environ["ATTNHUB_CUDA_BWD"] = mode
                os.environ["ATTNHUB_CUDA_BWD_STEPS"] = st_env
                os.environ["ATTNHUB_CUDA_BWD_WARPS"] = warps[0][1:] if warps else "4"
                try:
                    out = attnhub.attention(q, k, v, mask=mask, backend="cuda")
                    got = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
                    diff = max(float((a.float() - r.float()).abs().max()) for a, r in zip(got, ref))
                    ms = _ms(_grad, out, (q, k, v), do)
                except Exception as exc:
                    print(
                        f"bwd D={d} causal={causal} {st}: {type(exc).__name__}: {str(exc)[:200]}",
                        flush=True,
                    )
                    continue
                rows.append({"pass": "bwd", "D": d, "causal": causal, "variant": st, "ms": ms,
                             "tflops": flops / ms / 1e9, "flash_ms": flash, "vs_flash": flash / ms,
                             "max_abs_diff_vs_flash": diff})  # fmt: skip
                print(
                    f"bwd D={d:3d} causal={causal!s:5} {st:14s} {ms:7.3f} ms {flops / ms / 1e9:6.1f} TF/s "
                    f"flash {flash / ms:.2f}x (max |d grad| vs flash {diff:.3f})",
                    flush=True,
                )
                if quick:
                    break
    os.environ.pop("ATTNHUB_CUDA_BWD_STEPS", None)
    os.environ.pop("ATTNHUB_CUDA_BWD", None)
    os.environ.pop("ATTNHUB_CUDA_BWD_WARPS", None)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", help="git revision whose fwd_mma.cu (with its mma.cuh) is swept too (same run)")
    ap.add_argument("--old-dir", help="a directory holding an older fwd_mma.cu and mma.cuh, instead of --old")
    ap.add_argument("--quick", action="store_true", help="one tile per variant")
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--no-fwd", action="store_true")
    ap.add_argument(
        "--tiles", nargs="*", default=[], metavar="D:W,BN,RB",
        help="forward tiles to sweep besides the defaults, e.g. 64:8,64,1 128:8,64,1",
    )  # fmt: skip
    ap.add_argument("--json")
    args = ap.parse_args()
    variants = []
    old_dir = args.old_dir
    if args.old and not old_dir:
        old_dir = tempfile.mkdtemp(prefix="attnhub-sweep-")
        for name in ("fwd_mma.cu", "mma.cuh"):
            git = ["git", "show", f"{args.old}:attnhub_backends/cuda/kernels/{name}"]
            text = subprocess.run(git, capture_output=True, text=True, check=True).stdout
            with open(os.path.join(old_dir, name), "w") as f:
                f.write(text)
    if old_dir:
        variants.append((f"old {args.old or old_dir}", old_dir, (), [None]))
    tiles = {d: list(t) for d, t in FWD_TILES.items()}
    for spec in args.tiles:
        d, _, cfg = spec.partition(":")
        tiles[int(d)].append(tuple(int(x) for x in cfg.split(",")))
    variants += [("new", None, (), tiles)]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = [] if args.no_fwd else sweep_forward(variants, args.quick)
    if not args.no_bwd:
        rows += sweep_backward(BWD_STEPS, args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
