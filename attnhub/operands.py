"""The arrays beyond q, k and v that SPEC §9-§11 add, as a backend receives them.

The request (:class:`attnhub.request.Request`) says which are present; the arrays themselves
travel here, canonical and in the caller's framework and device, so that the request stays a
hashable signature. A backend receives them (its methods' ``operands``) only for requests that use
them, and only when it declared the matching feature ("bias", "sinks", "lengths", "varlen",
"paged", or an added modifier's feature); otherwise ``operands`` is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, init=False)
class Operands:
    """§9-§11 arrays of one call (None where absent).

    - ``bias``: float, rank 4, broadcastable to (B, Hq, Nq, Nk) (``Request.bias`` is its shape);
      float32 or the input dtype. With ``Request.bias_grad`` the backward returns ``dbias`` of
      exactly this shape (summed over the broadcast dimensions).
    - ``sinks``: (Hq,) float32 or the input dtype, contiguous (torch); with ``Request.sinks_grad`` the backward returns
      ``dsinks`` of shape (Hq,).
    - ``q_lengths`` / ``k_lengths``: (B,) int32 on the inputs' device (contiguous for torch, as
      are the cu_seqlens and the block table), values in [0, L].
    - ``cu_seqlens_q`` / ``cu_seqlens_k``: (N + 1,) int32 on the inputs' device (varlen);
      ``max_seqlen_q`` / ``max_seqlen_k``: Python ints, the longest sequence (for grid sizing).
    - ``block_table``: (B, max_blocks) int32 on the inputs' device (paged KV cache), with
      ``k_lengths`` giving each batch entry's number of valid keys.
    - ``more``: name -> array of the score modifiers added since SPEC's first edition
      (:mod:`attnhub.modifiers`; ``ScoreModifier.operand`` says what each holds), or None.
    """

    bias: Any = None
    sinks: Any = None
    q_lengths: Any = None
    k_lengths: Any = None
    cu_seqlens_q: Any = None
    cu_seqlens_k: Any = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    block_table: Any = None
    more: Any = None

    def __init__(
        self,
        bias: Any = None,
        sinks: Any = None,
        q_lengths: Any = None,
        k_lengths: Any = None,
        cu_seqlens_q: Any = None,
        cu_seqlens_k: Any = None,
        max_seqlen_q: int = 0,
        max_seqlen_k: int = 0,
        block_table: Any = None,
        more: Any = None,
    ) -> None:
        # Built on every call that has operands: one dict update, not the generated __init__'s
        # object.__setattr__ per field (a frozen instance still refuses assignment).
        self.__dict__.update(
            bias=bias, sinks=sinks, q_lengths=q_lengths, k_lengths=k_lengths, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            block_table=block_table, more=more,
        )  # fmt: skip
