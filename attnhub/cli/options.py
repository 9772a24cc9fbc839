"""Options shared by ``attnhub explain`` and ``attnhub show-mask``: the mask rule and the sync mode."""

from __future__ import annotations

import click

from attnhub.rules import Causal, Full, Local
from attnhub.shapes import parse_shape


def parse_mask_option(mask: str, window: str | None, log2_stride: int) -> object:
    """The rule named on the command line."""
    if mask == "full":
        return Full()
    if mask == "causal":
        return Causal()
    if window is None:
        raise click.BadParameter("--window is required for local masks", param_hint="--window")
    w = parse_shape(window)
    return Local(w[0] if len(w) == 1 else w, log2_stride=log2_stride, causal=mask == "local-causal")


MASKS = click.Choice(["full", "causal", "local", "local-causal"])
SYNCS = click.Choice(["none_front", "scale_front", "scale_end", "none_end"])
