"""Run one conformance case against one backend and judge it against the float64 reference.

For every case the backend's capability check decides: an accepted case must match the reference
(SPEC §6 tolerances), write every output element, keep the inputs intact, and give gradients and
bitwise repeats where declared; a declined case must be refused by ``attention(backend=NAME)``
with the same reasons and never be picked by ``auto``.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import attnhub
from attnhub.backend import Backend
from attnhub.dispatch import backend_reasons
from attnhub.errors import BackendUnsupported
from attnhub.frameworks import adapter_for, numpy_dtype
from attnhub.operands import Operands
from attnhub.positions import dense_rule_mask
from attnhub.registry import REGISTRY
from attnhub.request import Request, build_request, to_canonical
from attnhub.rules import ExplicitMask
from attnhub_conformance import oracle
from attnhub_conformance.arrays import Ops, from_layout, round_to, to_layout
from attnhub_conformance.cases import CHECK_FEATURES, Case
from attnhub_conformance.checks import (  # noqa: F401  (CaseFailure, compare: re-exported)
    CANCELLATION_FLOOR,
    CaseFailure,
    compare,
    compare_grad,
    errors,
    require_zero_rows,
    same_bits,
)
from attnhub_conformance.oracle import Problem
from attnhub_conformance.rounded import is_half, rounded_backward

#: SPEC §6: (forward, gradients) tolerance per dtype; float32 with tf32 is looser.
TOLERANCES = {
    "float64": (1e-10, 1e-9),
    "float32": (2e-5, 1e-4),
    "float16": (2e-3, 8e-3),
    "bfloat16": (1.6e-2, 4e-2),
}
TF32_TOLERANCES = (5e-4, 2e-3)


@dataclass
class Result:
    """The outcome of one case, as the reports store it."""

    id: str
    dtype: str
    features: list[str]
    status: str = "pass"  # "pass" | "FAIL" | "declined"
    reasons: list[str] = field(default_factory=list)
    check: str = ""
    message: str = ""
    request: str = ""
    repro: str = ""

    def failed_features(self) -> list[str]:
        """Rows this result marks FAIL: check-specific rows only when that check failed.

        Modified inputs are checked after everything else passed (see ``Certifier._run``): such a
        failure marks the "inputs unchanged" row alone."""
        family = self.check_family()
        if family == "inputs":
            return [f for f in self.features if f == "inputs unchanged"]
        return [f for f in self.features if f not in CHECK_FEATURES or CHECK_FEATURES[f] == family]

    def passed_features(self) -> list[str]:
        """Rows this result counts as passing: all of a passing case's; for a case that failed only
        the inputs check, every other row (its results were checked and right)."""
        if self.status == "pass":
            return list(self.features)
        if self.status == "FAIL" and self.check_family() == "inputs":
            return [f for f in self.features if f != "inputs unchanged"]
        return []

    def check_family(self) -> str:
        c = self.check
        if c.startswith("lse"):
            return "lse"
        if c in ("dq", "dk", "dv") or c.startswith("grad"):
            return "backward"
        if c.startswith("deterministic"):
            return "deterministic"
        if c == "inputs modified":
            return "inputs"
        return c


@dataclass
class Data:
    """The float64 (rounded) canonical inputs of one case, its upstream gradient and mask."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dout: np.ndarray
    mask: np.ndarray | None


