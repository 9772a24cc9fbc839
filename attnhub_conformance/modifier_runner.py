"""Certify one SPEC §9-§11 case (bias, bool masks, softcap, sinks, lengths, varlen, kvcache, offsets).

The same checks as :meth:`Certifier._run` for plain cases, against the suite's dense oracle
(:mod:`attnhub_conformance.oracle`): an honest decline, or out and lse within SPEC §6, exact zeros
on fully masked and padded query rows, gradients of q, k, v, and of the bias and sinks when the
caller differentiates them (summed over the bias's broadcast dimensions), zero dk and dv on padded
keys, and every caller array (lengths, cu_seqlens and block tables included) left unchanged.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from attnhub.dispatch import backend_reasons
from attnhub.errors import BackendUnsupported
from attnhub.frameworks import numpy_dtype
from attnhub_conformance import oracle
from attnhub_conformance.checks import CaseFailure, compare, compare_grad, require_zero_rows, same_bits
from attnhub_conformance.modifier_calls import Call
from attnhub_conformance.modifier_data import ModData, bias_dtype, make_mod_data, to_blocks
from attnhub_conformance.rounded import is_half, rounded_backward

if TYPE_CHECKING:
    from attnhub_conformance.cases import Case
    from attnhub_conformance.runner import Certifier, Result


def run_modified(cert: Certifier, case: Case, res: Result) -> None:
    """Run ``case`` against ``cert``'s backend; raise ``CaseFailure`` on a failed check."""

    fw = cert.framework_of(case)
    ops, b = cert.ops_for(fw), cert.backend
    rng = np.random.default_rng([cert.seed, zlib.crc32(case.id.encode())])
    d = make_mod_data(case, rng)
    call = Call(ops, case, d)
    if getattr(case, "expect_spec_error", ""):
        return require_spec_error(cert, call, case.expect_spec_error, res)
    req = call.request()
    res.request = req.describe()
    # As dispatch decides (Backend.check plus the core's own reasons, e.g. a bias's gradient)
    reasons = backend_reasons(b, req, frozenset())
    if reasons:
        honest_decline(cert, call, reasons)
        res.status, res.reasons = "declined", reasons
        return
    greq = call.grad_request(req)
    if case.grad and (why := backend_reasons(b, greq, frozenset())):
        res.status, res.reasons = "declined", why
        return
    if case.repeat and "deterministic" not in b.features:
        res.status, res.reasons = "declined", ["does not declare deterministic"]
        return
    if case.traced and (why := ops.tracer_obstacle()):
        res.status, res.reasons = "declined", [why]
        return

    modified: list[str] = []
    before = snapshot(ops, call)
    ops.poison(req.batch * req.heads_q * req.nq * (req.dim_v + 1) * 8)
    if case.traced:  # every array traced, lengths, tables and slopes included
        try:
            result = ops.traced_call(_invoke_all(cert, call), list(call.arrays.values()))
        except BackendUnsupported as exc:
            res.status, res.reasons = "declined", [f"under {ops.tracer}: {r}" for r in exc.reasons]
            return
    else:
        result = call.invoke(cert.name)
    out, lse = result if case.lse else (result, None)
    cert._hygiene(fw, "out", out, call.out_shape(), case.dtype, req.device)
    if case.lse:
        lse_dtype = "float64" if case.dtype == "float64" else "float32"
        cert._hygiene(fw, "lse", lse, call.lse_shape(), lse_dtype, req.device)
    prob = d.problem(case, req.scale)
    ref_out, ref_lse = oracle.forward(prob)
    fwd_tol, grad_tol = cert.tolerances(case.dtype)
    empty = oracle.empty_rows(prob)
    got = call.canonical("out", ops.to_f64(out))
    compare("out", got, ref_out, fwd_tol, case.dtype)
    require_zero_rows("out", got, empty)
    if case.lse:
        compare("lse", call.canonical("lse", ops.to_f64(lse)), ref_lse, fwd_tol, case.dtype)
    if changed(ops, call, before, "the forward pass", modified):
        call = Call(ops, case, d)

    grads = None
    if case.grad:
        grads = gradients(cert, call, greq, res, modified)
        if grads is None:
            return
        compare_grads(cert, call, grads, expected_grads(prob, case, d, d.dout), grad_tol, "")
        require_zero_rows("dq", grads["q"], empty)
        unused = oracle.unused_keys(case)
        if unused is not None:
            for name in ("k", "v"):
                require_zero_rows(f"d{name}", grads[name], unused_rows(unused, case, d, grads[name].shape))
        if changed(ops, call, before, "the backward pass", modified):
            call = Call(ops, case, d)
        if case.lse:
            check_lse_gradient(cert, call, greq, prob, ref_lse, grad_tol, modified)
            if changed(ops, call, before, "the lse gradient's passes", modified):
                call = Call(ops, case, d)
    if case.repeat:
        lse_got = call.canonical("lse", ops.to_f64(lse)) if case.lse else None
        require_repeat(cert, call, greq, res, modified, (got, lse_got), grads)
    if modified:
        raise CaseFailure("inputs modified", "; ".join(dict.fromkeys(modified)))


