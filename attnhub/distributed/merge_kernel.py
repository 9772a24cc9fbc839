"""A fused Triton kernel for one lse merge on the GPU (one pass over the rows instead of the
nine elementwise kernels of the torch form): ``merge.merge_into`` uses it for float32
accumulators on CUDA tensors when Triton is importable. With ``out`` it also writes the merged
rows in the output dtype (the rows' last merge: no separate cast pass over the accumulator)."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _merge(
    ao, al, ob, lb, out, xo, xl, rows, heads, dim,
    s_ao_b, s_ao_h, s_ao_r, s_ao_d, s_al_b, s_al_h, s_al_r,
    s_ob_b, s_ob_h, s_ob_r, s_ob_d, s_lb_b, s_lb_h, s_lb_r, s_o_b, s_o_h, s_o_r, s_o_d,
    s_xo_b, s_xo_h, s_xo_r, s_xo_d, s_xl_b, s_xl_h, s_xl_r,
    FRESH: tl.constexpr, OUT: tl.constexpr, PAIR: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    r = pid * BR + tl.arange(0, BR)
    d = tl.arange(0, BD)
    rm = r < rows
    m2 = rm[:, None] & (d < dim)[None, :]
    l_b = tl.load(lb + b * s_lb_b + h * s_lb_h + r * s_lb_r, mask=rm, other=float("-inf")).to(tl.float32)
    o_b = tl.load(
        ob + b * s_ob_b + h * s_ob_h + r[:, None] * s_ob_r + d[None, :] * s_ob_d, mask=m2, other=0.0
    ).to(tl.float32)
    pl = al + b * s_al_b + h * s_al_h + r * s_al_r
    po = ao + b * s_ao_b + h * s_ao_h + r[:, None] * s_ao_r + d[None, :] * s_ao_d
    if FRESH:
        tl.store(pl, l_b, mask=rm)
        o = o_b
    else:
        if PAIR:  # the rows' first block, not written yet: read from where it lies
            l_a = tl.load(xl + b * s_xl_b + h * s_xl_h + r * s_xl_r, mask=rm, other=float("-inf")).to(
                tl.float32
            )
            px = xo + b * s_xo_b + h * s_xo_h + r[:, None] * s_xo_r + d[None, :] * s_xo_d
            o_a = tl.load(px, mask=m2, other=0.0).to(tl.float32)
        else:
            l_a = tl.load(pl, mask=rm, other=float("-inf"))
            o_a = tl.load(po, mask=m2, other=0.0)
        mx = tl.maximum(l_a, l_b)
        ref = tl.where(mx == float("-inf"), 0.0, mx)
        wa = tl.exp(l_a - ref)
        wb = tl.exp(l_b - ref)
        tot = wa + wb
        safe = tl.where(tot == 0.0, 1.0, tot)
        new = tl.where(tot == 0.0, float("-inf"), ref + tl.log(safe))
        inv = 1.0 / safe
        o = (o_a * (wa * inv)[:, None]) + (o_b * (wb * inv)[:, None])
        # The rows are read and rewritten in place: no thread may store before every thread has
        # read (a row's lse is read by every warp holding part of the row; without the barrier a
        # warp could read the merged lse another warp had stored, and weight its part of O by it).
        tl.debug_barrier()
        tl.store(pl, new, mask=rm)
    tl.store(po, o, mask=m2)
    if OUT:
        po2 = out + b * s_o_b + h * s_o_h + r[:, None] * s_o_r + d[None, :] * s_o_d
        tl.store(po2, o.to(out.dtype.element_ty), mask=m2)


def merge(
    acc_o: Any, acc_lse: Any, o_b: Any, lse_b: Any, fresh: bool, out: Any = None, prev: Any = None
) -> None:
    """In place: (acc_o, acc_lse) ← lse-merge of themselves and (o_b, lse_b); (B, H, R, D).
    ``fresh``: the rows hold nothing yet (a copy). ``out``: also store the result there.
    ``prev``: (out, lse) of an earlier block merged in place of the accumulator's rows."""
    b, h, rows, dim = acc_o.shape
    bd = triton.next_power_of_2(dim)
    br = max(1, min(64, 8192 // bd))
    grid = (triton.cdiv(rows, br), b * h)
    dst = acc_o if out is None else out
    xo, xl = (acc_o, acc_lse) if prev is None else prev
    _merge[grid](
        acc_o, acc_lse, o_b, lse_b, dst, xo, xl, rows, h, dim, *acc_o.stride(), *acc_lse.stride(),
        *o_b.stride(), *lse_b.stride(), *dst.stride(), *xo.stride(), *xl.stride(),
        FRESH=fresh, OUT=out is not None, PAIR=prev is not None, BR=br, BD=bd,
    )  # fmt: skip
