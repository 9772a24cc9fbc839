"""Hugging Face mask requests turned into attnhub arguments, without building a dense 4-D mask.

transformers creates a model's masks once per forward through ``AttentionMaskInterface``: it passes
the mask pattern as a function of indices (causal, sliding window, bidirectional, packed
sequences...), the 2-D padding mask and the query/key offsets of the KV cache. :func:`attnhub_mask`
recognises the patterns that attnhub expresses natively (a rule, key lengths with a padding side,
a sync mode or position offsets, packed sequences as varlen) and returns an :class:`AttnhubMask`
that every attention call of the model then receives as its ``attention_mask``. A pattern it does
not recognise (e.g. image-token overlays, chunked attention, padding on both sides) is evaluated by
transformers' own ``sdpa_mask`` into a boolean mask: exact, counted in the stats as ``dense_masks``.

Positions (transformers' convention): query i sits at ``q_offset + i``, key j at ``kv_offset + j``;
a key is attended iff the pattern allows the pair and the 2-D mask marks column ``kv_offset + j``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import masking_utils as mu

import attnhub


@dataclass(frozen=True, eq=False)
class AttnhubMask:
    """What one model-level mask means to attnhub (passed to every layer as ``attention_mask``).

    - ``rule``: the attnhub rule (``Full``, ``Causal`` or ``Local``), or a boolean tensor
      (B, 1, Lq, Lk) for a pattern that attnhub cannot express otherwise (``dense``).
    - ``sync``, ``q_offset``, ``k_offset``: how query and key positions line up (SPEC §2, §11).
    - ``k_lengths``, ``padding_side``: valid keys per batch entry (SPEC §10); None when unpadded.
    - ``cu_seqlens``: (N + 1,) int32 boundaries of packed sequences over the flattened batch
      (B·L tokens), or None; then ``rule`` applies within each sequence.
    - ``q_length``, ``kv_length``: the sizes the mask was made for (checked against q and k).
    """

    rule: Any
    q_length: int
    kv_length: int
    sync: str = "none_front"
    q_offset: int = 0
    k_offset: int = 0
    k_lengths: Any = None
    padding_side: str = "right"
    cu_seqlens: Any = None
    max_seqlen: int = 0
    kind: str = "causal"

    @property
    def dense(self) -> bool:
        return isinstance(self.rule, torch.Tensor)

    @property
    def shape(self) -> tuple[int, ...]:
        """Like a (B, 1, Lq, Lk) mask, for model code that only reads the sizes."""
        b = self.k_lengths.shape[0] if self.k_lengths is not None else 1
        return (b, 1, self.q_length, self.kv_length)


def _closure(fn: Any) -> dict[str, Any]:
    """The variables a transformers mask closure captured, by name (empty if none)."""
    cells = getattr(fn, "__closure__", None) or ()
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    return {n: c.cell_contents for n, c in zip(names, cells)}


def _is(fn: Any, factory: Any) -> bool:
    """Whether ``fn`` is the inner function made by the transformers factory ``factory``."""
    return getattr(fn, "__qualname__", "") == f"{factory.__name__}.<locals>.inner_mask" and (
        getattr(fn, "__module__", "") == mu.__name__
    )


def _and_parts(fn: Any) -> tuple[Any, ...] | None:
    if getattr(fn, "__qualname__", "") == "and_masks.<locals>.and_mask":
        return tuple(_closure(fn).get("mask_functions", ()))
    return None


def recognise(fn: Any) -> tuple[str, Any] | None:
    """The attnhub rule of a transformers mask pattern whose meaning depends only on the query
    position minus the key position, as ``(kind, rule)``; None if it is not one of those."""
    if fn is mu.causal_mask_function:
        return "causal", attnhub.Causal()
    if fn is mu.bidirectional_mask_function:
        return "full", attnhub.Full()
    parts = _and_parts(fn)
    if parts is None or len(parts) != 2:
        return None
    overlay, base = parts
    # sliding_window_overlay: kv_idx > q_idx - w, with causal: 0 <= q - k < w = Local(w, causal).
    if base is mu.causal_mask_function and _is(overlay, mu.sliding_window_overlay):
        w = int(_closure(overlay)["sliding_window"])
        return "sliding", attnhub.Local(w, causal=True)
    # sliding_window_bidirectional_overlay: |q - k| <= w, i.e. Local(w + 1).
    if base is mu.bidirectional_mask_function and _is(overlay, mu.sliding_window_bidirectional_overlay):
        w = int(_closure(overlay)["sliding_window"])
        return "sliding", attnhub.Local(w + 1)
    return None


def _packed(fn: Any) -> tuple[Any, tuple[str, Any]] | None:
    """(packed_sequence_mask, inner rule) of transformers' packed-sequence pattern, else None."""
    parts = _and_parts(fn)
    if parts is None or len(parts) != 2:
        return None
    seq, remap = parts
    if not (
        _is(seq, mu.packed_sequence_mask_function) and _is(remap, mu.remap_positions_for_packed_sequence)
    ):
        return None
    inner = recognise(_closure(remap)["mask_function"])
    if inner is None:
        return None
    return _closure(seq)["packed_sequence_mask"], inner


