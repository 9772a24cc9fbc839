"""attnhub ``backend="auto"`` against torch's own SDPA on torch CPU tensors; prints one line per shape.

    python benchmarks/sdpa_cpu.py [--reps 10] [--threads N]

Dense shapes first, then SPEC §9-§10 requests (a padded batch given as lengths, a learned bias with
its gradient) against SDPA with the equivalent mask.

With the ``sdpa`` plugin installed, auto picks ``sdpa-cpu`` for torch CPU tensors; the ratio is
torch's time over attnhub's (>= 1: attnhub as fast or faster). Medians of interleaved samples,
each a loop of calls long enough (about 2 ms) for the timer not to count.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import attnhub

SHAPES = [
    # (B, H, L, D, causal, grad)
    (4, 8, 1024, 64, True, False),
    (4, 8, 1024, 64, False, False),
    (4, 8, 1024, 64, True, True),
    (1, 8, 128, 64, True, False),
    (1, 8, 16, 32, True, False),
    (1, 1, 16, 32, True, False),
]


def _median_us(fns, reps):
    """Median time per call (us) of each fn, from ``reps`` interleaved samples of ``inner`` calls
    each (``inner`` sized so that a sample takes about 2 ms: a tiny call's timer cost stays out)."""
    for fn in fns:
        for _ in range(20):  # past the first calls (a plan's first-call check, its thread choice)
            fn()
    start = time.perf_counter()
    fns[0]()
    inner = max(1, int(2e-3 / max(time.perf_counter() - start, 1e-7)))
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):  # interleaved, so drift hits both alike
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[i].append((time.perf_counter() - start) / inner)
    return [statistics.median(t) * 1e6 for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for b, h, n, d, causal, grad in SHAPES:
        q, k, v = (torch.randn(b, h, n, d, requires_grad=grad) for _ in range(3))
        mask = "causal" if causal else None
        chosen = attnhub.explain(q, k, v, mask=mask).chosen

        def ours(q=q, k=k, v=v, mask=mask, grad=grad):
            out = attnhub.attention(q, k, v, mask=mask)
            if grad:
                out.sum().backward()

        def theirs(q=q, k=k, v=v, causal=causal, grad=grad):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            if grad:
                out.sum().backward()

        reps = args.reps if n >= 512 else args.reps * 5
        t_ours, t_torch = _median_us([ours, theirs], reps)
        print(
            f"B={b} H={h} L={n} D={d} {'causal' if causal else 'full'}{' fwd+bwd' if grad else ''}: "
            f"auto={chosen} {t_ours:.1f} us, torch SDPA {t_torch:.1f} us, ratio {t_torch / t_ours:.2f}x"
        )
    for name, (ours, theirs, chosen) in _modifier_cases().items():
        t_ours, t_torch = _median_us([ours, theirs], args.reps)
        print(
            f"{name}: auto={chosen} {t_ours:.1f} us, torch SDPA {t_torch:.1f} us, ratio {t_torch / t_ours:.2f}x"
        )


def _modifier_cases() -> dict:
    """SPEC §9-§10 requests as real models send them, each against SDPA with the equivalent mask
    built once outside the timed call (as a model builds it once for all its layers): a padded
    causal batch (lengths, right padding; SDPA: a boolean (B, 1, L, L) mask), a T5-style learned
    (1, H, L, L) bias, forward + backward with its gradient (SDPA: the bias as attn_mask), and packed
    causal sequences (``attention_varlen``; SDPA: the packed tokens with a block-causal (T, T) mask)."""
    b, h, n, d = 4, 8, 512, 64
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(n // 4, n + 1, (b,), generator=g)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    idx = torch.arange(n)
    valid = idx[None, :] < lengths[:, None]
    keep = (valid[:, None, :, None] & valid[:, None, None, :]) & (idx[:, None] >= idx[None, :])
    pad_kw = dict(mask="causal", q_lengths=lengths, k_lengths=lengths)

    def pad_ours():
        attnhub.attention(q, k, v, **pad_kw)

    def pad_theirs():
        F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    bias = torch.randn(1, h, n, n, generator=g).requires_grad_(True)

    def bias_ours():
        attnhub.attention(qg, kg, vg, bias=bias).sum().backward()

    def bias_theirs():
        F.scaled_dot_product_attention(qg, kg, vg, attn_mask=bias).sum().backward()

    lens = torch.randint(64, 513, (8,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)])
    total = int(cu[-1])
    qp, kp, vp = (torch.randn(total, h, d, generator=g) for _ in range(3))
    seq = torch.repeat_interleave(torch.arange(len(lens)), lens)
    pos = torch.arange(total) - cu[:-1].long()[seq]
    block = (seq[:, None] == seq[None, :]) & (pos[:, None] >= pos[None, :])  # (T, T) block-causal

    def packed_ours():
        attnhub.attention_varlen(qp, kp, vp, cu, cu, mask="causal")

    def packed_theirs():
        F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (qp, kp, vp)), attn_mask=block)

    return {
        f"8 packed sequences of 64-512 tokens (T={total}) H={h} D={d} causal": (
            packed_ours,
            packed_theirs,
            "(attention_varlen)",
        ),
        f"B={b} H={h} L={n} D={d} padded causal (lengths)": (
            pad_ours,
            pad_theirs,
            attnhub.explain(q, k, v, **pad_kw).chosen,
        ),
        f"B={b} H={h} L={n} D={d} bias with grad fwd+bwd": (
            bias_ours,
            bias_theirs,
            attnhub.explain(qg, kg, vg, bias=bias).chosen,
        ),
    }


if __name__ == "__main__":
    main()
