"""Tile plans: which key tiles each query tile must visit, and which of them need no mask.

A rule is evaluated per tile pair from position bounds (SPEC §2-3): for each query tile and key tile
the per-dimension position boxes and flat-index ranges give a conservative verdict, ``EMPTY`` (no
pair attended: skipped), ``FULL`` (every pair attended: no mask evaluated) or ``PARTIAL`` (the
kernel evaluates the rule per element). Boxes over-approximate the true position sets, so ``EMPTY``
and ``FULL`` are only claimed when they hold for every pair. Plans are small NumPy arrays (one entry
per tile pair), computed once per signature and cached on the device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnhub.positions import grid_positions
from attnhub.rules import Causal, Full, Local, Rule

EMPTY, PARTIAL, FULL = 0, 1, 2


def _tile_reduce(values: np.ndarray, block: int, fn: Any) -> np.ndarray:
    starts = np.arange(0, values.shape[0], block)
    return fn.reduceat(values, starts)


def classify(
    rule: Rule, seq_q: tuple[int, ...], seq_k: tuple[int, ...], sync: str, block_m: int, block_n: int
) -> np.ndarray:
    """(query tiles x key tiles) int8 matrix of EMPTY / PARTIAL / FULL for ``rule``."""
    pq, pk, fq, fk = grid_positions(seq_q, seq_k, sync)
    nq, nk = fq.shape[0], fk.shape[0]
    tq, tk = -(-nq // block_m), -(-nk // block_n)
    # FULL also needs complete tiles, so that unmasked kernel steps load without bounds checks.
    complete = (
        (((np.arange(tq) + 1) * block_m <= nq)[:, None]) & (((np.arange(tk) + 1) * block_n <= nk)[None, :])
    )
    if isinstance(rule, Full):
        return np.where(complete, FULL, PARTIAL).astype(np.int8)
    nonempty = np.ones((tq, tk), dtype=bool)
    full = complete.copy()
    causal = isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal)
    if causal:
        fq_lo = _tile_reduce(fq, block_m, np.minimum)[:, None]
        fq_hi = _tile_reduce(fq, block_m, np.maximum)[:, None]
        fk_lo = _tile_reduce(fk, block_n, np.minimum)[None, :]
        fk_hi = _tile_reduce(fk, block_n, np.maximum)[None, :]
        nonempty &= fq_hi >= fk_lo
        full &= fq_lo >= fk_hi
    if isinstance(rule, Local):
        s = rule.stride
        for d, w in enumerate(rule.windows(len(seq_q))):
            q_lo = _tile_reduce(pq[d], block_m, np.minimum)[:, None]
            q_hi = _tile_reduce(pq[d], block_m, np.maximum)[:, None]
            k_lo = _tile_reduce(pk[d], block_n, np.minimum)[None, :]
            k_hi = _tile_reduce(pk[d], block_n, np.maximum)[None, :]
            dmin = np.maximum(np.maximum(k_lo - q_hi, q_lo - k_hi), 0)
            dmax = np.maximum(q_hi - k_lo, k_hi - q_lo)
            nonempty &= dmin // s < w
            full &= (dmax < w) if s == 1 else (dmax == 0)
    out = np.where(nonempty, np.where(full, FULL, PARTIAL), EMPTY).astype(np.int8)
    return out


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
) -> Plan:
    """Cached :class:`Plan` for the tile sizes; ``transposed`` also builds the per-key-tile lists."""
    key = (rule, seq_q, seq_k, sync, block_m, block_n, str(device), transposed)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    import torch

    cls = classify(rule, seq_q, seq_k, sync, block_m, block_n)
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