def cu_seqlens_of(segment_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Boundaries (N + 1,) int32 of the runs of equal ids in each row of ``segment_ids`` (B, L),
    over the flattened B·L tokens (a row start always begins a sequence), and the longest run."""
    b, n = segment_ids.shape
    ids = segment_ids.to(torch.int64) + torch.arange(b, device=segment_ids.device)[:, None] * (n + 1)
    flat = ids.reshape(-1)
    starts = torch.nonzero(flat[1:] != flat[:-1]).reshape(-1) + 1
    edge = torch.tensor([0, b * n], device=flat.device, dtype=starts.dtype)
    cu = torch.cat([edge[:1], starts, edge[1:]]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    return cu, longest


def _key_padding(
    attention_mask: torch.Tensor | None, kv_length: int, kv_offset: int
) -> tuple[torch.Tensor | None, str, torch.Tensor | None]:
    """(k_lengths (B,) int32 or None, padding side, the (B, Lk) key mask) of the 2-D mask's
    columns for these keys; side "both" when some row's valid keys are not one run at one end."""
    if attention_mask is None:
        return None, "right", None
    pm = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)[:, kv_offset : kv_offset + kv_length]
    if bool(pm.all()):
        return None, "right", pm
    counts = pm.sum(dim=1, dtype=torch.int32)
    cols = torch.arange(kv_length, device=pm.device)
    if bool((pm == (cols[None, :] < counts[:, None])).all()):
        return counts, "right", pm
    if bool((pm == (cols[None, :] >= (kv_length - counts)[:, None])).all()):
        return counts, "left", pm
    return counts, "both", pm


def _relative_placement(
    d: int, q_length: int, kv_length: int, side: str, padded: bool
) -> tuple[str, int, int] | None:
    """(sync, q_offset, k_offset) that put attnhub's positions at transformers' ones for a pattern
    depending on ``P - R`` only; ``d`` is query 0's position minus key 0's. None if none can.

    Unpadded: ``P - R = i - j + d``. ``none_end`` gives ``i - j + Lk - Lq``; ``none_front`` with
    offsets gives ``i - j + q_offset - k_offset``. Left padding (valid keys last, all queries kept):
    ``none_end`` on the valid keys gives transformers' positions iff the last query and the last
    key are aligned (``d == Lk - Lq``). Right padding: ``none_front`` and offsets, as unpadded.
    """
    if padded and side == "left":
        return ("none_end", 0, 0) if d == kv_length - q_length else None
    if not padded and d == kv_length - q_length:
        return "none_end", 0, 0
    return "none_front", max(d, 0), max(-d, 0)


def attnhub_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = mu.causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> AttnhubMask:
    """transformers' ``AttentionMaskInterface`` function for attnhub (see the module docstring)."""
    q_offset, kv_offset = int(q_offset), int(kv_offset)  # StaticCache passes tensors
    packed = _packed(mask_function)
    if packed is not None:
        segment_ids, (kind, rule) = packed
        cu, longest = cu_seqlens_of(segment_ids.expand(batch_size, -1))
        return AttnhubMask(rule, q_length, kv_length, cu_seqlens=cu, max_seqlen=longest, kind="packed")
    found = recognise(mask_function)
    k_lengths, side, pm = _key_padding(attention_mask, kv_length, kv_offset)
    if found is not None and isinstance(found[1], attnhub.Full):
        if side == "both":  # keys kept by a (B, 1, 1, Lk) boolean mask, not a 4-D one
            return AttnhubMask(pm[:, None, None, :], q_length, kv_length, kind="dense")
        return AttnhubMask(found[1], q_length, kv_length, "none_front", 0, 0, k_lengths, side, kind="full")
    if found is not None and side != "both":
        kind, rule = found
        placed = _relative_placement(q_offset - kv_offset, q_length, kv_length, side, k_lengths is not None)
        if placed is not None:
            sync, qo, ko = placed
            return AttnhubMask(rule, q_length, kv_length, sync, qo, ko, k_lengths, side, kind=kind)
    dense = mu.sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
        allow_is_bidirectional_skip=False,
        use_vmap=bool(kwargs.get("use_vmap", False)),
        device=kwargs.get("device", "cpu"),
    )
    return AttnhubMask(dense, q_length, kv_length, kind="dense")