def check_lse_gradient(
    cert: Certifier,
    call: Call,
    greq,
    prob: oracle.Problem,
    ref_lse: np.ndarray,
    tol: float,
    modified: list[str],
) -> None:
    """SPEC §5 with §9-§11's modifiers: a gradient through the returned lse alone (``∂lse/∂s = P``
    times a random ``dlse``; zero on rows with no keys) reaches q, k, v and the bias's and sinks'
    gradients as the oracle's, or the call raises. A backend whose modified kernels leave lse's term
    out (the bias's and sinks' gradients are where it is easiest to drop) fails; NumPy backends are
    asked through ``backend.backward(..., dlse)`` where they declare "dlse"."""
    case, ops, b = call.case, call.ops, cert.backend
    rng = np.random.default_rng([cert.seed, zlib.crc32(f"{case.id}/dlse".encode())])
    w = np.where(np.isfinite(ref_lse), rng.standard_normal(ref_lse.shape), 0.0)
    expected = expected_grads(prob, case, call.d, np.zeros_like(call.d.dout), w)
    lse_dtype = "float64" if case.dtype == "float64" else "float32"
    entry_w = w[0] if case.entry == "varlen" else w.reshape(call.lse_shape())
    names = call.differentiated
    if ops.framework == "numpy":
        if "dlse" not in b.features:
            return
        dl = w.astype(numpy_dtype(lse_dtype))
        got = dict(
            zip(("q", "k", "v", "bias", "sinks"), numpy_backward(b, call, greq, None, dl, modified)[2])
        )
        grads = {n: None if got.get(n) is None else np.asarray(got[n], np.float64) for n in names}
    else:
        dlse = ops.array(entry_w, lse_dtype)

        def lse_of(*xs: Any) -> Any:
            return call.invoke(cert.name, dict(call.arrays, **dict(zip(names, xs))), return_lse=True)[1]

        try:
            raw = ops.grads(lse_of, [call.arrays[n] for n in names], dlse)
        except Exception:  # an error (the backend cannot differentiate lse) is no silent drop
            return
        grads = {n: None if g is None else call.canonical(f"d{n}", ops.to_f64(g)) for n, g in zip(names, raw)}
    for n in names:
        if grads[n] is None:
            raise CaseFailure(f"grad lse {GRAD_KEYS[n]}", "no gradient through lse, and no error either")
    compare_grads(cert, call, grads, expected, tol, "grad lse ")


#: The caller's array -> the name of its gradient (oracle.Grads' fields).
GRAD_KEYS = {"q": "dq", "k": "dk", "v": "dv", "bias": "dbias", "sinks": "dsinks"}


def expected_grads(
    prob: oracle.Problem, case: Case, d: ModData, dout: np.ndarray, dlse: np.ndarray | None = None
):
    """(the oracle's gradients, their magnitudes, the half-precision formula's gradients or None),
    for a paged case in the cache's own form (each key's gradient in its block, SPEC §10)."""
    ref, mag = oracle.backward(prob, dout, dlse)
    rounded = rounded_backward(prob, dout, case.dtype, dlse) if is_half(case.dtype) else None
    if case.paged:
        ref, mag = (in_cache_form(g, case, d) for g in (ref, mag))
        rounded = None if rounded is None else in_cache_form(rounded, case, d)
    return ref, mag, rounded


def compare_grads(cert: Certifier, call: Call, grads: dict, expected: tuple, tol: float, prefix: str) -> None:
    """Each differentiated array's gradient against ``expected`` (:func:`expected_grads`) under
    SPEC §6; dbias in the bias's dtype where its tolerance is the looser one."""
    case = call.case
    ref, mag, rounded = expected
    for name in call.differentiated:
        key = GRAD_KEYS[name]
        t, dt = tol, case.dtype
        if name == "bias" and cert.tolerances(bias_dtype(case))[1] > t:  # dbias in the bias's dtype
            t, dt = cert.tolerances(bias_dtype(case))[1], bias_dtype(case)
        base = None if rounded is None else getattr(rounded, key)
        compare_grad(f"{prefix}{key}", grads[name], getattr(ref, key), t, dt, getattr(mag, key), base)


