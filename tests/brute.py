"""An independent, pair-by-pair reading of SPEC §2-4 in plain Python + float64 NumPy (test oracle)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from attnhub.rules import Causal, Full, Local


def position(i: int, lq: int, lk: int, sync: str, is_query: bool) -> int:
    m = max(lq, lk)
    n = lq if is_query else lk
    step = m // n
    if sync == "none_front":
        return i
    if sync == "none_end":
        return i + m - n
    if sync == "scale_front":
        return i * step
    if sync == "scale_end":
        return (i + 1) * step - 1
    raise ValueError(sync)


def attended(rule, sync: str, seq_q, seq_k, qi: tuple, kj: tuple) -> bool:
    ps = [position(qi[d], seq_q[d], seq_k[d], sync, True) for d in range(len(seq_q))]
    rs = [position(kj[d], seq_q[d], seq_k[d], sync, False) for d in range(len(seq_q))]
    extents = [max(a, b) for a, b in zip(seq_q, seq_k)]
    fq = fk = 0
    for d, m in enumerate(extents):
        fq = fq * m + ps[d]
        fk = fk * m + rs[d]
    if isinstance(rule, Full):
        return True
    if isinstance(rule, Causal):
        return fq >= fk
    assert isinstance(rule, Local)
    w = rule.window if isinstance(rule.window, tuple) else (rule.window,) * len(seq_q)
    if len(w) == 1:
        w = w * len(seq_q)
    s = 2**rule.log2_stride
    for d in range(len(seq_q)):
        delta = abs(ps[d] - rs[d])
        if delta % s != 0 or delta // s >= w[d]:
            return False
    return not rule.causal or fq >= fk


def dense_mask(rule, sync, seq_q, seq_k) -> np.ndarray:
    qs = list(itertools.product(*[range(n) for n in seq_q]))
    ks = list(itertools.product(*[range(n) for n in seq_k]))
    return np.array([[attended(rule, sync, seq_q, seq_k, a, b) for b in ks] for a in qs], dtype=bool).reshape(
        len(qs), len(ks)
    )


def dense_attention(q, k, v, keep, scale, bias=None):
    """q (B,Hq,Nq,D), k/v (B,Hkv,Nk,*), keep (Nq,Nk) or broadcastable 4-d: float64 (out, lse)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k = np.repeat(k, g, axis=1)
    v = np.repeat(v, g, axis=1)
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, k)
    if bias is not None:
        s = s + bias
    s = np.where(keep, s, -np.inf)
    out = np.zeros(q.shape[:3] + (v.shape[-1],))
    lse = np.full(q.shape[:3], -np.inf)
    for idx in np.ndindex(*s.shape[:3]):
        row = s[idx]
        if np.all(row == -np.inf):
            continue
        m = row.max()
        p = np.exp(row - m)
        out[idx] = p @ v[idx[0], idx[1]] / p.sum()
        lse[idx] = m + math.log(p.sum())
    return out, lse
