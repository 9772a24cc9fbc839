"""Boolean masks that are padding patterns, recognised exactly and run as SPEC §10 lengths.

A (B or 1, 1, Lq, Lk) boolean mask that equals, element for element, "each entry's valid queries
against its valid keys" (optionally causal on the valid segments, aligned top-left or
bottom-right), with every entry's valid rows and keys a prefix (right padding) or a suffix (left
padding), is the attention of ``q_lengths``/``k_lengths``: SPEC §3 gives a row without keys out 0
and lse -inf, and §10 gives padded query rows the same. That is the mask SDPA users and Hugging
Face's sdpa path build for padded batches. The ragged kernels skip padded tiles without reading a
mask byte; on the H100 the padded causal case (B 8, H 16, L 4k, D 128) ran 0.70 ms as lengths
against 1.05 ms with the mask (tools/dev/probe_s3.py at 0dabcb3).

The whole mask is compared once per mask identity (cached like mask_summary's plans: data pointer,
version, shape, strides, device), so a mask passed to every layer is checked once; anything else
keeps the mask kernels. A CUDA graph capture uses the verdict of an eager warm-up call with the
same mask and recognises nothing itself (that reads a verdict on the host).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from attnhub.operands import Operands
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Rule
from attnhub_backends.triton.mask_summary import mask_key

#: Masks whose verdicts are kept (each entry holds its mask alive, so its memory is not reused).
CACHE_SIZE = 4


@dataclass(frozen=True)
class LengthsForm:
    """The lengths request a mask equals: rule and sync on the valid segments, padding side, and
    the (B,) int32 lengths on the mask's device."""

    rule: Rule
    sync: str
    side: str
    q_lengths: Any
    k_lengths: Any

    def request(self, req: Request) -> Request:
        return dataclasses.replace(
            req, rule=self.rule, sync=self.sync, q_lengths=True, k_lengths=True, padding_side=self.side
        )

    def operands(self) -> Operands:
        return Operands(q_lengths=self.q_lengths, k_lengths=self.k_lengths)


_CACHE: OrderedDict[tuple, tuple[Any, LengthsForm | None]] = OrderedDict()


def eligible(req: Request) -> bool:
    """A plain boolean-mask request the ragged kernels could serve as lengths (1-d, one mask head,
    no modifiers, no §10/§11 arguments)."""
    rule = req.rule
    return (
        isinstance(rule, ExplicitMask) and rule.kind == "bool" and rule.shape[1] == 1 and req.ndim == 1
        and not req.modified and not req.ragged and req.q_offset == 0 and req.k_offset == 0
    )  # fmt: skip


def lengths_form(mask: Any, req: Request) -> LengthsForm | None:
    """The :class:`LengthsForm` that ``mask`` (torch bool, rank 4) equals, or None."""
    import torch

    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
        return None
    key = mask_key(mask)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit[1]  # also under a capture: a warm-up call's verdict, no host read
    if _capturing(mask):
        return None  # recognising reads a verdict on the host: the mask kernels take it
    form = _recognise(mask[:, 0], req.batch)
    _CACHE[key] = (mask, form)
    if len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return form


def _capturing(mask: Any) -> bool:
    """A CUDA graph capture is under way on the mask's device (no host read may happen)."""
    import torch

    return bool(mask.is_cuda and torch.cuda.is_current_stream_capturing())


def _recognise(m: Any, batch: int) -> LengthsForm | None:
    """Compare ``m`` (mb, Lq, Lk) with the padding patterns its row and column counts imply."""
    import torch

    mb, lq, lk = m.shape
    rows, cols = m.any(dim=2), m.any(dim=1)  # (mb, Lq) queries with a key, (mb, Lk) keys attended
    nq, nk = rows.sum(dim=1, dtype=torch.int32), cols.sum(dim=1, dtype=torch.int32)
    iq = torch.arange(lq, device=m.device, dtype=torch.int32)
    ik = torch.arange(lk, device=m.device, dtype=torch.int32)
    for side in ("right", "left"):
        sq = torch.zeros_like(nq) if side == "right" else lq - nq  # first valid row / key
        sk = torch.zeros_like(nk) if side == "right" else lk - nk
        vq = (iq >= sq[:, None]) & (iq < (sq + nq)[:, None])
        vk = (ik >= sk[:, None]) & (ik < (sk + nk)[:, None])
        if not (torch.equal(vq, rows) and torch.equal(vk, cols)):
            continue
        valid = vq[:, :, None] & vk[:, None, :]
        i_seg = (iq[None, :] - sq[:, None])[:, :, None]
        j_seg = (ik[None, :] - sk[:, None])[:, None, :]
        for rule, sync, shift in (
            (Causal(), "none_front", 0),
            (Causal(), "none_end", (nk - nq)[:, None, None]),
            (Full(), "none_front", None),
        ):
            pattern = valid if shift is None else valid & (j_seg <= i_seg + shift)
            if torch.equal(pattern, m):
                if mb != batch:
                    nq, nk = nq.expand(batch).contiguous(), nk.expand(batch).contiguous()
                return LengthsForm(rule, sync, side, nq, nk)
    return None
