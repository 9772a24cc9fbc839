"""Trace-time tiling plan of the ``tf`` backend, in NumPy (no TensorFlow here).

Queries are cut into row blocks and keys into tiles on a fixed grid. Every (row block, key tile)
pair is classified once per request signature from the positions of SPEC §2:

- ``skip``: the rule attends no pair in it (never computed),
- ``full``: the rule attends every pair (computed without a mask),
- ``partial``: the rule is evaluated element-wise from positions inside the kernel.

The classes come from :mod:`attnhub.tiling` (exact: cheap bounds decide most tiles, only the
undecided ones near the rule's boundary are evaluated element-wise), so planning costs about as
much as the rule's boundary area, not ``Nq x Nk``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from attnhub.request import Request
from attnhub.rules import ExplicitMask, Full, Rule
from attnhub.tiling import EMPTY, FULL, PARTIAL, Tiling

#: Default rows per query block and keys per key tile.
BLOCK_Q = 256
BLOCK_K = 512
#: Upper bound on blocks per axis: longer sequences get larger tiles so the traced graph stays small.
MAX_BLOCKS = 64


@dataclass(frozen=True)
class Tile:
    """Key tile ``[k0, k1)`` of a row block; ``full`` when no element mask is needed."""

    index: int
    k0: int
    k1: int
    full: bool


@dataclass(frozen=True)
class RowBlock:
    """Query rows ``[q0, q1)`` and the key tiles they attend (skipped tiles are absent)."""

    q0: int
    q1: int
    tiles: tuple[Tile, ...]


@dataclass(frozen=True)
class Plan:
    """The tiling of one request: row blocks, key tile size and count, and positions for masks."""

    blocks: tuple[RowBlock, ...]
    block_k: int
    num_tiles: int
    #: Per-dimension positions and flat indices of queries and keys (SPEC §2), for partial tiles.
    pq: tuple[np.ndarray, ...]
    pk: tuple[np.ndarray, ...]
    fq: np.ndarray
    fk: np.ndarray

    @property
    def computed_pairs(self) -> int:
        """Query-key pairs the kernel computes (for tests and benchmarks)."""
        return sum((b.q1 - b.q0) * (t.k1 - t.k0) for b in self.blocks for t in b.tiles)


def tile_sizes(nq: int, nk: int, block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> tuple[int, int]:
    """Rows per block and keys per tile for sequence lengths ``nq``, ``nk``."""
    bq = max(1, min(nq, max(block_q, math.ceil(nq / MAX_BLOCKS))))
    bk = max(1, min(nk, max(block_k, math.ceil(nk / MAX_BLOCKS))))
    return bq, bk


def static_differences(req: Request) -> bool:
    """True when a padded batch's rule sees the position differences of its padded shape.

    In 1-d every rule reads only ``P - R``. Right padding with ``none_front`` and left padding with
    ``none_end`` keep ``P - R = i - j + const`` whatever the lengths, so the dense plan's empty
    tiles stay empty; other sync modes move positions per entry and nothing can be skipped.
    """
    if req.varlen or req.paged:
        return False
    return req.sync == ("none_front" if req.padding_side == "right" else "none_end")


def _build(req: Request, block_q: int, block_k: int) -> Plan:
    rule: Rule = Full() if isinstance(req.rule, ExplicitMask) else req.rule
    bq, bk = tile_sizes(req.nq, req.nk, block_q, block_k)
    tiling = Tiling(req.seq_q, req.seq_k, req.sync, bq, bk)
    if req.q_offset or req.k_offset:  # SPEC §11 (1-d, none_front): global positions
        tiling.pq = [tiling.pq[0] + req.q_offset]
        tiling.pk = [tiling.pk[0] + req.k_offset]
        tiling.fq, tiling.fk = tiling.pq[0], tiling.pk[0]
    if req.ragged:
        # positions and segments are tensors (ragged.py): every computed tile is masked per element
        cls = tiling.classify(rule if static_differences(req) else Full())
        cls = np.where(cls == FULL, PARTIAL, cls)
    else:
        cls = tiling.classify(rule)
    blocks = []
    for bi in range(cls.shape[0]):
        rows = tiling.rows(bi)
        tiles = []
        for ti in np.flatnonzero(cls[bi] != EMPTY):
            cols = tiling.cols(int(ti))
            tiles.append(Tile(int(ti), cols.start, cols.stop, bool(cls[bi, ti] == FULL)))
        blocks.append(RowBlock(rows.start, rows.stop, tuple(tiles)))
    return Plan(
        blocks=tuple(blocks),
        block_k=bk,
        num_tiles=math.ceil(req.nk / bk),
        pq=tuple(tiling.pq),
        pk=tuple(tiling.pk),
        fq=tiling.fq,
        fk=tiling.fk,
    )


def plan_for(req: Request, block_q: int | None = None, block_k: int | None = None) -> Plan:
    """The (cached) tiling plan of ``req``; sizes default to this module's ``BLOCK_Q``/``BLOCK_K``."""
    return _cached(req, BLOCK_Q if block_q is None else block_q, BLOCK_K if block_k is None else block_k)


@lru_cache(maxsize=256)
def _cached(req: Request, block_q: int, block_k: int) -> Plan:
    return _build(req, block_q, block_k)