def in_cache_form(g: oracle.Grads, case: Case, d: ModData) -> oracle.Grads:
    """The oracle's logical dk, dv (B, Hkv, L, D) placed in the paged cache's blocks by the table
    (zero in the blocks no entry names): what the caller's cache arrays receive."""
    n = d.k_blocks.shape[0]
    dk, dv = (to_blocks(x, case.paged, d.block_table, n, fill=0.0) for x in (g.dk, g.dv))
    return dataclasses.replace(g, dk=dk, dv=dv)


def unused_rows(unused: np.ndarray, case: Case, d: ModData, shape: tuple[int, ...]) -> np.ndarray:
    """(B, Nk) unused keys as the gradient's leading dims: (B, Hkv, Nk), or for a paged cache
    (num_blocks, block, Hkv) with every row of a block no entry names included."""
    if not case.paged:
        return np.broadcast_to(unused[:, None], shape[:3])
    logical = np.broadcast_to(unused[:, None, :, None], (*unused.shape[:1], shape[2], unused.shape[1], 1))
    blocks = to_blocks(logical.astype(np.float64), case.paged, d.block_table, shape[0], fill=1.0)
    return blocks[..., 0] == 1.0


def require_repeat(
    cert: Certifier, call: Call, greq, res: Result, modified: list[str], first: tuple, grads: dict | None
) -> None:
    """SPEC §5: a backend declaring ``deterministic`` repeats out, lse and every gradient bitwise."""

    ops, case = call.ops, call.case
    result = call.invoke(cert.name)
    out, lse = result if case.lse else (result, None)
    again = (
        call.canonical("out", ops.to_f64(out)),
        None if lse is None else call.canonical("lse", ops.to_f64(lse)),
    )
    for name, x, y in zip(("out", "lse"), first, again):
        if x is not None and not np.array_equal(x, y, equal_nan=True):
            raise CaseFailure(
                f"deterministic {name}", f"a repeated forward's {name} is not bitwise identical"
            )
    if grads is None:
        return
    grads2 = gradients(cert, call, greq, res, modified) or {}
    for name, g in grads.items():
        if not np.array_equal(g, grads2.get(name), equal_nan=True):
            raise CaseFailure("deterministic grad", f"a repeated backward's d{name} is not bitwise identical")


def require_spec_error(cert: Certifier, call: Call, argument: str, res: Result) -> None:
    """The call must raise SpecError naming ``argument`` (SPEC §11's range, §12), before any kernel."""
    from attnhub.errors import SpecError

    if argument.endswith("_offset") and "offsets" not in cert.backend.features:
        res.status, res.reasons = "declined", ["does not take q_offset/k_offset"]
        return
    try:
        call.invoke(cert.name)
    except SpecError as exc:
        if argument not in str(getattr(exc, "argument", "")):
            raise CaseFailure(
                "spec error", f"the SpecError names {exc.argument!r}, not {argument!r}"
            ) from None
        res.request = f"SpecError: {exc}"
        return
    raise CaseFailure("spec error", f"the call was accepted; SPEC §12 expects a SpecError naming {argument}")


def gradients(
    cert: Certifier, call: Call, greq, res: Result, modified: list[str]
) -> dict[str, np.ndarray] | None:
    """name -> canonical float64 gradient, by the framework's autodiff (NumPy: backend.backward)."""

    case, ops, b = call.case, call.ops, cert.backend
    fw = ops.framework
    names = call.differentiated
    if fw == "numpy":
        dout = call.d.dout.astype(numpy_dtype(case.dtype))
        (qc, kc, vc), operands, got = numpy_backward(b, call, greq, dout, None, modified)
        allowed = (5,) if (greq.bias is not None or greq.sinks) else (3, 5)
        if len(got) not in allowed:
            raise CaseFailure("grad", f"backward returned {len(got)} gradients; this request takes {allowed}")
        by_name = dict(zip(("q", "k", "v", "bias", "sinks"), got))
        wanted = dict(zip(("q", "k", "v"), (qc, kc, vc)))
        if "bias" in names:
            wanted["bias"] = operands.bias
        if "sinks" in names:
            wanted["sinks"] = operands.sinks
        result = {}
        for n, like in wanted.items():
            g = by_name[n]
            if g is None:
                raise CaseFailure(f"grad d{n}", "backend.backward returned None for a requested gradient")
            cert._hygiene(fw, f"grad d{n}", g, like.shape, str(like.dtype) if n in ("bias", "sinks")
                          else case.dtype, greq.device)  # fmt: skip
            result[n] = np.asarray(g, dtype=np.float64)
        return result  # canonical already: (1, Hq, Tq, D) for varlen
    dout = ops.array(_dout_for(call), case.dtype)

    def fn(*xs: Any) -> Any:
        arrays = dict(call.arrays, **dict(zip(names, xs)))
        return call.invoke(cert.name, arrays, return_lse=False)

    try:
        ops.poison(0)
        if case.traced:
            every = list(call.arrays)
            grads = ops.traced_grads_of(
                _invoke_all(cert, call, return_lse=False), [call.arrays[n] for n in every],
                [every.index(n) for n in names], dout, ones=case.cotangent == "ones",
            )  # fmt: skip
        else:
            grads = ops.grads(fn, [call.arrays[n] for n in names], dout)
    except BackendUnsupported as exc:  # e.g. a traced (jax.vjp) request the backend declines
        res.status, res.reasons = "declined", [f"gradient call: {r}" for r in exc.reasons]
        return None
    shapes = call.grad_shapes()
    result = {}
    for n, g in zip(names, grads):
        if g is None:
            raise CaseFailure(f"grad d{n}", "the framework returned no gradient")
        shape, dt = shapes[n]
        cert._hygiene(fw, f"grad d{n}", g, shape, dt, greq.device)
        result[n] = call.canonical(f"d{n}", ops.to_f64(g))
    return result


