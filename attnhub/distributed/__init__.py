"""Context parallelism: attention of one long 1-d sequence sharded over a torch.distributed
process group (ring or all-gather of K/V; docs/distributed.md). Imports torch on use only through
``attnhub.distributed``; ``import attnhub`` never loads this package."""

from __future__ import annotations

from attnhub.distributed.context import choose_method, context_parallel_attention
from attnhub.distributed.shard import shard, unshard, unshard_local

__all__ = ["choose_method", "context_parallel_attention", "shard", "unshard", "unshard_local"]
