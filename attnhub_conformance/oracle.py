"""The suite's own dense float64 oracle for SPEC §9-§11: score modifiers, lengths, varlen, kvcache.

Written from SPEC.md alone (not from any backend), so that certifying the reference backend
compares two independent implementations. The grid's sizes are small: everything is dense.

The pairs a query may attend are a boolean ``keep`` (B, 1 | Hq, Nq, Nk) built from the rule
evaluated on each batch entry's (or packed sequence's) valid segment, the offsets and an explicit
bool mask; the logits are ``t = scale·q·k``, ``t = c·tanh(t / c)`` with softcap ``c``,
``s = t + bias − slope[b, h]·|P(i) − R(j)|`` (ALiBi, on each segment's positions); sinks add one
virtual key of logit ``sinks[h]`` and value 0 to every softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnhub.positions import dense_rule_mask, grid_positions, rule_mask
from attnhub.rules import Full

#: Tuple of (query rows, key columns, Lq, Lk) of one valid segment in the (padded or packed) arrays.
Segment = tuple[np.ndarray, np.ndarray]


@dataclass
class Problem:
    """A dense attention problem in float64 (canonical arrays, see attnhub.backend)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    keep: np.ndarray
    scale: float
    bias: np.ndarray | None = None
    softcap: float | None = None
    sinks: np.ndarray | None = None
    #: (B, Nq) True on padded query rows (lengths): out 0, lse -inf, no gradient, no sink.
    padded_q: np.ndarray | None = None
    #: The ALiBi term ``−slope·|P − R|`` (B | 1, Hq, Nq, Nk), 0 outside the valid segments, less each
    #: row's constant ``alibi_shift`` (B | 1, Hq, Nq): the term at its nearest key, added back to lse
    #: (at SPEC §11's positions the term reaches 1e9, where float64 loses the logits' differences).
    alibi: np.ndarray | None = None
    alibi_shift: np.ndarray | None = None


@dataclass
class Grads:
    """Gradients (or their cancellation-free magnitudes); dbias has the bias's own shape."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dbias: np.ndarray | None = None
    dsinks: np.ndarray | None = None


def _segment_rows(n: int, length: int, left: bool) -> np.ndarray:
    return np.arange(n - length, n) if left else np.arange(length)


def segments(case) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per batch entry, the (query rows, key columns) of each independent problem in it."""
    if case.entry == "varlen":
        cq = np.concatenate([[0], np.cumsum(case.seqlens_q)]).astype(int)
        ck = np.concatenate([[0], np.cumsum(case.seqlens_k)]).astype(int)
        return [[(np.arange(cq[n], cq[n + 1]), np.arange(ck[n], ck[n + 1])) for n in range(len(cq) - 1)]]
    lq, lk = case.nq, case.nk
    left = case.padding_side == "left"
    out = []
    for b in range(case.batch):
        ql = lq if case.q_lengths is None else case.q_lengths[b]
        kl = lk if case.k_lengths is None else case.k_lengths[b]
        out.append([(_segment_rows(lq, ql, left), _segment_rows(lk, kl, left))])
    return out


def _segment_positions(sync: str, lq: int, lk: int, q_offset: int, k_offset: int):
    """(pq, pk, fq, fk) of one 1-d segment of lq queries and lk keys (SPEC §2, §11)."""
    pq, pk, fq, fk = grid_positions((lq,), (lk,), sync)
    if q_offset or k_offset:
        pq, pk = [pq[0] + q_offset], [pk[0] + k_offset]
        fq, fk = pq[0], pk[0]
    return pq, pk, fq, fk


def _segment_keep(rule, sync: str, lq: int, lk: int, q_offset: int, k_offset: int) -> np.ndarray:
    """The rule on one 1-d segment of lq queries and lk keys (SPEC §2, §3, §11)."""
    if lq == 0 or lk == 0:
        return np.zeros((lq, lk), dtype=bool)
    if isinstance(rule, Full):
        return np.ones((lq, lk), dtype=bool)
    return rule_mask(rule, *_segment_positions(sync, lq, lk, q_offset, k_offset))


