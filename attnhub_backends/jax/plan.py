"""Tile plans, computed in NumPy at trace time: which key tiles each query tile needs, and lanes.

A *tile plan* cuts the flattened queries into tiles of ``bq`` rows and the keys into tiles of
``bk`` columns and lists, for every query tile, the key tiles in which the rule attends at least
one pair (tiles the rule masks entirely are never visited). A *lane plan* packs those
(outer tile, inner tile) pairs into ``lanes`` rows of ``steps`` pairs each, so that one
``lax.scan`` step processes one pair per lane for all lanes at once, every outer tile lives in
exactly one lane, and lanes are about equally long (longest-processing-time packing).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from attnhub.positions import grid_positions
from attnhub.rules import Causal, Full, Local, Rule
from attnhub.tiling import EMPTY, classify

#: Direct lanes (one per outer tile) are used when they pad the work by at most this factor.
DIRECT_WASTE = 1.25


@dataclass(frozen=True)
class Positions:
    """Per-element positions, padded to whole tiles, as int32 arrays (queries and keys)."""

    pq: tuple[np.ndarray, ...]  # one (nq_pad,) array per sequence dimension
    fq: np.ndarray  # (nq_pad,) flat index
    pk: tuple[np.ndarray, ...]
    fk: np.ndarray
    kvalid: np.ndarray  # (nk_pad,) bool: False for padding keys


@dataclass(frozen=True)
class Lanes:
    """(lanes, steps) int32/bool tables: outer and inner tile per step, and the step's role."""

    outer: np.ndarray
    inner: np.ndarray
    valid: np.ndarray  # False: a padding step (or the single step of an outer tile with no pairs)
    first: np.ndarray  # the first step of its outer tile: reset the accumulators
    last: np.ndarray  # the last step of its outer tile: write the result out
    #: One lane per outer tile, lane i = outer tile i, no resets: results are read after the scan.
    direct: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return self.outer.shape  # type: ignore[return-value]


def _pad_to(a: np.ndarray, n: int, value: int) -> np.ndarray:
    out = np.full((n,), value, dtype=np.int64)
    out[: a.shape[0]] = a
    return out


@lru_cache(maxsize=64)
def positions(seq_q: tuple[int, ...], seq_k: tuple[int, ...], sync: str, bq: int, bk: int) -> Positions:
    """Positions (SPEC §2) of every query and key, padded to ``bq``/``bk`` multiples."""
    pq, pk, fq, fk = grid_positions(seq_q, seq_k, sync)
    nq, nk = fq.shape[0], fk.shape[0]
    nq_pad, nk_pad = bq * math.ceil(nq / bq), bk * math.ceil(nk / bk)
    kvalid = np.zeros((nk_pad,), dtype=bool)
    kvalid[:nk] = True

    def i32(a: np.ndarray, n: int) -> np.ndarray:
        return _pad_to(a, n, 0).astype(np.int32)

    return Positions(
        pq=tuple(i32(p, nq_pad) for p in pq),
        fq=i32(fq, nq_pad),
        pk=tuple(i32(p, nk_pad) for p in pk),
        fk=i32(fk, nk_pad),
        kvalid=kvalid,
    )


@lru_cache(maxsize=64)
def tile_pairs(
    rule: Rule, seq_q: tuple[int, ...], seq_k: tuple[int, ...], sync: str, bq: int, bk: int
) -> tuple[tuple[int, ...], ...]:
    """For each query tile, the key tiles holding at least one attended pair (ascending)."""
    cls = classify(rule, seq_q, seq_k, sync, bq, bk)
    return tuple(tuple(int(j) for j in np.flatnonzero(row != EMPTY)) for row in cls)


def transpose_pairs(pairs: tuple[tuple[int, ...], ...], n_inner: int) -> tuple[tuple[int, ...], ...]:
    """The same pairs listed per inner tile (key tile -> query tiles)."""
    out: list[list[int]] = [[] for _ in range(n_inner)]
    for i, row in enumerate(pairs):
        for j in row:
            out[j].append(i)
    return tuple(tuple(r) for r in out)


