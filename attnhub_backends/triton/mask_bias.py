"""A boolean mask composed with SPEC §10's lengths, run by the ragged kernels as an additive bias.

The ragged kernels take lengths (padded tiles skipped) and a bias, not a mask array: the mask
becomes ``0`` / ``−inf`` (float32, the mask's own broadcast shape), added to the caller's bias if
there is one. A −inf logit excludes its pair exactly as the mask does (SPEC §9), rows it empties
give out 0 and lse −inf, and the backward's probabilities there are exact zeros. The caller's
dbias is the combined bias's gradient summed back over the dimensions the mask broadcast it to.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnhub.request import Request
from attnhub.rules import ExplicitMask, Full
from attnhub_backends.triton.modifiers import dbias_from


def applies(req: Request) -> bool:
    """A ragged request with a boolean mask array."""
    return req.ragged and isinstance(req.rule, ExplicitMask) and req.rule.kind == "bool"


def as_bias(req: Request, mask: Any, operands: Any) -> tuple[Request, Any]:
    """(request with the rule Full and the combined bias, operands carrying it)."""
    import torch

    keep = mask.reshape(req.rule.shape)
    if keep.dtype != torch.bool:
        keep = keep != 0
    add = torch.zeros(keep.shape, dtype=torch.float32, device=keep.device).masked_fill_(~keep, float("-inf"))
    bias = operands.bias if operands is not None else None
    if bias is not None:
        bias = bias.reshape(req.bias) if bias.dim() != 4 else bias
        add = bias.detach().float() + add  # broadcast to both shapes
    new = dataclasses.replace(req, rule=Full(), bias=tuple(add.shape), bias_grad=req.bias_grad)
    return new, dataclasses.replace(operands, bias=add)


def user_dbias(grads: tuple, req: Request, combined: Request, operands: Any) -> tuple:
    """``grads`` with dbias summed back from the combined bias's shape to the caller's."""
    if len(grads) < 4 or grads[3] is None or not req.bias_grad:
        return grads if req.bias is not None or req.sinks else grads[:3]
    dbias = dbias_from(grads[3], req.bias, operands.bias.dtype).reshape(operands.bias.shape)
    return (*grads[:3], dbias, *grads[4:])