def alibi_term(case, slopes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SPEC §9's ALiBi term ``−slope[b, h]·|P(i) − R(j)|`` as a dense (B | 1, Hq, Nq, Nk) array on
    the positions of each valid segment (§2's sync, §10's lengths, §11's offsets), 0 elsewhere (those
    pairs are excluded anyway), split exactly as (term − row constant, row constant (B | 1, Hq, Nq)):
    the row constant is the term at the row's nearest key of its segment (integer distances, so the
    split is exact), which softmax ignores and lse adds back. ``slopes`` is (1 | B, Hq)."""
    batch = 1 if case.entry == "varlen" else case.batch
    dist = np.zeros((batch, 1, case.nq, case.nk), dtype=np.int64)
    near = np.zeros((batch, 1, case.nq), dtype=np.int64)
    for b, segs in enumerate(segments(case)):
        for rows, cols in segs:
            if len(rows) and len(cols):
                _, _, fq, fk = _segment_positions(
                    case.sync, len(rows), len(cols), case.q_offset, case.k_offset
                )
                d = np.abs(fq[:, None] - fk[None, :])
                c = d.min(axis=1)
                dist[b, 0, rows[:, None], cols[None, :]] = d - c[:, None]
                near[b, 0, rows] = c
    s = -slopes.astype(np.float64)
    return s[:, :, None, None] * dist.astype(np.float64), s[:, :, None] * near.astype(np.float64)


def rule_keep(case) -> tuple[np.ndarray, np.ndarray | None]:
    """(keep (B, 1, Nq, Nk) from the rule, lengths, packing and offsets; padded query rows (B, Nq))."""
    rule = Full() if isinstance(case.rule, str) else case.rule
    if case.ndim > 1:
        keep = dense_rule_mask(rule, case.seq_q, case.seq_k, case.sync)
        return np.broadcast_to(keep, (case.batch, 1, case.nq, case.nk)).copy(), None
    batch = 1 if case.entry == "varlen" else case.batch
    keep = np.zeros((batch, 1, case.nq, case.nk), dtype=bool)
    padded = np.ones((batch, case.nq), dtype=bool)
    for b, segs in enumerate(segments(case)):
        for rows, cols in segs:
            part = _segment_keep(rule, case.sync, len(rows), len(cols), case.q_offset, case.k_offset)
            keep[b, 0, rows[:, None], cols[None, :]] = part
            padded[b, rows] = False
    lengths = case.entry == "attention" and case.q_lengths is not None
    return keep, (padded if lengths else None)


def unused_keys(case) -> np.ndarray | None:
    """(B, Nk) True on keys outside every valid segment (padding), None without lengths."""
    if case.entry == "varlen" or (case.q_lengths is None and case.k_lengths is None):
        return None
    unused = np.ones((case.batch, case.nk), dtype=bool)
    for b, segs in enumerate(segments(case)):
        for _, cols in segs:
            unused[b, cols] = False
    return unused


def case_has_empty_rows(case) -> bool:
    """Whether the case has query rows attending no key (padded rows included), data aside."""
    keep, padded = rule_keep(case)
    if (~keep.any(axis=-1)).any():
        return True
    if case.rule == "bool":
        return case.mask_empty_rows or case.mask_shape == "padding"
    return False


def _expand(x: np.ndarray, g: int) -> np.ndarray:
    return np.repeat(x, g, axis=1)


def _parts(p: Problem):
    """Logits pieces, probabilities, sink probabilities and lse, all (B, Hq, Nq, ...)."""
    b, hq = p.q.shape[:2]
    g = hq // p.k.shape[1]
    k = _expand(p.k, g)
    t = p.scale * (p.q @ np.swapaxes(k, -1, -2))
    u = None
    if p.softcap is not None:
        u = np.tanh(t / p.softcap)
        t = p.softcap * u
    s = t if p.bias is None else t + p.bias
    if p.alibi is not None:
        s = s + p.alibi
    # A bias of −inf excludes a pair (SPEC §9); a NaN logit stays in its row (SPEC §4: NaN propagates).
    keep = p.keep & ~np.isneginf(s) if p.bias is not None else np.broadcast_to(p.keep, s.shape)
    # The sink's logit against the logits as they are here: less ALiBi's row constant.
    sink = (
        None
        if p.sinks is None
        else p.sinks[None, :, None] - (0.0 if p.alibi_shift is None else p.alibi_shift)
    )
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(keep, s, -np.inf)
        m = s.max(axis=-1)
        if sink is not None:
            m = np.maximum(m, sink)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - m_safe[..., None])
        z = e.sum(axis=-1)
        zs = np.zeros_like(z) if sink is None else np.exp(sink - m_safe)
        if p.padded_q is not None:
            zs = np.where(p.padded_q[:, None, :], 0.0, zs)
        total = z + zs
        safe = np.where(total > 0, total, 1.0)
        prob = e / safe[..., None]
        psink = zs / safe
        lse = np.where(total > 0, m_safe + np.log(safe), np.where(np.isnan(total), np.nan, -np.inf))
        # A +Inf logit: lse is +Inf as a limit and NaN as Inf − Inf (its row's out is NaN); the
        # suite reads NaN and accepts either (runner.inf_logit_lse).
        lse = np.where(np.isposinf(m), np.nan, lse)
        if p.alibi_shift is not None:
            lse = lse + p.alibi_shift
    return u, prob, psink, lse, g


def empty_rows(p: Problem) -> np.ndarray:
    """(B, Hq, Nq) True where a query attends no key (fully masked or padded): out must be 0 there."""
    b, hq, nq = p.q.shape[:3]
    keep = np.broadcast_to(p.keep, (b, hq, nq, p.k.shape[2]))
    if p.bias is not None:
        keep = keep & ~np.isneginf(np.broadcast_to(p.bias, keep.shape))
    return ~keep.any(axis=-1)


def forward(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """(out (B, Hq, Nq, Dv), lse (B, Hq, Nq)) in float64."""
    _, prob, _, lse, g = _parts(p)
    return prob @ _expand(p.v, g), lse


def _reduce_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``x`` over the dimensions where ``shape`` (same rank) is 1 (a broadcast's gradient)."""
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape)


