"""A dense NumPy attention backend written from SPEC.md alone, and variants that each break one thing.

The correct backend (:class:`ToyBackend`) builds the whole Nq x Nk mask from the positions of
SPEC §2-3, runs a float64 softmax and casts back; its backward is the analytic one. Each broken
variant overrides one small hook, so the conformance suite can show it fails on that feature.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from attnhub import Backend, Causal, Full, Local, Request


def axis_positions(lq: int, lk: int, sync: str) -> tuple[np.ndarray, np.ndarray]:
    """Query and key positions on one sequence dimension (SPEC §2 table)."""
    m = max(lq, lk)
    i, j = np.arange(lq), np.arange(lk)
    if sync == "none_front":
        return i, j
    if sync == "none_end":
        return i + m - lq, j + m - lk
    a, b = m // lq, m // lk
    if sync == "scale_front":
        return i * a, j * b
    return (i + 1) * a - 1, (j + 1) * b - 1  # scale_end


class ToyBackend(Backend):
    """Dense float64 NumPy attention with every feature of SPEC (small sizes only: O(Nq x Nk))."""

    name: ClassVar[str] = "toy"
    priority: ClassVar[int] = -100  # never chosen by "auto" ahead of a real backend
    frameworks: ClassVar[tuple[str, ...]] = ("numpy",)
    device_types: ClassVar[tuple[str, ...]] = ("cpu",)
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float64", "float16", "bfloat16")
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward", "deterministic"}
    )
    max_head_dim: ClassVar[int | None] = 256

    def version(self) -> str:
        return f"numpy {np.__version__}"

    def extra_reasons(self, req: Request) -> list[str]:
        if req.nq * req.nk > 1 << 24:
            return [f"dense Nq x Nk scores: at most 2**24 pairs, got {req.nq} x {req.nk}"]
        return []

    # -- hooks the broken variants override ------------------------------------------------------
    def sync_mode(self, sync: str) -> str:
        return sync

    def causal_keep(self, fq: np.ndarray, fk: np.ndarray) -> np.ndarray:
        return fq[:, None] >= fk[None, :]

    def softmax_scale(self, req: Request) -> float:
        return req.scale

    def apply_mask(self, s: np.ndarray, keep: np.ndarray, mask: Any, req: Request) -> tuple[Any, Any]:
        if mask is None:
            return s, keep
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            return s, keep & m
        return s + m.astype(np.float64), keep

    def normalise(self, p: np.ndarray, rowsum: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(rowsum > 0, p / np.where(rowsum > 0, rowsum, 1.0), 0.0)

    def log_sum_exp(self, rowmax: np.ndarray, rowsum: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return rowmax + np.log(rowsum)

    def dq_factor(self, req: Request) -> float:
        return self.softmax_scale(req)

    # -- the computation ----------------------------------------------------------------------------
    def keep_matrix(self, req: Request) -> np.ndarray:
        """Boolean Nq x Nk: which keys each query attends under the request's rule and sync mode."""
        sync = self.sync_mode(req.sync)
        axes = [axis_positions(a, b, sync) for a, b in zip(req.seq_q, req.seq_k)]
        iq = np.indices(req.seq_q).reshape(len(req.seq_q), -1)
        ik = np.indices(req.seq_k).reshape(len(req.seq_k), -1)
        pq = [axes[d][0][iq[d]] for d in range(req.ndim)]
        pk = [axes[d][1][ik[d]] for d in range(req.ndim)]
        fq = np.zeros(req.nq, dtype=np.int64)
        fk = np.zeros(req.nk, dtype=np.int64)
        for d in range(req.ndim):
            width = max(req.seq_q[d], req.seq_k[d])
            fq, fk = fq * width + pq[d], fk * width + pk[d]
        rule = req.rule
        keep = np.ones((req.nq, req.nk), dtype=bool)
        if isinstance(rule, Causal):
            keep = self.causal_keep(fq, fk)
        elif isinstance(rule, Local):
            step = 2**rule.log2_stride
            for d, w in enumerate(rule.windows(req.ndim)):
                dist = np.abs(pq[d][:, None] - pk[d][None, :])
                keep &= (dist % step == 0) & (dist // step < w)
            if rule.causal:
                keep &= self.causal_keep(fq, fk)
        elif not isinstance(rule, Full):  # an explicit mask: the array decides
            pass
        return keep

    def probabilities(self, q, k, req: Request, mask) -> tuple[np.ndarray, np.ndarray]:
        """Normalised probabilities (B, Hq, Nq, Nk) and lse (B, Hq, Nq), float64."""
        qq = np.asarray(q).astype(np.float64)
        kk = np.repeat(np.asarray(k).astype(np.float64), req.group, axis=1)
        s = self.softmax_scale(req) * (qq @ np.swapaxes(kk, -1, -2))
        s, keep = self.apply_mask(s, self.keep_matrix(req), mask, req)
        s = np.where(keep, s, -np.inf)
        rowmax = s.max(axis=-1, keepdims=True)
        finite_max = np.where(np.isfinite(rowmax), rowmax, 0.0)
        p = np.exp(s - finite_max)
        rowsum = p.sum(axis=-1, keepdims=True)
        lse = self.log_sum_exp(finite_max, rowsum)[..., 0]
        return self.normalise(p, rowsum), lse

    def forward(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        p, lse = self.probabilities(q, k, req, mask)
        vv = np.repeat(np.asarray(v).astype(np.float64), req.group, axis=1)
        out = p @ vv
        lse_dtype = np.float64 if req.dtype == "float64" else np.float32
        return out.astype(q.dtype), lse.astype(lse_dtype)

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None
    ) -> tuple[Any, Any, Any]:
        p, _ = self.probabilities(q, k, req, mask)
        g = req.group
        qq = np.asarray(q).astype(np.float64)
        kk = np.repeat(np.asarray(k).astype(np.float64), g, axis=1)
        vv = np.repeat(np.asarray(v).astype(np.float64), g, axis=1)
        do = np.asarray(dout).astype(np.float64)
        o = p @ vv
        dp = do @ np.swapaxes(vv, -1, -2)
        ds = p * (dp - (do * o).sum(axis=-1, keepdims=True))
        dq = self.dq_factor(req) * (ds @ kk)
        dk = self.softmax_scale(req) * (np.swapaxes(ds, -1, -2) @ qq)
        dv = np.swapaxes(p, -1, -2) @ do

        def per_kv_head(x: np.ndarray) -> np.ndarray:
            b, _, n, d = x.shape
            return x.reshape(b, req.heads_kv, g, n, d).sum(axis=2)

        dt = q.dtype
        return dq.astype(dt), per_kv_head(dk).astype(dt), per_kv_head(dv).astype(dt)


# -- the broken variants: each breaks exactly one thing ------------------------------------------
class CausalOffByOne(ToyBackend):
    """Causal alignment off by one: a query also sees the next key."""

    name: ClassVar[str] = "toy_causal_off_by_one"

    def causal_keep(self, fq, fk):
        return fq[:, None] + 1 >= fk[None, :]


class SyncConfused(ToyBackend):
    """``scale_end`` computed as ``scale_front``."""

    name: ClassVar[str] = "toy_sync_confused"

    def sync_mode(self, sync):
        return "scale_front" if sync == "scale_end" else sync


class ScaleIgnored(ToyBackend):
    """The ``scale`` argument is ignored: always 1/sqrt(Dqk)."""

    name: ClassVar[str] = "toy_scale_ignored"

    def softmax_scale(self, req):
        return 1.0 / math.sqrt(req.dim_qk)


class LseWrong(ToyBackend):
    """lse forgets the row maximum it subtracted."""

    name: ClassVar[str] = "toy_lse_wrong"

    def log_sum_exp(self, rowmax, rowsum):
        with np.errstate(divide="ignore"):
            return np.log(rowsum)


class MaskedRowNaN(ToyBackend):
    """A fully masked row divides 0 by 0: NaN instead of 0."""

    name: ClassVar[str] = "toy_masked_row_nan"

    def normalise(self, p, rowsum):
        with np.errstate(invalid="ignore", divide="ignore"):
            return p / rowsum


class GradWrong(ToyBackend):
    """dq misses the softmax scale factor."""

    name: ClassVar[str] = "toy_grad_wrong"

    def dq_factor(self, req):
        return 1.0


class MaskIgnored(ToyBackend):
    """Claims ``explicit_mask`` but ignores the array (a capability declared and not honoured)."""

    name: ClassVar[str] = "toy_mask_ignored"

    def apply_mask(self, s, keep, mask, req):
        return s, keep


VARIANTS = (
    ToyBackend,
    CausalOffByOne,
    SyncConfused,
    ScaleIgnored,
    LseWrong,
    MaskedRowNaN,
    GradWrong,
    MaskIgnored,
)
