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

from attnhub.distributed import accumulate, merge, steps
from attnhub.distributed.schedule import Call, Setup, chunk_ids, classify
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
        cs = calls(setup, kf.shape[2])
        fwd = steps.Forward(q, v.shape[-1], [cs], setup.scale, setup.softcap, setup.backend)
        fwd.step(0, q, kf, vf)
        out, o, lse = fwd.finish()
        ctx.save_for_backward(q, kf, vf, o, lse)
        ctx.setup, ctx.calls = setup, cs
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):  # type: ignore[override]
        q, kf, vf, o, lse = ctx.saved_tensors
        s, cs = ctx.setup, ctx.calls
        acc = merge.acc_dtype(q.dtype)
        bwd = steps.Backward(q, o, lse, dout.contiguous(), [cs], s.scale, s.softcap, s.backend)
        grads = bwd.grads(0, q, kf, vf)
        bwd.add_dq(0, grads)
        # The sums stay in the accumulation dtype (out_from past the last call): all-reduced first.
        plan = accumulate.plan(tuple((c.k_lo, c.k_hi) for c in cs), kf.shape[2], len(cs))
        bufs = (
            accumulate.new(tuple(kf.shape), acc, q.device),
            accumulate.new(tuple(vf.shape), acc, q.device),
        )
        dk, dv = steps.kv_accs(plan, bufs, None)
        steps.add_kv(grads, 0, dk, dv)
        dk, dv = dk.finish(), dv.finish()
        dist.all_reduce(dk, group=s.group)
        dist.all_reduce(dv, group=s.group)
        return bwd.dq.finish(), _own(dk, s).to(kf.dtype), _own(dv, s).to(vf.dtype), None
