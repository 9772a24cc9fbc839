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

import inspect
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

    # generate() prepares the masks of compileable (static) caches itself, calls .contiguous() on
    # them and passes them back as the model's attention_mask, which transformers then treats as a
    # prepared 4-D mask (ndim 4); attnhub_mask returns such a descriptor unchanged.
    ndim = 4

    def contiguous(self) -> AttnhubMask:
        return self


def _closure(fn: Any) -> dict[str, Any]:
    """The variables a transformers mask closure captured, by name (empty if none)."""
    cells = getattr(fn, "__closure__", None) or ()
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    return {n: c.cell_contents for n, c in zip(names, cells)}


def _is(fn: Any, factory: str) -> bool:
    """Whether ``fn`` is the inner function made by transformers' mask factory named ``factory``."""
    return getattr(fn, "__qualname__", "") == f"{factory}.<locals>.inner_mask" and (
        getattr(fn, "__module__", "") == mu.__name__
    )


def _and_parts(fn: Any) -> tuple[Any, ...] | None:
    if getattr(fn, "__qualname__", "") == "and_masks.<locals>.and_mask":
        return tuple(_closure(fn).get("mask_functions", ()))
    return None


def _expected(rule: Any, d: torch.Tensor) -> torch.Tensor:
    """Which pairs ``rule`` attends, from ``d`` = query position minus key position (1-d)."""
    if isinstance(rule, attnhub.Full):
        return torch.ones_like(d, dtype=torch.bool)
    if isinstance(rule, attnhub.Causal):
        return d >= 0
    ok = d.abs() < rule.window
    return ok & (d >= 0) if rule.causal else ok


def _behaves_as(fn: Any, rule: Any, span: int) -> bool:
    """Whether transformers' pattern ``fn`` equals ``rule`` on a small grid of positions: the
    recognition by name is checked against what the function computes, so a transformers version
    that changed a pattern's meaning gets a dense mask, never a wrong rule."""
    idx = torch.arange(span)
    zero = torch.zeros((), dtype=torch.long)
    try:
        got = fn(zero, zero, idx[:, None], idx[None, :])
    except Exception:  # a pattern that needs more than positions (e.g. per-batch data)
        return False
    want = _expected(rule, idx[:, None] - idx[None, :])
    return isinstance(got, torch.Tensor) and bool((got.expand_as(want) == want).all())


def _by_name(fn: Any) -> tuple[str, Any] | None:
    if fn is mu.causal_mask_function:
        return "causal", attnhub.Causal()
    if fn is getattr(mu, "bidirectional_mask_function", None):
        return "full", attnhub.Full()
    parts = _and_parts(fn)
    if parts is None or len(parts) != 2:
        return None
    overlay, base = parts
    # sliding_window_overlay: kv_idx > q_idx - w, with causal: 0 <= q - k < w = Local(w, causal).
    if base is mu.causal_mask_function and _is(overlay, "sliding_window_overlay"):
        return "sliding", attnhub.Local(int(_closure(overlay)["sliding_window"]), causal=True)
    # sliding_window_bidirectional_overlay: |q - k| <= w, i.e. Local(w + 1).
    if base is getattr(mu, "bidirectional_mask_function", None) and _is(
        overlay, "sliding_window_bidirectional_overlay"
    ):
        return "sliding", attnhub.Local(int(_closure(overlay)["sliding_window"]) + 1)
    return None


def recognise(fn: Any) -> tuple[str, Any] | None:
    """The attnhub rule of a transformers mask pattern whose meaning depends only on the query
    position minus the key position, as ``(kind, rule)``; None if it is not one of those."""
    found = _by_name(fn)
    if found is None:
        return None
    rule = found[1]
    span = 2 * rule.window + 3 if isinstance(rule, attnhub.Local) else 6
    return found if _behaves_as(fn, rule, span) else None


def _packed(fn: Any) -> tuple[Any, tuple[str, Any]] | None:
    """(packed_sequence_mask, inner rule) of transformers' packed-sequence pattern, else None:
    ``and_masks(packed_sequence_mask_function(ids), remap_positions_for_packed_sequence(rule, pos))``
    (transformers 5) or ``and_masks(rule, packed_sequence_mask_function(ids))`` (4.x)."""
    parts = _and_parts(fn)
    if parts is None or len(parts) != 2:
        return None
    seq = next((p for p in parts if _is(p, "packed_sequence_mask_function")), None)
    if seq is None:
        return None
    other = parts[1] if seq is parts[0] else parts[0]
    if _is(other, "remap_positions_for_packed_sequence"):
        other = _closure(other)["mask_function"]
    inner = recognise(other)
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
    pm = attention_mask.to(torch.bool)
    if (short := kv_offset + kv_length - pm.shape[-1]) > 0:  # a static cache's slots beyond the mask
        pm = torch.nn.functional.pad(pm, (0, short), value=False)
    pm = pm[:, kv_offset : kv_offset + kv_length]
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
    if not padded and d != 0 and d == kv_length - q_length:
        return "none_end", 0, 0
    return "none_front", max(d, 0), max(-d, 0)  # d == 0: plain top-left (a square prefill)


def dense_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int,
    kv_offset: int,
    mask_function: Any,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' own boolean (B, 1, Lq, Lk) mask of this pattern (``sdpa_mask``), in the
    calling convention of the installed version (query sizes, or ``cache_position`` before 5.x)."""
    params = inspect.signature(mu.sdpa_mask).parameters
    sizes: dict[str, Any] = {"kv_length": kv_length, "kv_offset": kv_offset}
    device = kwargs.get("device") or (attention_mask.device if attention_mask is not None else "cpu")
    if "cache_position" in params:
        sizes["cache_position"] = torch.arange(q_offset, q_offset + q_length, device=device)
    else:
        sizes.update(q_length=q_length, q_offset=q_offset, device=device)
    optional = {
        "allow_is_causal_skip": False,
        "allow_is_bidirectional_skip": False,
        "use_vmap": kwargs.get("use_vmap"),
    }
    sizes.update({k: v for k, v in optional.items() if k in params and v is not None})
    return mu.sdpa_mask(
        batch_size=batch_size, mask_function=mask_function, attention_mask=attention_mask, **sizes
    )


def attnhub_mask(
    batch_size: int,
    q_length: int | None = None,
    kv_length: int = 0,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = mu.causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    cache_position: torch.Tensor | None = None,
    **kwargs: Any,
) -> AttnhubMask:
    """transformers' ``AttentionMaskInterface`` function for attnhub (see the module docstring).
    transformers 4.x passes the query positions as ``cache_position`` (consecutive)."""
    if isinstance(attention_mask, AttnhubMask):  # prepared by generate() for this step
        return attention_mask
    if cache_position is not None:
        q_length = int(cache_position.shape[0])
        q_offset = int(cache_position[0]) if q_length else 0
        if q_length and int(cache_position[-1]) - q_offset != q_length - 1:
            raise ValueError("attnhub: cache_position is not a run of consecutive positions")
    q_length, kv_length = int(q_length), int(kv_length)
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
    dense = dense_mask(
        batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, **kwargs
    )
    return AttnhubMask(dense, q_length, kv_length, kind="dense")
