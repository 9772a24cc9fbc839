"""Trace-time tiling plan of the ``tf`` backend, in NumPy (no TensorFlow here).

Queries are cut into row blocks and keys into tiles on a fixed grid. Every (row block, key tile)
pair is classified once per request signature from the positions of SPEC §2:

- ``skip``: the rule attends no pair in it (never computed),
- ``full``: the rule attends every pair (computed without a mask),
- ``partial``: the rule is evaluated element-wise from positions inside the kernel.

Cheap interval bounds decide most tiles; only the undecided ones near the rule's boundary are
evaluated exactly with :func:`attnhub.positions.rule_mask`, so planning costs about as much as the
attended area, not ``Nq x Nk``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from attnhub.positions import grid_positions, rule_mask
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local, Rule

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


def _ranges(x: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Minimum and maximum of ``x`` over consecutive chunks of ``size``."""
    starts = np.arange(0, x.shape[0], size)
    return np.minimum.reduceat(x, starts), np.maximum.reduceat(x, starts)


def _classify(
    rule: Rule,
    windows: tuple[int, ...],
    qlo: list[int],
    qhi: list[int],
    klo: list[int],
    khi: list[int],
    fq: tuple[int, int],
    fk: tuple[int, int],
) -> str | None:
    """'skip', 'full' or None (undecided) from per-dimension position intervals of a tile."""
    if isinstance(rule, Full):
        return "full"
    causal = isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal)
    if causal and fq[1] < fk[0]:
        return "skip"
    causal_full = not causal or fq[0] >= fk[1]
    if isinstance(rule, Causal):
        return "full" if causal_full else None
    assert isinstance(rule, Local)
    s = rule.stride
    all_in = True
    for d, w in enumerate(windows):
        gap = max(0, klo[d] - qhi[d], qlo[d] - khi[d])
        if gap > (w - 1) * s:
            return "skip"
        if max(qhi[d] - klo[d], khi[d] - qlo[d]) >= w or s != 1:
            all_in = False
    return "full" if all_in and causal_full else None


def _build(req: Request, block_q: int, block_k: int) -> Plan:
    pq, pk, fq, fk = grid_positions(req.seq_q, req.seq_k, req.sync)
    rule: Rule = Full() if isinstance(req.rule, ExplicitMask) else req.rule
    windows = rule.windows(req.ndim) if isinstance(rule, Local) else ()
    bq, bk = tile_sizes(req.nq, req.nk, block_q, block_k)
    q_rng = [_ranges(p, bq) for p in pq]
    k_rng = [_ranges(p, bk) for p in pk]
    fq_rng, fk_rng = _ranges(fq, bq), _ranges(fk, bk)
    blocks = []
    for bi, q0 in enumerate(range(0, req.nq, bq)):
        q1 = min(q0 + bq, req.nq)
        tiles = []
        for ti, k0 in enumerate(range(0, req.nk, bk)):
            k1 = min(k0 + bk, req.nk)
            verdict = _classify(
                rule,
                windows,
                [int(r[0][bi]) for r in q_rng],
                [int(r[1][bi]) for r in q_rng],
                [int(r[0][ti]) for r in k_rng],
                [int(r[1][ti]) for r in k_rng],
                (int(fq_rng[0][bi]), int(fq_rng[1][bi])),
                (int(fk_rng[0][ti]), int(fk_rng[1][ti])),
            )
            if verdict is None:
                keep = rule_mask(rule, [p[q0:q1] for p in pq], [p[k0:k1] for p in pk], fq[q0:q1], fk[k0:k1])
                verdict = "skip" if not keep.any() else "full" if keep.all() else "partial"
            if verdict != "skip":
                tiles.append(Tile(ti, k0, k1, verdict == "full"))
        blocks.append(RowBlock(q0, q1, tuple(tiles)))
    return Plan(
        blocks=tuple(blocks),
        block_k=bk,
        num_tiles=math.ceil(req.nk / bk),
        pq=tuple(pq),
        pk=tuple(pk),
        fq=fq,
        fk=fk,
    )


def plan_for(req: Request, block_q: int | None = None, block_k: int | None = None) -> Plan:
    """The (cached) tiling plan of ``req``; sizes default to this module's ``BLOCK_Q``/``BLOCK_K``."""
    return _cached(req, BLOCK_Q if block_q is None else block_q, BLOCK_K if block_k is None else block_k)


@lru_cache(maxsize=256)
def _cached(req: Request, block_q: int, block_k: int) -> Plan:
    return _build(req, block_q, block_k)
