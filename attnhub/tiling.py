"""Tile classification: which (query tile, key tile) pairs a rule masks entirely, partly or not at all.

Backends that cut the flattened queries and keys into tiles (contiguous ranges of row-major flat
indices, as the kernels receive them) skip the pairs the rule masks entirely and drop the element
mask where it attends every pair. This module is the one place that decides it, for every rule of
SPEC §3, every sync mode of SPEC §2 and any number of sequence dimensions:

- ``EMPTY``: no (query, key) pair of the tile is attended,
- ``FULL``: every pair is attended,
- ``PARTIAL``: anything else, or not decided (always safe: the kernel evaluates the rule per element).

``EMPTY`` and ``FULL`` are only ever claimed when they hold for every pair. :meth:`Tiling.bounds` decides
from per-tile position boxes (cheap: a few NumPy operations over the tile pairs);
:meth:`Tiling.classify` with ``exact=True`` also evaluates the rule element-wise on the pairs the
bounds leave undecided, so that ``PARTIAL`` then means exactly "some pairs but not all".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnhub.positions import grid_positions, rule_mask
from attnhub.rules import Causal, Full, Local, Rule

EMPTY, PARTIAL, FULL = 0, 1, 2

#: Rule-mask elements evaluated at once while refining undecided pairs (bounds planning memory).
REFINE_CHUNK = 1 << 24

#: Position differences never exceed this; larger window reaches are clipped to it.
_FAR = 1 << 62


def edges(n: int, size: int) -> np.ndarray:
    """Boundaries ``[0, size, 2·size, ..., n]`` of tiles of ``size`` elements (the last may be shorter)."""
    if size < 1:
        raise ValueError(f"the tile size must be >= 1, got {size}")
    return np.append(np.arange(0, n, size, dtype=np.int64), np.int64(n))


def _edges(tiles: int | Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    if isinstance(tiles, int | np.integer):
        return edges(n, int(tiles))
    out = np.asarray(tiles, dtype=np.int64)
    if out.ndim != 1 or out.shape[0] < 1 or out[0] != 0 or out[-1] != n or (np.diff(out) < 0).any():
        raise ValueError(f"tile boundaries must rise from 0 to {n}, got {out.tolist()}")
    return out


def _tile_range(x: np.ndarray, bounds: np.ndarray, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """Minimum and maximum of ``x`` over each tile ``bounds[t]:bounds[t+1]`` (``fill`` for empty tiles)."""
    lo = np.full(bounds.shape[0] - 1, fill, dtype=np.int64)
    hi = np.full(bounds.shape[0] - 1, fill, dtype=np.int64)
    live = np.flatnonzero(np.diff(bounds) > 0)
    if live.size:  # empty tiles have zero length, so each live tile's segment ends where the next starts
        starts = bounds[live]
        lo[live] = np.minimum.reduceat(x, starts)
        hi[live] = np.maximum.reduceat(x, starts)
    return lo, hi


class Tiling:
    """The positions (SPEC §2) of one request shape and the tiles cut from its flattened sequences.

    ``q_tiles`` / ``k_tiles``: a tile size, or the boundaries ``[0, ..., n]`` of contiguous tiles of flat
    indices (sizes may differ; a zero-size tile is ``EMPTY`` against everything).
    """

    def __init__(
        self,
        seq_q: tuple[int, ...],
        seq_k: tuple[int, ...],
        sync: str,
        q_tiles: int | Sequence[int] | np.ndarray,
        k_tiles: int | Sequence[int] | np.ndarray,
    ) -> None:
        self.seq_q, self.seq_k, self.sync = tuple(seq_q), tuple(seq_k), sync
        self.pq, self.pk, self.fq, self.fk = grid_positions(self.seq_q, self.seq_k, sync)
        self.q_edges = _edges(q_tiles, self.fq.shape[0])
        self.k_edges = _edges(k_tiles, self.fk.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        """(query tiles, key tiles)."""
        return self.q_edges.shape[0] - 1, self.k_edges.shape[0] - 1

    def rows(self, i: int) -> slice:
        """The flat query indices of query tile ``i``."""
        return slice(int(self.q_edges[i]), int(self.q_edges[i + 1]))

    def cols(self, j: int) -> slice:
        """The flat key indices of key tile ``j``."""
        return slice(int(self.k_edges[j]), int(self.k_edges[j + 1]))

    def mask(self, rule: Rule, i: int, j: int) -> np.ndarray:
        """The element mask (True = attended) of query tile ``i`` against key tile ``j``."""
        r, c = self.rows(i), self.cols(j)
        return rule_mask(rule, [p[r] for p in self.pq], [p[c] for p in self.pk], self.fq[r], self.fk[c])

    def bounds(self, rule: Rule) -> np.ndarray:
        """(query tiles x key tiles) int8 classes from position boxes: exact where EMPTY or FULL.

        Per tile, the smallest and largest position along each dimension and flat index are taken;
        a verdict holds for the boxes, hence for every pair inside them. Along a dimension of a
        strided window, positions that all share one residue modulo the stride are also used.
        """
        if not isinstance(rule, Full | Causal | Local):
            raise TypeError(f"tiles are classified for Full, Causal and Local rules, not {rule!r}")
        live = (np.diff(self.q_edges) > 0)[:, None] & (np.diff(self.k_edges) > 0)[None, :]
        some, every = live.copy(), live.copy()
        if isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal):
            # Exact on its own: the largest query and the smallest key flat index both occur.
            fq_lo, fq_hi = _tile_range(self.fq, self.q_edges, 0)
            fk_lo, fk_hi = _tile_range(self.fk, self.k_edges, 0)
            some &= fq_hi[:, None] >= fk_lo[None, :]
            every &= fq_lo[:, None] >= fk_hi[None, :]
        if isinstance(rule, Local):
            s = rule.stride
            for d, w in enumerate(rule.windows(len(self.seq_q))):
                reach = min((w - 1) * s, _FAR)  # attended: |P - R| in {0, s, ..., (w - 1)·s}
                q_lo, q_hi = (a[:, None] for a in _tile_range(self.pq[d], self.q_edges, 0))
                k_lo, k_hi = (a[None, :] for a in _tile_range(self.pk[d], self.k_edges, 0))
                near = np.maximum(np.maximum(k_lo - q_hi, q_lo - k_hi), 0)
                far = np.maximum(q_hi - k_lo, k_hi - q_lo)
                rq_lo, rq_hi = (a[:, None] for a in _tile_range(self.pq[d] % s, self.q_edges, 0))
                rk_lo, rk_hi = (a[None, :] for a in _tile_range(self.pk[d] % s, self.k_edges, 0))
                one_residue = (rq_lo == rq_hi) & (rk_lo == rk_hi)
                some &= (near <= reach) & ~(one_residue & (rq_lo != rk_lo))
                every &= (far <= reach) & one_residue & (rq_lo == rk_lo)
        return np.where(some, np.where(every, FULL, PARTIAL), EMPTY).astype(np.int8)

    def classify(self, rule: Rule, exact: bool = True) -> np.ndarray:
        """(query tiles x key tiles) int8 classes; ``exact`` refines the pairs :meth:`bounds` leaves
        PARTIAL by evaluating the rule on their elements (about the cost of the rule's boundary area)."""
        cls = self.bounds(rule)
        if exact:
            self._refine(rule, cls)
        return cls

    def _refine(self, rule: Rule, cls: np.ndarray) -> None:
        """Replace undecided PARTIAL entries of ``cls`` (in place) by the element mask's verdict."""
        for i in np.flatnonzero((cls == PARTIAL).any(axis=1)):
            r = self.rows(int(i))
            pq, fq = [p[r] for p in self.pq], self.fq[r]
            todo = np.flatnonzero(cls[i] == PARTIAL)
            widths = self.k_edges[todo + 1] - self.k_edges[todo]
            per_chunk = max(1, REFINE_CHUNK // max(1, r.stop - r.start))
            start = 0
            while start < todo.size:  # consecutive key tiles whose widths fit one chunk
                stop = start + 1
                total = int(widths[start])
                while stop < todo.size and total + widths[stop] <= per_chunk:
                    total += int(widths[stop])
                    stop += 1
                group = todo[start:stop]
                cols = np.concatenate([np.arange(self.k_edges[j], self.k_edges[j + 1]) for j in group])
                keep = rule_mask(rule, pq, [p[cols] for p in self.pk], fq, self.fk[cols])
                offsets = np.concatenate(([0], np.cumsum(widths[start:stop])[:-1]))
                some = np.logical_or.reduceat(keep.any(axis=0), offsets)
                every = np.logical_and.reduceat(keep.all(axis=0), offsets)
                cls[i, group] = np.where(some, np.where(every, FULL, PARTIAL), EMPTY)
                start = stop


def classify(
    rule: Rule,
    seq_q: tuple[int, ...],
    seq_k: tuple[int, ...],
    sync: str,
    q_tiles: int | Sequence[int] | np.ndarray,
    k_tiles: int | Sequence[int] | np.ndarray,
    exact: bool = True,
) -> np.ndarray:
    """(query tiles x key tiles) int8 matrix of EMPTY / PARTIAL / FULL (see :class:`Tiling`)."""
    return Tiling(seq_q, seq_k, sync, q_tiles, k_tiles).classify(rule, exact)
