"""float32 forward of the cuda backend: accuracy against float64 and speed against torch's math SDPA.

    python tools/dev/cuda_f32.py [--configs f16x3:4,64,1 tf32:4,64,2/8 ...]

Accuracy: ||out - ref|| / ||ref|| and max |out - ref| / max |ref| against SDPA (math) in float64 on
the same float32 inputs, for the default (3xFP16) and 3xTF32 tensor-core kernels, the SIMT kernel (ATTNHUB_CUDA_F32=simt),
torch's math SDPA in float32 and, for contrast, math SDPA with TF32 matmuls (plain TF32). Fresh
random inputs, q scaled by 1 and by 8 (large logits). Speed: median of triton's do_bench, B = 1,
H = 8 and the ``attnhub bench`` grid's B = 4, H = 2048 / D, L = 4096.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from envvars import env_set
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnhub
from attnhub_backends.cuda import compiler


def _ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=60, return_mode="median"))


def _math(q, k, v, causal):
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _cuda(q, k, v, causal, f32=None, cfg=None):
    """f32: the kernel (ATTNHUB_CUDA_F32: f16x3, tf32, simt; None: the default); cfg: "[kernel:]warps,bn,rb"
    with "/pvc" for tf32 (ATTNHUB_CUDA_F16X3, or ATTNHUB_CUDA_TF32 and ATTNHUB_CUDA_TF32_PVC) or None."""
    kern, _, spec = (cfg or "").rpartition(":")
    f32 = kern or f32
    tile, _, pvc = spec.partition("/")
    env = {"ATTNHUB_CUDA_F32": f32, "ATTNHUB_CUDA_TF32_PVC": pvc or None}
    env["ATTNHUB_CUDA_TF32" if f32 == "tf32" else "ATTNHUB_CUDA_F16X3"] = tile or None
    with env_set(**env):
        return attnhub.attention(q, k, v, mask="causal" if causal else None, backend="cuda")


def _err(got, ref):
    e = (got.double() - ref).float()
    return float(e.norm() / ref.float().norm()), float(e.abs().max() / ref.abs().max())


def accuracy(configs: list[str]) -> None:
    names = ("default", "3xTF32", *configs, "SIMT", "math f32", "math TF32")
    print(f"{'D':>4} {'causal':6} {'qscale':6} " + "".join(f"{n:>20}" for n in names))
    for d in (64, 128):
        for causal in (False, True):
            for qs in (1.0, 8.0):
                g = torch.Generator(device="cuda").manual_seed(1000 * d + 10 * causal + int(qs))
                q, k, v = (torch.randn(1, 8, 4096, d, device="cuda", generator=g) for _ in range(3))
                q = q * qs
                ref = _math(q.double(), k.double(), v.double(), causal)
                cells = [_err(_cuda(q, k, v, causal), ref), _err(_cuda(q, k, v, causal, "tf32"), ref)]
                cells += [_err(_cuda(q, k, v, causal, None, c), ref) for c in configs]
                cells.append(_err(_cuda(q, k, v, causal, "simt"), ref))
                cells.append(_err(_math(q, k, v, causal), ref))
                torch.backends.cuda.matmul.allow_tf32 = True
                cells.append(_err(_math(q, k, v, causal), ref))
                torch.backends.cuda.matmul.allow_tf32 = False
                print(
                    f"{d:>4} {causal!s:6} {qs:6.0f} "
                    + "".join(f"{f'{a:.1e}/{b:.1e}':>20}" for a, b in cells),
                    flush=True,
                )


def speed(configs: list[str]) -> None:
    names = ["math", "simt", "3xTF32", "default", *configs]
    print(f"\n{'B':>2} {'H':>3} {'D':>4} {'causal':6} " + "".join(f"{n:>10}" for n in names) + "  (TFLOP/s)")
    for d in (64, 128):
        for b, h in ((1, 8), (4, 2048 // d)):
            q, k, v = (torch.randn(b, h, 4096, d, device="cuda") for _ in range(3))
            for causal in (False, True):
                flops = 4 * b * h * 4096 * 4096 * d * (0.5 if causal else 1.0)
                args = (q, k, v, causal)
                fns = [
                    lambda a=args: _math(*a),
                    lambda a=args: _cuda(*a, "simt"),
                    lambda a=args: _cuda(*a, "tf32"),
                ]
                fns += [lambda a=args: _cuda(*a)]
                fns += [lambda a=args, c=c: _cuda(*a, None, c) for c in configs]
                cells = []
                for fn in fns:
                    try:
                        with torch.no_grad():
                            cells.append(f"{flops / _ms(fn) / 1e9:10.1f}")
                    except Exception as exc:  # noqa: BLE001
                        cells.append(f"{type(exc).__name__[:9]:>10}")
                print(f"{b:>2} {h:>3} {d:>4} {causal!s:6} " + "".join(cells), flush=True)
            del q, k, v, args, fns
            torch.cuda.empty_cache()
    for key, kern in compiler._kernels.items():
        if key[0].startswith(("fwd_tf32", "fwd_f16x3")) and not key[0].endswith(":obj"):
            a = kern.attributes
            print(key[0], "regs", a.num_regs, "local bytes", a.local_size_bytes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--configs",
        nargs="*",
        default=["f16x3:4,64,1", "f16x3:4,32,1", "f16x3:8,64,1", "f16x3:4,32,2", "f16x3:8,32,1"],
    )
    args = ap.parse_args()
    print(
        torch.cuda.get_device_name(), torch.__version__, "allow_tf32", torch.backends.cuda.matmul.allow_tf32
    )
    accuracy(args.configs)
    speed(args.configs)


if __name__ == "__main__":
    main()
