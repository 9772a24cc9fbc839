"""The kernels' ``Mask`` struct (common.cuh) for a request: 16 int32 fields that encode the rule and
the sequence positions of SPEC §2-3, launched as 8 int64 arguments of two fields each."""

from __future__ import annotations

import numpy as np

from attnhub.positions import axis_affine
from attnhub.request import Request
from attnhub.rules import Causal, Full, Local

#: Largest window value passed to the kernels (larger windows behave identically: no position is farther).
_WINDOW_CAP = 1 << 30


def mask_args(req: Request) -> list[np.int64]:
    """The kernels' ``MASK_PARAMS`` for ``req``: :func:`mask_values` in pairs, each pair one int64
    (the first value in the low 32 bits, both two's complement), as ``MASK_INIT`` unpacks them."""
    vals = mask_values(req)
    return [np.int64(_pair(a, b)) for a, b in zip(vals[::2], vals[1::2])]


def _pair(low: int, high: int) -> int:
    """The int64 whose low 32 bits are ``low`` and high 32 bits ``high`` (signed int32s)."""
    return ((high & 0xFFFFFFFF) << 32 | (low & 0xFFFFFFFF)) - ((high & 0x80000000) << 33)


def mask_values(req: Request) -> list[int]:
    """The 16 integers of the kernels' ``Mask`` struct for ``req`` (1-d requests as 2-d with Y = 1;
    q_offset / k_offset move the x positions)."""
    seq_q, seq_k = req.seq_q, req.seq_k
    if len(seq_q) == 1:
        seq_q, seq_k = (1, *seq_q), (1, *seq_k)
    (lqy, lqx), (lky, lkx) = seq_q, seq_k
    aqy, bqy, aky, bky = axis_affine(lqy, lky, req.sync)
    aqx, bqx, akx, bkx = axis_affine(lqx, lkx, req.sync)
    mx = max(lqx, lkx)
    if req.q_offset or req.k_offset:
        # SPEC §11 (1-d, none_front): rules depend on P - R only, so the offsets shift the side that
        # is ahead and positions stay non-negative; mx bounds them (it scales no y position in 1-d).
        shift = req.q_offset - req.k_offset
        bqx, bkx = bqx + max(shift, 0), bkx + max(-shift, 0)
        mx = max(lqx + bqx, lkx + bkx)
    rule = req.rule
    wy = wx = 1
    log2s = lcausal = 0
    if isinstance(rule, Full):
        code = 0
    elif isinstance(rule, Causal):
        code = 1
    elif isinstance(rule, Local):
        code = 2
        ws = rule.windows(req.ndim)
        ws = (1, *ws) if len(ws) == 1 else ws
        wy, wx = (min(w, _WINDOW_CAP) for w in ws)
        log2s, lcausal = rule.log2_stride, int(rule.causal)
    else:  # pragma: no cover - explicit masks are declined by check()
        raise TypeError(f"the cuda backend cannot evaluate {rule!r}")
    vals = [lqx, lkx, aqy, bqy, aqx, bqx, aky, bky, akx, bkx, mx, code, wy, wx, log2s, lcausal]
    for x in vals:
        if not -(2**31) <= x < 2**31:
            raise OverflowError(f"mask value {x} does not fit the kernels' int32 fields")
    return vals


def offset_reasons(req: Request) -> list[str]:
    """Offsets the kernels' 32-bit positions cannot hold (SPEC §11)."""
    span = abs(req.q_offset - req.k_offset) + max(req.nq, req.nk)
    if (req.q_offset or req.k_offset) and span >= _WINDOW_CAP:
        return [
            f"|q_offset - k_offset| + the sequence length must stay below 2**30 (32-bit positions), got "
            f"{span}: use backend='triton' or 'reference'"
        ]
    return []
