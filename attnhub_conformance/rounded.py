"""The attention backward as a tensor-core kernel computes it: SPEC §6's yardstick for half gradients.

A kernel that keeps its tensors in float16 or bfloat16 inherits error from rounding them: the output
it stores (the backward's ``Δ = rowsum(dO∘O)`` reads it), and the operands it feeds to matrix
multiplies (P for ``P·V`` and ``Pᵀ·dO``, dS for ``dS·K`` and ``dSᵀ·Q``). Where a gradient cancels (a row
whose probability sits on one key: ``dP − Δ`` cancels in ``dS``) that inherited error can exceed SPEC
§6's table while the kernel is as exact as its storage allows. SPEC §6 therefore also accepts a
float16 or bfloat16 gradient whose errors are at most :data:`ROUNDED_FACTOR` times those of this
formula (as FlashAttention's tests bound a kernel by a multiple of a lower-precision formula's
error). A broken kernel is far off either bound.

The formula, in float64 with ``r`` rounding to the input dtype (softmax and sums exact)::

    T = scale·Q·Kᵀ   T = c·tanh(T/c)   S = T + bias   P = softmax(S)   O = r(r(P)·V)
    dP = dO·Vᵀ   Δ = rowsum(dO∘O)   dS = P∘(dP − Δ)   dT = r(dS∘(1 − tanh²))
    dQ = r(scale·dT·K)   dK = r(scale·dTᵀ·Q)   dV = r(r(P)ᵀ·dO)   dbias = r(Σ dS)   dsinks = r(−Σ P_sink·Δ)
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from attnhub_conformance import oracle
from attnhub_conformance.oracle import Grads, Problem

#: A half-precision gradient passes when its errors are within this multiple of the formula's.
ROUNDED_FACTOR = 2.0

_HALF = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def is_half(dtype: str) -> bool:
    """Whether SPEC §6's rounded-formula bound applies to gradients of ``dtype``."""
    return dtype in _HALF


def _rounder(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    kind = _HALF[dtype]
    return lambda x: np.asarray(x).astype(kind).astype(np.float64)


def rounded_backward(p: Problem, dout: np.ndarray, dtype: str, dlse: np.ndarray | None = None) -> Grads:
    """dq, dk, dv (and dbias, dsinks where ``p`` has them) of the formula above in ``dtype``: the
    oracle's exact softmax (:func:`oracle._parts`), then the rounded products; ``dlse`` adds lse's
    term as :func:`oracle.backward` does."""
    r = _rounder(dtype)
    u, prob, psink, _, g = oracle._parts(p)
    b, hq = p.q.shape[:2]
    k, v = oracle._expand(p.k, g), oracle._expand(p.v, g)
    out = r(r(prob) @ v)
    dp = dout @ np.swapaxes(v, -1, -2)
    delta = (dout * out).sum(axis=-1, keepdims=True)
    if dlse is not None:
        delta = delta - dlse[..., None]
    ds = prob * (dp - delta)
    dt = r(ds if u is None else ds * (1.0 - u * u))

    def per_kv(x: np.ndarray) -> np.ndarray:
        return x.reshape(b, hq // g, g, *x.shape[2:]).sum(axis=2)

    dbias = None if p.bias is None else r(oracle._reduce_to(ds, p.bias.shape))
    dsinks = None if p.sinks is None else r(-(psink * delta[..., 0]).sum(axis=(0, 2)))
    return Grads(
        dq=r(p.scale * (dt @ k)),
        dk=r(per_kv(p.scale * (np.swapaxes(dt, -1, -2) @ p.q))),
        dv=r(per_kv(np.swapaxes(r(prob), -1, -2) @ dout)),
        dbias=dbias,
        dsinks=dsinks,
    )
