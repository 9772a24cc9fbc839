"""Benchmark cases: the default grid (B·L = 16384, H·D = 2048), a quick grid, and FLOP counts as FlashAttention counts."""

from __future__ import annotations

import numpy as np

from attnhub.bench.case import Case
from attnhub.positions import axis_positions
from attnhub.rules import Causal, Full, Local, Rule


def attended_pairs(rule: Rule, len_q: int, len_k: int, sync: str) -> int:
    """Exact number of attended (query, key) pairs of a 1-d rule, row by row from intervals."""
    pq, pk = axis_positions(len_q, len_k, sync)
    if isinstance(rule, Full):
        return len_q * len_k
    if isinstance(rule, Causal):
        return int(np.searchsorted(pk, pq, side="right").sum())
    assert isinstance(rule, Local)
    (w,) = rule.windows(1)
    s = rule.stride
    reach = (w - 1) * s
    lo = pq - reach
    hi = pq if rule.causal else pq + reach
    total = 0
    for start in range(0, len_q, 4096):  # strided windows: count keys on the stride lattice
        sl = slice(start, start + 4096)
        d = pq[sl, None] - pk[None, :]
        keep = (pk[None, :] >= lo[sl, None]) & (pk[None, :] <= hi[sl, None]) & (np.abs(d) % s == 0)
        total += int(keep.sum())
    return total


def flops(case: Case) -> float:
    """FlashAttention's count: forward 4·B·H·Lq·Lk·D, halved for causal; backward 2.5x forward
    (direction "fwdbwd", forward and backward together: 3.5x).

    Local rules count the attended pairs instead of Lq·Lk; the real-model families
    (:mod:`attnhub.bench.workloads`) count valid pairs only.
    """
    from attnhub.bench import workloads

    if case.family in workloads.FAMILIES:
        return workloads.work(case)[0]
    pairs: float
    if isinstance(case.rule, Local):
        pairs = attended_pairs(case.rule, case.len_q, case.len_k, case.sync)
    else:
        pairs = case.len_q * case.len_k * (0.5 if case.causal else 1.0)
    f = 4.0 * case.batch * case.heads_q * pairs * case.dim
    return f * {"bwd": 2.5, "fwdbwd": 3.5}.get(case.direction, 1.0)


def default_grid(quick: bool = False, dtype: str = "bfloat16") -> list[Case]:
    """The default grid: B·L = 16384, H·D = 2048, D in {64, 128}, L in 1k..16k, causal and not, fwd
    and bwd; Local(w, causal=True, sync="none_end") w in {256, 1024} at L = 16k; decode
    (Lq = 1, Lk in {8k, 32k}, Hq = 32, Hkv = 8, B = 8). ``quick``: D = 128, L in {1k, 4k}, w = 256,
    Lk = 8k."""
    dims = (128,) if quick else (64, 128)
    lengths = (1024, 4096) if quick else (1024, 2048, 4096, 8192, 16384)
    cases: list[Case] = []
    for direction in ("fwd", "bwd"):
        for d in dims:
            h = 2048 // d
            for causal in (False, True):
                rule: Rule = Causal() if causal else Full()
                for n in lengths:
                    cases.append(
                        Case("dense", 16384 // n, h, h, n, n, d, rule, "none_front", dtype, direction)
                    )
            n = 4096 if quick else 16384
            for w in (256,) if quick else (256, 1024):
                cases.append(
                    Case(
                        "local",
                        16384 // n,
                        h,
                        h,
                        n,
                        n,
                        d,
                        Local(w, causal=True),
                        "none_end",
                        dtype,
                        direction,
                    )
                )
    for lk in (8192,) if quick else (8192, 32768):
        cases.append(Case("decode", 8, 32, 8, 1, lk, 128, Full(), "none_end", dtype, "fwd"))
    return cases


#: The host-bound shapes of issue 21 (B, H, Lq, Lk), D = 64: a call costs microseconds of GPU time,
#: so what it costs the host decides which backend is fastest.
HOST_SHAPES = ((1, 8, 1, 512), (1, 8, 128, 128), (8, 12, 512, 512))


def host_grid(dtype: str = "bfloat16") -> list[Case]:
    """Small causal forward cases (family "host"), filed by the tuner as sized classes
    (:func:`attnhub.profile.request_class` with ``sized=True``) so that they apply only to requests
    of about their size."""
    return [
        Case("host", b, h, h, lq, lk, 64, Causal(), "none_front", dtype, "fwd")
        for b, h, lq, lk in HOST_SHAPES
    ]