def backward(p: Problem, dout: np.ndarray, dlse: np.ndarray | None = None) -> tuple[Grads, Grads]:
    """(gradients, magnitudes): d(sum(out·dout) + sum(lse·dlse)) with respect to q, k, v, bias and
    sinks (``dlse`` (B, Hq, Nq) or None: ∂lse/∂s = P), and the same terms summed in absolute value
    (the suite's cancellation floor, see runner.errors)."""
    u, prob, psink, _, g = _parts(p)
    b, hq = p.q.shape[:2]
    k, v = _expand(p.k, g), _expand(p.v, g)
    out = prob @ v
    dp = dout @ np.swapaxes(v, -1, -2)
    delta = (dout * out).sum(axis=-1, keepdims=True)
    ds_mag = prob * (np.abs(dp) + np.abs(delta))
    if dlse is not None:  # lse's term: the rows' softmax weights times dlse
        ds_mag = ds_mag + prob * np.abs(dlse)[..., None]
        delta = delta - dlse[..., None]
    ds = prob * (dp - delta)
    tanh_d = 1.0 if u is None else 1.0 - u * u

    def per_kv(x: np.ndarray) -> np.ndarray:
        return x.reshape(b, hq // g, g, *x.shape[2:]).sum(axis=2)

    def grads(ds_: np.ndarray, absolute: bool, delta_: np.ndarray) -> Grads:
        f = (lambda x: np.abs(x)) if absolute else (lambda x: x)  # noqa: E731
        dt = ds_ * tanh_d
        dbias = None if p.bias is None else _reduce_to(ds_, p.bias.shape)
        dsinks = None
        if p.sinks is not None:
            dsinks = (psink * delta_[..., 0]).sum(axis=(0, 2)) * (1.0 if absolute else -1.0)
        return Grads(
            dq=p.scale * (dt @ f(k)),
            dk=per_kv(p.scale * (np.swapaxes(dt, -1, -2) @ f(p.q))),
            dv=per_kv(np.swapaxes(prob, -1, -2) @ f(dout)),
            dbias=dbias,
            dsinks=dsinks,
        )

    return grads(ds, False, delta), grads(ds_mag, True, np.abs(delta))


def expected_grad_shapes(case) -> dict[str, tuple[int, ...]]:
    """Shapes of dbias and dsinks for the case (what the framework returns)."""
    shapes = {}
    if case.bias:
        shapes["dbias"] = bias_shape(case)
    if case.sinks:
        shapes["dsinks"] = (case.heads_q,)
    return shapes


def bias_shape(case) -> tuple[int, int, int, int]:
    """The rank-4 shape of the case's bias over (B, Hq, Nq, Nk)."""
    batch = 1 if case.entry == "varlen" else case.batch
    return {
        "1hqk": (1, case.heads_q, case.nq, case.nk),
        "b11k": (batch, 1, 1, case.nk),
        "full": (batch, case.heads_q, case.nq, case.nk),
    }[case.bias]


def block_sparse(nq: int, nk: int, tile: int, rng: np.random.Generator) -> np.ndarray:
    """(Nq, Nk) bool: whole tile x tile blocks on (about half) or off, diagonal blocks always on."""
    tq, tk = math.ceil(nq / tile), math.ceil(nk / tile)
    on = rng.random((tq, tk)) < 0.5
    on[np.arange(tq), np.minimum(np.arange(tq), tk - 1)] = True
    return np.repeat(np.repeat(on, tile, axis=0), tile, axis=1)[:nq, :nk]
