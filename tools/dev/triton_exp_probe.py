"""Experiment for the sliding-window target: is the D = 64 forward limited by the SFU's exp2?

A minimal dense FlashAttention forward (bf16, D = 64, non-causal; not the backend's kernel) in three
forms: MODE 0 every exponential on the SFU (ex2.approx), MODE 1 every second key tile's exponentials
as a degree-3 polynomial on the FMA pipes (2^x = 2^floor(x) * p(frac(x)), the exponent added to the
bits; relative error 1.7e-4, below bfloat16's rounding of P), MODE 2 half of each tile's columns so.
Checked against SDPA, then timed against SDPA cuDNN / flash with triton's do_bench (B = 1, H = 32,
L = 16k, and B = 4, L = 4k).

    python tools/dev/triton_exp_probe.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

# least-squares (relative) fit of 2^f - 1 on [0, 1)
C1, C2, C3 = tl.constexpr(0.69503617), tl.constexpr(0.22830825), tl.constexpr(0.07632546)


@triton.jit
def _exp2_fma(x):
    """2^x for x <= 0 on the FMA / integer pipes; exactly 0 below 2^-127 (masked logits)."""
    x = tl.maximum(x, -127.0)
    j = tl.floor(x)
    f = x - j
    p = 1.0 + f * (C1 + f * (C2 + f * C3))
    bits = p.to(tl.int32, bitcast=True) + (j.to(tl.int32) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _step(
    q, k_ptrs, v_ptrs, start, m_i, l_i, acc, scale, D: tl.constexpr, BN: tl.constexpr, HOW: tl.constexpr
):
    k = tl.load(k_ptrs + start * D)
    v = tl.load(v_ptrs + start * D)
    s = tl.dot(q, k)
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
    x = s * scale - m_new[:, None]
    if HOW == 0:
        p = tl.math.exp2(x)
    elif HOW == 1:
        p = _exp2_fma(x)
    else:
        a, b = tl.split(tl.reshape(x, [x.shape[0], BN // 2, 2]))
        p = tl.reshape(tl.join(tl.math.exp2(a), _exp2_fma(b)), [x.shape[0], BN])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def fwd(Q, K, V, O, scale, N, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr):
    pid_m = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * N * D
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + base + offs_m[:, None] * D + offs_d[None, :])
    k_ptrs = K + base + offs_n[None, :] * D + offs_d[:, None]
    v_ptrs = V + base + offs_n[:, None] * D + offs_d[None, :]
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    if MODE == 1:
        for start in range(0, N, 2 * BN):
            m_i, l_i, acc = _step(q, k_ptrs, v_ptrs, start, m_i, l_i, acc, scale, D, BN, 0)
            m_i, l_i, acc = _step(q, k_ptrs, v_ptrs, start + BN, m_i, l_i, acc, scale, D, BN, 1)
    else:
        for start in range(0, N, BN):
            m_i, l_i, acc = _step(
                q, k_ptrs, v_ptrs, start, m_i, l_i, acc, scale, D, BN, 2 if MODE == 2 else 0
            )
    out = acc / l_i[:, None]
    tl.store(O + base + offs_m[:, None] * D + offs_d[None, :], out.to(O.dtype.element_ty))


def run(q, k, v, mode, bm, bn, warps, stages):
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    scale = d**-0.5 * 1.4426950408889634
    fwd[(n // bm, b * h)](q, k, v, o, scale, n, d, bm, bn, mode, num_warps=warps, num_stages=stages)
    return o


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    d = 64
    for b, n in ((1, 16384), (4, 4096)):
        h = 32
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * n * n * d
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        line = []
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel([be]):
                ms = do_bench(lambda a=(q, k, v): F.scaled_dot_product_attention(*a), warmup=25, rep=100)
            line.append(f"{name} {flops / ms / 1e9:.0f}")
        print(f"B={b} L={n}: " + ", ".join(line), flush=True)
        for mode in (0, 1, 2):
            for bm, bn, warps, stages in ((128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)):
                try:
                    o = run(q, k, v, mode, bm, bn, warps, stages)
                    err = float((o.float() - ref).abs().max() / ref.abs().max())
                    ms = do_bench(
                        lambda a=(q, k, v, mode, bm, bn, warps, stages): run(*a), warmup=25, rep=100
                    )
                    print(f"  mode {mode} {bm}x{bn} w{warps} s{stages}: {flops / ms / 1e9:.0f} TF/s, err {err:.1e}",
                          flush=True)  # fmt: skip
                except Exception as exc:  # noqa: BLE001
                    print(
                        f"  mode {mode} {bm}x{bn} w{warps} s{stages}: {type(exc).__name__}: {str(exc)[:200]}"
                    )
        del q, k, v, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
