"""Is triton's dense forward bitwise repeatable, with K/V load path TMA (descriptors) or pointers?

Issue 40: the 4-GPU ring was not bitwise repeatable only where Hq = Hkv (the forward's TMA path;
GQA calls take pointer loads), and only in O (lse, dV equal). This repeats forwards of ring-shaped
blocks (K/V as views of one packed buffer, offsets) and of plain causal calls ``--repeat`` times,
optionally while another stream copies large buffers (``--hog``: memory traffic as NCCL makes),
and counts the runs whose out or lse differ from the first.
Usage: ``python tools/dev/triton_fwd_repeatability.py [--repeat 100] [--hog]``; set
``ATTNHUB_TRITON_TMA=0`` to force pointer loads.
"""

from __future__ import annotations

import argparse

import torch

import attnhub


def packed_views(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V as views of one flat uint8 buffer (as the ring's messages hold them)."""
    buf = torch.cat([x.contiguous().reshape(-1).view(torch.uint8) for x in (k, v)])
    n = k.numel() * k.element_size()
    return buf[:n].view(k.dtype).view(k.shape), buf[n:].view(v.dtype).view(v.shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--hog", action="store_true")
    ap.add_argument("--backend", default="triton")
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(5)
    hog_src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    hog_dst = torch.empty_like(hog_src)
    side = torch.cuda.Stream()
    cases = [
        # (name, Lq, Lk, heads, causal, q_offset, k_offset, packed views)
        ("ring block 1024x1024 diag", 1024, 1024, 8, True, 0, 0, True),
        ("ring block 1024x2048 offset", 1024, 2048, 8, True, 3072, 0, True),
        ("ring block 1024x1024 full", 1024, 1024, 8, False, 0, 0, True),
        ("causal 2048", 2048, 2048, 8, True, 0, 0, False),
        ("causal 8192", 8192, 8192, 8, True, 0, 0, False),
        ("causal 4096 H16", 4096, 4096, 16, True, 0, 0, False),
    ]
    for name, lq, lk, h, causal, qo, ko, packed in cases:
        q = torch.randn(1, h, lq, 128, generator=g, device="cuda").to(torch.bfloat16)
        k, v = (torch.randn(1, h, lk, 128, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
        if packed:
            k, v = packed_views(k, v)
        kw = dict(
            mask="causal" if causal else None, backend=a.backend, return_lse=True, q_offset=qo, k_offset=ko
        )
        first_o, first_l = attnhub.attention(q, k, v, **kw)
        bad_o = bad_l = 0
        worst = 0.0
        for _ in range(a.repeat):
            if a.hog:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    hog_dst.copy_(hog_src)
            o, lse = attnhub.attention(q, k, v, **kw)
            if not torch.equal(o, first_o):
                bad_o += 1
                worst = max(worst, float((o.float() - first_o.float()).abs().max()))
            bad_l += int(not torch.equal(lse, first_l))
        torch.cuda.synchronize()
        print(f"{name:30s} hog {a.hog}: runs with out differing {bad_o}/{a.repeat} (max |diff| {worst:.3g}), "
              f"lse differing {bad_l}/{a.repeat}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
