"""Which blocks of a sharded attention are computed, and how: pure Python, no torch.

A rank holds its queries and keys as a few *chunks* of the global sequence (one chunk for
``load_balance="none"``, chunks ``r`` and ``2N-1-r`` for ``"zigzag"``). At ring step ``t`` rank
``r`` holds the keys of rank ``(r - t) mod N``. Every (query chunk, key chunk) pair is *empty*
(the rule masks it entirely: skipped), *full* (every pair attended: rule Full, no offsets) or
*partial* (the rule on global positions: SPEC §11 offsets, unless local positions already agree).
Pairs are grouped into as few backend calls as exactness allows.

*Packed documents* (``Geometry.docs``, the global ``cu_seqlens``): a pair is cut into its
per-document pieces (queries and keys of one document); pieces of no document are never
computed, and a ring step no rank needs is not run (:func:`active_steps`).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from attnhub.errors import SpecError
from attnhub.rules import Causal, Full, Local

LOAD_BALANCES = ("zigzag", "none")


def chunk_ids(rank: int, world: int, load_balance: str) -> tuple[int, ...]:
    """The global chunk indices rank ``rank`` holds, in local order (increasing)."""
    if load_balance == "zigzag":
        return (rank, 2 * world - 1 - rank)
    if load_balance == "none":
        return (rank,)
    raise SpecError("load_balance", f"one of {LOAD_BALANCES}", load_balance)


def chunks_per_rank(load_balance: str) -> int:
    return 2 if load_balance == "zigzag" else 1


@dataclass(frozen=True)
class Call:
    """One backend call: local rows ``q_lo:q_hi`` against local keys ``k_lo:k_hi``."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    rule: object
    q_offset: int = 0
    k_offset: int = 0


def classify(rule: object, p0: int, m: int, r0: int, n: int) -> str:
    """'empty', 'full' or 'partial' for queries at positions p0..p0+m-1, keys at r0..r0+n-1."""
    if m == 0 or n == 0:
        return "empty"
    if isinstance(rule, Full):
        return "full"
    dlo, dhi = p0 - (r0 + n - 1), p0 + m - 1 - r0  # range of P - R
    if isinstance(rule, Causal):
        return "full" if dlo >= 0 else "empty" if dhi < 0 else "partial"
    if isinstance(rule, Local):
        w = rule.window[0] if isinstance(rule.window, tuple) else rule.window
        s = rule.stride
        if rule.causal:
            if dhi < 0:
                return "empty"
            dlo_c = max(dlo, 0)
        else:
            dlo_c = dlo
        nearest = 0 if dlo_c <= 0 <= dhi else min(abs(dlo_c), abs(dhi))
        if nearest >= s * w:
            return "empty"
        farthest = max(abs(dlo), abs(dhi))
        if s == 1 and farthest < w and (not rule.causal or dlo >= 0):
            return "full"
        return "partial"
    raise SpecError("mask", "Full, Causal or Local for context-parallel attention", rule)


@dataclass(frozen=True)
class Geometry:
    """Chunk sizes and the global position shift of queries and keys (sync, SPEC §2)."""

    world: int
    load_balance: str
    cq: int  # query chunk length
    ck: int  # key chunk length
    shift_q: int  # added to global query indices (none_end: M - Lq)
    shift_k: int
    docs: tuple[int, ...] = ()  # packed documents: global cu_seqlens (0, ..., L); () for one sequence

    def q_starts(self, rank: int) -> list[int]:
        return [c * self.cq + self.shift_q for c in chunk_ids(rank, self.world, self.load_balance)]

    def k_starts(self, rank: int) -> list[int]:
        return [c * self.ck + self.shift_k for c in chunk_ids(rank, self.world, self.load_balance)]


@lru_cache(maxsize=4096)
def step_calls(geo: Geometry, rule: object, rank: int, source: int) -> tuple[Call, ...]:
    """The backend calls of rank ``rank`` on the keys of rank ``source`` (cached: the schedule
    is pure Python, and recomputing it per call cost the simulated ring at N = 8 several ms)."""
    return tuple(_step_calls(geo, rule, rank, source))


def _overlap(docs: tuple[int, ...], a: tuple[int, int], b: tuple[int, int]) -> list[tuple[int, ...]]:
    """Per document meeting both position ranges ``a`` and ``b``: (a_lo, a_hi, b_lo, b_hi), the
    parts of ``a`` and ``b`` inside it."""
    out = []
    first = max(bisect_right(docs, max(a[0], b[0])) - 1, 0)
    for d in range(first, len(docs) - 1):
        s, e = docs[d], docs[d + 1]
        if s >= min(a[1], b[1]):
            break
        lo_a, hi_a, lo_b, hi_b = max(a[0], s), min(a[1], e), max(b[0], s), min(b[1], e)
        if lo_a < hi_a and lo_b < hi_b:
            out.append((lo_a, hi_a, lo_b, hi_b))
    return out


