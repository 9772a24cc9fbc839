"""The core tile classifier (attnhub.tiling) against a pair-by-pair reading of the rules (tests/brute.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from attnhub import tiling
from attnhub.rules import Causal, Full, Local
from attnhub.tiling import EMPTY, FULL, PARTIAL, Tiling
from tests.brute import dense_mask

SYNCS = ("none_front", "scale_front", "scale_end", "none_end")


def brute_mask(rule, seq_q, seq_k, sync) -> np.ndarray:
    """Nq x Nk mask, one pair at a time, independent of attnhub.positions."""
    return dense_mask(rule, sync, seq_q, seq_k)


def truth(dense: np.ndarray, t: Tiling) -> np.ndarray:
    """The exact class of every tile pair from the dense mask."""
    out = np.zeros(t.shape, dtype=np.int8)
    for i, j in np.ndindex(*t.shape):
        tile = dense[t.rows(i), t.cols(j)]
        out[i, j] = FULL if tile.size and tile.all() else PARTIAL if tile.any() else EMPTY
    return out


def check(cls: np.ndarray, want: np.ndarray, exact: bool) -> None:
    """EMPTY and FULL only where true; with ``exact`` every class is the true one."""
    assert cls.shape == want.shape and cls.dtype == np.int8
    assert not ((cls == EMPTY) & (want != EMPTY)).any(), "EMPTY claimed for a pair with an attended element"
    assert not ((cls == FULL) & (want != FULL)).any(), "FULL claimed for a pair with a masked element"
    if exact:
        np.testing.assert_array_equal(cls, want)


def random_rule(rng: random.Random, ndim: int):
    kind = rng.choice(["full", "causal", "local", "local", "local"])
    if kind == "full":
        return Full()
    if kind == "causal":
        return Causal()
    window = rng.randint(1, 6)
    if ndim == 2 and rng.random() < 0.5:
        window = (rng.randint(1, 4), rng.randint(1, 5))
    return Local(window, rng.choice([0, 0, 1, 2, 3]), rng.random() < 0.5)


def random_edges(rng: random.Random, n: int) -> list[int] | int:
    """A tile size, or uneven boundaries (some tiles possibly empty)."""
    if rng.random() < 0.7:
        return rng.randint(1, 13)
    cuts = sorted(rng.randint(0, n) for _ in range(rng.randint(0, 5)))
    return [0, *cuts, n]


def random_case(rng: random.Random, ndim: int):
    if ndim == 1:
        seq_q, seq_k = (rng.randint(1, 45),), (rng.randint(1, 45),)
    else:
        seq_q = (rng.randint(1, 7), rng.randint(1, 8))
        seq_k = (rng.randint(1, 7), rng.randint(1, 8))
    return random_rule(rng, ndim), seq_q, seq_k


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("seed", range(4))
def test_random_cases_against_the_pair_by_pair_rule(ndim, sync, seed):
    rng = random.Random(f"{ndim}-{sync}-{seed}")
    for _ in range(40):
        rule, seq_q, seq_k = random_case(rng, ndim)
        nq, nk = int(np.prod(seq_q)), int(np.prod(seq_k))
        t = Tiling(seq_q, seq_k, sync, random_edges(rng, nq), random_edges(rng, nk))
        want = truth(brute_mask(rule, seq_q, seq_k, sync), t)
        check(t.bounds(rule), want, exact=False)
        check(t.classify(rule), want, exact=True)


@pytest.mark.parametrize(
    "rule",
    [
        Full(),
        Causal(),
        Local(3),
        Local(2, causal=True),
        Local(3, log2_stride=1),
        Local(2, 2, True),
        Local((2,), causal=True),
    ],
)
@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("shapes", [((13,), (6,)), ((6,), (13,)), ((5, 7), (3, 4)), ((3, 4), (6, 9))])
@pytest.mark.parametrize("tiles", [(1, 1), (4, 3), (5, 8), (100, 100)])
def test_every_rule_sync_and_shape(rule, sync, shapes, tiles):
    """Lq != Lk both ways, lengths not multiples of the tiles, tiles larger than the sequences."""
    seq_q, seq_k = shapes
    t = Tiling(seq_q, seq_k, sync, *tiles)
    want = truth(brute_mask(rule, seq_q, seq_k, sync), t)
    check(t.bounds(rule), want, exact=False)
    check(tiling.classify(rule, seq_q, seq_k, sync, *tiles), want, exact=True)


def test_bounds_are_tight_where_boxes_decide():
    """Work skipping: a causal 1-d plan and a sliding window are decided by the bounds alone."""
    n, b = 1024, 64
    causal = tiling.classify(Causal(), (n,), (n,), "none_front", b, b, exact=False)
    assert (causal == PARTIAL).sum() == n // b  # only the diagonal
    assert (causal == EMPTY).sum() == (n // b) * (n // b - 1) // 2
    local = tiling.classify(Local(64), (n,), (n,), "none_front", b, b, exact=False)
    assert ((local != EMPTY).sum(axis=1) <= 3).all()
    # a strided window reaches (w - 1)·s positions, not w·s - 1: the tile 16 positions away is empty
    strided = tiling.classify(Local(2, log2_stride=4), (64,), (64,), "none_front", 16, 16, exact=False)
    assert strided[0, 2] == EMPTY and strided[0, 1] != EMPTY


def test_strided_tiles_of_one_residue_are_full_or_empty():
    """scale_front with step 4 puts every query on a multiple of 4: stride-4 tiles are decided."""
    t = Tiling((8,), (32,), "scale_front", 2, 8)
    rule = Local(3, log2_stride=2)
    want = truth(brute_mask(rule, (8,), (32,), "scale_front"), t)
    assert (t.bounds(rule) != PARTIAL).sum() > 0
    check(t.bounds(rule), want, exact=False)


def test_large_windows_and_strides_do_not_overflow():
    rule = Local(2**40, log2_stride=30, causal=True)
    t = Tiling((40,), (40,), "none_end", 7, 9)
    check(t.classify(rule), truth(brute_mask(rule, (40,), (40,), "none_end"), t), exact=True)


def test_refinement_in_several_chunks(monkeypatch):
    monkeypatch.setattr(tiling, "REFINE_CHUNK", 7)
    rule = Local((2, 3), causal=True)
    t = Tiling((6, 7), (6, 7), "none_front", 5, 3)
    check(t.classify(rule), truth(brute_mask(rule, (6, 7), (6, 7), "none_front"), t), exact=True)


def test_empty_tiles_and_bad_boundaries():
    t = Tiling((6,), (6,), "none_front", [0, 0, 3, 6, 6], [0, 6])
    np.testing.assert_array_equal(t.classify(Full())[:, 0], [EMPTY, FULL, FULL, EMPTY])
    with pytest.raises(ValueError):
        Tiling((6,), (6,), "none_front", [0, 4, 3, 6], 2)
    with pytest.raises(ValueError):
        Tiling((6,), (6,), "none_front", [0, 5], 2)
    with pytest.raises(ValueError):
        Tiling((6,), (6,), "none_front", 0, 2)


def test_the_check_catches_a_wrong_classifier(monkeypatch):
    """Self-test: the brute-force comparison fails for classifiers that over-claim."""
    rule, seq, sync = Local(3, log2_stride=1, causal=True), (20,), "scale_end"
    t = Tiling(seq, (9,), sync, 4, 3)
    want = truth(brute_mask(rule, seq, (9,), sync), t)
    right = t.classify(rule)
    check(right, want, exact=True)
    assert (right == PARTIAL).any() and (right == EMPTY).any()
    # PARTIAL everywhere is safe but not exact
    check(np.full_like(right, PARTIAL), want, exact=False)
    with pytest.raises(AssertionError):
        check(np.full_like(right, PARTIAL), want, exact=True)
    # claiming FULL for a partial pair, or EMPTY for one with an attended element, is caught
    for wrong_class, where in ((FULL, right == PARTIAL), (EMPTY, right != EMPTY)):
        wrong = right.copy()
        wrong[np.argwhere(where)[0][0], np.argwhere(where)[0][1]] = wrong_class
        with pytest.raises(AssertionError):
            check(wrong, want, exact=False)
    # a classifier whose window is off by one either way is caught (the oracle reads rule.window)
    for shift in (-1, 1):
        monkeypatch.setattr(Local, "windows", lambda self, ndim, shift=shift: (self.window + shift,) * ndim)
        with pytest.raises(AssertionError):
            for sync in SYNCS:
                for local in (rule, Local(3)):
                    t = Tiling((16,), (16,), sync, 2, 2)
                    check(t.bounds(local), truth(brute_mask(local, (16,), (16,), sync), t), exact=False)
