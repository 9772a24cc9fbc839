"""Planned sums of context parallelism (attnhub/distributed/accumulate.py) and the per-rank steps
on uninitialised (NaN-filled) buffers: every element of every result is written, and the sums
equal the plain float32 sum in the same order, rounded once."""

from __future__ import annotations

import random

import pytest
import torch

from attnhub import Local
from attnhub.distributed import accumulate, simulate
from tests.distributed_cases import TOL, errors, make_inputs, reference


def poisoned(shape, dtype, device):
    """What ``accumulate.new`` may return: NaN in every float, 0xFF in every byte."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, 255, dtype=dtype, device=device)


@pytest.fixture
def poison(monkeypatch):
    monkeypatch.setattr(accumulate, "new", poisoned)


def _random_spans(rng: random.Random, rows: int) -> tuple[tuple[int, int], ...]:
    spans = []
    for _ in range(rng.randint(1, 7)):
        lo = rng.randint(0, rows - 1)
        spans.append((lo, rng.randint(lo + 1, rows)))
    return tuple(spans)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_planned_sum_is_the_ordered_float32_sum(out_dtype) -> None:
    """Random spans (overlapping, with gaps), random out_from, deferred pairs or not: bitwise the
    float32 sum taken in contribution order, rounded once; rows nobody covers are 0; no NaN of
    the poison left."""
    rng = random.Random(3)
    g = torch.Generator().manual_seed(3)
    for _ in range(60):
        rows = rng.randint(1, 24)
        spans = _random_spans(rng, rows)
        out_from = rng.randint(0, len(spans))
        plan = accumulate.plan(spans, rows, out_from, pairs=rng.random() < 0.5)
        parts = [torch.randn(1, 2, hi - lo, 3, generator=g).to(out_dtype) for lo, hi in spans]
        acc = poisoned((1, 2, rows, 3), torch.float32, "cpu")
        out = None if out_dtype == torch.float32 else poisoned((1, 2, rows, 3), out_dtype, "cpu")
        a = accumulate.Acc(plan, acc, out)
        for i, ((lo, _), x) in enumerate(zip(spans, parts)):
            a.add(i, x, lo)
        got = a.finish()
        want = torch.zeros(1, 2, rows, 3, dtype=torch.float32)
        seen = torch.zeros(rows, dtype=torch.bool)
        for (lo, hi), x in zip(spans, parts):
            # the first write of a row is a copy: 0 + x is x exactly, so a zero start is the same
            want[:, :, lo:hi] += x.float()
            seen[lo:hi] = True
        assert got.dtype == out_dtype
        assert not torch.isnan(got).any(), (spans, out_from)
        assert torch.equal(got, want.to(out_dtype)), (spans, out_from)
        assert torch.equal(got[:, :, ~seen], torch.zeros_like(got[:, :, ~seen]))


def test_plan_pieces() -> None:
    """Two calls over rows 0:8 and 4:12 of 16: copies, one sum, one rounding, zeros at 12:16."""
    p = accumulate.plan(((0, 8), (4, 12)), 16, pairs=False)
    P = accumulate.Piece
    assert p.pieces == (
        (P(0, 4, True, True), P(4, 8, True, False)),
        (P(4, 8, False, True), P(8, 12, True, True)),
    )
    assert p.zero == ((12, 16),) and p.cast == ()
    paired = accumulate.plan(((0, 8), (4, 12)), 16)  # rows 4:8: the second writes both, once
    assert paired.pieces == (
        (P(0, 4, True, True), P(4, 8, True, False, defer=True)),
        (P(4, 8, False, True, pair=0), P(8, 12, True, True)),
    )
    travelling = accumulate.plan(((0, 8), (4, 12)), 16, out_from=1, pairs=False)
    assert travelling.pieces[0] == (P(0, 8, True, False),)
    assert travelling.cast == ((0, 4),)


CASES = [
    # mask, sync, Lq, Lk, world, dtype: fully masked query rows (none_end, Lq > Lk), keys no
    # query reaches (a window with none_end), zigzag causal, full
    ("causal", "none_end", 48, 16, 2, torch.bfloat16),
    (Local(3, causal=True), "none_end", 16, 48, 4, torch.float32),
    ("causal", "none_front", 32, 32, 4, torch.bfloat16),
    (None, "none_front", 16, 16, 2, torch.float64),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[4]}-{c[5]}" for c in CASES])
def test_simulated_ring_writes_every_element(poison, case) -> None:
    """The simulated ring (the ring's per-rank steps) on NaN-filled buffers, reference backend,
    against the float64 reference (SPEC §6 tolerances)."""
    mask, sync, lq, lk, world, dtype = case
    q, k, v, do = make_inputs(11, 1, 2, 1, lq, lk, 16, dtype, "cpu", big=True)
    got = simulate.run(q, k, v, do, world, mask=mask, sync=sync, backend="reference")
    ro, rl, rg = reference(q, k, v, do, mask, sync, None)
    for i, (name, ref) in enumerate(zip(("out", "lse", "dq", "dk", "dv"), (ro, rl, *rg))):
        x = got[name]
        assert x.dtype == (
            dtype if name != "lse" else (torch.float64 if dtype == torch.float64 else torch.float32)
        )
        assert not torch.isnan(x).any(), name
        masked = torch.isneginf(ref)
        assert torch.equal(torch.isneginf(x), masked), name
        rel, mx = errors(x[~masked], ref[~masked])
        tol = TOL[dtype][0 if i < 2 else 1]
        assert rel <= tol and mx <= tol, f"{name}: rel {rel:.2e} max {mx:.2e} > {tol}"
