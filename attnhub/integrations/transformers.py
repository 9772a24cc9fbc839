"""attnhub as a Hugging Face transformers attention implementation.

    import attnhub.integrations.transformers as ah_hf
    ah_hf.register()                      # registers "attnhub"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="attnhub")
    # or: model.set_attn_implementation("attnhub")

:func:`register` adds an attention function to ``transformers.AttentionInterface`` and a mask
function to ``AttentionMaskInterface`` under the same name (without the mask function transformers
creates no masks for an unknown implementation, and causal masking would be lost). The mask function
(:mod:`attnhub.integrations.hf_masks`) turns each model-level mask into attnhub arguments once per
forward; the attention function sends every attention call to :func:`attnhub.attention` (or
:func:`attnhub.attention_varlen` for packed sequences) with GQA native, softcap, sinks and position
biases (with their gradients) passed through. What it cannot serve raises :class:`AttnhubHFError`
with the reason; it never computes attention any other way. :func:`stats` counts the calls.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

import attnhub
from attnhub.integrations.hf_masks import AttnhubMask, attnhub_mask

__all__ = ["AttnhubHFError", "AttnhubMask", "Stats", "attention_forward", "register", "reset_stats", "stats"]


class AttnhubHFError(ValueError):
    """An attention call of a transformers model that the attnhub integration cannot serve."""


@dataclass
class Stats:
    """Counts of the attention calls served by attnhub since the last :func:`reset_stats`.

    ``calls``: every call; ``kinds``: by mask kind ("causal", "sliding", "full", "packed", "dense",
    "tensor", "none"); ``features``: calls using "bias", "softcap", "sinks", "lengths", "offsets",
    "varlen", "none_end".
    """

    calls: int = 0
    kinds: Counter = field(default_factory=Counter)
    features: Counter = field(default_factory=Counter)

    def reset(self) -> None:
        """Zero every count in place (whoever holds this object sees the zeroes, then new counts)."""
        self.calls = 0
        self.kinds.clear()
        self.features.clear()

    def record(self, kind: str, **used: bool) -> None:
        self.calls += 1
        self.kinds[kind] += 1
        for name, on in used.items():
            if on:
                self.features[name] += 1


_STATS = Stats()


def stats() -> Stats:
    """The live call counter (shared by every registered name): the same object for the whole
    process, so one taken before :func:`reset_stats` goes on counting after it."""
    return _STATS


def reset_stats() -> None:
    """Zero the call counter in place."""
    _STATS.reset()


def _refuse(module: Any, dropout: float, kwargs: dict[str, Any]) -> None:
    if dropout and dropout > 0.0:
        raise AttnhubHFError(
            f"attention dropout {dropout} requested (the module is in training mode): attnhub computes exact "
            "attention without dropout; set the config's attention dropout to 0 or train with another "
            "attn_implementation"
        )
    if kwargs.get("output_attentions"):
        raise AttnhubHFError(
            "output_attentions=True: attnhub never materialises the attention weights; "
            "use attn_implementation='eager' to inspect them"
        )
    if kwargs.get("cache") is not None:
        raise AttnhubHFError(
            "a PagedAttentionCache (continuous batching) was passed: the transformers integration of attnhub "
            "does not serve paged caches yet; use generate() with a DynamicCache or StaticCache"
        )


def _varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: AttnhubMask | None,
    common: dict[str, Any],
    kwargs: dict[str, Any],
    is_causal: bool,
) -> torch.Tensor:
    """Packed sequences: attnhub.attention_varlen over the flattened (B·L) tokens."""
    b, hq, lq, _ = query.shape
    lk = key.shape[2]
    if kwargs.get("cu_seq_lens_q") is not None:
        if mask is not None and (mask.dense or mask.k_lengths is not None or mask.sync != "none_front"):
            raise AttnhubHFError(
                "cu_seq_lens_q/k were passed together with a padding mask or a KV cache: packed sequences "
                "must come without attention_mask and without past_key_values"
            )
        cu_q = kwargs["cu_seq_lens_q"].to(device=query.device, dtype=torch.int32)
        cu_k = kwargs["cu_seq_lens_k"].to(device=query.device, dtype=torch.int32)
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    else:
        cu_q = cu_k = mask.cu_seqlens.to(query.device)
        max_q = max_k = mask.max_seqlen
    rule = mask.rule if mask is not None else (attnhub.Causal() if is_causal else attnhub.Full())
    q = query.transpose(1, 2).reshape(b * lq, hq, query.shape[-1])
    k = key.transpose(1, 2).reshape(b * lk, key.shape[1], key.shape[-1])
    v = value.transpose(1, 2).reshape(b * lk, value.shape[1], value.shape[-1])
    out = attnhub.attention_varlen(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_seqlen_q=None if max_q is None else int(max_q),
        max_seqlen_k=None if max_k is None else int(max_k),
        mask=rule,
        **common,
    )
    return out.reshape(b, lq, hq, value.shape[-1])


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
    *,
    backend: str = "auto",
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), returns
    ``(out (B, Lq, Hq, Dv), None)``. ``sliding_window`` is ignored: the window comes with the mask,
    as for eager attention."""
    _refuse(module, dropout, kwargs)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    common: dict[str, Any] = {"scale": scaling, "backend": backend}
    if softcap is not None:
        common["softcap"] = float(softcap)
    if s_aux is not None:
        common["sinks"] = s_aux
    mask = attention_mask if isinstance(attention_mask, AttnhubMask) else None
    used = {"softcap": softcap is not None, "sinks": s_aux is not None, "bias": position_bias is not None}

    if (mask is not None and mask.cu_seqlens is not None) or kwargs.get("cu_seq_lens_q") is not None:
        if position_bias is not None:
            raise AttnhubHFError(
                "a position bias with packed sequences: attnhub.attention_varlen takes no bias; "
                "unpack the batch (pad it and pass attention_mask)"
            )
        out = _varlen(query, key, value, mask, common, kwargs, causal)
        _STATS.record("packed", varlen=True, **used)
        return out, None

    args: dict[str, Any] = dict(common)
    if position_bias is not None:
        args["bias"] = position_bias
    lq, lk = query.shape[2], key.shape[2]
    if mask is not None:
        if (mask.q_length, mask.kv_length) != (lq, lk):
            raise AttnhubHFError(
                f"the model's mask was made for {mask.q_length} queries x {mask.kv_length} keys but attention "
                f"got {lq} x {lk}; this model slices its keys after mask creation, which the attnhub "
                "integration does not follow"
            )
        rule = mask.rule.to(query.device) if mask.dense else mask.rule
        args.update(mask=rule, sync=mask.sync)
        if mask.q_offset or mask.k_offset:
            args.update(q_offset=mask.q_offset, k_offset=mask.k_offset)
        if mask.k_lengths is not None:
            args.update(k_lengths=mask.k_lengths.to(query.device), padding_side=mask.padding_side)
        kind = mask.kind
        used.update(
            lengths=mask.k_lengths is not None,
            offsets=bool(mask.q_offset or mask.k_offset),
            none_end=mask.sync == "none_end",
        )
    elif isinstance(attention_mask, torch.Tensor):
        if attention_mask.dim() != 4:
            raise AttnhubHFError(f"a {attention_mask.dim()}-D attention mask tensor; expected a 4-D one")
        kind = "tensor"
        if attention_mask.dtype == torch.bool:
            args["mask"] = attention_mask
        else:  # an additive float mask, as eager adds it: a bias with the rule Full
            args["bias"] = attention_mask if position_bias is None else position_bias + attention_mask
            used["bias"] = True
    elif attention_mask is None:
        kind = "none"
        if causal and lq not in (1, lk):
            raise AttnhubHFError(
                f"a causal attention call without a mask and {lq} queries against {lk} keys: where the queries "
                "sit is ambiguous; create the model's masks through transformers.masking_utils or pass one"
            )
        args.update(mask=attnhub.Causal() if causal and lq > 1 else attnhub.Full())
    else:
        raise AttnhubHFError(
            f"attention_mask of type {type(attention_mask).__name__}: the model was prepared for another "
            "attn_implementation; set attn_implementation='attnhub' before creating its masks"
        )
    out = attnhub.attention(query, key, value, **args)
    _STATS.record(kind, **used)
    return out.transpose(1, 2).contiguous(), None


def register(name: str = "attnhub", backend: str = "auto") -> str:
    """Register attnhub under ``name`` with transformers' attention and mask interfaces.

    ``backend`` is passed to every :func:`attnhub.attention` call ("auto" or a backend's name).
    Returns ``name``, for ``attn_implementation=``.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    def attnhub_attention(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return attention_forward(*args, backend=backend, **kwargs)

    AttentionInterface.register(name, attnhub_attention)
    AttentionMaskInterface.register(name, attnhub_mask)
    return name
