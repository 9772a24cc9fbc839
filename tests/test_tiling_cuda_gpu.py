"""The cuda kernels' own tile walk (device-side, common.cuh) on cases where skipping matters.

The kernels classify tiles on the device and expose no record of the tiles they visit, so this
checks the walk through its results: on requests where the core classifier (attnhub.tiling) skips
many 64 x 64 tile pairs next to attended ones (strided and 2-d windows, scaled syncs, fully masked
rows), a wrongly skipped tile changes the output and a wrongly unmasked one lets masked keys in.

Run on the device machine: ``python -m pytest -q -m gpu tests/test_tiling_cuda_gpu.py``.
"""

from __future__ import annotations

import math

import pytest

from attnhub.rules import Causal, Local
from attnhub.tiling import EMPTY, FULL, classify

CASES = [
    ((1000,), (1000,), Local(40, log2_stride=2), "none_front"),
    ((300,), (1200,), Local(16, log2_stride=1, causal=True), "scale_end"),
    ((1200,), (300,), Local(24, causal=True), "none_end"),
    ((500,), (1300,), Causal(), "none_end"),
    ((24, 40), (24, 40), Local((3, 5), log2_stride=1), "none_front"),
    ((12, 20), (24, 40), Local((2, 3), causal=True), "scale_front"),
]
IDS = [f"{r.describe()}-{sync}-{sq}x{sk}" for sq, sk, r, sync in CASES]


@pytest.mark.parametrize("seq_q,seq_k,rule,sync", CASES, ids=IDS)
def test_cases_skip_tiles_beside_attended_ones(seq_q, seq_k, rule, sync):
    """CPU: every case has skipped tile pairs in rows that also attend (else it would test nothing)."""
    cls = classify(rule, seq_q, seq_k, sync, 64, 64)
    mixed = (cls == EMPTY).any(axis=1) & (cls != EMPTY).any(axis=1)
    assert mixed.sum() >= min(2, math.ceil(math.prod(seq_q) / 64) - 1)
    assert not (cls == FULL).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
@pytest.mark.parametrize("seq_q,seq_k,rule,sync", CASES, ids=IDS)
def test_device_walk_matches_the_reference(rng, dtype, seq_q, seq_k, rule, sync):
    from tests.test_cuda_gpu import _check

    _check(rng, dtype, seq_q, seq_k, rule, sync, hq=2, hkv=1, b=1, grad=dtype != "float64")
