"""How a request's rule reaches an SDPA kernel: as ``is_causal``, as nothing, or as a mask array.

SDPA's ``is_causal=True`` aligns the causal mask top-left (query i attends keys j <= i). That is
SPEC's ``Causal`` exactly when the flat positions of §2 equal the flattened indices: for a 1-d
sequence under ``sync="none_front"``, and for any sequence shape and sync mode when q and k have
the same sequence shape (every sync mode then puts query i and key j at i and j). Every other rule
(``none_end`` and the ``scale_*`` modes with different lengths, ``Local``, ``Causal`` over 2-d
grids of different shapes) is materialised from :mod:`attnhub.positions`, the same code the
reference backend evaluates, as a boolean Nq x Nk matrix, so the result is exact by construction;
only up to :data:`MAX_MASK_ELEMENTS` elements, as the matrix costs memory.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from attnhub.positions import axis_affine, dense_rule_mask
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local

#: Largest rule mask (Nq * Nk elements) materialised for a kernel; larger requests are declined.
MAX_MASK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class RulePlan:
    """``causal``: pass ``is_causal=True``; ``materialise``: build the rule's mask; ``explicit``:
    the caller's mask array is passed; ``empty_rows``: some query rows may attend no key."""

    causal: bool = False
    materialise: bool = False
    explicit: bool = False
    empty_rows: bool = False
    why_not: str | None = None
    #: lengths or offsets (SPEC §10-§11): the rule is evaluated per entry (``ragged.keep_mask``)
    ragged: bool = False


def is_top_left_causal(req: Request) -> bool:
    """True when SPEC's ``Causal`` for ``req`` is SDPA's ``is_causal=True`` on the flattened sequence."""
    return req.seq_q == req.seq_k or (req.ndim == 1 and req.sync == "none_front")


def causal_attends_all(req: Request) -> bool:
    """True for a 1-d ``Causal`` whose first query sits at or after the last key, so that it
    excludes nothing: a decode step (one query under ``none_end``) needs no mask at all."""
    if req.ndim != 1 or req.nq == 0 or req.nk == 0:
        return False
    _, bq, ak, bk = axis_affine(req.nq, req.nk, req.sync)
    return bq >= ak * (req.nk - 1) + bk


@lru_cache(maxsize=256)
def rule_plan(req: Request) -> RulePlan:
    rule = req.rule
    if req.varlen:  # packed sequences: one dense plan per sequence (SdpaCpu._packed)
        return RulePlan(empty_rows=True, ragged=True)
    if req.q_lengths or req.k_lengths or req.q_offset or req.k_offset:
        elements = (req.batch if req.q_lengths or req.k_lengths else 1) * req.nq * req.nk
        if elements > MAX_MASK_ELEMENTS:
            return RulePlan(
                why_not=(
                    f"lengths or offsets need a materialised (B, 1, Nq, Nk) mask of {elements} elements "
                    f"(limit {MAX_MASK_ELEMENTS})"
                )
            )
        return RulePlan(explicit=isinstance(rule, ExplicitMask), empty_rows=True, ragged=True)
    if isinstance(rule, Full) or (isinstance(rule, Causal) and causal_attends_all(req)):
        return RulePlan()
    if isinstance(rule, ExplicitMask):
        return RulePlan(explicit=True, empty_rows=True)
    # torch's CPU kernel gives NaN for is_causal with scale 0 (and with negative scales, which
    # the backends turn positive by negating q): a zero scale takes the materialised mask.
    if isinstance(rule, Causal) and is_top_left_causal(req) and req.scale != 0:
        return RulePlan(causal=True)
    if isinstance(rule, (Causal, Local)):
        if req.nq * req.nk > MAX_MASK_ELEMENTS:
            return RulePlan(
                why_not=(
                    f"{rule.describe()} with sync={req.sync} over Sq={req.seq_q} Sk={req.seq_k} is not "
                    "SDPA's top-left is_causal and needs a materialised Nq x Nk mask of "
                    f"{req.nq * req.nk} elements (limit {MAX_MASK_ELEMENTS})"
                )
            )
        empty = bool((~bool_rule_mask(req.rule, req.seq_q, req.seq_k, req.sync).any(axis=1)).any())
        return RulePlan(materialise=True, empty_rows=empty)
    return RulePlan(why_not=f"does not support the rule {rule!r}")


@lru_cache(maxsize=16)
def bool_rule_mask(rule: Any, seq_q: tuple[int, ...], seq_k: tuple[int, ...], sync: str) -> np.ndarray:
    """The rule's Nq x Nk boolean mask (True = attend), evaluated by :mod:`attnhub.positions`."""
    m = dense_rule_mask(rule, seq_q, seq_k, sync)
    m.setflags(write=False)
    return m


_TORCH_MASKS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def torch_rule_mask(req: Request, device: Any, dtype: Any) -> Any:
    """The rule's mask as a (1, 1, Nq, Nk) torch tensor on ``device``: boolean for ``dtype=torch.bool``,
    else additive (0 attended, -inf not). A few recent ones are kept, keyed by what they depend on."""
    import torch

    key = (req.rule, req.seq_q, req.seq_k, req.sync, str(device), dtype)
    hit = _TORCH_MASKS.get(key)
    if hit is None:
        keep = torch.from_numpy(bool_rule_mask(req.rule, req.seq_q, req.seq_k, req.sync).copy()).to(device)
        if dtype == torch.bool:
            hit = keep
        else:
            hit = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill_(~keep, float("-inf"))
        hit = hit[None, None]
        with _LOCK:
            if len(_TORCH_MASKS) >= 8:
                _TORCH_MASKS.pop(next(iter(_TORCH_MASKS)), None)
            _TORCH_MASKS[key] = hit
    return hit
