"""Merge a block's partial result into the accumulated rows by lse.

The forward accumulates ``(O, lse)`` in float32 (float64 for float64 inputs): merging block
``b`` into rows already holding ``(O, L)`` gives ``L' = logaddexp(L, lse_b)`` and
``O' = O·exp(L − L') + O_b·exp(lse_b − L')``; rows masked so far (``L = −inf``) stay exact.
"""

from __future__ import annotations

from typing import Any

import torch

from attnhub import settings


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge_into(
    acc_o: Any, acc_lse: Any, o_b: Any, lse_b: Any, lo: int, hi: int, fresh: bool, out: Any = None,
    prev: tuple[Any, Any] | None = None,
) -> None:  # fmt: skip
    """Merge a block's (out, lse) into rows ``lo:hi``; ``fresh`` rows hold nothing yet (a copy).
    ``out`` (another dtype than ``acc_o``): also write the merged rows there, rounded. ``prev``:
    an earlier block's (out, lse) of these rows, not yet written: the rows become the merge of
    the two (what a fresh copy of ``prev`` and a merge give, in one pass)."""
    a_o, a_l = acc_o[:, :, lo:hi], acc_lse[:, :, lo:hi]
    o_out = None if out is None else out[:, :, lo:hi]
    if _fused(acc_o):
        from attnhub.distributed import merge_kernel

        merge_kernel.merge(a_o, a_l, o_b, lse_b, fresh, o_out, prev)
        return
    if prev is not None:
        a_o.copy_(prev[0])
        a_l.copy_(prev[1])
    if fresh:
        a_o.copy_(o_b)
        a_l.copy_(lse_b)
    else:
        l_b = lse_b.to(a_l.dtype)
        new = torch.logaddexp(a_l, l_b)
        ref = new.nan_to_num(neginf=0.0)  # rows masked in both: weights exp(-inf) = 0
        wa, wb = (a_l - ref).exp_().unsqueeze(-1), (l_b - ref).exp_().unsqueeze(-1)
        a_o.mul_(wa).add_(o_b * wb)
        a_l.copy_(new)
    if o_out is not None:
        o_out.copy_(a_o)


def _fused(acc_o: Any) -> bool:
    """The Triton merge: float32 accumulators on a CUDA device (or under TRITON_INTERPRET=1 for
    tests), unless ATTNHUB_CP_TORCH_MERGE=1."""
    if acc_o.dtype != torch.float32 or settings.value("ATTNHUB_CP_TORCH_MERGE"):
        return False
    if not acc_o.is_cuda and (settings.external("TRITON_INTERPRET") or "0") != "1":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
