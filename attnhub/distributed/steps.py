"""What one rank does at each ring step, without the messages: its block calls on the keys at
hand and the planned accumulation of their results (:mod:`attnhub.distributed.accumulate`).

:mod:`attnhub.distributed.ring` runs these steps with messages between processes,
:mod:`attnhub.distributed.simulate` runs N virtual ranks' steps in one process, and
:mod:`attnhub.distributed.allgather` runs them as one step on the gathered keys: one glue for all.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from attnhub.distributed import accumulate, block, merge
from attnhub.distributed.accumulate import Acc, Plan
from attnhub.distributed.schedule import Call, Geometry, step_calls

Steps = Sequence[Sequence[Call]]


def _offsets(steps: Steps) -> list[int]:
    """Index of each step's first call in the flat list of calls."""
    out, n = [], 0
    for cs in steps:
        out.append(n)
        n += len(cs)
    return out


def q_plan(steps: Steps, rows: int) -> Plan:
    """The plan of a rank's query rows (forward O and dq): every call in step order."""
    return accumulate.plan(tuple((c.q_lo, c.q_hi) for cs in steps for c in cs), rows)


class Forward:
    """One rank's forward: merged (O, lse) in the accumulation dtype, and O in q's dtype written
    by the last merge of each row."""

    def __init__(self, q: Any, dv: int, steps: Steps, scale: float, softcap: float | None, backend: str):
        self.steps, self.first = steps, _offsets(steps)
        self.scale, self.softcap, self.backend = scale, softcap, backend
        b, h, lq, _ = q.shape
        acc = merge.acc_dtype(q.dtype)
        self.plan = q_plan(steps, lq)
        self.o = accumulate.new((b, h, lq, dv), acc, q.device)
        self.lse = accumulate.new((b, h, lq), acc, q.device)
        self.out = None if acc == q.dtype else accumulate.new((b, h, lq, dv), q.dtype, q.device)
        self.deferred: dict[int, tuple[Any, Any, int]] = {}

    def step(self, t: int, q: Any, k: Any, v: Any) -> None:
        """The calls of the ``t``-th step run (``steps[t]``) on the keys ``k``, ``v`` at hand,
        merged into the rows."""
        for j, c in enumerate(self.steps[t]):
            o_b, l_b = block.forward(
                q[:, :, c.q_lo : c.q_hi], k[:, :, c.k_lo : c.k_hi], v[:, :, c.k_lo : c.k_hi], c,
                self.scale, self.softcap, self.backend,
            )  # fmt: skip
            i = self.first[t] + j
            for p in self.plan.pieces[i]:
                a, z = p.lo - c.q_lo, p.hi - c.q_lo
                out = self.out if p.last else None
                if p.defer:  # merged with the next block of these rows, in one pass
                    self.deferred[i] = (o_b, l_b, c.q_lo)
                    continue
                prev = None
                if p.pair >= 0:
                    o1, l1, lo1 = self.deferred[p.pair]
                    prev = (o1[:, :, p.lo - lo1 : p.hi - lo1], l1[:, :, p.lo - lo1 : p.hi - lo1])
                merge.merge_into(
                    self.o, self.lse, o_b[:, :, a:z], l_b[:, :, a:z], p.lo, p.hi, p.first, out, prev
                )

    def finish(self) -> tuple[Any, Any, Any]:
        """(out in q's dtype, O and lse in the accumulation dtype); rows no call reached: O = 0,
        lse = −inf."""
        self.deferred.clear()
        for lo, hi in self.plan.zero:
            self.o[:, :, lo:hi].zero_()
            self.lse[:, :, lo:hi].fill_(float("-inf"))
            if self.out is not None:
                self.out[:, :, lo:hi].zero_()
        return (self.o if self.out is None else self.out), self.o, self.lse


class Backward:
    """One rank's backward: the merged (O, lse) and dO of its queries, and dq summed over the
    steps (in q's dtype at the end)."""

    def __init__(
        self, q: Any, o: Any, lse: Any, do: Any, steps: Steps, scale: float, softcap: float | None,
        backend: str,
    ) -> None:  # fmt: skip
        self.o, self.lse, self.do = o, lse, do
        self.lse_flash = block.flash_lse(lse)
        self.steps, self.first = steps, _offsets(steps)
        self.scale, self.softcap, self.backend = scale, softcap, backend
        acc = merge.acc_dtype(q.dtype)
        out = None if acc == q.dtype else accumulate.new(tuple(q.shape), q.dtype, q.device)
        self.dq = Acc(q_plan(steps, q.shape[2]), accumulate.new(tuple(q.shape), acc, q.device), out)

    def grads(self, t: int, q: Any, k: Any, v: Any) -> list[tuple[Call, tuple[Any, Any, Any]]]:
        """The block gradients of step ``t``'s calls on the keys at hand (kernels only)."""
        out = []
        for c in self.steps[t]:
            r, s = slice(c.q_lo, c.q_hi), slice(c.k_lo, c.k_hi)
            g = block.backward(
                q[:, :, r], k[:, :, s], v[:, :, s], self.o[:, :, r], self.lse[:, :, r], self.do[:, :, r],
                c, self.scale, self.softcap, self.backend, self.lse_flash[:, :, r],
            )  # fmt: skip
            out.append((c, g))
        return out

    def add_dq(self, t: int, grads: list) -> None:
        for j, (c, g) in enumerate(grads):
            self.dq.add(self.first[t] + j, g[0], c.q_lo)


def add_kv(grads: list, first: int, dk: Acc, dv: Acc) -> None:
    """Add a step's dk/dv blocks into the sums of the keys they came from; ``first``: the index
    of the step's first call among the contributions to those sums."""
    for j, (c, g) in enumerate(grads):
        dk.add(first + j, g[1], c.k_lo)
        dv.add(first + j, g[2], c.k_lo)


@lru_cache(maxsize=1024)
def kv_plan(
    geo: Geometry, rule: object, src: int, ring: tuple[int, ...], rows: int
) -> tuple[Plan, tuple[int, ...]]:
    """The plan of the dK/dV sums of rank ``src``'s keys, which visit rank ``src + t`` at each
    step ``t`` of ``ring`` (the steps run), and each step's first contribution index (by position
    in ``ring``). Only the last step writes the input dtype: the sums travel in the accumulation
    dtype until then."""
    spans: list[tuple[int, int]] = []
    first = []
    for t in ring:
        first.append(len(spans))
        spans += [(c.k_lo, c.k_hi) for c in step_calls(geo, rule, (src + t) % geo.world, src)]
    # No deferred pairs: the two contributions may come from two ranks.
    return accumulate.plan(tuple(spans), rows, first[-1], pairs=False), tuple(first)


def kv_accs(p: Plan, acc: tuple[Any, Any], out: tuple[Any, Any] | None) -> tuple[Acc, Acc]:
    """The dK and dV sums over buffers ``acc`` (accumulation dtype) and ``out`` (keys' dtype)."""
    return Acc(p, acc[0], None if out is None else out[0]), Acc(p, acc[1], None if out is None else out[1])
