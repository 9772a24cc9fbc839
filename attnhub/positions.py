"""Positions on the common grid (SPEC §2) and rule evaluation from positions (SPEC §3), in NumPy.

These functions are the single written-down form of the mask semantics: the reference backend,
`show-mask` and the tests use them, and other backends may too.
"""

from __future__ import annotations

import math

import numpy as np

from attnhub.errors import SpecError
from attnhub.rules import SYNC_MODES, Causal, Full, Local, Rule

#: Every query and key position (SPEC §2, §11) lies in [-2**30, 2**30) (SPEC §12): kernels compute
#: positions in int32, and the difference of two positions in range still fits int32.
POSITION_LIMIT = 1 << 30


def check_position_range(
    seq_q: tuple[int, ...], seq_k: tuple[int, ...], q_offset: int = 0, k_offset: int = 0
) -> None:
    """Raise :class:`SpecError` unless every position of the request (SPEC §2, shifted by the
    offsets of §11) and, with 2-d sequences, every flat index lies in [-2**30, 2**30) (SPEC §12).

    Positions under any sync mode are below ``max(Lq_d, Lk_d)``, so it is enough to bound the
    lengths, the flat grid and the offsets; arbitrary Python ints are compared exactly."""
    two_d = len(seq_q) > 1
    for name, lengths in (("q", seq_q), ("k", seq_k)):
        for d, n in enumerate(lengths):
            if n > POSITION_LIMIT:
                where = f" (dimension {d})" if two_d else ""
                raise SpecError(
                    f"sequence length of {name}{where}",
                    f"at most 2**30 = {POSITION_LIMIT} (positions lie in [-2**30, 2**30), SPEC §12)",
                    n,
                )
    if two_d:
        grid = tuple(max(a, b) for a, b in zip(seq_q, seq_k, strict=True))
        if math.prod(grid) > POSITION_LIMIT:
            raise SpecError(
                "sequence shapes of q/k",
                "a common grid of at most 2**30 positions (flat indices lie in [0, 2**30), SPEC §12)",
                grid,
            )
        return
    for name, offset, n in (("q_offset", q_offset, seq_q[0]), ("k_offset", k_offset, seq_k[0])):
        if not -POSITION_LIMIT <= offset <= POSITION_LIMIT - n:
            raise SpecError(
                name,
                f"an int in [-2**30, 2**30 - {n}] = [{-POSITION_LIMIT}, {POSITION_LIMIT - n}] (positions "
                f"{name} .. {name} + {n} - 1 must lie in [-2**30, 2**30), SPEC §11)",
                offset,
            )


def axis_affine(lq: int, lk: int, sync: str) -> tuple[int, int, int, int]:
    """(a_q, b_q, a_k, b_k) with query position ``a_q·i + b_q`` and key position ``a_k·j + b_k``.

    SPEC §2 along one sequence dimension; kernels take these four integers to evaluate rules
    from indices.
    """
    m = max(lq, lk)
    if sync == "none_front":
        return 1, 0, 1, 0
    if sync == "none_end":
        return 1, m - lq, 1, m - lk
    sq = m // lq if lq else 1
    sk = m // lk if lk else 1
    if sync == "scale_front":
        return sq, 0, sk, 0
    if sync == "scale_end":
        return sq, sq - 1, sk, sk - 1
    raise SpecError("sync", "one of " + ", ".join(SYNC_MODES), sync)


def axis_positions(lq: int, lk: int, sync: str) -> tuple[np.ndarray, np.ndarray]:
    """Query and key positions along one sequence dimension under ``sync``."""
    aq, bq, ak, bk = axis_affine(lq, lk, sync)
    return np.arange(lq, dtype=np.int64) * aq + bq, np.arange(lk, dtype=np.int64) * ak + bk


def grid_positions(
    seq_q: tuple[int, ...], seq_k: tuple[int, ...], sync: str
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
    """Per-dimension positions of every (row-major flattened) query and key, and flat indices.

    Returns ``(pq, pk, fq, fk)``: ``pq[d]`` has one entry per flattened query, ``fq`` is the flat
    index on the common grid (row-major over ``M_d = max(Lq_d, Lk_d)``).
    """
    axes = [axis_positions(a, b, sync) for a, b in zip(seq_q, seq_k, strict=True)]
    grids_q = np.meshgrid(*[a[0] for a in axes], indexing="ij")
    grids_k = np.meshgrid(*[a[1] for a in axes], indexing="ij")
    pq = [g.reshape(-1) for g in grids_q]
    pk = [g.reshape(-1) for g in grids_k]
    extents = [max(a, b) for a, b in zip(seq_q, seq_k, strict=True)]
    fq = np.zeros(pq[0].shape if pq else (1,), dtype=np.int64)
    fk = np.zeros(pk[0].shape if pk else (1,), dtype=np.int64)
    for d, m in enumerate(extents):
        fq = fq * m + pq[d]
        fk = fk * m + pk[d]
    return pq, pk, fq, fk


def rule_mask(
    rule: Rule,
    pq: list[np.ndarray],
    pk: list[np.ndarray],
    fq: np.ndarray,
    fk: np.ndarray,
) -> np.ndarray:
    """Boolean ``len(fq) x len(fk)`` matrix: True where the query attends the key."""
    shape = (fq.shape[0], fk.shape[0])
    if isinstance(rule, Full):
        return np.ones(shape, dtype=bool)
    if isinstance(rule, Causal):
        return fq[:, None] >= fk[None, :]
    if isinstance(rule, Local):
        windows = rule.windows(len(pq))
        s = rule.stride
        keep = np.ones(shape, dtype=bool)
        for d, w in enumerate(windows):
            delta = np.abs(pq[d][:, None] - pk[d][None, :])
            keep &= (delta % s == 0) & (delta // s < w)
        if rule.causal:
            keep &= fq[:, None] >= fk[None, :]
        return keep
    raise TypeError(f"rule_mask cannot evaluate {rule!r}")


def dense_rule_mask(rule: Rule, seq_q: tuple[int, ...], seq_k: tuple[int, ...], sync: str) -> np.ndarray:
    """The whole ``Nq x Nk`` boolean mask of a rule (small sizes: tests and show-mask)."""
    pq, pk, fq, fk = grid_positions(seq_q, seq_k, sync)
    return rule_mask(rule, pq, pk, fq, fk)
