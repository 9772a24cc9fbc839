"""The per-rank schedule of N *virtual* ranks run in one process, without communication: the
same per-step code as :mod:`attnhub.distributed.ring` (:mod:`attnhub.distributed.steps`: block
calls, merges, planned gradient sums, final rounding), for measuring the block kernels'
efficiency, the glue and the skipped blocks on one device (benchmarks/ring_sim.py) and for GPU
tests."""

from __future__ import annotations

from typing import Any

import torch

from attnhub.distributed import accumulate, merge, steps
from attnhub.distributed.context import _shifts, packed_docs
from attnhub.distributed.schedule import Geometry, Setup, chunks_per_rank
from attnhub.distributed.shard import shard, unshard_local
from attnhub.request import parse_rule


def setups(
    q: Any, k: Any, world: int, mask: Any = "causal", sync: str = "none_front", load_balance: str = "zigzag",
    scale: float | None = None, softcap: float | None = None, backend: str = "auto", cu_seqlens: Any = None,
) -> list[Setup]:  # fmt: skip
    """One :class:`Setup` per virtual rank for global q (B, Hq, Lq, D) and k; ``cu_seqlens``:
    packed documents (the global offsets, as for ``context_parallel_attention``)."""
    per = chunks_per_rank(load_balance)
    lq, lk = q.shape[2], k.shape[2]
    sq, sk = _shifts(sync, lq, lk)
    docs = () if cu_seqlens is None else packed_docs(cu_seqlens, lq)
    geo = Geometry(world, load_balance, lq // (per * world), lk // (per * world), sq, sk, docs)
    scale = 1.0 / float(q.shape[-1]) ** 0.5 if scale is None else scale
    rule = parse_rule(mask)
    return [Setup(None, r, world, geo, rule, scale, softcap, backend) for r in range(world)]


def shards(x: Any, world: int, load_balance: str) -> list[Any]:
    return [shard(x, r, world, load_balance=load_balance) for r in range(world)]


def forward(qs: list, ks: list, vs: list, sets: list[Setup]) -> list[tuple[Any, Any, Any]]:
    """Each virtual rank's (out in q's dtype, merged O and lse in the accumulation dtype)."""
    results = []
    for s, q in zip(sets, qs):
        fwd = steps.Forward(q, vs[0].shape[-1], s.all_calls(), s.scale, s.softcap, s.backend)
        for i, t in enumerate(s.ring):
            src = s.source(t)
            fwd.step(i, q, ks[src], vs[src])
        results.append(fwd.finish())
    return results


def backward(
    qs: list, ks: list, vs: list, fwd: list, dos: list, sets: list[Setup]
) -> tuple[list, list, list]:
    """Each virtual rank's (dq, dk, dv) of the merged result, in the inputs' dtypes.

    Step by step, as the ring runs: at step ``t`` the dK/dV sums of rank ``src``'s keys are at
    rank ``src + t``, which adds its share (the same order of additions as the real ring)."""
    ring = sets[0].ring
    n = len(ring)
    ranks = [
        steps.Backward(q, o, lse, do, s.all_calls(), s.scale, s.softcap, s.backend)
        for q, (_, o, lse), do, s in zip(qs, fwd, dos, sets)
    ]
    acc = merge.acc_dtype(ks[0].dtype)
    sums = [tuple(accumulate.new(tuple(x.shape), acc, x.device) for x in kv) for kv in zip(ks, vs)]
    outs = [
        None if acc == ks[0].dtype else (torch.empty_like(k), torch.empty_like(v)) for k, v in zip(ks, vs)
    ]
    dk: list = [None] * len(ks)
    dv: list = [None] * len(vs)
    for i, t in enumerate(ring):
        for r, s in enumerate(sets):
            src = s.source(t)
            grads = ranks[r].grads(i, qs[r], ks[src], vs[src])
            ranks[r].add_dq(i, grads)
            plan, first = steps.kv_plan(s.geo, s.rule, src, ring, ks[src].shape[2])
            acc_k, acc_v = steps.kv_accs(plan, sums[src], outs[src] if i + 1 == n else None)
            steps.add_kv(grads, first[i], acc_k, acc_v)
            if i + 1 == n:
                dk[src], dv[src] = acc_k.finish(), acc_v.finish()
    return [b.dq.finish() for b in ranks], dk, dv


def run(q, k, v, do, world, **kw) -> dict[str, Any]:
    """Global out, lse, dq, dk, dv of the simulated ring (for tests)."""
    lb = kw.get("load_balance", "zigzag")
    sets = setups(q, k, world, **kw)
    qs, ks, vs, dos = (shards(x, world, lb) for x in (q, k, v, do))
    fwd = forward(qs, ks, vs, sets)
    dq, dk, dv = backward(qs, ks, vs, fwd, dos, sets)
    glue = lambda xs: unshard_local(xs, load_balance=lb)  # noqa: E731
    return {
        "out": glue([out for out, _, _ in fwd]), "lse": glue([lse for _, _, lse in fwd]),
        "dq": glue(dq), "dk": glue(dk), "dv": glue(dv),
    }  # fmt: skip
