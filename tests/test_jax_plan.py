"""Tile and lane plans of the jax backend (NumPy, no jax needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnhub import Causal, Full, Local
from attnhub.positions import dense_rule_mask

plan = pytest.importorskip("attnhub_backends.jax.plan")


@pytest.mark.parametrize(
    "rule,sq,sk,sync",
    [
        (Causal(), (64,), (64,), "none_front"),
        (Local(4, log2_stride=1), (80,), (40,), "scale_end"),
        (Local((2, 3), causal=True), (8, 12), (8, 12), "none_front"),
        (Full(), (10,), (30,), "none_end"),
    ],
)
def test_tile_pairs_are_exactly_the_tiles_with_an_attended_pair(rule, sq, sk, sync):
    bq, bk = 8, 16
    pairs = plan.tile_pairs(rule, sq, sk, sync, bq, bk)
    keep = dense_rule_mask(rule, sq, sk, sync)
    nq, nk = keep.shape
    for i, row in enumerate(pairs):
        want = [
            j for j in range(math.ceil(nk / bk)) if keep[i * bq : (i + 1) * bq, j * bk : (j + 1) * bk].any()
        ]
        assert list(row) == want


def test_local_window_skips_tiles():
    pairs = plan.tile_pairs(Local(16), (1024,), (1024,), "none_front", 64, 64)
    assert max(len(r) for r in pairs) <= 3  # never all 16 key tiles


@pytest.mark.parametrize("max_lanes", [1, 3, 100])
def test_lanes_cover_every_pair_once_and_balance_causal(max_lanes):
    pairs = plan.tile_pairs(Causal(), (256,), (256,), "none_front", 16, 16)
    lp = plan.lanes(pairs, max_lanes)
    seen = sorted(
        (int(o), int(i)) for o, i, ok in zip(lp.outer.ravel(), lp.inner.ravel(), lp.valid.ravel()) if ok
    )
    assert seen == sorted((o, i) for o, row in enumerate(pairs) for i in row)
    assert lp.last.sum() == len(pairs) and lp.first.sum() == len(pairs)
    assert sorted(lp.outer[lp.last].tolist()) == list(range(len(pairs)))
    total = sum(len(r) for r in pairs)
    lanes, steps = lp.shape
    assert lanes <= max_lanes
    assert steps * lanes <= total * 1.2 + lanes  # packing wastes little (causal: 16 + 1 per pair of lanes)


def test_banded_plans_use_direct_lanes_and_empty_tiles_get_a_step():
    pairs = ((0, 1), (), (1, 2), (2, 3))
    lp = plan.lanes(pairs, 16)
    assert lp.direct and lp.shape == (4, 2)
    assert not lp.valid[1].any()
    np.testing.assert_array_equal(lp.outer[:, 0], np.arange(4))
