"""Ring attention: K/V blocks travel round the process group, overlapped with compute.

Forward: at step ``t`` rank ``r`` holds the keys of rank ``(r − t) mod N``; it starts passing them
on to ``r + 1`` (and receiving the next from ``r − 1``) before computing its calls on them, and
waits only afterwards. Backward: a second ring carries K/V and, behind them, float32 dK/dV
accumulators; after the last step each accumulator goes back to its owner. Steps after the last
one any rank needs (``schedule.ring_steps``) are not run at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from attnhub.distributed import comm, merge
from attnhub.distributed.schedule import Geometry, ring_steps, step_calls


@dataclass(frozen=True)
class Setup:
    """Everything but the tensors: the group, the positions, the rule and the block backend."""

    group: Any
    rank: int
    world: int
    geo: Geometry
    rule: object
    scale: float
    softcap: float | None
    backend: str

    @property
    def steps(self) -> int:
        return ring_steps(self.geo, self.rule)

    def source(self, t: int) -> int:
        return (self.rank - t) % self.world

    def calls(self, t: int) -> list:
        return step_calls(self.geo, self.rule, self.rank, self.source(t))


def ring_forward(q: Any, k: Any, v: Any, s: Setup) -> tuple[Any, Any]:
    """(O, lse) of the local queries, both in the accumulation dtype."""
    acc = merge.acc_dtype(q.dtype)
    b, hq, lq, _ = q.shape
    acc_o = torch.zeros((b, hq, lq, v.shape[-1]), dtype=acc, device=q.device)
    acc_lse = torch.full((b, hq, lq), float("-inf"), dtype=acc, device=q.device)
    likes = [(tuple(k.shape), k.dtype), (tuple(v.shape), v.dtype)]
    cur = comm.pack(k, v)
    steps, rows = s.steps, merge.Rows()
    for t in range(steps):
        reqs, nxt = None, None
        if t + 1 < steps:
            nxt = torch.empty_like(cur)
            reqs = comm.exchange(cur, (s.rank + 1) % s.world, nxt, (s.rank - 1) % s.world, s.group)
        kt, vt = comm.unpack(cur, likes)
        merge.forward_calls(q, kt, vt, s.calls(t), acc_o, acc_lse, s.scale, s.softcap, s.backend, rows)
        comm.wait(reqs)
        if nxt is not None:
            cur = nxt
    return acc_o, acc_lse


def ring_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, s: Setup) -> tuple[Any, Any, Any]:
    acc = merge.acc_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    likes = [(tuple(k.shape), k.dtype), (tuple(v.shape), v.dtype)]
    glikes = [(tuple(k.shape), acc), (tuple(v.shape), acc)]
    cur = comm.pack(k, v)
    dcur = torch.zeros(k.numel() + v.numel(), dtype=acc, device=q.device).view(torch.uint8)
    nxt_rank, prev_rank = (s.rank + 1) % s.world, (s.rank - 1) % s.world
    steps = s.steps
    for t in range(steps):
        reqs, nxt = None, None
        if t + 1 < steps:
            nxt = torch.empty_like(cur)
            reqs = comm.exchange(cur, nxt_rank, nxt, prev_rank, s.group)
        kt, vt = comm.unpack(cur, likes)
        dkt, dvt = comm.unpack(dcur, glikes)
        merge.backward_calls(q, kt, vt, o, lse, do, s.calls(t), dq, dkt, dvt, s.scale, s.softcap, s.backend)
        comm.wait(reqs)
        if t + 1 < steps:
            cur = nxt
            dnxt = torch.empty_like(dcur)
            comm.wait(comm.exchange(dcur, nxt_rank, dnxt, prev_rank, s.group))
            dcur = dnxt
    back = steps - 1  # dcur holds the gradient of rank (rank - back)'s keys: send it home
    if back % s.world:
        home = torch.empty_like(dcur)
        comm.wait(comm.exchange(dcur, (s.rank - back) % s.world, home, (s.rank + back) % s.world, s.group))
        dcur = home
    dk, dv = comm.unpack(dcur, glikes)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class RingAttention(torch.autograd.Function):
    """Differentiable ring attention over local (B, H, L_local, D) shards; lse carries no gradient
    (as in attnhub's torch glue)."""

    @staticmethod
    def forward(ctx, q, k, v, setup):  # type: ignore[override]
        o, lse = ring_forward(q, k, v, setup)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.setup = setup
        out = o.to(q.dtype)
        lse_out = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
        ctx.mark_non_differentiable(lse_out)
        return out, lse_out

    @staticmethod
    def backward(ctx, dout, _dlse):  # type: ignore[override]
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, o, lse, dout.contiguous(), ctx.setup)
        return dq, dk, dv, None


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()
