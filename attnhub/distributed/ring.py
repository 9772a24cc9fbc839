"""Ring attention: K/V blocks travel round the process group, overlapped with compute.

Forward: at step ``t`` rank ``r`` holds the keys of rank ``(r − t) mod N``; it starts passing them
on to ``r + 1`` (and receiving the next from ``r − 1``) before computing its calls on them, and
waits only afterwards. Backward: a second ring carries K/V and, one step behind, the float32
dK/dV sums: a rank computes its block gradients while the sums of the keys it holds arrive, adds
its share and passes them on; at the last step the sums are rounded to the keys' dtype and go back
to their owner. Steps no rank needs (``schedule.active_steps``: after the last one needed, or in
between, e.g. packed documents that share no document with the keys) are not run: the messages
jump over them (rank ``r`` sends to ``r + gap``).
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


def _pass_on(buf: Any, into: Any, s: Setup, i: int) -> list[Any]:
    """Send ``buf`` on to the rank that needs it at the next step run (``gap`` ranks on) and
    receive the one from ``gap`` ranks back into ``into``."""
    gap = s.ring[i + 1] - s.ring[i]
    return comm.exchange(buf, (s.rank + gap) % s.world, into, (s.rank - gap) % s.world, s.group)


def ring_forward(q: Any, k: Any, v: Any, s: Setup) -> tuple[Any, Any, Any]:
    """(out in q's dtype, O and lse in the accumulation dtype) of the local queries."""
    fwd = steps.Forward(q, v.shape[-1], s.all_calls(), s.scale, s.softcap, s.backend)
    likes = [(tuple(k.shape), k.dtype), (tuple(v.shape), v.dtype)]
    n = len(s.ring)
    kv = _pair(comm.pack(k, v), n)
    for i in range(n):
        cur = kv[i % 2]
        reqs = _pass_on(cur, kv[(i + 1) % 2], s, i) if i + 1 < n else None
        kt, vt = comm.unpack(cur, likes)
        fwd.step(i, q, kt, vt)
        comm.wait(reqs)
    return fwd.finish()


def ring_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, s: Setup) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) of the local shards, in their dtypes."""
    acc = merge.acc_dtype(q.dtype)
    bwd = steps.Backward(q, o, lse, do, s.all_calls(), s.scale, s.softcap, s.backend)
    likes = [(tuple(k.shape), k.dtype), (tuple(v.shape), v.dtype)]
    glikes = [(tuple(k.shape), acc), (tuple(v.shape), acc)]
    n = len(s.ring)
    kv = _pair(comm.pack(k, v), n)
    size = (k.numel() + v.numel()) * torch.empty((), dtype=acc).element_size()
    sums = _pair(accumulate.new((size,), torch.uint8, q.device), n)
    # The final dK/dV in the keys' dtype (the float32 sums themselves for float32 keys).
    home = None if acc == k.dtype else torch.empty_like(kv[0])
    kv_reqs = sum_reqs = None
    for i, t in enumerate(s.ring):
        cur, last = kv[i % 2], i + 1 == n
        kv_reqs = _pass_on(cur, kv[(i + 1) % 2], s, i) if not last else None
        kt, vt = comm.unpack(cur, likes)
        grads = bwd.grads(i, q, kt, vt)
        bwd.add_dq(i, grads)
        comm.wait(sum_reqs)  # the sums of the keys at hand, from the previous holder (at t = 0 ours)
        plan, first = steps.kv_plan(s.geo, s.rule, s.source(t), s.ring, k.shape[2])
        out = comm.unpack(home, likes) if last and home is not None else None
        dk, dv = steps.kv_accs(plan, comm.unpack(sums[i % 2], glikes), out)
        steps.add_kv(grads, first[i], dk, dv)
        if not last:
            sum_reqs = _pass_on(sums[i % 2], sums[(i + 1) % 2], s, i)
        comm.wait(kv_reqs)
    dk.finish()
    dv.finish()
    final = sums[(n - 1) % 2] if home is None else home
    back = s.ring[-1]  # final holds the gradient of rank (rank - back)'s keys: send it home
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
