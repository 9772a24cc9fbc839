"""The all-gather variant: every rank gathers the whole K/V once, then computes its queries.

One collective instead of N−1 ring steps: better when a ring step's compute is too short to
hide its message (short sequences), or when K/V are small next to Q (many query heads per KV
head). The backward sums the gathered dK/dV over the group with ``all_reduce`` (gloo has no
reduce-scatter) and keeps the rank's own chunks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from attnhub.distributed import merge
from attnhub.distributed.ring import Setup
from attnhub.distributed.schedule import Call, chunk_ids, classify
from attnhub.distributed.shard import unshard_local
from attnhub.rules import Causal, Full, Local


def _gather(x: Any, s: Setup) -> Any:
    parts = [torch.empty_like(x) for _ in range(s.world)]
    dist.all_gather(parts, x.contiguous(), group=s.group)
    return unshard_local(parts, dim=2, load_balance=s.geo.load_balance)


def _key_range(rule: object, p: int, m: int, shift_k: int, lk: int) -> tuple[int, int]:
    """The keys [lo, hi) that queries at positions p..p+m-1 may attend (others are masked)."""
    lo, hi = 0, lk
    if isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal):
        hi = min(hi, max(0, p + m - shift_k))
    if isinstance(rule, Local):
        w = rule.window[0] if isinstance(rule.window, tuple) else rule.window
        reach = rule.stride * (w - 1)
        lo = max(lo, p - reach - shift_k)
        hi = min(hi, max(0, p + m + reach - shift_k))
    return min(lo, hi), hi


def calls(s: Setup, lk: int) -> list[Call]:
    """One call per local query chunk, against the keys it can attend."""
    geo, out = s.geo, []
    for i, p in enumerate(geo.q_starts(s.rank)):
        lo, hi = _key_range(s.rule, p, geo.cq, geo.shift_k, lk)
        kind = classify(s.rule, p, geo.cq, lo + geo.shift_k, hi - lo)
        if kind == "empty":
            continue
        rows = (i * geo.cq, (i + 1) * geo.cq, lo, hi)
        if kind == "full":
            out.append(Call(*rows, Full()))
        else:
            r = lo + geo.shift_k
            out.append(Call(*rows, s.rule, max(p - r, 0), max(r - p, 0)))
    return out


def _own(full: Any, s: Setup) -> Any:
    c = full.shape[2] // (s.world * len(chunk_ids(s.rank, s.world, s.geo.load_balance)))
    ids = chunk_ids(s.rank, s.world, s.geo.load_balance)
    return torch.cat([full[:, :, i * c : (i + 1) * c] for i in ids], 2)


class AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, setup):  # type: ignore[override]
        kf, vf = _gather(k, setup), _gather(v, setup)
        acc = merge.acc_dtype(q.dtype)
        b, hq, lq, _ = q.shape
        o = torch.zeros((b, hq, lq, v.shape[-1]), dtype=acc, device=q.device)
        lse = torch.full((b, hq, lq), float("-inf"), dtype=acc, device=q.device)
        cs = calls(setup, kf.shape[2])
        merge.forward_calls(q, kf, vf, cs, o, lse, setup.scale, setup.softcap, setup.backend, merge.Rows())
        ctx.save_for_backward(q, kf, vf, o, lse)
        ctx.setup, ctx.calls = setup, cs
        lse_out = lse.to(acc)
        ctx.mark_non_differentiable(lse_out)
        return o.to(q.dtype), lse_out

    @staticmethod
    def backward(ctx, dout, _dlse):  # type: ignore[override]
        q, kf, vf, o, lse = ctx.saved_tensors
        s = ctx.setup
        acc = merge.acc_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(kf.shape, dtype=acc, device=q.device)
        dv = torch.zeros(vf.shape, dtype=acc, device=q.device)
        merge.backward_calls(
            q, kf, vf, o, lse, dout.contiguous(), ctx.calls, dq, dk, dv, s.scale, s.softcap, s.backend
        )
        dist.all_reduce(dk, group=s.group)
        dist.all_reduce(dv, group=s.group)
        return dq.to(q.dtype), _own(dk, s).to(kf.dtype), _own(dv, s).to(vf.dtype), None
