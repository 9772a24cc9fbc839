"""Planned accumulation: sums of contributions to row spans (dim 2) known before the first one.

A rank's schedule is pure Python, so for every buffer that sums block results (the forward's
merged O, dq, and the dK/dV that travel round the ring) the order of the contributions and the
rows each covers are known in advance. Each contribution is cut into *pieces* that say, per run
of rows, whether it is the first to write them (a copy: no zero fill, no read of zeros) and
whether it is the last (the sum goes straight into the output dtype: no separate cast pass).
Rows that only one contribution covers never touch the float32 buffer. Rows no contribution
covers are zero-filled by :meth:`Acc.finish`, so buffers may start uninitialised (:func:`new`).
Rows with exactly two contributions skip the accumulator too: the second writes the sum of both.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

Span = tuple[int, int]


@dataclass(frozen=True)
class Piece:
    """Rows ``lo:hi`` of one contribution: ``first`` to write them, ``last`` (and allowed to
    write the output dtype). ``defer``: not written now, the next contribution to these rows
    combines this one with itself; ``pair``: the index of that deferred contribution (else −1)."""

    lo: int
    hi: int
    first: bool
    last: bool
    defer: bool = False
    pair: int = -1


@dataclass(frozen=True)
class Plan:
    pieces: tuple[tuple[Piece, ...], ...]  # per contribution, in order
    cast: tuple[Span, ...]  # rows complete in the accumulator before the output may be written
    zero: tuple[Span, ...]  # rows no contribution covers


def _join(spans: list[Span]) -> tuple[Span, ...]:
    out: list[Span] = []
    for lo, hi in spans:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def _join_pieces(ps: list[Piece]) -> tuple[Piece, ...]:
    out: list[Piece] = []
    for p in ps:
        q = out[-1] if out else None
        if (
            q is not None
            and q.hi == p.lo
            and (q.first, q.last, q.defer, q.pair) == (p.first, p.last, p.defer, p.pair)
        ):
            out[-1] = Piece(q.lo, p.hi, p.first, p.last, p.defer, p.pair)
        else:
            out.append(p)
    return tuple(out)


@lru_cache(maxsize=4096)
def plan(spans: tuple[Span, ...], rows: int, out_from: int = 0, pairs: bool = True) -> Plan:
    """The pieces of contributions ``spans`` (in order) to a buffer of ``rows`` rows; only
    contributions ``out_from`` and later may write the output (earlier ones stay in the
    accumulator, which then travels: :attr:`Plan.cast` rows are rounded at the end).
    ``pairs``: rows with exactly two contributions skip the accumulator (the first is deferred
    and the second writes their sum, rounded once); the caller keeps deferred results alive."""
    cuts = sorted({0, rows, *(x for s in spans for x in s)})
    per: list[list[Piece]] = [[] for _ in spans]
    cast, zero = [], []
    for a, b in zip(cuts, cuts[1:]):
        cover = [i for i, (lo, hi) in enumerate(spans) if lo <= a and b <= hi and lo < hi]
        if not cover:
            zero.append((a, b))
            continue
        first, last = cover[0], cover[-1]
        if last < out_from:
            cast.append((a, b))
        if pairs and len(cover) == 2 and last >= out_from:
            per[first].append(Piece(a, b, True, False, defer=True))
            per[last].append(Piece(a, b, False, True, pair=first))
            continue
        for i in cover:
            per[i].append(Piece(a, b, i == first, i == last and i >= out_from))
    return Plan(tuple(_join_pieces(p) for p in per), _join(cast), _join(zero))


def new(shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> torch.Tensor:
    """An uninitialised buffer (every row is written by a plan's copies, sums or zero fill)."""
    return torch.empty(shape, dtype=dtype, device=device)


class Acc:
    """A sum over planned contributions: ``acc`` in the accumulation dtype, ``out`` (default
    ``acc`` itself) in the result dtype; both (B, H, rows, D)."""

    def __init__(self, p: Plan, acc: torch.Tensor, out: torch.Tensor | None = None) -> None:
        self.plan, self.acc = p, acc
        self.out = acc if out is None else out
        self.deferred: dict[int, tuple[torch.Tensor, int]] = {}

    def add(self, i: int, g: torch.Tensor, lo: int) -> None:
        """Contribution ``i``: ``g`` holds rows ``lo:lo + g.shape[2]``; in place, no temporary."""
        for p in self.plan.pieces[i]:
            src = g[:, :, p.lo - lo : p.hi - lo]
            a, o = self.acc[:, :, p.lo : p.hi], self.out[:, :, p.lo : p.hi]
            if p.defer:
                self.deferred[i] = (g, lo)
            elif p.pair >= 0:
                g1, lo1 = self.deferred[p.pair]
                first = g1[:, :, p.lo - lo1 : p.hi - lo1]
                if o.dtype == src.dtype:
                    torch.add(first, src, out=o)  # computed in float32 for 16-bit: one rounding
                else:
                    o.copy_(first)
                    o.add_(src)
            elif p.first and p.last:
                o.copy_(src)
            elif p.first:
                a.copy_(src)
            elif p.last:
                torch.add(a, src, out=o)
            else:
                a.add_(src)

    def finish(self) -> torch.Tensor:
        """Round the rows summed before the output could be written, zero the rows nobody wrote."""
        if self.out is not self.acc:
            for lo, hi in self.plan.cast:
                self.out[:, :, lo:hi].copy_(self.acc[:, :, lo:hi])
        for lo, hi in self.plan.zero:
            self.out[:, :, lo:hi].zero_()
        self.deferred.clear()
        return self.out
