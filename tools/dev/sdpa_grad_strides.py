"""What SDPA's CUDA kernels give for (1) a gradient dO whose strides differ from out's (a bshd
caller's out is a transposed view, so dO arrives transposed), with GQA, against float64; and
(2) a +Inf in v at one key: +Inf on the rows that attend it (SPEC §4), or NaN.

    python tools/dev/sdpa_grad_strides.py

Prints one line per (kernel, dtype, dO form): dq/dk/dv relative errors; then per kernel the
values an Inf in v gives, over a few random draws.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

KERNELS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
           "flash": SDPBackend.FLASH_ATTENTION}  # fmt: skip


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


def grads(kernel, dtype, transposed_do: bool, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, hq, hkv, lq, lk, d = 2, 4, 2, 23, 31, 32
    q, k, v = (
        torch.randn(b, h, n, d, device="cuda", generator=g) for h, n in ((hq, lq), (hkv, lk), (hkv, lk))
    )
    do = torch.randn(b, lq, hq, d, device="cuda", generator=g)  # the caller's (bshd) gradient
    do_bhsd = do.transpose(1, 2) if transposed_do else do.transpose(1, 2).contiguous()
    x = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    gqa = kernel == SDPBackend.CUDNN_ATTENTION  # efficient takes no enable_gqa: kv heads repeated
    kv = x[1:] if gqa else [t.repeat_interleave(hq // hkv, dim=1) for t in x[1:]]
    with sdpa_kernel(kernel):
        out = F.scaled_dot_product_attention(x[0], *kv, is_causal=True, enable_gqa=gqa)
    got = torch.autograd.grad(out, x, do_bhsd.to(dtype))
    r = [t.detach().double().requires_grad_(True) for t in x]
    ref_out = F.scaled_dot_product_attention(*r, is_causal=True, enable_gqa=True)
    ref = torch.autograd.grad(ref_out, r, do_bhsd.double())
    return [rel(a, c) for a, c in zip(got, ref)]


def inf_in_v(kernel, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, hq, hkv, n, d = 3, 4, 2, 24, 16
    q = torch.randn(b, hq, n, d, device="cuda", generator=g)
    k = torch.randn(b, hkv, n, d, device="cuda", generator=g)
    v = torch.randn(b, hkv, n, d, device="cuda", generator=g)
    v[2, 1, 12, 1] = float("inf")
    k, v = (t.repeat_interleave(hq // hkv, dim=1) for t in (k, v))
    if kernel != SDPBackend.EFFICIENT_ATTENTION:  # flash and cuDNN take 16-bit inputs only
        q, k, v = (t.half() for t in (q, k, v))
    with sdpa_kernel(kernel):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    rows = out[2, 2:4, 12:, 1]  # rows attending key 12: +Inf by SPEC §4
    return int(torch.isnan(rows).sum()), int(torch.isinf(rows).sum()), rows.numel()


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, "cuDNN", torch.backends.cudnn.version())
    for name, kernel in KERNELS.items():
        for dtype in (torch.float16, torch.bfloat16):
            for tr in (False, True):
                try:
                    e = grads(kernel, dtype, tr)
                    print(f"{name:9} {str(dtype):15} dO {'transposed' if tr else 'contiguous':10} "
                          f"dq {e[0]:.2e} dk {e[1]:.2e} dv {e[2]:.2e}")  # fmt: skip
                except RuntimeError as exc:
                    print(f"{name:9} {dtype} {tr}: {str(exc)[:100]}")
    for name in ("efficient", "flash", "cudnn"):
        for seed in range(4):
            try:
                nan, inf, total = inf_in_v(KERNELS[name], seed)
                print(f"+Inf in v, {name}, seed {seed}: of {total} rows attending it {inf} +Inf, {nan} NaN")
            except RuntimeError as exc:
                print(f"+Inf in v, {name}: {str(exc)[:100]}")


if __name__ == "__main__":
    main()
