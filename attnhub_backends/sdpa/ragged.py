"""Padded batches and position offsets (SPEC §10-§11) as one boolean mask for torch's CPU kernels.

Each batch entry's valid queries and keys are placed on the positions of their own segment
(``padding_side`` decides where the segment starts, the sync mode aligns it on its own lengths,
the offsets shift it), and a pair is attended iff both are valid and the rule holds on their
positions: the same construction as the TensorFlow backend's (``attnhub_backends.tf.ragged``) and
the reference's segments, with each entry's position maps from :func:`attnhub.positions.axis_affine`
and the mask built with torch ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnhub.positions import axis_affine
from attnhub.request import Request
from attnhub.rules import Causal, Full, Local, Rule


def rule_keep(rule: Rule, pq: Any, pk: Any) -> Any:
    """The 1-d rule on broadcastable position tensors (True = attended); None for Full or a mask."""
    if isinstance(rule, Causal):
        return pq >= pk
    if not isinstance(rule, Local):
        return None  # Full, or an explicit mask (applied from its array)
    (w,) = rule.windows(1)
    s = rule.stride
    delta = (pq - pk).abs()
    keep = delta < w if s == 1 else (delta % s == 0) & (delta // s < w)
    return keep & (pq >= pk) if rule.causal else keep


def keep_mask(req: Request, operands: Any, like: Any) -> Any:
    """(B or 1, 1, Nq, Nk) bool on ``like``'s device, True where query i attends key j.

    Each entry's affine position maps come from :func:`attnhub.positions.axis_affine` on its own
    lengths (read on the host: this backend's inputs are CPU tensors)."""
    import torch

    nq, nk = req.nq, req.nk
    ragged = operands is not None and (operands.q_lengths is not None or operands.k_lengths is not None)
    batch = req.batch if ragged else 1
    lq = _host_lengths(operands.q_lengths if ragged else None, nq, batch)
    lk = _host_lengths(operands.k_lengths if ragged else None, nk, batch)
    maps = torch.tensor(
        [axis_affine(a, b, req.sync) for a, b in zip(lq, lk)], dtype=torch.int64, device=like.device
    )
    aq, bq, ak, bk = (maps[:, c : c + 1] for c in range(4))  # (B, 1) each
    ql, kl = (torch.tensor(x, device=like.device)[:, None] for x in (lq, lk))
    i = torch.arange(nq, device=like.device)[None, :]
    j = torch.arange(nk, device=like.device)[None, :]
    if req.padding_side == "left":
        i, j = i - (nq - ql), j - (nk - kl)
    q_valid = (i >= 0) & (i < ql)
    k_valid = (j >= 0) & (j < kl)
    qpos = aq * i + bq + req.q_offset
    kpos = ak * j + bk + req.k_offset
    keep = q_valid[:, :, None] & k_valid[:, None, :]
    ok = rule_keep(req.rule, qpos[:, :, None], kpos[:, None, :])
    if ok is not None:
        keep = keep & ok
    return keep[:, None]


@dataclass(frozen=True)
class Padding:
    """A padded request whose rule is one top-left ``is_causal`` (or none) on every entry's indices.

    Then the kernel needs no (B, 1, Nq, Nk) mask: ``key_keep`` (B, 1, 1, Nk) excludes padded keys,
    ``causal`` is the kernel's ``is_causal``, and the rows of padded queries (``q_valid`` False,
    (B, 1, Nq, 1)) are zeroed after the kernel (which also zeroes their gradients)."""

    key_keep: Any
    q_valid: Any
    causal: bool
    #: (b, start, stop) of each entry's padded query rows (none listed where none are padded)
    q_padded: tuple[tuple[int, int, int], ...] = ()


def padding(req: Request, operands: Any, like: Any) -> Padding | None:
    """The :class:`Padding` form of a request with lengths (no offsets), or None where the rule
    differs between entries or is not Full or Causal.

    Entry b's query index i and key index j sit at positions ``i + cq[b]`` and ``j + ck[b]`` under
    the sync modes ``none_*`` (SPEC §2, §10), so its causal rule is ``i - j >= ck[b] - cq[b]``: one
    top-left ``is_causal`` when that shift is 0 for every entry, no rule at all when every valid
    key index is within it (a decode step's single query). Lengths are read on the host (CPU
    tensors: this backend's inputs)."""
    import torch

    rule = req.rule
    if req.q_offset or req.k_offset or not isinstance(rule, (Full, Causal)):
        return None
    nq, nk = req.nq, req.nk
    lq = _host_lengths(operands.q_lengths, nq, req.batch)
    lk = _host_lengths(operands.k_lengths, nk, req.batch)
    left = req.padding_side == "left"
    q_start = [nq - n if left else 0 for n in lq]
    k_start = [nk - n if left else 0 for n in lk]
    causal = False
    if isinstance(rule, Causal):
        if req.sync not in ("none_front", "none_end"):
            return None
        shifts = set()
        for b in range(req.batch):
            _, bq, _, bk = axis_affine(lq[b], lk[b], req.sync)  # unit steps under none_*
            shifts.add((bk - k_start[b]) - (bq - q_start[b]))  # ck[b] - cq[b]
        if shifts == {0}:
            causal = True
        elif not all(s <= -(nk - 1) for s in shifts):  # not every key index within the rule
            return None
    i = torch.arange(nq, device=like.device)
    j = torch.arange(nk, device=like.device)
    qs, ks = (torch.tensor(x, device=like.device)[:, None] for x in (q_start, k_start))
    ql, kl = (torch.tensor(x, device=like.device)[:, None] for x in (lq, lk))
    q_valid = ((i >= qs) & (i < qs + ql))[:, None, :, None] if operands.q_lengths is not None else None
    key_keep = ((j >= ks) & (j < ks + kl))[:, None, None, :]
    q_padded = tuple((b, *((0, q_start[b]) if left else (lq[b], nq))) for b in range(req.batch) if lq[b] < nq)
    return Padding(key_keep=key_keep, q_valid=q_valid, causal=causal, q_padded=q_padded)


def _host_lengths(x: Any, full: int, batch: int) -> list[int]:
    """Per-entry lengths as Python ints, clamped to [0, full]: lengths the core did not read
    (``ATTNHUB_TRUST_LENGTHS=1``) act as clamped."""
    if x is None:
        return [full] * batch
    return [min(max(int(n), 0), full) for n in x.reshape(-1).tolist()]


def padded_slots(req: Request, operands: Any, n: int, lengths: Any) -> list[tuple[int, int, int]]:
    """(b, start, stop) of each entry's padded slots along a sequence of ``n`` (none listed for an
    entry that has none): after the valid ones under right padding, before them under left."""
    if lengths is None:
        return []
    left = req.padding_side == "left"
    spans = ((b, 0, n - m) if left else (b, m, n) for b, m in enumerate(_host_lengths(lengths, n, req.batch)))
    return [s for s in spans if s[2] > s[1]]


def zero_padded(x: Any, spans: list[tuple[int, int, int]]) -> Any:
    """A copy of ``x`` (B, H, N, D) with zeros in the padded slots ``spans`` where they hold a NaN or
    an Inf (else ``x`` itself: summing the padded slots costs less than copying x). Padded slots
    are never attended (SPEC §10), so what they hold must not matter: a NaN there would reach valid
    rows through 0 x NaN in the kernel's products. The copy is differentiable, with zero
    gradients in the padded slots (SPEC §10's dk = dv = 0 and the zero dq of padded query rows)."""
    import torch

    if not spans or bool(torch.isfinite(sum(x[b, :, start:stop].sum() for b, start, stop in spans))):
        return x  # a NaN or Inf makes the sum non-finite (a finite sum's overflow only costs the copy)
    n = x.shape[2]
    b, start, stop = (torch.tensor(c, device=x.device) for c in zip(*spans))
    i = torch.arange(n, device=x.device)
    rows = torch.zeros(x.shape[0], n, dtype=torch.bool, device=x.device)
    rows[b] = (i >= start[:, None]) & (i < stop[:, None])
    return x.masked_fill(rows[:, None, :, None], 0.0)
