"""The comparisons certify makes (SPEC §4 and §6): a backend's result against the oracle's, NaN and
Inf kept where they belong, fully masked rows exactly 0, bitwise repeats. One module for every
section's runner (runner.py for §1-§8, modifier_runner.py for §9-§11)."""

from __future__ import annotations

import math

import numpy as np

from attnhub_conformance.rounded import ROUNDED_FACTOR, is_half


class CaseFailure(AssertionError):
    """An accepted case did not conform; ``check`` names what failed (out, lse, dq, hygiene, ...)."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        super().__init__(f"[{check}] {message}")


#: Gradient denominators are floored at the terms' magnitude divided by this (see grad_magnitudes).
CANCELLATION_FLOOR = 64.0


def errors(got: np.ndarray, ref: np.ndarray, floor: np.ndarray | None = None) -> tuple[float, float]:
    """(relative L2 error, max error relative to max |ref|) over the elements finite in both.

    With ``floor`` (same shape, >= 0) the denominators are at least ``floor``'s norm and maximum
    divided by :data:`CANCELLATION_FLOOR`.
    """
    fin = np.isfinite(got) & np.isfinite(ref)
    e, r = got[fin] - ref[fin], ref[fin]
    if e.size == 0:
        return 0.0, 0.0
    nr, mr = float(np.linalg.norm(r)), float(np.abs(r).max())
    if floor is not None:
        f = floor[fin]
        nr = max(nr, float(np.linalg.norm(f)) / CANCELLATION_FLOOR)
        mr = max(mr, float(np.abs(f).max()) / CANCELLATION_FLOOR)
    ne, me = float(np.linalg.norm(e)), float(np.abs(e).max())
    return (ne / nr if nr else ne), (me / mr if mr else me)


def compare(
    check: str, got: np.ndarray, ref: np.ndarray, tol: float, dtype: str, floor: np.ndarray | None = None
) -> None:
    """Raise :class:`CaseFailure` unless ``got`` matches ``ref`` within ``tol`` (SPEC §6)."""
    if got.shape != ref.shape:
        raise CaseFailure(check, f"shape {got.shape}, the reference has {ref.shape}")
    bad = np.isnan(got) & ~np.isnan(ref)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise CaseFailure(
            check, f"{int(bad.sum())} NaN element(s) where the reference is finite (first at {first})"
        )
    lost = np.isnan(ref) & ~np.isnan(got)
    if lost.any():  # SPEC §4: NaN propagates, it is never replaced
        first = tuple(int(i) for i in np.argwhere(lost)[0])
        raise CaseFailure(
            check, f"{int(lost.sum())} element(s) not NaN where the reference is NaN (first at {first}: "
            f"got {got[first]}); SPEC §4: NaN and Inf inputs propagate to the affected outputs",
        )  # fmt: skip
    inf = (np.isinf(got) | np.isinf(ref)) & (got != ref)
    if inf.any():
        first = tuple(int(i) for i in np.argwhere(inf)[0])
        raise CaseFailure(
            check, f"{int(inf.sum())} infinite element(s) differ from the reference (first at {first}: "
            f"got {got[first]}, expected {ref[first]})",
        )  # fmt: skip
    rel, mx = errors(got, ref, floor)
    if not (rel <= tol and mx <= tol):
        raise CaseFailure(
            check, f"relative error {rel:.3g}, max error {mx:.3g}; SPEC §6 tolerance for {dtype} is {tol:g}"
        )


def compare_grad(
    check: str,
    got: np.ndarray,
    ref: np.ndarray,
    tol: float,
    dtype: str,
    floor: np.ndarray | None = None,
    rounded: np.ndarray | None = None,
) -> None:
    """:func:`compare` for a gradient under SPEC §6: within ``tol``, or for float16 and bfloat16 within
    :data:`ROUNDED_FACTOR` times the errors of ``rounded``, the formula computed in ``dtype``
    (:mod:`attnhub_conformance.rounded`), both errors measured the same way."""
    if rounded is None or not is_half(dtype):
        return compare(check, got, ref, tol, dtype, floor)
    compare(check, got, ref, math.inf, dtype, floor)  # NaN and Inf checks
    rel_r, mx_r = errors(rounded, ref, floor)
    rel, mx = errors(got, ref, floor)
    if rel > max(tol, ROUNDED_FACTOR * rel_r) or mx > max(tol, ROUNDED_FACTOR * mx_r):
        raise CaseFailure(
            check, f"relative error {rel:.3g}, max error {mx:.3g}; SPEC §6 tolerance for {dtype} is "
            f"{tol:g}, or {ROUNDED_FACTOR:g}x the {dtype} formula's errors ({rel_r:.3g}, {mx_r:.3g})",
        )  # fmt: skip


def require_zero_rows(check: str, got: np.ndarray, empty: np.ndarray) -> None:
    """Fully masked query rows (``empty``, shape B x H x Nq) must be exactly 0 (SPEC §4)."""
    if empty.any():
        rows = got[empty]
        if not np.all(rows == 0):
            raise CaseFailure(
                check, f"fully masked query rows must be exactly 0 (SPEC §4); "
                f"{int((rows != 0).any(axis=-1).sum())} of {rows.shape[0]} are not",
            )  # fmt: skip


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (NaN payloads and the sign of zero included)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
