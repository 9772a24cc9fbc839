"""Backward of the padded causal batch (benchmarks/modifiers.py's mask case: B 8, H 16, L 4k, D 128,
lengths uniform in [1k, 4k]) through the triton ragged kernels: each (BM, BN, warps, stages) of the
dK/dV and dQ kernels pinned in ``ragged_launch.TUNE`` (one kernel's sweep with the other at its
default), the zeroed gradient buffers' cost, and FlexAttention's backward in the same process.

    python tools/dev/padded_bwd_sweep.py
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

import attnhub
from attnhub_backends.triton import ragged_launch

B, H, N, D = 8, 16, 4096, 128
DKDV = [(64, 64, 4, 2), (64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3),
        (128, 64, 8, 2)]  # fmt: skip
DQ = [(64, 64, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 128, 8, 2),
      (128, 128, 8, 2)]  # fmt: skip


def _ms(fn) -> float:  # noqa: ANN001
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(N // 4, N + 1, (B,), generator=gen).cuda()
    q, k, v = (
        torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    dout = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    lens32 = lens.to(torch.int32)
    work = float((lens.double() ** 2 / 2).sum()) * H * D * 4 * 2.5

    def run():  # noqa: ANN202
        return attnhub.attention(q, k, v, mask="causal", q_lengths=lens32, k_lengths=lens32, backend="triton")

    def step() -> None:
        for x in (q, k, v):
            x.grad = None
        run().backward(dout)

    def bwd_ms() -> float:
        return _ms(step) - _ms(run)

    print(f"{torch.cuda.get_device_name()}; lengths {lens.tolist()}; bwd work {work / 1e12:.3f} TFLOP")
    zeros = _ms(lambda: [torch.zeros(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)])
    print(f"three zeroed gradient buffers: {zeros * 1e3:.1f} us")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(bb, hh, qi, ki):  # noqa: ANN001, ANN202
        return (qi >= ki) & (qi < lens[bb]) & (ki < lens[bb])

    bm = create_block_mask(mask_mod, B, None, N, N, device="cuda")
    fa = torch.compile(flex_attention, dynamic=False)

    def flex():  # noqa: ANN202
        return fa(q, k, v, block_mask=bm)

    def flex_step() -> None:
        for x in (q, k, v):
            x.grad = None
        flex().backward(dout)

    for _ in range(3):
        flex_step()
    t_flex = _ms(flex_step) - _ms(flex)
    print(
        f"flex backward {t_flex:.3f} ms ({work / t_flex / 1e9:.0f} TFLOP/s); target 1.2x: {t_flex / 1.2:.3f} ms"
    )
    print(f"default triton backward {bwd_ms():.3f} ms")
    for name, cfgs in (("dkdv", DKDV), ("dq", DQ)):
        for cfg in cfgs:
            ragged_launch.TUNE.update(dkdv=DKDV[0], dq=DQ[0])
            ragged_launch.TUNE[name] = cfg
            try:
                t = bwd_ms()
                print(f"  {name} {cfg}: backward {t:.3f} ms, flex/this {t_flex / t:.3f}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a config that does not fit is reported
                print(f"  {name} {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    ragged_launch.TUNE.update(dkdv=None, dq=None)


if __name__ == "__main__":
    main()
