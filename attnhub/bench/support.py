"""What the bench runners share: the runner-cannot-express-this error and FlexAttention's
recompile limit."""

from __future__ import annotations


class Unsupported(Exception):
    """The runner cannot express this case (reported as n/a with the reason)."""


def allow_recompiles() -> None:
    """Let every bench case compile its own FlexAttention kernel.

    Each case (shape, mask) recompiles ``flex_attention``; past dynamo's recompile limit (8 by
    default) torch silently runs it eagerly, unfused and about 100x slower, which once made the
    peer look absurdly slow at D = 128 after eight D = 64 cases in the same process."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    ):
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), 4096))
    if hasattr(cfg, "fail_on_recompile_limit_hit"):  # never time the eager fallback by accident
        cfg.fail_on_recompile_limit_hit = True