@lru_cache(maxsize=64)
def lanes(pairs: tuple[tuple[int, ...], ...], max_lanes: int) -> Lanes:
    """Pack every outer tile's pairs into at most ``max_lanes`` lanes of about equal length.

    An outer tile without pairs still gets one (invalid) step so that its result, zeros and
    ``-inf`` for a fully masked tile, is written.
    """
    counts = [max(1, len(r)) for r in pairs]
    if len(pairs) <= max_lanes and len(pairs) * max(counts) <= DIRECT_WASTE * sum(counts):
        return _direct(pairs, max(counts))
    n_lanes = max(1, min(max_lanes, len(pairs), math.ceil(sum(counts) / max(counts))))
    heap = [(0, lane) for lane in range(n_lanes)]
    members: list[list[int]] = [[] for _ in range(n_lanes)]
    for o in sorted(range(len(pairs)), key=lambda o: -counts[o]):
        load, lane = heapq.heappop(heap)
        members[lane].append(o)
        heapq.heappush(heap, (load + counts[o], lane))
    steps = max(sum(counts[o] for o in m) for m in members)
    outer = np.zeros((n_lanes, steps), dtype=np.int32)
    inner = np.zeros((n_lanes, steps), dtype=np.int32)
    valid = np.zeros((n_lanes, steps), dtype=bool)
    first = np.zeros((n_lanes, steps), dtype=bool)
    last = np.zeros((n_lanes, steps), dtype=bool)
    for lane, m in enumerate(members):
        t = 0
        for o in m:
            row = pairs[o]
            n = max(1, len(row))
            outer[lane, t : t + n] = o
            if row:
                inner[lane, t : t + n] = row
                valid[lane, t : t + n] = True
            first[lane, t] = True
            last[lane, t + n - 1] = True
            t += n
        if t:  # padding steps repeat the lane's last tile, invalid, never first or last
            outer[lane, t:] = outer[lane, t - 1]
            inner[lane, t:] = inner[lane, t - 1]
    return Lanes(outer, inner, valid, first, last)


def _direct(pairs: tuple[tuple[int, ...], ...], steps: int) -> Lanes:
    """Lane i walks outer tile i's pairs; shorter lanes are padded with invalid steps."""
    n = len(pairs)
    outer = np.repeat(np.arange(n, dtype=np.int32)[:, None], steps, axis=1)
    inner = np.zeros((n, steps), dtype=np.int32)
    valid = np.zeros((n, steps), dtype=bool)
    for o, row in enumerate(pairs):
        if row:
            inner[o, : len(row)] = row
            inner[o, len(row) :] = row[-1]
            valid[o, : len(row)] = True
    first = np.zeros((n, steps), dtype=bool)
    last = np.zeros((n, steps), dtype=bool)
    first[:, 0] = True
    last[:, -1] = True
    return Lanes(outer, inner, valid, first, last, direct=True)


def all_pairs(nqt: int, nkt: int) -> tuple[tuple[int, ...], ...]:
    """Every key tile for every query tile (positions known only at run time)."""
    return tuple(tuple(range(nkt)) for _ in range(nqt))


@lru_cache(maxsize=64)
def shifted_pairs(
    rule: Rule, nq: int, nk: int, q_offset: int, k_offset: int, bq: int, bk: int
) -> tuple[tuple[int, ...], ...]:
    """1-d tile pairs with positions ``i + q_offset`` and ``j + k_offset`` (SPEC §11).

    Conservative: a pair is kept when the interval of position differences ``P - R`` it spans
    meets the rule's band (causal: ``>= 0``; Local: ``|d| <= s·(w-1)``), which includes every
    tile holding an attended pair; the mask inside a tile is exact.
    """
    nqt, nkt = math.ceil(nq / bq), math.ceil(nk / bk)
    if isinstance(rule, Full):
        return all_pairs(nqt, nkt)
    causal = isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal)
    hi = math.inf
    if isinstance(rule, Local):
        (w,) = rule.windows(1)
        hi = rule.stride * (w - 1)
    lo = 0 if causal else -hi
    out = []
    for i in range(nqt):
        p0, p1 = i * bq + q_offset, min(nq, (i + 1) * bq) - 1 + q_offset
        row = []
        for j in range(nkt):
            r0, r1 = j * bk + k_offset, min(nk, (j + 1) * bk) - 1 + k_offset
            if p1 - r0 >= lo and p0 - r1 <= hi:
                row.append(j)
        out.append(tuple(row))
    return tuple(out)
