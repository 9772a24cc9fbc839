"""Tile plans: which key tiles each query tile must visit, and which of them need no mask.

Each (query tile, key tile) pair is classified by :mod:`attnhub.tiling` from position bounds (SPEC
§2-3): ``EMPTY`` (no pair attended: skipped), ``FULL`` (every pair attended: no mask evaluated) or
``PARTIAL`` (the kernel evaluates the rule per element). Plans are small NumPy arrays (one entry per
tile pair), computed once per signature and cached on the device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnhub.rules import Rule
from attnhub.tiling import EMPTY, FULL, PARTIAL, Tiling


def classify(
    rule: Rule,
    seq_q: tuple[int, ...],
    seq_k: tuple[int, ...],
    sync: str,
    block_m: int,
    block_n: int,
    offsets: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """(query tiles x key tiles) int8 matrix of EMPTY / PARTIAL / FULL for ``rule``.

    ``offsets``: SPEC §11's (q_offset, k_offset), 1-d with sync none_front only: positions (and
    flat indices, which for one dimension are the positions) shift by them.
    """
    tiling = Tiling(seq_q, seq_k, sync, block_m, block_n)
    if offsets != (0, 0):
        if len(seq_q) != 1 or sync != "none_front":
            raise ValueError("position offsets are defined for 1-d sequences with sync none_front")
        qo, ko = offsets
        tiling.pq, tiling.fq = [tiling.pq[0] + qo], tiling.fq + qo
        tiling.pk, tiling.fk = [tiling.pk[0] + ko], tiling.fk + ko
    cls = tiling.bounds(rule)  # bounds only: planning stays O(tile pairs) however long the sequences
    # FULL also needs complete tiles, so that unmasked kernel steps load without bounds checks.
    complete = (np.diff(tiling.q_edges) == block_m)[:, None] & (np.diff(tiling.k_edges) == block_n)[None, :]
    cls[(cls == FULL) & ~complete] = PARTIAL
    return cls


def lists(cls: np.ndarray) -> np.ndarray:
    """Per row of ``cls``: a contiguous run of FULL columns and the list of other visited columns.

    Returns an int32 array ``(rows, 3 + width)``: ``[full_lo, full_hi, count, idx...]`` where the
    kernel visits columns ``full_lo..full_hi-1`` without a mask and ``idx[:count]`` with one.
    """
    rows, cols = cls.shape
    visit = cls != EMPTY
    counts = visit.sum(axis=1)
    width = max(1, int(counts.max()) if rows else 1)
    out = np.zeros((rows, 3 + width), dtype=np.int32)
    for r in range(rows):
        full_idx = np.flatnonzero(cls[r] == FULL)
        lo = hi = 0
        if full_idx.size:
            lo = int(full_idx[0])
            breaks = np.flatnonzero(np.diff(full_idx) != 1)
            hi = int(full_idx[breaks[0]] + 1) if breaks.size else int(full_idx[-1] + 1)
        rest = np.flatnonzero(visit[r])
        rest = rest[(rest < lo) | (rest >= hi)]
        out[r, 0], out[r, 1], out[r, 2] = lo, hi, rest.size
        out[r, 3 : 3 + rest.size] = rest
    return out


def band_lists(cls: np.ndarray, base: np.ndarray) -> np.ndarray | None:
    """Per row ``[full_lo, full_hi, lo, hi]`` when each row visits exactly the columns ``lo..hi-1``
    (1-d rules with stride 1: full, causal, sliding windows), else ``None``; ``base`` is
    ``lists(cls)``, whose full runs are reused.

    The forward's band walk (``fwd_kernel`` with ``BAND``) visits ``lo..hi-1`` in one loop and
    evaluates the rule only outside ``full_lo..full_hi-1``.
    """
    visit = cls != EMPTY
    out = np.zeros((cls.shape[0], 4), dtype=np.int32)
    for r in range(cls.shape[0]):
        idx = np.flatnonzero(visit[r])
        if idx.size and idx[-1] - idx[0] + 1 != idx.size:
            return None
        out[r, :2] = base[r, :2]
        if idx.size:
            out[r, 2:] = idx[0], idx[-1] + 1
    return out


@dataclass(frozen=True)
class Plan:
    """Forward-direction lists (per query tile) and transposed lists (per key tile), on a device."""

    rows: Any  # (query tiles, 3 + width) int32
    cols: Any  # (key tiles, 3 + width) int32
    band: Any  # (query tiles, 4) int32 band_lists, or None where a row's visits are not contiguous
    pairs: int  # tile pairs visited (for reporting)
    max_visits: int  # most tiles one query tile visits (split-KV heuristic)


_CACHE: OrderedDict[tuple, Plan] = OrderedDict()
_CACHE_SIZE = 128


def plan(
    rule: Rule,
    seq_q: tuple[int, ...],
    seq_k: tuple[int, ...],
    sync: str,
    block_m: int,
    block_n: int,
    device: Any,
    transposed: bool = False,
    offsets: tuple[int, int] = (0, 0),
) -> Plan:
    """Cached :class:`Plan` for the tile sizes; ``transposed`` also builds the per-key-tile lists;
    ``offsets`` as in :func:`classify`."""
    key = (rule, seq_q, seq_k, sync, block_m, block_n, str(device), transposed, offsets)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    import torch

    cls = classify(rule, seq_q, seq_k, sync, block_m, block_n, offsets)
    fwd = lists(cls)
    rows = torch.from_numpy(fwd).to(device)
    cols = torch.from_numpy(lists(np.ascontiguousarray(cls.T))).to(device) if transposed else rows
    band = band_lists(cls, fwd)
    band_t = None if band is None else torch.from_numpy(band).to(device)
    visits = (cls != EMPTY).sum(axis=1)
    found = Plan(
        rows=rows, cols=cols, band=band_t, pairs=int(visits.sum()), max_visits=int(visits.max(initial=0))
    )
    _CACHE[key] = found
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return found
