"""SPEC §9 ``sinks``: (Hq,) logits of a virtual key of value zero that joins every row's softmax."""

from __future__ import annotations

from typing import Any

from attnhub.errors import SpecError
from attnhub.frameworks import adapter_for
from attnhub.modifiers.arrays import check_float_array
from attnhub.modifiers.base import Call, ScoreModifier


class Sinks(ScoreModifier):
    """Built in: the request keeps ``sinks`` and ``sinks_grad``; backends get the array as
    ``Operands.sinks`` (contiguous: kernels index ``sinks[h]``)."""

    name = "sinks"
    feature = "sinks"
    missing = "does not take attention sinks"

    def signature(self, value: Any, call: Call) -> bool:
        """Whether the caller differentiates the sinks."""
        shape = check_float_array("sinks", value, call.ad, call.device, call.dtype, None)
        if shape != (call.heads_q,):
            raise SpecError("sinks.shape", f"({call.heads_q},) (one logit per query head)", shape)
        return adapter_for(value, "sinks").mask_needs_grad(value)

    def used(self, req: Any) -> bool:
        return req.sinks

    def describe(self, req: Any) -> str:
        return "sinks" + ("-grad" if req.sinks_grad else "")


MODIFIER = Sinks()
