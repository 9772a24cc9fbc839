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
from attnhub.distributed.schedule import chunk_ids, chunks_per_rank
from attnhub.distributed.shard import unshard_local
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


def _by_head_group(x: torch.Tensor, world: int) -> torch.Tensor:
    """(B, H, ...) → (N, B, H/N, ...) contiguous, slice ``r`` head group ``r`` (a view, no copy,
    for one contiguous batch row: packed documents and most long-context training)."""
    if x.shape[0] == 1 and x.is_contiguous():
        return x.view(world, 1, x.shape[1] // world, *x.shape[2:])
    return torch.stack(x.chunk(world, dim=1)).contiguous()


def _by_sequence_shard(x: torch.Tensor, s: Heads) -> torch.Tensor:
    """(B, H/N, L, ...) → (N, B, H/N, L/N, ...), slice ``r`` rank ``r``'s sequence shard: every
    element copied once, straight into the send buffer."""
    per = chunks_per_rank(s.load_balance)
    c = x.shape[2] // (s.world * per)
    out = x.new_empty((s.world, *x.shape[:2], c * per, *x.shape[3:]))
    for r in range(s.world):
        for slot, cid in enumerate(chunk_ids(r, s.world, s.load_balance)):
            out[r].narrow(2, slot * c, c).copy_(x.narrow(2, cid * c, c))
    return out


def seq_to_heads_raw(x: torch.Tensor, s: Heads) -> torch.Tensor:
    """(B, H, L/N, ...) sequence shard → (B, H/N, L, ...) head group ``rank``, global order."""
    recv = _exchange(_by_head_group(x, s.world), s.group)
    return unshard_local(list(recv.unbind(0)), dim=2, load_balance=s.load_balance)


def heads_to_seq_raw(x: torch.Tensor, s: Heads) -> torch.Tensor:
    """The inverse: (B, H/N, L, ...) head group ``rank`` → (B, H, L/N, ...) sequence shard."""
    recv = _exchange(_by_sequence_shard(x, s), s.group)  # (N, B, H/N, L/N, ...): group r from rank r
    if recv.shape[1] == 1:
        return recv.view(1, recv.shape[0] * recv.shape[2], *recv.shape[3:])
    return torch.cat(recv.unbind(0), dim=1)


class Regroup(torch.autograd.Function):
    """``there(x, s)``, differentiable: the two regroupings (sequence shards ↔ head groups) are
    each other's inverse, so the backward of one is the other on the gradient."""

    @staticmethod
    def forward(ctx, x, s, there, back):  # type: ignore[override]
        ctx.s, ctx.back = s, back
        return there(x, s)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return ctx.back(g.contiguous(), ctx.s), None, None, None


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
    qh, kh, vh = (Regroup.apply(x, s, seq_to_heads_raw, heads_to_seq_raw) for x in (q, k, v))
    out, lse = _local(qh, kh, vh, s)
    out = Regroup.apply(out, s, heads_to_seq_raw, seq_to_heads_raw)
    lse = heads_to_seq_raw(lse.detach().unsqueeze(-1).contiguous(), s).squeeze(-1)
    return out, lse