def _piece_call(rule: object, box: tuple[int, int, int, int], p: int, r: int) -> Call | None:
    """The call of queries at positions ``p``.. against keys at ``r``.. in local ``box``
    (None when the rule masks all of it); offsets only where the positions differ."""
    c = classify(rule, p, box[1] - box[0], r, box[3] - box[2])
    if c == "empty":
        return None
    if c == "full":
        return Call(*box, Full())
    if p == r:
        return Call(*box, rule)
    return Call(*box, rule, max(p - r, 0), max(r - p, 0))


def _doc_calls(geo: Geometry, rule: object, rank: int, source: int) -> list[Call]:
    """Packed documents: one call per (query chunk, key chunk, document) piece the rule keeps."""
    cq, ck, calls = geo.cq, geo.ck, []
    for i, p in enumerate(geo.q_starts(rank)):
        for j, r in enumerate(geo.k_starts(source)):
            for qa, qb, ka, kb in _overlap(geo.docs, (p, p + cq), (r, r + ck)):
                box = (i * cq + qa - p, i * cq + qb - p, j * ck + ka - r, j * ck + kb - r)
                call = _piece_call(rule, box, qa, ka)
                if call is not None:
                    calls.append(call)
    return calls


def _step_calls(geo: Geometry, rule: object, rank: int, source: int) -> list[Call]:
    if geo.docs:
        return _doc_calls(geo, rule, rank, source)
    qs, ks = geo.q_starts(rank), geo.k_starts(source)
    cq, ck = geo.cq, geo.ck
    cls = [[classify(rule, p, cq, r, ck) for r in ks] for p in qs]
    if all(c == "empty" for row in cls for c in row):
        return []
    # 1. One call on the whole local buffers, rule on local positions, when they agree with the
    #    global ones for every pair (e.g. the zigzag diagonal step of a causal rule).
    same = all(
        cls[i][j] == classify(rule, i * cq, cq, j * ck, ck)
        and (cls[i][j] != "partial" or qs[i] - ks[j] == i * cq - j * ck)
        for i in range(len(qs))
        for j in range(len(ks))
    )
    if same:
        return [Call(0, len(qs) * cq, 0, len(ks) * ck, rule)]
    # 2. One Full call when the non-empty pairs are all full and form a rectangle.
    rows = [i for i in range(len(qs)) if any(c != "empty" for c in cls[i])]
    cols = [j for j in range(len(ks)) if any(cls[i][j] != "empty" for i in range(len(qs)))]
    rectangle = rows == list(range(rows[0], rows[-1] + 1)) and cols == list(range(cols[0], cols[-1] + 1))
    if rectangle and all(cls[i][j] == "full" for i in rows for j in cols):
        return [Call(rows[0] * cq, (rows[-1] + 1) * cq, cols[0] * ck, (cols[-1] + 1) * ck, Full())]
    # 3. Pair by pair; offsets only where the positions differ.
    calls = []
    for i, p in enumerate(qs):
        for j, r in enumerate(ks):
            call = _piece_call(rule, (i * cq, (i + 1) * cq, j * ck, (j + 1) * ck), p, r)
            if call is not None:
                calls.append(call)
    return calls


@dataclass(frozen=True)
class Setup:
    """Everything of one rank's ring but the tensors: the group, the positions, the rule and
    the block backend."""

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
        """Ring steps spanned (the last active step + 1)."""
        return ring_steps(self.geo, self.rule)

    @property
    def ring(self) -> tuple[int, ...]:
        """The steps run (:func:`active_steps`); the keys jump over the others."""
        return active_steps(self.geo, self.rule)

    def source(self, t: int) -> int:
        """The rank whose keys this rank holds at step ``t``."""
        return (self.rank - t) % self.world

    def calls(self, t: int) -> tuple[Call, ...]:
        return step_calls(self.geo, self.rule, self.rank, self.source(t))

    def all_calls(self) -> list[tuple[Call, ...]]:
        """The calls of every step run (:attr:`ring`), in order."""
        return [self.calls(t) for t in self.ring]


@lru_cache(maxsize=1024)
def active_steps(geo: Geometry, rule: object) -> tuple[int, ...]:
    """The ring steps some rank has calls at (step 0, the rank's own keys, always): a step empty
    on every rank is not run, the keys move on by the gap (rank ``r`` sends to ``r + gap``)."""
    return tuple(
        t for t in range(geo.world)
        if t == 0 or any(step_calls(geo, rule, r, (r - t) % geo.world) for r in range(geo.world))
    )  # fmt: skip


@lru_cache(maxsize=1024)
def ring_steps(geo: Geometry, rule: object) -> int:
    """How many ring steps any rank needs: later steps are empty on every rank and not run."""
    return active_steps(geo, rule)[-1] + 1
