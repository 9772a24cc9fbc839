"""The static tile plan of chunked attention, computed in NumPy at trace time.

The query and key sequences (flattened row-major, as the backend receives them) are cut into
``num_chunks_q`` x ``num_chunks_kv`` chunks. Every chunk pair is classified by
:mod:`attnhub.tiling` (exactly) as

- ``skip``: the rule masks every (query, key) pair of the tile; no operation is emitted for it;
- ``full``: the rule keeps every pair; the tile runs without a mask;
- ``partial``: the tile runs with a constant boolean mask (True = attend).

Nothing here depends on tensor values, so the graph built from a plan has static shapes and no
data-dependent control flow, as PopTorch requires.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from attnhub.rules import Rule
from attnhub.tiling import EMPTY, PARTIAL, Tiling


@dataclass(frozen=True)
class Tile:
    """One chunk pair that is computed: query chunk ``i`` against key chunk ``j``."""

    i: int
    j: int
    #: None for a tile the rule keeps entirely, else the (rows x cols) boolean mask.
    mask: np.ndarray | None

    def __hash__(self) -> int:
        return hash((self.i, self.j))


@dataclass(frozen=True)
class Plan:
    """Chunk boundaries and the tiles that run, per query chunk."""

    q_bounds: tuple[tuple[int, int], ...]
    k_bounds: tuple[tuple[int, int], ...]
    #: For each query chunk, the tiles that are computed, in key order.
    tiles: tuple[tuple[Tile, ...], ...]

    @property
    def num_pairs(self) -> int:
        """Chunk pairs that are computed (not masked entirely by the rule)."""
        return sum(len(row) for row in self.tiles)

    @property
    def num_masked_pairs(self) -> int:
        """Computed chunk pairs that need a mask (the rule cuts through them)."""
        return sum(t.mask is not None for row in self.tiles for t in row)


def bounds(n: int, chunks: int) -> tuple[tuple[int, int], ...]:
    """``chunks`` contiguous (start, stop) ranges covering ``range(n)``, sizes differing by <= 1.

    When ``chunks`` divides ``n`` every chunk has ``n // chunks`` elements, as in
    flash-attention-ipu; otherwise the first ``n % chunks`` chunks are one element longer.
    """
    if chunks < 1:
        raise ValueError(f"the number of chunks must be >= 1, got {chunks}")
    chunks = min(chunks, max(n, 1))
    base, extra = divmod(n, chunks)
    out, start = [], 0
    for c in range(chunks):
        stop = start + base + (1 if c < extra else 0)
        out.append((start, stop))
        start = stop
    return tuple(out)


@lru_cache(maxsize=256)
def make_plan(
    rule: Rule,
    seq_q: tuple[int, ...],
    seq_k: tuple[int, ...],
    sync: str,
    num_chunks_q: int,
    num_chunks_kv: int,
) -> Plan:
    """The tile plan of ``rule`` for these sequence shapes and chunk counts (cached)."""
    nq, nk = math.prod(seq_q), math.prod(seq_k)
    qb, kb = bounds(nq, num_chunks_q), bounds(nk, num_chunks_kv)
    tiling = Tiling(seq_q, seq_k, sync, [0] + [b for _, b in qb], [0] + [b for _, b in kb])
    cls = tiling.classify(rule)
    rows = []
    for i in range(len(qb)):
        row = []
        for j in np.flatnonzero(cls[i] != EMPTY):
            mask = tiling.mask(rule, i, int(j)) if cls[i, j] == PARTIAL else None
            if mask is not None:
                mask.setflags(write=False)
            row.append(Tile(i, int(j), mask))
        rows.append(tuple(row))
    return Plan(qb, kb, tuple(rows))


def choose_chunks(seq_q: int, seq_k: int, head_dim: int, max_chunks: int = 64) -> tuple[int, int]:
    """``(num_chunks_q, num_chunks_kv)`` from the memory model of docs/backends/ipu.md.

    A tile's logits (``(Lq / num_chunks_q) x (Lk / num_chunks_kv)`` per batch-head) are kept no
    larger than the larger of q and k (``max(Lq, Lk) x head_dim``), so the attention scratch never
    outgrows the inputs. That needs ``num_chunks_q * num_chunks_kv >= min(Lq, Lk) / head_dim``;
    the product is a power of two split as evenly as possible with the query side taking the
    larger half (each query chunk carries its own accumulators, each key chunk is re-read per
    query chunk), as flash-attention-ipu's heuristic does for square causal attention.
    """
    if head_dim < 1:
        raise ValueError(f"head_dim must be >= 1, got {head_dim}")
    ratio = max(1, math.ceil(min(seq_q, seq_k) / head_dim))
    e = max(0, math.ceil(math.log2(ratio)))
    cq = 1 << ((e + 1) // 2)
    ck = 1 << (e // 2)
    cap_q = max(1, min(seq_q, max_chunks))
    cap_k = max(1, min(seq_k, max_chunks))
    if cq > cap_q:  # move what the query side cannot take to the key side
        ck = min(cap_k, ck * math.ceil(cq / cap_q))
        cq = cap_q
    if ck > cap_k:
        cq = min(cap_q, cq * math.ceil(ck / cap_k))
        ck = cap_k
    return cq, ck
