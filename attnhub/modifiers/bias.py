"""SPEC §9 ``bias``: an additive float array broadcastable to (B, Hq, Nq, Nk), differentiable."""

from __future__ import annotations

from typing import Any

from attnhub.frameworks import adapter_for
from attnhub.modifiers.arrays import check_float_array
from attnhub.modifiers.base import Call, ScoreModifier


class Bias(ScoreModifier):
    """``s = t + bias``; a float ``mask=`` is the same thing (validated under the name "mask").

    Built in: the request keeps ``bias`` (the rank-4 broadcast shape) and ``bias_grad``; backends
    get the array as ``Operands.bias``; differentiated, it needs the feature "dbias" too
    (attnhub.dispatch)."""

    name = "bias"
    feature = "bias"
    missing = "does not take an additive bias (bias=, or a float mask) with this request"

    def signature(self, value: Any, call: Call, from_mask: bool = False) -> tuple[tuple[int, ...], bool]:
        """(rank-4 shape, requires grad)."""
        shape = check_float_array(
            "mask" if from_mask else "bias", value, call.ad, call.device, call.dtype,
            (call.batch, call.heads_q, call.nq, call.nk), from_mask,
        )  # fmt: skip
        return shape, adapter_for(value, "bias").mask_needs_grad(value)

    def used(self, req: Any) -> bool:
        return req.bias is not None

    def describe(self, req: Any) -> str:
        return f"bias{'x'.join(map(str, req.bias))}" + (" bias-grad" if req.bias_grad else "")


MODIFIER = Bias()
