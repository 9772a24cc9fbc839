"""Split a global sequence into per-rank shards and put it back together.

``zigzag`` (the default) cuts the sequence into ``2N`` equal chunks and gives rank ``r`` chunks
``r`` and ``2N-1-r``: under a causal rule every rank then has the same amount of work.
``none`` gives rank ``r`` the ``r``-th of ``N`` contiguous chunks.
"""

from __future__ import annotations

from typing import Any

from attnhub.distributed.schedule import chunk_ids, chunks_per_rank
from attnhub.errors import SpecError


def _pieces(length: int, world: int, load_balance: str) -> int:
    n = world * chunks_per_rank(load_balance)
    if length % n:
        raise SpecError(
            "sequence length", f"a multiple of {n} ({world} ranks, load_balance={load_balance!r})", length
        )
    return length // n


def shard(x: Any, rank: int, world: int, *, dim: int = 2, load_balance: str = "zigzag") -> Any:
    """Rank ``rank``'s shard of the global tensor ``x`` along ``dim`` (2 for bhsd, 1 for bshd)."""
    c = _pieces(x.shape[dim], world, load_balance)
    import torch

    parts = [x.narrow(dim, i * c, c) for i in chunk_ids(rank, world, load_balance)]
    return torch.cat(parts, dim).contiguous()


def unshard_local(shards: list[Any], *, dim: int = 2, load_balance: str = "zigzag") -> Any:
    """The global tensor from the list of every rank's shard (rank order), in one process."""
    import torch

    world = len(shards)
    per = chunks_per_rank(load_balance)
    c = shards[0].shape[dim] // per
    pieces: list[Any] = [None] * (world * per)
    for rank, s in enumerate(shards):
        for slot, cid in enumerate(chunk_ids(rank, world, load_balance)):
            pieces[cid] = s.narrow(dim, slot * c, c)
    return torch.cat(pieces, dim)


def unshard(x: Any, *, group: Any = None, dim: int = 2, load_balance: str = "zigzag") -> Any:
    """All-gather the shards of the process group and return the global tensor on every rank."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x.contiguous(), group=group)
    return unshard_local(gathered, dim=dim, load_balance=load_balance)
