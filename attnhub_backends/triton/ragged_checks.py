"""What the triton backend's ragged kernels (SPEC §10-§11) decline, without importing torch."""

from __future__ import annotations

from attnhub.request import Request
from attnhub.rules import ExplicitMask


def reasons(req: Request) -> list[str]:
    """Why the ragged kernels cannot serve ``req`` (empty when they can)."""
    out = []
    if isinstance(req.rule, ExplicitMask) and (req.rule.kind != "bool" or req.varlen or req.paged):
        out.append(
            "combines only a boolean mask array with q_lengths/k_lengths (as an additive bias), not "
            "with attention_varlen or a paged cache; use backend='reference'"
        )
    if req.paged and (req.needs_grad or req.sinks_grad or req.bias_grad):
        out.append("reads paged KV caches forward only; call attention_kvcache under torch.no_grad()")
    if req.ndim != 1:
        out.append("takes ragged sequences (lengths, varlen, paged) in 1-d only")
    return out
