"""SPEC §9's ALiBi for the SDPA backends: the term ``−slope·|P(i) − R(j)|`` as an additive mask.

SDPA has no ALiBi of its own, so the term is materialised, (B | 1, Hq, Nq, Nk), and added to the
bias (the caller's, if any) that reaches the kernel as ``attn_mask``. Dense 1-d requests only:
with lengths each entry has its own positions (declined, ``reasons``).
"""

from __future__ import annotations

from typing import Any

from attnhub.modifiers.alibi import MODIFIER, float32_alibi_problem, float64_alibi_problem
from attnhub.positions import axis_affine
from attnhub.request import Request


def used(req: Request) -> bool:
    return MODIFIER.used(req)


def reasons(req: Request) -> list[str]:
    """Why the SDPA backends cannot add ``req``'s ALiBi term (empty when they can)."""
    if not used(req):
        return []
    if req.ragged:
        return [
            "adds ALiBi (alibi_slopes=) to dense batches only, not with q_lengths/k_lengths or "
            "attention_varlen; use backend='reference'"
        ]
    why = float64_alibi_problem(req) if req.dtype == "float64" else float32_alibi_problem(req)
    return [why] if why else []


def with_alibi(bias: Any, req: Request, operands: Any, q: Any, dtype: Any) -> Any:
    """``bias`` (or None) plus ``req``'s ALiBi term, in ``dtype``; ``bias`` itself without ALiBi.
    The term is formed in float64 (exact for every position of SPEC §11) and rounded once."""
    slopes = operands.more.get(MODIFIER.name) if operands is not None and operands.more else None
    if slopes is None:
        return bias
    import torch

    (nq,), (nk,) = req.seq_q, req.seq_k
    aq, bq, ak, bk = axis_affine(nq, nk, req.sync)
    pq = torch.arange(nq, device=q.device, dtype=torch.int64) * aq + (bq + req.q_offset)
    pk = torch.arange(nk, device=q.device, dtype=torch.int64) * ak + (bk + req.k_offset)
    dist = (pq[:, None] - pk[None, :]).abs().to(torch.float64)
    term = -slopes.to(torch.float64)[:, :, None, None] * dist
    total = term if bias is None else bias.to(torch.float64) + term
    return total.to(dtype)
