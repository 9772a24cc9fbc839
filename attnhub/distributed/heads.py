"""The head-parallel variant (all-to-all, "Ulysses"): sequence shards become head shards.

Each rank holds a shard of the sequence for every head. One all-to-all gives each rank the whole
sequence for ``H/N`` heads (group ``r`` of ``N`` contiguous head groups), which it attends locally
with any attnhub backend (``attention``, or ``attention_varlen`` for packed documents); a second
all-to-all returns the output to sequence shards. Both all-to-alls are differentiable (each one's
backward is the other), so the backward is the local attention's own backward between two
all-to-alls. Needs ``Hq % N == 0``; K/V heads are repeated up to ``Hq`` when ``Hkv % N != 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import attnhub
from attnhub.distributed.shard import shard, unshard_local
from attnhub.errors import SpecError


@dataclass(frozen=True)
class Heads:
    """The group, the shard order and the local attention's arguments."""

    group: Any
    rank: int
    world: int
    load_balance: str
    rule: object
    sync: str
    scale: float
    softcap: float | None
    backend: str
    docs: tuple[int, ...] = ()


def _exchange(send: torch.Tensor, group: Any) -> torch.Tensor:
    """all_to_all over dim 0 (one slice per rank) of a contiguous tensor."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


def seq_to_heads_raw(x: torch.Tensor, s: Heads) -> torch.Tensor:
    """(B, H, L/N, ...) sequence shard → (B, H/N, L, ...) head group ``rank``, global order."""
    send = torch.stack(x.chunk(s.world, dim=1)).contiguous()  # (N, B, H/N, L/N, ...)
    recv = _exchange(send, s.group)
    return unshard_local(list(recv.unbind(0)), dim=2, load_balance=s.load_balance)


def heads_to_seq_raw(x: torch.Tensor, s: Heads) -> torch.Tensor:
    """The inverse: (B, H/N, L, ...) head group ``rank`` → (B, H, L/N, ...) sequence shard."""
    parts = [shard(x, r, s.world, dim=2, load_balance=s.load_balance) for r in range(s.world)]
    recv = _exchange(torch.stack(parts).contiguous(), s.group)
    return torch.cat(recv.unbind(0), dim=1)


class SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):  # type: ignore[override]
        ctx.s = s
        return seq_to_heads_raw(x, s)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return heads_to_seq_raw(g.contiguous(), ctx.s), None


class HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):  # type: ignore[override]
        ctx.s = s
        return heads_to_seq_raw(x, s)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return seq_to_heads_raw(g.contiguous(), ctx.s), None


def check_heads(hq: int, world: int) -> None:
    if hq % world:
        raise SpecError("q.shape[1]", f"a multiple of the {world} ranks for method='heads'", hq)


def _local(q: Any, k: Any, v: Any, s: Heads) -> tuple[Any, Any]:
    """(out, lse) of the whole sequence for this rank's heads."""
    kw = {"mask": s.rule, "scale": s.scale, "softcap": s.softcap, "backend": s.backend, "return_lse": True}
    if not s.docs:
        return attnhub.attention(q, k, v, sync=s.sync, **kw)
    cu = torch.tensor(s.docs, dtype=torch.int32, device=q.device)
    thd = [x[0].transpose(0, 1) for x in (q, k, v)]  # (L, H, D)
    out, lse = attnhub.attention_varlen(*thd, cu, cu, **kw)
    return out.transpose(0, 1).unsqueeze(0), lse.unsqueeze(0)


def heads_attention(q: Any, k: Any, v: Any, s: Heads) -> tuple[Any, Any]:
    """(out, lse) of the local sequence shards; differentiable in q, k, v (lse is not)."""
    check_heads(q.shape[1], s.world)
    if k.shape[1] % s.world:  # repeat K/V heads up to Hq (q head h reads kv head h // group)
        group = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    qh, kh, vh = (SeqToHeads.apply(x, s) for x in (q, k, v))
    out, lse = _local(qh, kh, vh, s)
    out = HeadsToSeq.apply(out, s)
    lse = heads_to_seq_raw(lse.detach().unsqueeze(-1).contiguous(), s).squeeze(-1)
    return out, lse
