"""Boolean masks (SPEC §3) as tile plans: per-tile summaries, combined with the rule's plan.

A mask (mb, mh, mq, mk), each dimension 1 or the full extent (B, Hq, Nq, Nk), is summarised per
(mask batch, mask head, query tile, key tile) as ``EMPTY`` (no True), ``FULL`` (all True) or
``PARTIAL``, by torch reductions on the mask's device. The summary joins the rule's classes
(:func:`plan.classify`): a tile is visited unless either says EMPTY, and read without the mask
only where both say FULL. The kernels then read the mask element-wise on PARTIAL tiles only.

Summaries and plans are cached by the mask's identity (data pointer, version counter, shape,
strides, device) and the tile sizes; the cache holds a reference to the mask, so that its memory
cannot be reused by another tensor while the entry lives. A caller passing the same mask to every
layer (Hugging Face models do) builds the summary once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnhub.rules import Rule
from attnhub.tiling import EMPTY, FULL, PARTIAL
from attnhub_backends.triton import plan

#: Masks whose plans are kept (each entry holds its mask alive).
CACHE_SIZE = 4


@dataclass(frozen=True)
class MaskPlan:
    """Plan lists with one row block per (mask batch, mask head), on the mask's device.

    ``rows``: (mb·mh·query tiles, 3 + width) int32 as ``plan.lists``; the kernels find their row at
    ``b·plan_b + h·plan_h + tile`` (``plan_b``/``plan_h`` 0 where the mask broadcasts).
    """

    rows: Any
    band: Any  # plan.band_lists per row block (forward only), or None
    plan_b: int
    plan_h: int
    pairs: int
    max_visits: int


def summary(mask: Any, block_m: int, block_n: int) -> np.ndarray:
    """(mb, mh, query tiles, key tiles) int8 EMPTY / PARTIAL / FULL of a rank-4 bool mask.

    A mask dimension of size 1 (broadcast) gives one tile along it. Elements past the last
    complete tile count for neither verdict (the rule's plan makes such tiles PARTIAL anyway).
    """
    import torch

    m = mask.to(torch.uint8)
    mb, mh, mq, mk = m.shape
    bm = block_m if mq > 1 else 1
    bn = block_n if mk > 1 else 1
    tq, tk = -(-mq // bm), -(-mk // bn)
    pad = (0, tk * bn - mk, 0, tq * bm - mq)
    anyv = torch.nn.functional.pad(m, pad, value=0).view(mb, mh, tq, bm, tk, bn).amax(dim=(3, 5))
    allv = torch.nn.functional.pad(m, pad, value=1).view(mb, mh, tq, bm, tk, bn).amin(dim=(3, 5))
    cls = torch.where(anyv == 0, EMPTY, torch.where(allv == 1, FULL, PARTIAL)).to(torch.int8)
    return cls.cpu().numpy()


def mask_key(mask: Any) -> tuple:
    """A mask's identity for the caches of its plans and verdicts (here and mask_forms.py)."""
    return (mask.data_ptr(), mask._version, tuple(mask.shape), mask.stride(), str(mask.device))


#: mask identity -> (the mask, {(rule, shapes, tiles, transposed): plan}); the LRU counts masks,
#: so that every tile shape of one mask (the forward's, the backward's, tuning candidates) stays.
_CACHE: OrderedDict[tuple, tuple[Any, dict[tuple, MaskPlan]]] = OrderedDict()


def mask_plan(
    mask: Any,
    rule: Rule,
    seq_q: tuple[int, ...],
    seq_k: tuple[int, ...],
    sync: str,
    block_m: int,
    block_n: int,
    transposed: bool = False,
) -> MaskPlan:
    """The cached :class:`MaskPlan` of ``mask`` joined with ``rule``'s plan (``transposed``: per key
    tile, for the dk/dv kernel)."""
    mkey = mask_key(mask)
    entry = _CACHE.get(mkey)
    if entry is None:
        entry = _CACHE[mkey] = (mask, {})
        if len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(mkey)
    key = (rule, seq_q, seq_k, sync, block_m, block_n, transposed)
    found = entry[1].get(key)
    if found is None:
        found = entry[1][key] = _build(mask, rule, seq_q, seq_k, sync, block_m, block_n, transposed)
    return found


def _build(
    mask: Any,
    rule: Rule,
    seq_q: tuple[int, ...],
    seq_k: tuple[int, ...],
    sync: str,
    block_m: int,
    block_n: int,
    transposed: bool,
) -> MaskPlan:
    import torch

    base = plan.classify(rule, seq_q, seq_k, sync, block_m, block_n)  # (tq, tk)
    s = summary(mask, block_m, block_n)
    mb, mh = s.shape[:2]
    s = np.broadcast_to(s, (mb, mh, *base.shape))
    both = np.where(
        (base == EMPTY) | (s == EMPTY), EMPTY, np.where((base == FULL) & (s == FULL), FULL, PARTIAL)
    ).astype(np.int8)
    if transposed:
        both = np.swapaxes(both, 2, 3)
    tiles = both.shape[2]
    flat = np.ascontiguousarray(both.reshape(mb * mh * tiles, both.shape[3]))
    visits = (flat != EMPTY).sum(axis=1)
    base_lists = plan.lists(flat)
    rows = torch.from_numpy(base_lists).to(mask.device)
    band = None if transposed else plan.band_lists(flat, base_lists)
    return MaskPlan(
        rows=rows,
        band=None if band is None else torch.from_numpy(band).to(mask.device),
        plan_b=mh * tiles if mb > 1 else 0,
        plan_h=tiles if mh > 1 else 0,
        pairs=int(visits.sum()),
        max_visits=int(visits.max(initial=0)),
    )
