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
        {
            "1d",
            "2d",
            "full",
            "causal",
            "local",
            "explicit_mask",
            "gqa",
            "lse",
            "backward",
            "deterministic",
            "bias",
        }
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
        """A boolean mask narrows ``keep``; a float one (the bias, SPEC §9) is added to ``s``."""
        if mask is None:
            return s, keep
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            return s, keep & m
        return s + m.astype(np.float64), keep

    def normalise(self, p: np.ndarray, rowsum: np.ndarray) -> np.ndarray:
        """p / rowsum; a fully masked row (rowsum 0) gives 0, a NaN row sum stays NaN (SPEC §4)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(rowsum == 0, 0.0, p / np.where(rowsum == 0, 1.0, rowsum))

    def log_sum_exp(self, rowmax: np.ndarray, rowsum: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return rowmax + np.log(rowsum)

    def dq_factor(self, req: Request) -> float:
        return self.softmax_scale(req)

    def read_input(self, x: Any, heads: int, seq: tuple[int, ...], req: Request) -> np.ndarray:
        """The canonical (B, H, N, D) array (sequence shape ``seq``) the backend computes on, in float64."""
        return np.asarray(x).astype(np.float64)

    def dot_scores(self, qq: np.ndarray, kk: np.ndarray, req: Request) -> np.ndarray:
        """q @ k^T (float64 inputs and accumulation)."""
        return qq @ np.swapaxes(kk, -1, -2)

    def finish_out(self, out: np.ndarray, req: Request) -> np.ndarray:
        return out

    def weighted_values(self, p: np.ndarray, vv: np.ndarray) -> np.ndarray:
        """p @ vv where only keys with weight != 0 contribute: a NaN or Inf in a value a row does not
        attend stays out of that row (a plain product gives 0 x NaN = NaN there; SPEC §4)."""
        bad = ~np.isfinite(vv)
        if not bad.any():
            return p @ vv
        used = (p != 0).astype(np.float64)  # a NaN weight is != 0: its row is NaN anyway
        nan = used @ np.isnan(vv).astype(np.float64) > 0
        pos = used @ (vv == np.inf).astype(np.float64) > 0
        neg = used @ (vv == -np.inf).astype(np.float64) > 0
        out = p @ np.where(bad, 0.0, vv)
        return np.where(nan | (pos & neg), np.nan, np.where(pos, np.inf, np.where(neg, -np.inf, out)))

    def after_forward(self, q: Any, k: Any, v: Any, req: Request) -> None:
        """Called once the result is computed (the correct backend leaves its inputs alone)."""

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

    def probabilities(self, q, k, req: Request, mask, bias=None) -> tuple[np.ndarray, np.ndarray]:
        """Normalised probabilities (B, Hq, Nq, Nk) and lse (B, Hq, Nq), float64."""
        qq = self.read_input(q, req.heads_q, req.seq_q, req)
        kk = np.repeat(self.read_input(k, req.heads_kv, req.seq_k, req), req.group, axis=1)
        s = self.softmax_scale(req) * self.dot_scores(qq, kk, req)
        s, keep = self.apply_mask(s, self.keep_matrix(req), mask, req)
        s, keep = self.apply_mask(s, keep, bias, req)
        s = np.where(keep, s, -np.inf)
        rowmax = s.max(axis=-1, keepdims=True)
        finite_max = np.where(np.isfinite(rowmax), rowmax, 0.0)
        p = np.exp(s - finite_max)
        rowsum = p.sum(axis=-1, keepdims=True)
        lse = self.log_sum_exp(finite_max, rowsum)[..., 0]
        return self.normalise(p, rowsum), lse

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        p, lse = self.probabilities(q, k, req, mask, _bias(operands))
        vv = np.repeat(self.read_input(v, req.heads_kv, req.seq_k, req), req.group, axis=1)
        with np.errstate(invalid="ignore"):
            out = self.finish_out(self.weighted_values(p, vv), req)
        lse_dtype = np.float64 if req.dtype == "float64" else np.float32
        result = out.astype(q.dtype), lse.astype(lse_dtype)
        self.after_forward(q, k, v, req)
        return result

    def backward(
        self,
        q: Any,
        k: Any,
        v: Any,
        out: Any,
        lse: Any,
        dout: Any,
        req: Request,
        mask: Any = None,
        operands: Any = None,
        dlse: Any = None,
    ) -> tuple[Any, Any, Any]:
        p, _ = self.probabilities(q, k, req, mask, _bias(operands))
        g = req.group
        qq = self.read_input(q, req.heads_q, req.seq_q, req)
        kk = np.repeat(self.read_input(k, req.heads_kv, req.seq_k, req), g, axis=1)
        vv = np.repeat(self.read_input(v, req.heads_kv, req.seq_k, req), g, axis=1)
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


def _bias(operands: Any) -> Any:
    """The bias (or float mask) of a request that has one (SPEC §9), else None."""
    return None if operands is None else operands.bias


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
    """Claims ``explicit_mask`` and ``bias`` but ignores the arrays (capabilities declared and not
    honoured)."""

    name: ClassVar[str] = "toy_mask_ignored"

    def apply_mask(self, s, keep, mask, req):
        return s, keep


def f16_truncating_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b^T summed term by term in a float16 accumulator that truncates (rounds toward zero)."""
    acc = np.zeros((*a.shape[:-1], b.shape[-2]), dtype=np.float64)
    for i in range(a.shape[-1]):
        exact = acc + a[..., i : i + 1] * b[..., None, :, i]
        r = exact.astype(np.float16)
        over = np.abs(r.astype(np.float64)) > np.abs(exact)
        r[over] = np.nextafter(r[over], np.float16(0))
        acc = r.astype(np.float64)
    return acc


