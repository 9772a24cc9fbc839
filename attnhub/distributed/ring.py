"""Ring attention: K/V blocks travel round the process group, overlapped with compute.

Forward: at step ``t`` rank ``r`` holds the keys of rank ``(r − t) mod N``; it starts passing them
on to ``r + 1`` (and receiving the next from ``r − 1``) before computing its calls on them, and
waits only afterwards. Backward: a second ring carries K/V and, one step behind, the float32
dK/dV sums: a rank computes its block gradients while the sums of the keys it holds arrive, adds
its share and passes them on; at the last step the sums are rounded to the keys' dtype and go back
to their owner. Steps after the last one any rank needs (``schedule.ring_steps``) are not run.
What a rank does at each step, messages aside, is :mod:`attnhub.distributed.steps` (which the
one-process simulation runs too). Message buffers are allocated once per call (two, used in turn).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from attnhub.distributed import accumulate, comm, merge, steps
from attnhub.distributed.schedule import Setup

__all__ = ["RingAttention", "Setup", "ring_backward", "ring_forward"]


def _pair(first: Any, n: int) -> list[Any]:
    """``first`` and, when a message follows, a second buffer like it (used in turn)."""
    return [first, torch.empty_like(first)] if n > 1 else [first]


def ring_forward(q: Any, k: Any, v: Any, s: Setup) -> tuple[Any, Any, Any]:
    """(out in q's dtype, O and lse in the accumulation dtype) of the local queries."""
    fwd = steps.Forward(q, v.shape[-1], s.all_calls(), s.scale, s.softcap, s.backend)
    likes = [(tuple(k.shape), k.dtype), (tuple(v.shape), v.dtype)]
    n, nxt, prv = s.steps, (s.rank + 1) % s.world, (s.rank - 1) % s.world
    kv = _pair(comm.pack(k, v), n)
    for t in range(n):
        cur = kv[t % 2]
        reqs = comm.exchange(cur, nxt, kv[(t + 1) % 2], prv, s.group) if t + 1 < n else None
        kt, vt = comm.unpack(cur, likes)
        fwd.step(t, q, kt, vt)
        comm.wait(reqs)
    return fwd.finish()


def ring_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, s: Setup) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) of the local shards, in their dtypes."""
    acc = merge.acc_dtype(q.dtype)
    bwd = steps.Backward(q, o, lse, do, s.all_calls(), s.scale, s.softcap, s.backend)
    likes = [(tuple(k.shape), k.dtype), (tuple(v.shape), v.dtype)]
    glikes = [(tuple(k.shape), acc), (tuple(v.shape), acc)]
    n, nxt, prv = s.steps, (s.rank + 1) % s.world, (s.rank - 1) % s.world
    kv = _pair(comm.pack(k, v), n)
    size = (k.numel() + v.numel()) * torch.empty((), dtype=acc).element_size()
    sums = _pair(accumulate.new((size,), torch.uint8, q.device), n)
    # The final dK/dV in the keys' dtype (the float32 sums themselves for float32 keys).
    home = None if acc == k.dtype else torch.empty_like(kv[0])
    kv_reqs = sum_reqs = None
    for t in range(n):
        cur, last = kv[t % 2], t + 1 == n
        kv_reqs = comm.exchange(cur, nxt, kv[(t + 1) % 2], prv, s.group) if not last else None
        kt, vt = comm.unpack(cur, likes)
        grads = bwd.grads(t, q, kt, vt)
        bwd.add_dq(t, grads)
        comm.wait(sum_reqs)  # the sums of the keys at hand, from rank - 1 (at t = 0 our own)
        plan, first = steps.kv_plan(s.geo, s.rule, s.source(t), n, k.shape[2])
        out = comm.unpack(home, likes) if last and home is not None else None
        dk, dv = steps.kv_accs(plan, comm.unpack(sums[t % 2], glikes), out)
        steps.add_kv(grads, first[t], dk, dv)
        if not last:
            sum_reqs = comm.exchange(sums[t % 2], nxt, sums[(t + 1) % 2], prv, s.group)
        comm.wait(kv_reqs)
    dk.finish()
    dv.finish()
    final = sums[(n - 1) % 2] if home is None else home
    back = n - 1  # final holds the gradient of rank (rank - back)'s keys: send it home
    if back % s.world:
        arrived = torch.empty_like(final)
        comm.wait(
            comm.exchange(final, (s.rank - back) % s.world, arrived, (s.rank + back) % s.world, s.group)
        )
        final = arrived
    dkf, dvf = comm.unpack(final, likes)
    return bwd.dq.finish(), dkf, dvf


class RingAttention(torch.autograd.Function):
    """Differentiable ring attention over local (B, H, L_local, D) shards; lse carries no gradient
    (as in attnhub's torch glue)."""

    @staticmethod
    def forward(ctx, q, k, v, setup):  # type: ignore[override]
        out, o, lse = ring_forward(q, k, v, setup)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.setup = setup
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):  # type: ignore[override]
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, o, lse, dout.contiguous(), ctx.setup)
        return dq, dk, dv, None


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()
