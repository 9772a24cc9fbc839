"""The per-rank schedule of N *virtual* ranks run in one process, without communication: the
same calls and merges as :mod:`attnhub.distributed.ring`, for measuring the block kernels'
efficiency and the skipped blocks on one device (benchmarks/ring_sim.py) and for GPU tests."""

from __future__ import annotations

from typing import Any

import torch

from attnhub.distributed import merge
from attnhub.distributed.context import _shifts
from attnhub.distributed.ring import Setup
from attnhub.distributed.schedule import Geometry, chunks_per_rank
from attnhub.distributed.shard import shard, unshard_local
from attnhub.request import parse_rule


def setups(
    q: Any, k: Any, world: int, mask: Any = "causal", sync: str = "none_front", load_balance: str = "zigzag",
    scale: float | None = None, softcap: float | None = None, backend: str = "auto",
) -> list[Setup]:  # fmt: skip
    """One :class:`Setup` per virtual rank for global q (B, Hq, Lq, D) and k."""
    per = chunks_per_rank(load_balance)
    lq, lk = q.shape[2], k.shape[2]
    sq, sk = _shifts(sync, lq, lk)
    geo = Geometry(world, load_balance, lq // (per * world), lk // (per * world), sq, sk)
    scale = 1.0 / float(q.shape[-1]) ** 0.5 if scale is None else scale
    rule = parse_rule(mask)
    return [Setup(None, r, world, geo, rule, scale, softcap, backend) for r in range(world)]


def shards(x: Any, world: int, load_balance: str) -> list[Any]:
    return [shard(x, r, world, load_balance=load_balance) for r in range(world)]


def forward(qs: list, ks: list, vs: list, sets: list[Setup]) -> list[tuple[Any, Any]]:
    """Each virtual rank's merged (O, lse) in the accumulation dtype."""
    results = []
    for s, q in zip(sets, qs):
        acc = merge.acc_dtype(q.dtype)
        b, hq, lq, _ = q.shape
        o = torch.zeros((b, hq, lq, vs[0].shape[-1]), dtype=acc, device=q.device)
        lse = torch.full((b, hq, lq), float("-inf"), dtype=acc, device=q.device)
        rows = merge.Rows()
        for t in range(s.steps):
            src = s.source(t)
            merge.forward_calls(q, ks[src], vs[src], s.calls(t), o, lse, s.scale, s.softcap, s.backend, rows)
        results.append((o, lse))
    return results


def backward(qs, ks, vs, fwd, dos, sets) -> tuple[list, list, list]:
    """Each virtual rank's (dq, dk, dv) of the merged result, in the accumulation dtype."""
    acc = merge.acc_dtype(qs[0].dtype)
    dq = [torch.zeros(q.shape, dtype=acc, device=q.device) for q in qs]
    dk = [torch.zeros(k.shape, dtype=acc, device=k.device) for k in ks]
    dv = [torch.zeros(v.shape, dtype=acc, device=v.device) for v in vs]
    for r, s in enumerate(sets):
        o, lse = fwd[r]
        for t in range(s.steps):
            src = s.source(t)
            merge.backward_calls(
                qs[r], ks[src], vs[src], o, lse, dos[r], s.calls(t), dq[r], dk[src], dv[src], s.scale,
                s.softcap, s.backend,
            )  # fmt: skip
    return dq, dk, dv


def run(q, k, v, do, world, **kw) -> dict[str, Any]:
    """Global out, lse, dq, dk, dv of the simulated ring (for tests)."""
    lb = kw.get("load_balance", "zigzag")
    sets = setups(q, k, world, **kw)
    qs, ks, vs, dos = (shards(x, world, lb) for x in (q, k, v, do))
    fwd = forward(qs, ks, vs, sets)
    dq, dk, dv = backward(qs, ks, vs, fwd, dos, sets)
    glue = lambda xs: unshard_local(xs, load_balance=lb)  # noqa: E731
    return {
        "out": glue([o for o, _ in fwd]).to(q.dtype), "lse": glue([lse for _, lse in fwd]),
        "dq": glue(dq), "dk": glue(dk), "dv": glue(dv),
    }  # fmt: skip