def numpy_backward(b, call: Call, greq, dout: Any, dlse: Any, modified: list[str]) -> tuple:
    """((q, k, v), operands, backend.backward's gradients) for a NumPy backend, called as the core
    calls it (attnhub.plan.Plan: the §9-§11 arrays as ``operands``); ``dout`` None: zeros (lse's
    gradient alone). Writes into the inputs are noted in ``modified`` and undone after the forward,
    so the backward gets the inputs it should have had."""
    (qc, kc, vc), mc, operands = call.canonical_inputs(greq)
    extra = [getattr(operands, f.name) for f in dataclasses.fields(operands)]
    arrays = [qc, kc, vc] + [x for x in (mc, *extra) if isinstance(x, np.ndarray)]
    keep = [x.copy() for x in arrays]
    out, lse = b.forward(qc, kc, vc, greq, mc, operands)
    if not all(same(x, y) for x, y in zip(arrays, keep)):
        modified.append("backend.forward wrote into its inputs")
        for x, y in zip(arrays, keep):
            x[...] = y
    if dout is None:
        dout = np.zeros(np.shape(out), dtype=np.asarray(out).dtype)
    if dlse is not None:
        dlse = dlse.reshape(np.shape(lse))  # the canonical form lse has here
    got = b.backward(qc, kc, vc, out, lse, dout, greq, mc, operands, dlse)
    if not all(same(x, y) for x, y in zip(arrays, keep)):
        modified.append("backend.backward wrote into its inputs")
    return (qc, kc, vc), operands, got


def _invoke_all(cert: Certifier, call: Call, return_lse: bool | None = None) -> Any:
    """``fn(*arrays)``: the entry point called on every one of the call's arrays, in order (what
    a tracer receives as its arguments)."""
    names = list(call.arrays)

    def fn(*xs: Any) -> Any:
        return call.invoke(cert.name, dict(zip(names, xs)), return_lse=return_lse)

    return fn


def _dout_for(call: Call) -> np.ndarray:
    """The upstream gradient in the entry point's output layout."""
    from attnhub_conformance.arrays import to_layout
    from attnhub_conformance.modifier_calls import _thd

    c = call.case
    if c.entry == "varlen":
        return _thd(call.d.dout)
    if c.entry == "kvcache":
        return call.d.dout
    return to_layout(call.d.dout, c.seq_q, c.layout)


def same(a: np.ndarray, b: np.ndarray) -> bool:

    return same_bits(np.asarray(a), np.asarray(b))


def snapshot(ops, call: Call) -> list[tuple[str, np.ndarray]]:
    return [(n, ops.to_numpy(x)) for n, x in call.named()]


def changed(ops, call: Call, before: list[tuple[str, np.ndarray]], when: str, notes: list[str]) -> bool:
    """Whether ``when`` changed a bit of the caller's arrays (noted in ``notes``)."""
    now = dict(call.named())
    bad = [n for n, old in before if not same(ops.to_numpy(now[n]), old)]
    if bad:
        notes.append(f"{when} modified the caller's {', '.join(bad)}")
    return bool(bad)


def honest_decline(cert: Certifier, call: Call, reasons: list[str]) -> None:
    """A declined request: ``backend=NAME`` raises with the same reasons; ``auto`` avoids it."""

    try:
        call.invoke(cert.name)
    except BackendUnsupported as exc:
        if exc.reasons != reasons:
            raise CaseFailure(
                "honesty", f"check() gave {reasons} but the call with backend=NAME raised {exc.reasons}"
            ) from None
    else:
        raise CaseFailure("honesty", f"check() declined ({'; '.join(reasons)}) but the call ran")
    if call.explain().chosen == cert.name:
        raise CaseFailure("honesty", "auto dispatch chose the backend for a request it declines")
