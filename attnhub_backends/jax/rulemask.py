"""A rule (SPEC §3) evaluated on query and key indices with jnp integer arithmetic.

Every sync mode puts index i of a dimension at an affine position ``a*i + c`` (SPEC §2), and a
2-d flat index splits into (row, column) by division by the row length, so the mask of any tile
follows from its indices alone: no position table is read. Used inside the Pallas kernel and by
the blockwise ``jax.lax`` path.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from attnhub.positions import axis_affine
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local

#: Positions and their differences are int32; a window bound above this admits every pair.
_INT32_MAX = 2**31 - 1


def keep(req: Request, qi: Any, kj: Any) -> Any:
    """Bool mask of flat query indices ``qi`` x flat key indices ``kj`` (int32, broadcastable).

    Keys at or past ``req.nk`` (tile padding) are never attended. An explicit mask's request
    gets the ``Full`` rule here (the array is applied separately). Offsets (SPEC §11) shift the
    1-d positions; lengths and packed sequences are :mod:`ragged`'s.
    """
    qi, kj = qi.astype(jnp.int32), kj.astype(jnp.int32)  # int64 under jax_enable_x64 otherwise
    ok = kj < req.nk
    rule = req.rule
    if isinstance(rule, (Full, ExplicitMask)):
        return ok
    axes = [axis_affine(a, b, req.sync) for a, b in zip(req.seq_q, req.seq_k)]
    if req.ndim == 1:
        iq, ik = [qi], [kj]
    else:
        xq, xk = jnp.int32(req.seq_q[1]), jnp.int32(req.seq_k[1])
        iq = [jax.lax.div(qi, xq), jax.lax.rem(qi, xq)]
        ik = [jax.lax.div(kj, xk), jax.lax.rem(kj, xk)]
    pq = [a[0] * i + a[1] for a, i in zip(axes, iq)]
    pk = [a[2] * j + a[3] for a, j in zip(axes, ik)]
    if req.q_offset or req.k_offset:  # SPEC §11 (1-d, sync none_front)
        pq[0] = pq[0] + jnp.int32(req.q_offset)
        pk[0] = pk[0] + jnp.int32(req.k_offset)
    if isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal):
        mx = max(req.seq_q[-1], req.seq_k[-1])
        fq = pq[0] if req.ndim == 1 else pq[0] * mx + pq[1]
        fk = pk[0] if req.ndim == 1 else pk[0] * mx + pk[1]
        ok = ok & (fq >= fk)
    if isinstance(rule, Local):
        s = rule.stride
        for d, w in enumerate(rule.windows(req.ndim)):
            delta = jnp.maximum(pq[d] - pk[d], pk[d] - pq[d])
            if s > 1:
                ok = ok & ((delta & (s - 1)) == 0)
            if s * w <= _INT32_MAX:  # delta // s < w; a larger bound holds for every int32 delta
                ok = ok & (delta < s * w)
    return ok