class Bf16InF16(ToyBackend):
    """bfloat16 scores accumulated in a truncating float16 accumulator on the wide-head path
    (head dim >= 64); over tolerance only where logits are large."""

    name: ClassVar[str] = "toy_bf16_in_f16"

    def dot_scores(self, qq, kk, req):
        if req.dtype == "bfloat16" and req.dim_qk >= 64:
            return f16_truncating_dot(qq, kk)
        return super().dot_scores(qq, kk, req)


class BshdIgnored(ToyBackend):
    """Guesses the layout from the shape: a ``bshd`` array whose dimension 1 equals its head count
    looks like ``bhsd`` and is read as such (wrong only when the sequence length equals the heads)."""

    name: ClassVar[str] = "toy_bshd_ignored"

    def read_input(self, x, heads, seq, req):
        x = np.asarray(x)
        if req.layout == "bshd":
            b, _, _, d = x.shape
            caller = np.moveaxis(x.reshape(b, heads, *seq, d), 1, -2)  # (B, *S, H, D)
            if caller.shape[1] == heads:
                x = caller.reshape(b, heads, -1, d)
        return x.astype(np.float64)


class DvGtDqk(ToyBackend):
    """The output's tile loop runs over Dqk columns: when Dv > Dqk the columns past Dqk stay 0."""

    name: ClassVar[str] = "toy_dv_gt_dqk"

    def finish_out(self, out, req):
        out = out.copy()
        out[..., req.dim_qk :] = 0.0
        return out


class ModifiesInputs(ToyBackend):
    """Reuses q as scratch space: once the result is computed, q is scaled in place."""

    name: ClassVar[str] = "toy_modifies_inputs"

    def after_forward(self, q, k, v, req):
        np.multiply(q, req.scale, out=q, casting="unsafe")


class NanToNum(ToyBackend):
    """Cleans its output with ``nan_to_num``: NaN becomes 0 (and Inf a huge finite number)."""

    name: ClassVar[str] = "toy_nan_to_num"

    def finish_out(self, out, req):
        return np.nan_to_num(out, nan=0.0)


class ZeroNanRows(ToyBackend):
    """Treats a row holding a NaN like a fully masked row: the whole row becomes 0."""

    name: ClassVar[str] = "toy_zero_nan_rows"

    def finish_out(self, out, req):
        return np.where(np.isnan(out).any(axis=-1, keepdims=True), 0.0, out)


VARIANTS = (
    ToyBackend,
    CausalOffByOne,
    SyncConfused,
    ScaleIgnored,
    LseWrong,
    MaskedRowNaN,
    GradWrong,
    MaskIgnored,
    Bf16InF16,
    BshdIgnored,
    DvGtDqk,
    ModifiesInputs,
    NanToNum,
    ZeroNanRows,
)