def make_data(case: Case, rng: np.random.Generator) -> Data:
    """N(0, 1) inputs rounded to the case's dtype (q scaled by 8 for large logits), in float64."""
    b, hq, hkv, nq, nk = case.batch, case.heads_q, case.heads_kv, case.nq, case.nk
    q = rng.standard_normal((b, hq, nq, case.dim_qk)) * (8.0 if case.large_logits else 1.0)
    k = rng.standard_normal((b, hkv, nk, case.dim_qk))
    v = rng.standard_normal((b, hkv, nk, case.dim_v))
    dout = rng.standard_normal((b, hq, nq, case.dim_v))
    if case.peaked:  # key 0 holds ~98 % of every row's probability (with the default scale)
        q = rng.standard_normal(q.shape) * 0.3
        q[..., 0] = 8.0 * math.sqrt(case.dim_qk) / 4.0
        k = rng.standard_normal(k.shape) * 0.3
        k[..., 0, 0] = 4.0
    q, k, v, dout = (round_to(a, case.dtype) for a in (q, k, v, dout))
    if case.cotangent == "ones":  # the gradient of out.sum()
        dout = np.ones_like(dout)
    if case.nonfinite:
        place_nonfinite(case, q, k, v)
    mask = None
    if isinstance(case.rule, str):
        shape = (1, 1, nq, nk) if case.mask_shape == "bcast" else (b, hq, nq, nk)
        rows = np.arange(nq)
        empty = np.unique([0, nq // 2]) if case.mask_empty_rows else np.array([], dtype=int)
        if case.rule == "bool":
            mask = rng.random(shape) < 0.7
            mask[..., rows, rows % nk] = True  # no row empty by chance
            mask[..., empty, :] = False
        else:
            mask = round_to(rng.standard_normal(shape) * 2.0, case.dtype)
            mask[rng.random(shape) < 0.2] = -np.inf
            mask[..., rows, rows % nk] = 0.0
            mask[..., empty, :] = -np.inf
    return Data(q, k, v, dout, mask)


def nonfinite_sites(case: Case) -> dict[str, tuple[int, int, int, int]]:
    """Where a ``nonfinite`` case puts its value (canonical B, H, N, D indices): q in batch entry 0
    (last query row of the last head: it attends the most keys under a causal rule), k in entry 1
    and v in entry 2 (key ``Nk // 2`` of the first and last kv head, so GQA shows which heads read it)."""
    j = case.nk // 2
    return {
        "q": (0, case.heads_q - 1, case.nq - 1, 0),
        "k": (1, 0, j, 0),
        "v": (2, case.heads_kv - 1, j, min(1, case.dim_v - 1)),
    }


def place_nonfinite(case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """Write the case's NaN or +Inf into q, k and v (in place, see :func:`nonfinite_sites`).

    For +Inf the other operand's column is made positive, so that every logit the Inf touches is
    +Inf and its rows are NaN (Inf − Inf) without doubt: an Inf meeting a negative factor would give
    a −Inf logit, which excludes the pair (SPEC §9) instead."""
    value = np.nan if case.nonfinite == "nan" else np.inf
    group = case.heads_q // case.heads_kv
    (bq, hq, iq, dq), (bk, hk, jk, dk), site_v = (nonfinite_sites(case)[x] for x in "qkv")
    if case.nonfinite == "inf":
        k[bq, hq // group, :, dq] = np.abs(k[bq, hq // group, :, dq])
        q[bk, hk * group : (hk + 1) * group, :, dk] = np.abs(q[bk, hk * group : (hk + 1) * group, :, dk])
    q[bq, hq, iq, dq] = value
    k[bk, hk, jk, dk] = value
    v[site_v] = value


def attended(data: Data, req: Request) -> np.ndarray:
    """Boolean (B|1, Hq|1, Nq, Nk): which keys each query attends (rule, or boolean mask; a float
    mask is the bias, SPEC §9, and excludes a key where it is −inf)."""
    if isinstance(req.rule, ExplicitMask):
        return data.mask
    keep = dense_rule_mask(req.rule, req.seq_q, req.seq_k, req.sync)[None, None]
    if req.bias is not None:
        keep = keep & (data.mask > -np.inf)
    return keep


def expected_forward(data: Data, req: Request, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """The float64 (out, lse) a case must match: the suite's dense oracle (oracle.py, written from
    SPEC alone); for a ``nonfinite`` case SPEC §4 literally for the value in v (the product P·V
    would spread it, 0 × NaN, to rows that do not attend that key): the oracle on v without it,
    then that value in column d of exactly the rows attending key j (their weight is > 0, so NaN
    stays NaN and +Inf stays +Inf)."""
    if not case.nonfinite:
        return oracle.forward(dense_problem(data, req))
    b, h, j, d = nonfinite_sites(case)["v"]
    value = data.v[b, h, j, d]
    v = data.v.copy()
    v[b, h, j, d] = 0.0
    out, lse = oracle.forward(dense_problem(data, req, v))
    keep = attended(data, req)
    for hq in range(h * req.group, (h + 1) * req.group):
        rows = keep[min(b, keep.shape[0] - 1), min(hq, keep.shape[1] - 1), :, j]
        out[b, hq, rows, d] = value
    return out, lse


def forgiven_rows(data: Data, req: Request, case: Case) -> np.ndarray | None:
    """(B, Hq, Nq) True on the rows whose non-finite out and lse docs/semantics.md leaves open: rows
    of the batch entry and heads that read the non-finite value of a ``nonfinite`` case in k or v but
    do not attend its key (a tiled kernel's masked probability 0 times NaN, or an additive mask's −inf
    plus +Inf, gives NaN there, as FlashAttention's and SDPA's do). Padded keys (SPEC §10) are never
    forgiven: the §9-§11 cases check that they do not leak."""
    if not case.nonfinite:
        return None
    keep = attended(data, req)
    rows = np.zeros((req.batch, req.heads_q, req.nq), dtype=bool)
    for site in ("k", "v"):
        b, h, j, _ = nonfinite_sites(case)[site]
        for hq in range(h * req.group, (h + 1) * req.group):
            rows[b, hq] |= ~keep[min(b, keep.shape[0] - 1), min(hq, keep.shape[1] - 1), :, j]
    return rows


def inf_as_nan(got: np.ndarray, expected: np.ndarray, case: Case) -> np.ndarray:
    """``got`` with NaN read as the expected ±Inf where an Inf case's out is ±Inf (the rows that
    attend the +Inf in v, SPEC §4: an Inf may come back NaN there; SDPA's efficient kernel in
    float32 returns NaN on every such row). A finite value there still fails."""
    if case.nonfinite != "inf":
        return got
    return np.where(np.isinf(expected) & np.isnan(got), expected, got)


def forgive(got: np.ndarray, expected: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    """``got`` with its non-finite elements on ``rows`` replaced by ``expected`` (see forgiven_rows)."""
    if rows is None:
        return got
    rows = rows.reshape(rows.shape + (1,) * (got.ndim - rows.ndim))
    return np.where(rows & ~np.isfinite(got), expected, got)


def dense_problem(data: Data, req: Request, v: np.ndarray | None = None) -> Problem:
    """The dense oracle problem of a plain case (``v`` in place of ``data.v`` where given): the
    pairs :func:`attended` keeps, a float mask as the bias it is (SPEC §9)."""
    bias = None
    if req.bias is not None:
        bias = np.broadcast_to(data.mask.astype(np.float64), (*data.q.shape[:2], req.nq, req.nk))
    keep = np.broadcast_to(attended(data, req), (*data.q.shape[:2], req.nq, req.nk))
    return Problem(data.q, data.k, data.v if v is None else v, keep, req.scale, bias=bias)


def grad_magnitudes(problem: Problem, dout: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """|dq|, |dk|, |dv| computed without cancellation (float64, dense; the grid's sizes are small).

    ``ds = p * (dp - delta)`` cancels exactly where a query attends a single key (Local window 1):
    the reference gradient is then 0 up to rounding, and a relative error against it is noise
    over noise. With ``ds_mag = p * (|dp| + |delta|)`` and absolute values in the products (the
    oracle's magnitudes, :func:`oracle.backward`), these bound the terms a backend sums; gradient
    errors are measured against at least 1/64 of them, which leaves every well-conditioned case
    (ratio 4 to 16 on random data) under SPEC §6 as is.
    """
    mag = oracle.backward(problem, dout)[1]
    return mag.dq, mag.dk, mag.dv


class Certifier:
    """Runs cases against the backend ``name`` and keeps every :class:`Result`."""

    def __init__(
        self,
        name: str,
        *,
        seed: int,
        framework: str | None = None,
        device: str | None = None,
    ) -> None:
        table = REGISTRY.backends()
        if name not in table:
            raise KeyError(name)
        self.name = name
        self.backend: Backend = table[name]
        self.seed = seed
        self.framework = framework or (self.backend.frameworks[0] if self.backend.frameworks else "numpy")
        self.device = device or default_device(self.backend)
        self.ops = Ops(self.framework, self.device)
        self._ops = {self.framework: self.ops}
        self.results: dict[str, Result] = {}
        self.repro_base = f"attnhub certify {name}"
        self.repro_extra = ""

    # -- bookkeeping ----------------------------------------------------------------------------
    def tolerances(self, dtype: str) -> tuple[float, float]:
        if dtype == "float32" and "tf32" in self.backend.features:
            return TF32_TOLERANCES
        return TOLERANCES[dtype]

    def ops_for(self, framework: str) -> Ops:
        """The operations for ``framework`` on the run's device (raises when it cannot be used)."""
        if framework not in self._ops:
            self._ops[framework] = Ops(framework, self.device)
        return self._ops[framework]

    def framework_of(self, case: Case) -> str:
        return case.framework or self.framework

    def features(self, case: Case) -> list[str]:
        """The case's matrix rows, with the framework its inputs were built in."""
        own = f"framework {self.framework_of(case)}"
        return [*case.features, *([] if own in case.features else [own])]

    def repro(self, case: Case) -> str:
        return f"{self.repro_base} --case {case.id} --seed {self.seed}{self.repro_extra}"

    def run(self, case: Case) -> Result:
        """Certify one case; records its result and raises :class:`CaseFailure` when it fails."""
        res = Result(case.id, case.dtype, self.features(case), repro=self.repro(case))
        # a randomised case's id names none of its content: its failures say it in full
        about = "" if case.random_index is None else f"{{{case.describe()}; seed {self.seed}}} "
        try:
            self._run(case, res)
        except CaseFailure as exc:
            res.status, res.check, res.message = "FAIL", exc.check, about + str(exc)
            raise
        except Exception as exc:  # an accepted case that crashes fails
            res.status, res.check = "FAIL", _crash_check(exc)
            what = f"{type(exc).__name__}: {exc}" if res.check == "error" else f"[{res.check}] {exc}"
            res.message = about + what
            raise CaseFailure(res.check, res.message) from exc
        finally:
            prev = self.results.get(case.id)
            if prev is None or prev.status != "FAIL":  # a replay never hides an earlier failure
                self.results[case.id] = res
        return res

    # -- one case -------------------------------------------------------------------------------
    def _run(self, case: Case, res: Result) -> None:
        if case.modified:  # SPEC §9-§11: against the suite's dense oracle
            from attnhub_conformance.modifier_runner import run_modified

            return run_modified(self, case, res)
        fw = self.framework_of(case)
        ops, b = self.ops_for(fw), self.backend
        rng = np.random.default_rng([self.seed, zlib.crc32(case.id.encode())])
        data = make_data(case, rng)
        xs, kw = self._inputs(ops, fw, case, data)
        mask = kw["mask"]
        req, _ = build_request(xs[0], xs[1], xs[2], mask, case.sync, case.scale, case.layout, case.lse)
        res.request = req.describe()

        reasons = _reasons(b, req)
        if reasons:
            self._honest_decline(xs, kw, reasons)
            res.status, res.reasons = "declined", reasons
            return
        greq = dataclasses.replace(req, needs_grad=True)
        if case.grad and (why := _reasons(b, greq)):
            res.status, res.reasons = "declined", why
            return
        if case.repeat and "deterministic" not in b.features:
            res.status, res.reasons = "declined", ["does not declare deterministic"]
            return
        if case.traced and (why := ops.tracer_obstacle()):
            res.status, res.reasons = "declined", [why]
            return

        # Modified inputs are noted, the inputs rebuilt, and the other checks go on: the failure is
        # raised last, so it names the "inputs unchanged" row alone when everything else is right.
        modified: list[str] = []
        before = self._snapshot(ops, xs, kw)
        try:
            out, lse = self._forward(ops, fw, xs, kw, req, case)
        except BackendUnsupported as exc:
            if not case.traced:
                raise
            res.status, res.reasons = "declined", [f"under {ops.tracer}: {r}" for r in exc.reasons]
            return
        ref_out, ref_lse = expected_forward(data, req, case)
        fwd_tol, grad_tol = self.tolerances(case.dtype)
        empty = np.isneginf(ref_lse)
        forgiven = forgiven_rows(data, req, case)
        got = forgive(from_layout(ops.to_f64(out), case.layout), ref_out, forgiven)
        compare("out", inf_as_nan(got, ref_out, case), ref_out, fwd_tol, case.dtype)
        require_zero_rows("out", got, empty)
        got_lse = None
        if case.lse:
            got_lse = forgive(ops.to_f64(lse).reshape(ref_lse.shape), ref_lse, forgiven)
            compare("lse", inf_logit_lse(got_lse, ref_lse, case), ref_lse, fwd_tol, case.dtype)
        if self._changed(ops, xs, kw, before, "the forward pass", modified):
            xs, kw = self._inputs(ops, fw, case, data)

        grads = None
        if case.grad:
            grads = self._grads(ops, fw, xs, kw, req, greq, data, case, res, modified)
            if grads is None:
                return
            problem = dense_problem(data, req)
            ref_grads = oracle.backward(problem, data.dout)[0]
            refs = (ref_grads.dq, ref_grads.dk, ref_grads.dv)
            floors = grad_magnitudes(problem, data.dout)
            rounded = None
            if is_half(case.dtype):
                rg = rounded_backward(problem, data.dout, case.dtype)
                rounded = (rg.dq, rg.dk, rg.dv)
            for i, (name, g, r, f) in enumerate(zip(("dq", "dk", "dv"), grads, refs, floors)):
                compare_grad(name, g, r, grad_tol, case.dtype, f, None if rounded is None else rounded[i])
            require_zero_rows("dq", grads[0], empty)
            if self._changed(ops, xs, kw, before, "the backward pass", modified):
                xs, kw = self._inputs(ops, fw, case, data)
            if case.lse:
                self._check_lse_grad(ops, fw, xs, kw, greq, data, case, problem, grad_tol)

        if case.repeat:
            out2, lse2 = self._forward(ops, fw, xs, kw, req, case)
            if not np.array_equal(from_layout(ops.to_f64(out2), case.layout), got, equal_nan=True):
                raise CaseFailure("deterministic out", "a repeated forward is not bitwise identical")
            if case.lse and not np.array_equal(
                ops.to_f64(lse2).reshape(ref_lse.shape), got_lse, equal_nan=True
            ):
                raise CaseFailure("deterministic lse", "a repeated forward's lse is not bitwise identical")
            if grads is not None:
                again = self._grads(ops, fw, xs, kw, req, greq, data, case, res, modified)
                for name, g, h in zip(("dq", "dk", "dv"), grads, again or ()):
                    if not np.array_equal(g, h, equal_nan=True):
                        raise CaseFailure(
                            "deterministic grad", f"a repeated backward's {name} is not bitwise identical"
                        )
        if modified:
            raise CaseFailure("inputs modified", "; ".join(dict.fromkeys(modified)))

    def _inputs(self, ops: Ops, fw: str, case: Case, data: Data) -> tuple[list[Any], dict[str, Any]]:
        """Fresh q, k, v in the case's framework and layout, and the call's keyword arguments."""
        torch_grad = case.grad and fw == "torch"
        xs = [
            ops.array(to_layout(a, seq, case.layout), case.dtype, case.noncontig, grad=torch_grad)
            for a, seq in ((data.q, case.seq_q), (data.k, case.seq_k), (data.v, case.seq_k))
        ]
        mask = ops.mask(data.mask, case.dtype) if data.mask is not None else case.mask
        kw: dict[str, Any] = dict(
            mask=mask, sync=case.sync, scale=case.scale, layout=case.layout, return_lse=case.lse
        )
        return xs, kw

    def _forward(
        self, ops: Ops, fw: str, xs: list[Any], kw: dict[str, Any], req: Request, case: Case
    ) -> tuple[Any, Any]:
        nbytes = req.batch * req.heads_q * req.nq * (req.dim_v + 1) * 8
        ops.poison(nbytes)
        if case.traced:
            result = ops.traced_call(lambda q, k, v: attnhub.attention(q, k, v, backend=self.name, **kw), xs)
        else:
            result = attnhub.attention(*xs, backend=self.name, **kw)
        out, lse = result if case.lse else (result, None)
        self._hygiene(fw, "out", out, expected_out_shape(case), req.dtype, req.device)
        if case.lse:
            lse_dtype = "float64" if req.dtype == "float64" else "float32"
            self._hygiene(fw, "lse", lse, (req.batch, req.heads_q, *req.seq_q), lse_dtype, req.device)
        return out, lse

    def _grads(
        self, ops: Ops, fw: str, xs, kw, req: Request, greq: Request, data: Data, case: Case, res: Result,
        modified: list[str],
    ) -> list[np.ndarray] | None:  # fmt: skip
        """(dq, dk, dv) canonical float64, by the framework's autodiff (NumPy: backend.backward)."""
        b = self.backend
        if fw == "numpy":
            (qc, kc, vc), mc, mask_arg, operands = _numpy_call_args(xs, kw, data, greq, case)
            arrays = [qc, kc, vc] + ([] if mc is None else [mc])
            before = [x.copy() for x in arrays]
            dout = data.dout.astype(numpy_dtype(case.dtype))
            ops.poison(0)
            out, lse = b.forward(qc, kc, vc, greq, mask_arg, operands)
            if self._changed_np(arrays, before, "backend.forward", modified):
                for x, y in zip(arrays, before):
                    x[...] = y  # the backward gets the inputs it should have had
            grads = b.backward(qc, kc, vc, out, lse, dout, greq, mask_arg, operands, None)
            for name, g, x in zip(("dq", "dk", "dv"), grads, (qc, kc, vc)):
                self._hygiene(fw, f"grad {name}", g, x.shape, case.dtype, req.device)
            self._changed_np(arrays, before, "backend.backward", modified)
            return [np.asarray(g, dtype=np.float64) for g in grads]
        gkw = dict(kw, return_lse=False)
        dout = ops.array(to_layout(data.dout, case.seq_q, case.layout), case.dtype)
        try:
            ops.poison(0)
            call = lambda q, k, v: attnhub.attention(q, k, v, backend=self.name, **gkw)  # noqa: E731
            if case.traced:
                grads = ops.traced_grads(call, xs, dout, ones=case.cotangent == "ones")
            else:
                grads = ops.grads(call, xs, dout)
        except BackendUnsupported as exc:  # e.g. a traced (jax.vjp) request the backend declines
            where = f"gradient call under {ops.tracer}" if case.traced else "gradient call"
            res.status, res.reasons = "declined", [f"{where}: {r}" for r in exc.reasons]
            return None
        for name, g, x in zip(("dq", "dk", "dv"), grads, xs):
            if g is None:
                raise CaseFailure(f"grad {name}", "the framework returned no gradient")
            self._hygiene(fw, f"grad {name}", g, tuple(int(s) for s in x.shape), case.dtype, req.device)
        return [from_layout(ops.to_f64(g), case.layout) for g in grads]

    def _check_lse_grad(
        self, ops: Ops, fw: str, xs, kw, greq: Request, data: Data, case: Case, problem: Problem, tol: float
    ) -> None:  # fmt: skip
        """SPEC §5: a gradient through the returned lse is the oracle's (``∂lse/∂s = P``), or the
        call raises; a gradient that leaves lse's term out (zeros, or out's gradient only) fails.
        NumPy: ``backend.backward`` with ``dlse``, for a backend declaring "dlse"."""
        rng = np.random.default_rng([self.seed, zlib.crc32(f"{case.id}/dlse".encode())])
        w = rng.standard_normal((case.batch, case.heads_q, greq.nq))
        refs, mags = oracle.backward(problem, np.zeros_like(data.dout), w)
        lse_dtype = "float64" if case.dtype == "float64" else "float32"
        if fw == "numpy":
            b = self.backend
            if "dlse" not in b.features:
                return
            (qc, kc, vc), _, mask_arg, operands = _numpy_call_args(xs, kw, data, greq, case)
            out, lse = b.forward(qc, kc, vc, greq, mask_arg, operands)
            zeros = np.zeros(out.shape, dtype=out.dtype)
            dl = w.astype(numpy_dtype(lse_dtype))
            got = [
                np.asarray(g, np.float64)
                for g in b.backward(qc, kc, vc, out, lse, zeros, greq, mask_arg, operands, dl)[:2]
            ]
        else:
            lkw = dict(kw, return_lse=True)
            dlse = ops.array(w.reshape(case.batch, case.heads_q, *case.seq_q), lse_dtype)
            call = lambda q, k, v: attnhub.attention(q, k, v, backend=self.name, **lkw)[1]  # noqa: E731
            try:
                grads = ops.grads(call, xs, dlse)
            except Exception:  # an error (the backend cannot differentiate lse) is no silent drop
                return
            if grads[0] is None or grads[1] is None:
                raise CaseFailure("grad lse", "no gradient for q or k through lse, and no error either")
            got = [from_layout(ops.to_f64(g), case.layout) for g in grads[:2]]
        for name, g, r, f in zip(("dq", "dk"), got, (refs.dq, refs.dk), (mags.dq, mags.dk)):
            compare_grad(f"grad lse {name}", g, r, tol, case.dtype, f)

    # -- checks ---------------------------------------------------------------------------------
    def _hygiene(self, fw: str, what: str, x: Any, shape: tuple[int, ...], dtype: str, device: str) -> None:
        try:
            ad = adapter_for(x)
        except Exception:
            raise CaseFailure(f"hygiene {what}", f"not an array: {type(x).__name__}") from None
        if ad.name != fw:
            raise CaseFailure(f"hygiene {what}", f"a {ad.name} array, the inputs are {fw}")
        if ad.shape(x) != tuple(shape):
            raise CaseFailure(f"hygiene {what}", f"shape {ad.shape(x)}, expected {tuple(shape)}")
        if ad.dtype_name(x) != dtype:
            raise CaseFailure(f"hygiene {what}", f"dtype {ad.dtype_name(x)}, expected {dtype}")
        if ad.device(x) != device:
            raise CaseFailure(f"hygiene {what}", f"on device {ad.device(x)}, the inputs are on {device}")

    @staticmethod
    def _named(xs: list[Any], kw: dict[str, Any]) -> list[tuple[str, Any]]:
        """The caller's arrays: q, k, v and an explicit mask."""
        named = list(zip("qkv", xs))
        if hasattr(kw["mask"], "shape"):
            named.append(("mask", kw["mask"]))
        return named

    def _snapshot(self, ops: Ops, xs: list[Any], kw: dict[str, Any]) -> list[np.ndarray]:
        return [ops.to_numpy(x) for _, x in self._named(xs, kw)]

    def _changed(
        self,
        ops: Ops,
        xs: list[Any],
        kw: dict[str, Any],
        before: list[np.ndarray],
        when: str,
        notes: list[str],
    ) -> bool:
        """Whether ``when`` changed a bit of the caller's arrays (noted in ``notes``)."""
        bad = [n for (n, x), old in zip(self._named(xs, kw), before) if not same_bits(ops.to_numpy(x), old)]
        if bad:
            notes.append(f"{when} modified the caller's {', '.join(bad)}")
        return bool(bad)

    @staticmethod
    def _changed_np(arrays: list[np.ndarray], before: list[np.ndarray], when: str, notes: list[str]) -> bool:
        bad = [n for n, x, old in zip(("q", "k", "v", "mask"), arrays, before) if not same_bits(x, old)]
        if bad:
            notes.append(f"{when} wrote into its inputs ({', '.join(bad)})")
        return bool(bad)

    def _honest_decline(self, xs: list[Any], kw: dict[str, Any], reasons: list[str]) -> None:
        """A declined request: ``backend=NAME`` raises with the same reasons; ``auto`` avoids it."""
        try:
            attnhub.attention(*xs, backend=self.name, **kw)
        except BackendUnsupported as exc:
            if exc.reasons != reasons:
                raise CaseFailure(
                    "honesty", f"check() gave {reasons} but attention(backend=NAME) raised {exc.reasons}"
                ) from None
        else:
            raise CaseFailure("honesty", f"check() declined ({'; '.join(reasons)}) but the call ran")
        chosen = attnhub.explain(*xs, **kw).chosen
        if chosen == self.name:
            raise CaseFailure("honesty", "auto dispatch chose the backend for a request it declines")


def inf_logit_lse(got: np.ndarray, ref: np.ndarray, case: Case) -> np.ndarray:
    """``got`` lse with +Inf read as NaN where an Inf case's reference lse is NaN: a row with a +Inf
    logit has lse = log Σ exp = +Inf as a limit and NaN as Inf − Inf; both propagate (SPEC §4)."""
    if case.nonfinite != "inf":
        return got
    return np.where(np.isnan(ref) & (got == np.inf), np.nan, got)


def expected_out_shape(case: Case) -> tuple[int, ...]:
    canon = (case.batch, case.heads_q, case.nq, case.dim_v)
    return to_layout(np.empty(canon, dtype=np.int8), case.seq_q, case.layout).shape


def default_device(backend: Backend) -> str:
    """cpu when the backend runs there, else cuda when it declares cuda, else its first device type."""
    types = tuple(backend.device_types)
    if "cpu" in types or not types:
        return "cpu"
    if "cuda" in types:
        return "cuda"
    return "cpu"


def _numpy_call_args(xs, kw, data: Data, req: Request, case: Case) -> tuple:  # noqa: ANN001
    """((q, k, v) canonical, the caller's mask array reshaped or None, and the ``mask`` and
    ``operands`` a NumPy backend's methods get, as the core passes them (attnhub.plan.Plan): a
    float mask is the bias, in ``operands``)."""
    ad = adapter_for(xs[0])
    qkv = tuple(to_canonical(ad, x, case.layout) for x in xs)
    mc = None if data.mask is None else kw["mask"].reshape(req.bias or req.rule.shape)
    if req.bias is not None:
        return qkv, mc, None, Operands(bias=mc)
    return qkv, mc, mc, None


def _reasons(b: Any, req: Any) -> list[str]:
    """Everything ``backend=NAME`` would decline the request for: the dispatcher's own reasons
    (:func:`attnhub.dispatch.backend_reasons`), one source for dispatch and certify."""
    return backend_reasons(b, req, frozenset())


def _crash_check(exc: Exception) -> str:
    """The check a crashed case failed: the core's result check (a ``BackendError`` saying the backend
    returned a wrong result) is the suite's hygiene check of that output; anything else is ``error``."""
    from attnhub.errors import BackendError

    problem = getattr(exc, "problem", "") if isinstance(exc, BackendError) else ""
    if problem.startswith("returned a wrong result"):
        return "hygiene lse" if "(lse:" in problem else "hygiene out"
    return "error"
