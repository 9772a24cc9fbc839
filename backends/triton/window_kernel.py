"""Hopper forward for 1-d causal sliding windows, written in Gluon (Triton's explicit-layout
language), with the schedule Triton's automatic pipeliner does not give.

The tile loop is software-pipelined by hand, as FlashAttention-3 does within one warpgroup: while
the softmax of key tile j runs on the CUDA cores, the tensor cores compute Q K^T of tile j + 1 and
finish P V of tile j - 1. K and V arrive by TMA into
rings of ``STAGES`` shared-memory buffers, each with its own mbarrier. In the Triton kernel
(``kernels.fwd_kernel``) the compiler waits for each Q K^T product right after issuing it, so the
softmax and the matrix products of one program never overlap.

Scope (``launch.window_fast_path`` checks it): 1-d causal window with stride 1, 16-bit q/k/v,
equal head dims 64 or 128, a positive scale, compute capability 9.x. One program computes 64 query
rows of one head over the contiguous run of key tiles ``plan.band_lists`` gives it; tiles outside
the plan's FULL run evaluate the window per element (the rule of ``kernels._keep``'s 1-d causal
window path). Fully masked rows give 0 and lse -inf, as in every attnhub backend.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


@gluon.jit
def _tile_origin(b, h, sb, sh, sn):
    """(row, column) of a (batch, head) slab in the 2-d (rows, ``sn``) view the descriptors use."""
    off = b.to(gl.int64) * sb + h.to(gl.int64) * sh
    return (off // sn).to(gl.int32), (off % sn).to(gl.int32)


@gluon.jit
def _softmax_tile(
    s, m_i, l_i, t, full_lo, full_hi, offs_m, offs_n, qk_scale, Nk, AQX, BQX, AKX, BKX, WX,
    BN: gl.constexpr,
):  # fmt: skip
    """Masked (outside the FULL run) online softmax of one score tile: P, the rescale factor of the
    running sums, and the new row max and row sum (log2 domain)."""
    if (t < full_lo) | (t >= full_hi):
        # keep 0 <= d < w with d = query pos - key pos, and key < Nk (folded into the row bounds)
        pqx = AQX * offs_m + BQX
        dmin = gl.maximum(pqx - (AKX * Nk + BKX) + 1, 0)
        span = gl.maximum(WX - dmin, 0).to(gl.uint32)
        d = (pqx - dmin)[:, None] - (AKX * (t * BN + offs_n) + BKX)[None, :]
        keep = d.to(gl.uint32, bitcast=True) < span[:, None]
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit
def window_fwd_kernel(
    q_desc, k_desc, v_desc, O, LSE, PLAN, plan_stride,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
    H, GROUP, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
):  # fmt: skip
    """One (query tile, head, batch) program: out and natural-log lse of its ``BM`` rows (16 per
    warp: one warpgroup per 64 rows, the warpgroups sharing the K and V tiles)."""
    pid = gl.num_programs(0) - 1 - gl.program_id(0)  # late (heavier) tiles first, as the Triton path
    h = gl.program_id(1)
    b = gl.program_id(2)
    hk = h // GROUP
    dtype: gl.constexpr = q_desc.dtype

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    cols_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BM, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    row = PLAN + pid * plan_stride
    full_lo = gl.load(row)
    full_hi = gl.load(row + 1)
    lo = gl.load(row + 2)
    n = gl.load(row + 3) - lo  # key tiles visited: lo .. lo + n - 1

    q_row, q_col = _tile_origin(b, h, sqb, sqh, sqn)
    k_row, k_col = _tile_origin(b, hk, skb, skh, skn)
    v_row, v_col = _tile_origin(b, hk, svb, svh, svn)
    k_bytes: gl.constexpr = k_desc.block_type.nbytes
    v_bytes: gl.constexpr = v_desc.block_type.nbytes

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row + pid * BM, q_col], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        go = i < n
        mbarrier.expect(k_bars.index(i), k_bytes, pred=go)
        tma.async_copy_global_to_shared(
            k_desc, [k_row + (lo + i) * BN, k_col], k_bars.index(i), k_smem.index(i), pred=go
        )
        mbarrier.expect(v_bars.index(i), v_bytes, pred=go)
        tma.async_copy_global_to_shared(
            v_desc, [v_row + (lo + i) * BN, v_col], v_bars.index(i), v_smem.index(i), pred=go
        )

    offs_m = pid * BM + gl.arange(0, BM, layout=rows_s)
    offs_n = gl.arange(0, BN, layout=cols_s)
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=rows_s)
    l_i = gl.zeros([BM], gl.float32, layout=rows_s)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)
    if n > 0:
        mbarrier.wait(k_bars.index(0), 0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        acc_tok = warpgroup_mma_init(acc)
        for j in range(0, n - 1):
            # S_j is complete. Issue S_{j+1}; it runs on the tensor cores during this softmax.
            nxt = (j + 1) % STAGES
            mbarrier.wait(k_bars.index(nxt), ((j + 1) // STAGES) & 1)
            s_tok = warpgroup_mma(
                q_smem, k_smem.index(nxt).permute((1, 0)), s_zero, use_acc=False, is_async=True
            )
            p, alpha, m_i, l_i = _softmax_tile(
                s,
                m_i,
                l_i,
                lo + j,
                full_lo,
                full_hi,
                offs_m,
                offs_n,
                qk_scale,
                Nk,
                AQX,
                BQX,
                AKX,
                BKX,
                WX,
                BN,
            )
            # P V_{j-1} and S_{j+1} done. (Waiting for P V_{j-1} alone, num_outstanding=1, makes
            # ptxas serialise every wgmma: C7514, "non wgmma instructions reading accumulator
            # registers"; S_{j+1} has had the softmax's time to finish anyway.)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok,))
            cur = j % STAGES
            refill = j + STAGES < n  # K_j's buffer is free (S_j done): load K_{j+STAGES} there
            mbarrier.expect(k_bars.index(cur), k_bytes, pred=refill)
            tma.async_copy_global_to_shared(
                k_desc,
                [k_row + (lo + j + STAGES) * BN, k_col],
                k_bars.index(cur),
                k_smem.index(cur),
                pred=refill,
            )
            prev = (j + STAGES - 1) % STAGES  # V_{j-1}'s buffer is free: load V_{j-1+STAGES} there
            refill = (j >= 1) & (j - 1 + STAGES < n)
            mbarrier.expect(v_bars.index(prev), v_bytes, pred=refill)
            tma.async_copy_global_to_shared(
                v_desc, [v_row + (lo + j - 1 + STAGES) * BN, v_col], v_bars.index(prev), v_smem.index(prev),
                pred=refill,
            )  # fmt: skip
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
            mbarrier.wait(v_bars.index(cur), (j // STAGES) & 1)
            acc_tok = warpgroup_mma(
                gl.convert_layout(p.to(dtype), p_layout), v_smem.index(cur), acc, is_async=True
            )
            # S_{j+1} is done (waited above); P V_j stays in flight into the next softmax.
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        last = n - 1
        p, alpha, m_i, l_i = _softmax_tile(
            s, m_i, l_i, lo + last, full_lo, full_hi, offs_m, offs_n, qk_scale, Nk, AQX, BQX, AKX, BKX, WX, BN
        )
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok,))
        acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
        cur = last % STAGES
        mbarrier.wait(v_bars.index(cur), (last // STAGES) & 1)
        acc_tok = warpgroup_mma(
            gl.convert_layout(p.to(dtype), p_layout), v_smem.index(cur), acc, is_async=True
        )
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
    inv = gl.convert_layout(1.0 / gl.where(empty, 1.0, l_i), rows_o)
    out = (acc * inv[:, None]).to(O.dtype.element_ty)
    rows = pid * BM + gl.arange(0, BM, layout=rows_o)
    cols = gl.arange(0, D, layout=cols_o)
    o_ptrs = O + b.to(gl.int64) * sob + h.to(gl.int64) * soh + (rows * son)[:, None] + cols[None, :]
    gl.store(o_ptrs, out, mask=(rows < Nq)[:, None])
    gl.store(LSE + (b.to(gl.int64) * H + h) * Nq + offs_m, lse, mask=offs_m < Nq)


@gluon.jit
def _ws_plan_row(PLAN, plan_stride, tile, tiles):
    """(full_lo, full_hi, lo, n) of 64-row query tile ``tile``; n = 0 past the last tile."""
    row = PLAN + gl.minimum(tile, tiles - 1) * plan_stride
    lo = gl.load(row + 2)
    n = gl.where(tile < tiles, gl.load(row + 3) - lo, 0)
    return gl.load(row), gl.load(row + 1), lo, n


@gluon.jit
def _ws_load(
    q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty,
    q_row, q_col, k_row, k_col, v_row, v_col, pid, ulo, un,
):  # fmt: skip
    """Producer: both query tiles, then the union of the two warpgroups' key tiles in order,
    each into the next ring buffer once both consumers have released it."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BN: gl.constexpr = k_smem.shape[1]
    NC: gl.constexpr = q_smem.shape[0]
    for w in gl.static_range(NC):
        mbarrier.expect(q_bars.index(w), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [q_row + (NC * pid + w) * 64, q_col], q_bars.index(w), q_smem.index(w)
        )
    for u in range(un):
        st = u % STAGES
        ph = ((u // STAGES) & 1) ^ 1  # a fresh barrier completes the phase before its first
        mbarrier.wait(k_empty.index(st), ph)
        mbarrier.expect(k_full.index(st), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [k_row + (ulo + u) * BN, k_col], k_full.index(st), k_smem.index(st)
        )
        mbarrier.wait(v_empty.index(st), ph)
        mbarrier.expect(v_full.index(st), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [v_row + (ulo + u) * BN, v_col], v_full.index(st), v_smem.index(st)
        )


@gluon.jit
def _ws_consume(
    w: gl.constexpr, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN,
    plan_stride, tiles, pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    """Consumer warpgroup ``w``: query tile 2 pid + w over its own key tiles (a sub-run of the
    union), Q K^T of the next tile in flight during this tile's softmax; buffers it does not use
    are released at once."""
    BM: gl.constexpr = 64
    STAGES: gl.constexpr = k_smem.shape[0]
    BN: gl.constexpr = k_smem.shape[1]
    D: gl.constexpr = k_smem.shape[2]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    tile = q_smem.shape[0] * pid + w
    full_lo, full_hi, lo, n = _ws_plan_row(PLAN, plan_stride, tile, tiles)
    off = gl.where(n > 0, lo - ulo, un)
    for u in range(0, off):  # leading union tiles this warpgroup skips: released once loaded
        mbarrier.wait(k_full.index(u % STAGES), (u // STAGES) & 1)
        mbarrier.arrive(k_empty.index(u % STAGES))
        mbarrier.wait(v_full.index(u % STAGES), (u // STAGES) & 1)
        mbarrier.arrive(v_empty.index(u % STAGES))
    offs_m = tile * BM + gl.arange(0, BM, layout=rows_s)
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=rows_s)
    l_i = gl.zeros([BM], gl.float32, layout=rows_s)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    q = q_smem.index(w)
    mbarrier.wait(q_bars.index(w), 0)
    if n > 0:
        for j in range(0, n):
            u = off + j
            cur = u % STAGES
            ph = (u // STAGES) & 1
            mbarrier.wait(k_full.index(cur), ph)
            s_tok = warpgroup_mma(q, k_smem.index(cur).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            mbarrier.arrive(k_empty.index(cur))
            p, alpha, m_i, l_i = _softmax_tile(
                s,
                m_i,
                l_i,
                lo + j,
                full_lo,
                full_hi,
                offs_m,
                offs_n,
                qk_scale,
                Nk,
                AQX,
                BQX,
                AKX,
                BKX,
                WX,
                BN,
            )
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
            mbarrier.wait(v_full.index(cur), ph)
            acc_tok = warpgroup_mma(
                gl.convert_layout(p.to(dtype), p_layout), v_smem.index(cur), acc, is_async=True
            )
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok,))
            mbarrier.arrive(v_empty.index(cur))
    for u in range(off + n, un):  # trailing union tiles this warpgroup skips: released once loaded
        mbarrier.wait(k_full.index(u % STAGES), (u // STAGES) & 1)
        mbarrier.arrive(k_empty.index(u % STAGES))
        mbarrier.wait(v_full.index(u % STAGES), (u // STAGES) & 1)
        mbarrier.arrive(v_empty.index(u % STAGES))
    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
    inv = gl.convert_layout(1.0 / gl.where(empty, 1.0, l_i), rows_o)
    out = (acc * inv[:, None]).to(O.dtype.element_ty)
    rows = tile * BM + gl.arange(0, BM, layout=rows_o)
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = O + b.to(gl.int64) * sob + h.to(gl.int64) * soh + (rows * son)[:, None] + cols[None, :]
    gl.store(o_ptrs, out, mask=(rows < Nq)[:, None])
    gl.store(LSE + (b.to(gl.int64) * H + h) * Nq + offs_m, lse, mask=offs_m < Nq)


@gluon.jit
def _ws_consume_pp(
    w: gl.constexpr, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN,
    plan_stride, tiles, pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    """Consumer warpgroup ``w`` of two, FlashAttention-3's ping-pong: the two warpgroups take turns
    to issue their matrix products (P V of the previous tile and Q K^T of this one, back to back),
    so that one warpgroup's softmax runs while the other's products occupy the tensor cores. Both
    products are waited for before the softmax (none stays in flight across it)."""
    BM: gl.constexpr = 64
    STAGES: gl.constexpr = k_smem.shape[0]
    BN: gl.constexpr = k_smem.shape[1]
    D: gl.constexpr = k_smem.shape[2]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    NC: gl.constexpr = q_smem.shape[0]
    nxt: gl.constexpr = (w + 1) % NC
    tile = NC * pid + w
    full_lo, full_hi, lo, n = _ws_plan_row(PLAN, plan_stride, tile, tiles)
    turns_total = n + 1  # every warpgroup takes as many turns as the busiest one
    for o in gl.static_range(NC):
        _, _, _, n_o = _ws_plan_row(PLAN, plan_stride, NC * pid + o, tiles)
        turns_total = gl.maximum(turns_total, n_o + 1)
    first: gl.constexpr = 1 if w > 0 else 0  # warpgroup 0 starts; the others wait from turn 0 on
    off = gl.where(n > 0, lo - ulo, un)
    for u in range(0, off):  # leading union tiles this warpgroup skips: released once loaded
        mbarrier.wait(k_full.index(u % STAGES), (u // STAGES) & 1)
        mbarrier.arrive(k_empty.index(u % STAGES))
        mbarrier.wait(v_full.index(u % STAGES), (u // STAGES) & 1)
        mbarrier.arrive(v_empty.index(u % STAGES))
    offs_m = tile * BM + gl.arange(0, BM, layout=rows_s)
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=rows_s)
    l_i = gl.zeros([BM], gl.float32, layout=rows_s)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    q = q_smem.index(w)
    mbarrier.wait(q_bars.index(w), 0)
    t0 = 0
    if n > 0:
        # turn 0: Q K^T of the first tile only
        if w > 0:
            mbarrier.wait(turns.index(w), 0)
        cur = off % STAGES
        mbarrier.wait(k_full.index(cur), (off // STAGES) & 1)
        s_tok = warpgroup_mma(q, k_smem.index(cur).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.arrive(turns.index(nxt))
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(cur))
        pf, alpha, m_i, l_i = _softmax_tile(
            s, m_i, l_i, lo, full_lo, full_hi, offs_m, offs_n, qk_scale, Nk, AQX, BQX, AKX, BKX, WX, BN
        )
        p = gl.convert_layout(pf.to(dtype), p_layout)
        for t in range(1, n):  # P V of tile t - 1 and Q K^T of tile t, issued in one turn
            mbarrier.wait(turns.index(w), (t - 1 + first) & 1)
            u = off + t
            cur = u % STAGES
            prv = (u - 1) % STAGES
            mbarrier.wait(v_full.index(prv), ((u - 1) // STAGES) & 1)
            acc_tok = warpgroup_mma(p, v_smem.index(prv), acc, is_async=True)
            mbarrier.wait(k_full.index(cur), (u // STAGES) & 1)
            s_tok = warpgroup_mma(q, k_smem.index(cur).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.arrive(turns.index(nxt))
            acc, s = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, s_tok))
            mbarrier.arrive(v_empty.index(prv))
            mbarrier.arrive(k_empty.index(cur))
            pf, alpha, m_i, l_i = _softmax_tile(
                s,
                m_i,
                l_i,
                lo + t,
                full_lo,
                full_hi,
                offs_m,
                offs_n,
                qk_scale,
                Nk,
                AQX,
                BQX,
                AKX,
                BKX,
                WX,
                BN,
            )
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
            p = gl.convert_layout(pf.to(dtype), p_layout)
        # turn n: P V of the last tile
        mbarrier.wait(turns.index(w), (n - 1 + first) & 1)
        u = off + n - 1
        prv = u % STAGES
        mbarrier.wait(v_full.index(prv), (u // STAGES) & 1)
        acc_tok = warpgroup_mma(p, v_smem.index(prv), acc, is_async=True)
        mbarrier.arrive(turns.index(nxt))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok,))
        mbarrier.arrive(v_empty.index(prv))
        t0 = n + 1
    for t in range(t0, turns_total):  # turns past this warpgroup's tiles: pass them on
        if (w > 0) | (t > 0):
            mbarrier.wait(turns.index(w), (t - 1 + first) & 1)
        mbarrier.arrive(turns.index(nxt))
    for u in range(off + n, un):  # trailing union tiles this warpgroup skips: released once loaded
        mbarrier.wait(k_full.index(u % STAGES), (u // STAGES) & 1)
        mbarrier.arrive(k_empty.index(u % STAGES))
        mbarrier.wait(v_full.index(u % STAGES), (u // STAGES) & 1)
        mbarrier.arrive(v_empty.index(u % STAGES))
    empty = l_i == 0.0
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * LN2)
    inv = gl.convert_layout(1.0 / gl.where(empty, 1.0, l_i), rows_o)
    out = (acc * inv[:, None]).to(O.dtype.element_ty)
    rows = tile * BM + gl.arange(0, BM, layout=rows_o)
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = O + b.to(gl.int64) * sob + h.to(gl.int64) * soh + (rows * son)[:, None] + cols[None, :]
    gl.store(o_ptrs, out, mask=(rows < Nq)[:, None])
    gl.store(LSE + (b.to(gl.int64) * H + h) * Nq + offs_m, lse, mask=offs_m < Nq)


@gluon.jit
def _ws_pp0(
    q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN, plan_stride, tiles,
    pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    _ws_consume_pp(
        0, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN, plan_stride,
        tiles, pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    )  # fmt: skip


@gluon.jit
def _ws_pp1(
    q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN, plan_stride, tiles,
    pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    _ws_consume_pp(
        1, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN, plan_stride,
        tiles, pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    )  # fmt: skip


@gluon.jit
def _ws_pp2(
    q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN, plan_stride, tiles,
    pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    _ws_consume_pp(
        2, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN, plan_stride,
        tiles, pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    )  # fmt: skip


@gluon.jit
def _ws_pp3(
    q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN, plan_stride, tiles,
    pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    _ws_consume_pp(
        3, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN, plan_stride,
        tiles, pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    )  # fmt: skip


@gluon.jit
def _ws_consume1(
    q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN, plan_stride, tiles, pid,
    ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    _ws_consume(
        1, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN, plan_stride, tiles,
        pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    )  # fmt: skip


@gluon.jit
def _ws_consume2(
    q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN, plan_stride, tiles, pid,
    ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    _ws_consume(
        2, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN, plan_stride, tiles,
        pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    )  # fmt: skip


@gluon.jit
def _ws_consume3(
    q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN, plan_stride, tiles, pid,
    ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    _ws_consume(
        3, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN, plan_stride, tiles,
        pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    )  # fmt: skip


@gluon.jit
def _ws_consume0(
    q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN, plan_stride, tiles, pid,
    ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
):  # fmt: skip
    _ws_consume(
        0, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN, plan_stride, tiles,
        pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    )  # fmt: skip


@gluon.jit
def window_ws_fwd_kernel(
    q_desc, k_desc, v_desc, O, LSE, PLAN, plan_stride,
    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
    H, GROUP, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
    CREGS: gl.constexpr = 112,
    PP: gl.constexpr = False,
):  # fmt: skip
    """FlashAttention-3's layout of one program: a producer warp loading K and V by TMA and two
    consumer warpgroups, each with its own 64-row query tile (``BM`` = 128 rows per program).
    The K/V ring holds the union of the two tiles' key runs, so each key tile is read from L2 once
    per 128 query rows, while each warpgroup still computes only the tiles its rows attend."""
    pid = gl.num_programs(0) - 1 - gl.program_id(0)
    h = gl.program_id(1)
    b = gl.program_id(2)
    dtype: gl.constexpr = q_desc.dtype
    tiles = gl.cdiv(Nq, 64)
    NC: gl.constexpr = BM // 64  # consumer warpgroups, one 64-row query tile each
    ulo = 1 << 30
    uhi = 0
    for w in gl.static_range(NC):
        _, _, lo_w, n_w = _ws_plan_row(PLAN, plan_stride, NC * pid + w, tiles)
        ulo = gl.where(n_w > 0, gl.minimum(ulo, lo_w), ulo)
        uhi = gl.where(n_w > 0, gl.maximum(uhi, lo_w + n_w), uhi)
    un = gl.maximum(uhi - ulo, 0)
    ulo = gl.where(un > 0, ulo, 0)

    q_smem = gl.allocate_shared_memory(dtype, [NC, 64, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NC):
        mbarrier.init(turns.index(i), count=1)
    for i in gl.static_range(NC):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NC)
        mbarrier.init(v_empty.index(i), count=NC)

    q_row, q_col = _tile_origin(b, h, sqb, sqh, sqn)
    k_row, k_col = _tile_origin(b, h // GROUP, skb, skh, skn)
    v_row, v_col = _tile_origin(b, h // GROUP, svb, svh, svn)
    consume_args = (
        q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, O, LSE, PLAN, plan_stride, tiles,
        pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
    )  # fmt: skip
    load_args = (
        q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty,
        q_row, q_col, k_row, k_col, v_row, v_col, pid, ulo, un,
    )  # fmt: skip
    # The loads run in the kernel's own warps (one warpgroup, which gives its registers away); the
    # consumers are workers, so that ptxas allocates their code 240 registers per thread.
    if PP:
        pp_args = (
            q_smem, k_smem, v_smem, q_bars, k_full, v_full, k_empty, v_empty, turns, O, LSE, PLAN, plan_stride,
            tiles, pid, ulo, un, b, h, sob, soh, son, H, Nq, Nk, qk_scale, AQX, BQX, AKX, BKX, WX,
        )  # fmt: skip
        if NC == 2:
            gl.warp_specialize(
                [(_ws_load, load_args), (_ws_pp0, pp_args), (_ws_pp1, pp_args)],
                [4, 4],
                [240, 240],
            )
        else:
            gl.warp_specialize(
                [(_ws_load, load_args), (_ws_pp0, pp_args), (_ws_pp1, pp_args), (_ws_pp2, pp_args),
                 (_ws_pp3, pp_args)],
                [4, 4, 4, 4],
                [CREGS, CREGS, CREGS, CREGS],
            )  # fmt: skip
    elif NC == 2:
        gl.warp_specialize(
            [(_ws_load, load_args), (_ws_consume0, consume_args), (_ws_consume1, consume_args)],
            [4, 4],
            [240, 240],
        )
    else:
        gl.warp_specialize(
            [
                (_ws_load, load_args), (_ws_consume0, consume_args), (_ws_consume1, consume_args),
                (_ws_consume2, consume_args), (_ws_consume3, consume_args),
            ],
            [4, 4, 4, 4],
            [CREGS, CREGS, CREGS, CREGS],
        )  # fmt: skip
