"""Triton kernels: FlashAttention-2 forward, backward preprocess, dk/dv and dq, with rule masks.

Masks are evaluated in the kernel from positions (SPEC §2-3); no mask tensor is read. Each query
tile (forward, dq) or key tile (dk/dv) visits a contiguous run of tiles that need no mask, then a
list of tiles that do (see ``plan.py``); tiles a rule masks entirely are never visited.
Logits are kept in the log2 domain (``log2(e)`` folded into the scale) so that ``exp2`` is used.

The rule's runtime scalars (``args.rule_args``) are the same thirteen kernel parameters in every
kernel (separate, so that the unspecialised ones can be named in ``do_not_specialize``), gathered
into one tuple ``rule`` at the top of the kernel and unpacked only by ``_keep``:

- ``q_cols``, ``k_cols``: 2-d only, the query / key grid's row length (flat index -> row, column);
- ``qy_scale``, ``qy_shift``, ``ky_scale``, ``ky_shift``: position along y = scale * row + shift;
- ``qx_scale``, ``qx_shift``, ``kx_scale``, ``kx_shift``: the same along x (1-d: the only axis);
- ``row_len``: the causal order of 2-d positions is ``y * row_len + x``;
- ``window_y``, ``window_x``: a Local rule's window along each axis.

Every other argument comes in groups: each tensor's element strides as one tuple (``sq`` = (batch,
head, row, column) strides of Q, ...), the §9 modifiers' tensors and scalars as one tuple ``mods``,
and the constexprs as named tuples (``args.py``; each function names the fields it uses as local
constexprs at its top): ``T`` the tile (head dims, their tiles, ``BM``,
``BN``, ``DOT_PRECISION``: how ``tl.dot`` multiplies, see ``_dot``; ``SWAP_HB``), ``R`` the rule's
(``NDIM``: 1 or 2, ``RULE``: "full", "causal" or "local", ``CAUSAL``: also for a causal window,
``LOG2_STRIDE``: a window's dilation), ``M`` the modifiers' and ``W`` the forward's walk. Triton
specialises the members of a tuple as it would separate arguments (integers equal to 1 or divisible
by 16, 16-byte aligned pointers), so the compiled kernels are those of separate arguments.

This module is executed once per mode (compiled or ``TRITON_INTERPRET=1``) by ``loader.py``; the
helpers it shares with the ragged kernels (``_dot``) come from ``tiles.py``, loaded in the same mode.
"""

import os

import triton
import triton.language as tl

from attnhub_backends.triton.loader import load

_tiles = load("tiles.py", os.environ.get("TRITON_INTERPRET") == "1")
_dot = _tiles._dot
LN2 = _tiles.LN2
LOG2E = _tiles.LOG2E

# Integer arguments that follow the sequence lengths (and the windows, offsets, split count and
# mask plans), which Triton must not specialise on: by default it compiles a variant per integer
# argument equal to 1 or divisible by 16, so every new length class (and every split-KV factor)
# would compile the kernels again. None of them takes part in an address whose alignment matters
# (tile plans are read one scalar at a time, positions only feed masks); strides, head counts and
# the position scales stay specialised. SPEC §11's offsets are folded into the shifts.
RULE_LENGTH_ARGS = ["q_cols", "k_cols", "qy_shift", "ky_shift", "qx_shift", "kx_shift", "row_len",
                    "window_y", "window_x"]  # fmt: skip
PLAN_ARGS = ["plan_stride", "plan_b", "plan_h"]
# The lengths themselves: also the bounds masks (``offs < Nk``) and the row bases of lse, delta,
# dk and dv, where Triton's divisibility-by-16 information lets masked loads vectorise. Kept apart
# per direction so that either can be specialised again by emptying its list (a length crossing a
# multiple of 16 then compiles one more variant; tests/test_triton_compile.py follows the lists).
# The backward keeps them specialised: unspecialised, it ran 3-33 % slower on the H100 (bf16,
# D = 64/128, L = 4k/16k; tools/dev/tjit_ab.sh at 0dabcb3, 2026-11-24), while the forward was level. A
# training run's lengths rarely move, and at most two variants (multiple of 16 or not) exist.
FWD_SEQ_ARGS = ["Nq", "Nk"]
BWD_SEQ_ARGS: list[str] = []
FWD_LENGTH_ARGS = [*PLAN_ARGS, "SPLITS", *FWD_SEQ_ARGS, *RULE_LENGTH_ARGS]
BWD_LENGTH_ARGS = [*PLAN_ARGS, *BWD_SEQ_ARGS, *RULE_LENGTH_ARGS]


@triton.jit
def _load_tile(ptrs, bounds, pad, BOUNDS: tl.constexpr, PAD: tl.constexpr):
    """Load a tile; ``bounds`` (sequence) and ``pad`` (head dim) masks only where needed."""
    if BOUNDS:
        return tl.load(ptrs, mask=bounds & pad, other=0.0)
    elif PAD:
        return tl.load(ptrs, mask=pad, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _keep(offs_m, offs_n, Nk, rule, R: tl.constexpr):
    """Boolean (len(offs_m), len(offs_n)) tile: query attends key, by the rule, from positions."""
    NDIM: tl.constexpr = R.NDIM
    RULE: tl.constexpr = R.RULE
    CAUSAL: tl.constexpr = R.CAUSAL
    LOG2_STRIDE: tl.constexpr = R.LOG2_STRIDE
    (q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
     row_len, window_y, window_x) = rule  # fmt: skip
    if NDIM == 1 and CAUSAL and RULE == "local" and LOG2_STRIDE == 0:
        # 1-d causal sliding window (the common case): keep 0 <= d < w, d = P - R, and key < Nk,
        # which (key positions rising with the index) is d >= dmin = P - pos(Nk) + 1. Both bounds
        # are folded into the row, leaving one subtraction and one unsigned comparison per pair.
        pqx = qx_scale * offs_m + qx_shift
        dmin = tl.maximum(pqx - (kx_scale * Nk + kx_shift) + 1, 0)
        span = tl.maximum(window_x - dmin, 0).to(tl.uint32)
        d = (pqx - dmin)[:, None] - (kx_scale * offs_n + kx_shift)[None, :]
        return d.to(tl.uint32, bitcast=True) < span[:, None]
    keep = (offs_n < Nk)[None, :] & (offs_m >= 0)[:, None]
    if NDIM == 2:
        pqy = qy_scale * (offs_m // q_cols) + qy_shift
        pky = ky_scale * (offs_n // k_cols) + ky_shift
        pqx = qx_scale * (offs_m % q_cols) + qx_shift
        pkx = kx_scale * (offs_n % k_cols) + kx_shift
    else:
        pqy = offs_m * 0
        pky = offs_n * 0
        pqx = qx_scale * offs_m + qx_shift
        pkx = kx_scale * offs_n + kx_shift
    if CAUSAL:
        fq = pqy * row_len + pqx
        fk = pky * row_len + pkx
        keep = keep & (fq[:, None] >= fk[None, :])
    if RULE == "local":
        dx = tl.abs(pqx[:, None] - pkx[None, :])
        keep = keep & ((dx & ((1 << LOG2_STRIDE) - 1)) == 0) & ((dx >> LOG2_STRIDE) < window_x)
        if NDIM == 2:
            dy = tl.abs(pqy[:, None] - pky[None, :])
            keep = keep & ((dy & ((1 << LOG2_STRIDE) - 1)) == 0) & ((dy >> LOG2_STRIDE) < window_y)
    return keep


if os.environ.get("TRITON_INTERPRET") == "1":

    @triton.jit
    def _rcp(x):
        return 1.0 / x

else:

    @triton.jit
    def _rcp(x):
        """The hardware's approximate reciprocal (1 ulp; no division sequence): with softcap the
        forward is bound by the per-element special functions."""
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )


@triton.jit
def _tanh(x):
    """tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both ends (exp overflows to inf, or is 0)."""
    return 1.0 - 2.0 * _rcp(tl.math.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def _softcap_probs(qk, m_i, qk_scale, softcap2, keep, MASKED: tl.constexpr, CAP_MAX: tl.constexpr = False):
    """(m_new, m_use, p) of a softcapped tile without a bias (positive scale), in four operations
    per score: e = exp2(a·qk) + 1, r = 1/e, p = exp2((softcap2 - m) - 2·softcap2·r), the same
    ``softcap2·tanh(s/softcap2) - m`` as ``_modify_with`` then ``p = exp2(s - m)``. tanh increases,
    so the row max is taken on the raw products and only the max is capped (one per row).

    ``CAP_MAX``: every row's max is the bound softcap2 itself (``m_i`` holds it from the start; see
    ``shape.cap_max``), so no max is taken and p = exp2(-2·softcap2·r)."""
    r = _rcp(tl.math.exp2(qk * (qk_scale * 2.8853900817779268 / softcap2)) + 1.0)
    if CAP_MAX:
        m_new = m_i
        m_use = m_i
        p = tl.math.exp2((-2.0 * softcap2) * r)
    else:
        if MASKED:
            qk = tl.where(keep, qk, float("-inf"))
        mx = tl.max(qk, 1) * qk_scale
        m_tile = tl.where(mx == float("-inf"), float("-inf"), softcap2 * _tanh(mx * (1.0 / softcap2)))
        m_new = tl.maximum(m_i, m_tile)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2((softcap2 - m_use)[:, None] - (2.0 * softcap2) * r)
    if MASKED:
        p = tl.where(keep, p, 0.0)
    return m_new, m_use, p


@triton.jit
def _modify(qk, qk_scale, bias_ptrs, ld, softcap2, SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr):
    """SPEC §9 scores of a tile in the log2 domain: ``softcap·tanh(scale·qk / softcap) + bias``
    (``softcap2`` is the softcap times log2(e)), and the tanh (for the backward's derivative)."""
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(bias_ptrs, mask=ld, other=0.0)
    return _modify_with(qk, qk_scale, bias, softcap2, SOFTCAP, HAS_BIAS)


@triton.jit
def _modify_with(qk, qk_scale, bias, softcap2, SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr):
    """:func:`_modify` with the bias tile already loaded."""
    s = qk * qk_scale
    th = s
    if SOFTCAP:
        th = _tanh(s * (1.0 / softcap2))
        s = softcap2 * th
    if HAS_BIAS:
        s = s + bias.to(tl.float32) * LOG2E
    return s, th


@triton.jit
def _alibi_dist(rows, cols, rule, KEYS_FIRST: tl.constexpr = False):
    """(len(rows), len(cols)) float32 ``|P(i) − R(j)|`` of 1-d positions (SPEC §9's ALiBi distance:
    the logits take ``− slope·log2(e)·dist``), (len(cols), len(rows)) with ``KEYS_FIRST``.

    Positions are taken relative to the keys' origin ``kx_shift`` in int32 (exact in SPEC §11's
    range) and converted per row and per column, so each score costs one float subtraction: an
    int-to-float conversion per score runs on Hopper's quarter-rate pipe beside the exponentials.
    Both operands are integers below 2**24 wherever a float32 kernel serves ALiBi (the nearest key
    is at most ``alibi.FLOAT32_TERM_GAP`` away), so the difference is exact, or rounded once as a
    conversion of the integer difference would be."""
    (q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
     row_len, window_y, window_x) = rule  # fmt: skip
    pq = (qx_scale * rows + (qx_shift - kx_shift)).to(tl.float32)
    pk = (kx_scale * cols).to(tl.float32)
    # One return, no ternary: Triton 3.6 types both returns of a constexpr branch alike.
    if KEYS_FIRST:  # noqa: SIM108
        d = tl.abs(pk[:, None] - pq[None, :])
    else:
        d = tl.abs(pq[:, None] - pk[None, :])
    return d


@triton.jit
def _alibi_origin(row0, rule):
    """The key-relative position (int32, as ``_alibi_dist`` takes positions) of query row ``row0``:
    the origin ``c`` of the causal ALiBi split (``_alibi_keys``)."""
    (q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
     row_len, window_y, window_x) = rule  # fmt: skip
    return qx_scale * row0 + (qx_shift - kx_shift)


@triton.jit
def _alibi_keys(cols, c, slope2, rule):
    """``slope2·(R(j) − c)`` for the key tile ``cols``: the part of a causal ALiBi term that varies
    along a row.

    A causal rule attends R(j) <= P(i) only, where ``−slope·|P(i) − R(j)|`` equals
    ``slope·(R(j) − c) − slope·(P(i) − c)`` for any c: a key term and a row term. The row term moves
    every logit of a row alike, so the softmax ignores it and only lse takes it back
    (``_alibi_rows``); the key term is one vector per tile, so a score costs one fused multiply-add
    (``t + key term``) in place of a subtraction and a multiply-add. With c the tile's first query
    row both terms stay as small as ``|P(i) − R(j)|`` plus a tile's rows where the softmax weight is
    (keys near the diagonal), so the rounding is the per-score form's. Pairs the rule excludes are
    excluded after the term is added, whatever its value."""
    (q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
     row_len, window_y, window_x) = rule  # fmt: skip
    return slope2 * (kx_scale * cols - c).to(tl.float32)


@triton.jit
def _alibi_rows(rows, row0, slope2, rule):
    """``slope2·(P(i) − c)`` for the query rows ``rows`` of a tile starting at ``row0``: the row term of
    the causal ALiBi split (``_alibi_keys``), subtracted from the rows' lse."""
    (q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
     row_len, window_y, window_x) = rule  # fmt: skip
    return slope2 * (qx_scale * (rows - row0)).to(tl.float32)


@triton.jit
def _head_batch(SWAP_HB: tl.constexpr):
    """(axis-1 id, batch) of a program: grid axes (tiles, heads, batch), or (tiles, batch, heads)
    with ``SWAP_HB``, so that the programs of one head's tiles for every batch entry run together
    and a bias shared across the batch is read from DRAM about once (then from L2)."""
    if SWAP_HB:
        ax = tl.program_id(2)
        b = tl.program_id(1)
    else:
        ax = tl.program_id(1)
        b = tl.program_id(2)
    return ax, b


@triton.jit
def _row_tile(ptrs, row_ok, cols, Nk, start_n, BN: tl.constexpr, other, INBOUNDS: tl.constexpr):
    """A (rows, BN) tile of a bias or mask whose columns are keys: the column bounds mask only on a
    tile that reaches past ``Nk``. The forward leaves ``Nk`` unspecialised (a new length compiles
    nothing), so a mask that follows it would make every load a scalar one; tiles below ``Nk``
    (``INBOUNDS``, or found so at run time) load whole vectors."""
    if INBOUNDS:  # noqa: SIM114 - a compile-time branch, then a run-time one (no mixed `or`)
        x = tl.load(ptrs, mask=row_ok[:, None], other=other)
    elif start_n + BN <= Nk:
        x = tl.load(ptrs, mask=row_ok[:, None], other=other)
    else:
        x = tl.load(ptrs, mask=row_ok[:, None] & (cols < Nk)[None, :], other=other)
    return x


@triton.jit
def _mask_keep(mask_ptrs, ld):
    """The boolean mask tile (True = attend; stored as bytes), False outside ``ld``."""
    return tl.load(mask_ptrs, mask=ld, other=0) != 0


@triton.jit
def _mask_tile(mask_ptrs, row_ok, cols, Nk, start_n, BN: tl.constexpr):
    """The forward's boolean mask tile (as :func:`_mask_keep`), loaded as :func:`_row_tile` does."""
    return _row_tile(mask_ptrs, row_ok, cols, Nk, start_n, BN, 0, False) != 0


# --- forward --------------------------------------------------------------------------------------


@triton.jit
def _load_kv(
    kd, vd, k_ptrs, v_ptrs, start_n, b, hk, cols, offs_dq, offs_dv, skn, svn, Nk,
    DQK: tl.constexpr, DV: tl.constexpr, BDQK: tl.constexpr, BDV: tl.constexpr, BN: tl.constexpr,
    MASKED: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """K^T (BDQK, BN) and V (BN, BDV) tiles at key ``start_n``.

    TMA: ``kd``/``vd`` are host-made 4-d (B, H, L, D) tensor descriptors, which zero-fill rows past
    ``Nk`` (no padded head dims); otherwise pointer loads, with bounds/pad masks where needed.
    """
    if TMA:
        kt = tl.trans(kd.load([b, hk, start_n, 0]).reshape(BN, BDQK))
        v = vd.load([b, hk, start_n, 0]).reshape(BN, BDV)
    else:
        koff = tl.cast(start_n, tl.int64) * skn
        voff = tl.cast(start_n, tl.int64) * svn
        if MASKED:
            kt = tl.load(k_ptrs + koff, mask=(cols < Nk)[None, :] & (offs_dq < DQK)[:, None], other=0.0)
            v = tl.load(v_ptrs + voff, mask=(cols < Nk)[:, None] & (offs_dv < DV)[None, :], other=0.0)
        else:
            if BDQK != DQK:
                kt = tl.load(k_ptrs + koff, mask=(offs_dq < DQK)[:, None], other=0.0)
            else:
                kt = tl.load(k_ptrs + koff)
            if BDV != DV:
                v = tl.load(v_ptrs + voff, mask=(offs_dv < DV)[None, :], other=0.0)
            else:
                v = tl.load(v_ptrs + voff)
    return kt, v


@triton.jit
def _accumulate(m_i, m_use, l_i, acc, p, v, DOT_PRECISION: tl.constexpr, FIXED_MAX: tl.constexpr = False):
    """Online-softmax update with a key tile's exponentials ``p`` (taken against ``m_use``): the
    row sums and output accumulator rescaled from the running max ``m_i``, then P V added.
    ``FIXED_MAX``: ``m_use`` is ``m_i`` by construction (softcap's bound, ``CAP_MAX``): no rescale."""
    if FIXED_MAX:
        l_i = l_i + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, DOT_PRECISION, acc)
    else:
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, DOT_PRECISION, acc * alpha[:, None])
    return l_i, acc


@triton.jit
def _fwd_step(
    q, kd, vd, k_ptrs, v_ptrs, b, hk, start_n, offs_m, offs_n, offs_dq, offs_dv, m_i, l_i, acc,
    qk_scale, skn, svn, Nk, rule, mod, row_ok,
    T: tl.constexpr, R: tl.constexpr, M: tl.constexpr, W: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One key tile of the index-list walk: the rule (and a boolean mask) evaluated only where
    ``MASKED``.

    ``NEG``: a negative scale, so the row max is taken after scaling. ``mod``: the §9 modifiers'
    pointers (see ``fwd_kernel``), used where ``SOFTCAP``, ``HAS_BIAS`` or ``HAS_MASK``.
    """
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BN: tl.constexpr = T.BN
    DOT_PRECISION: tl.constexpr = T.DOT_PRECISION
    SOFTCAP: tl.constexpr = M.SOFTCAP
    HAS_BIAS: tl.constexpr = M.HAS_BIAS
    HAS_MASK: tl.constexpr = M.HAS_MASK
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    ALIBI_SPLIT: tl.constexpr = HAS_ALIBI and R.CAUSAL and not W.PACK  # _alibi_keys
    CAP_MAX: tl.constexpr = M.CAP_MAX
    NEG: tl.constexpr = W.NEG
    TMA: tl.constexpr = W.TMA
    cols = start_n + offs_n
    kt, v = _load_kv(
        kd, vd, k_ptrs, v_ptrs, start_n, b, hk, cols, offs_dq, offs_dv, skn, svn, Nk,
        DQK, DV, BDQK, BDV, BN, MASKED, TMA,
    )  # fmt: skip
    qk = _dot(q, kt, DOT_PRECISION)
    if SOFTCAP and not HAS_BIAS and not HAS_ALIBI and not NEG:
        bias_ptr, brow, sbn, mask_ptr, mrow, smn, softcap2, slope2, alibi_c = mod
        keep = None
        if MASKED:
            keep = _keep(offs_m, cols, Nk, rule, R)
            if HAS_MASK:
                keep = keep & _mask_tile(mask_ptr + mrow[:, None] + (cols * smn)[None, :], row_ok, cols, Nk,
                                         start_n, BN)  # fmt: skip
        m_new, m_use, p = _softcap_probs(qk, m_i, qk_scale, softcap2, keep, MASKED, CAP_MAX)
    elif SOFTCAP or HAS_BIAS or HAS_ALIBI:
        bias_ptr, brow, sbn, mask_ptr, mrow, smn, softcap2, slope2, alibi_c = mod
        bias = 0.0
        if HAS_BIAS:
            bias = _row_tile(bias_ptr + brow[:, None] + (cols * sbn)[None, :], row_ok, cols, Nk, start_n, BN,
                             0.0, not MASKED)  # fmt: skip
        qk, _ = _modify_with(qk, qk_scale, bias, softcap2, SOFTCAP, HAS_BIAS)
        if ALIBI_SPLIT:
            qk = qk + _alibi_keys(cols, alibi_c, slope2, rule)[None, :]
        elif HAS_ALIBI:
            qk = qk - slope2[:, None] * _alibi_dist(offs_m, cols, rule)
        if MASKED:
            keep = _keep(offs_m, cols, Nk, rule, R)
            if HAS_MASK:
                keep = keep & _mask_tile(mask_ptr + mrow[:, None] + (cols * smn)[None, :], row_ok, cols, Nk,
                                         start_n, BN)  # fmt: skip
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_use[:, None])
    elif MASKED:
        keep = _keep(offs_m, cols, Nk, rule, R)
        if HAS_MASK:
            bias_ptr, brow, sbn, mask_ptr, mrow, smn, softcap2, slope2, alibi_c = mod
            keep = keep & _mask_tile(mask_ptr + mrow[:, None] + (cols * smn)[None, :], row_ok, cols, Nk,
                                     start_n, BN)  # fmt: skip
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_use[:, None])
    elif not NEG:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_use = m_new
        p = tl.math.exp2(qk * qk_scale - m_use[:, None])
    else:
        qk = qk * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = m_new
        p = tl.math.exp2(qk - m_use[:, None])
    l_i, acc = _accumulate(m_i, m_use, l_i, acc, p, v, DOT_PRECISION, CAP_MAX)
    return m_new, l_i, acc


@triton.jit
def _fwd_band_step(
    q, kd, vd, k_ptrs, v_ptrs, b, hk, t, full_lo, full_hi, offs_m, offs_n, offs_dq, offs_dv, m_i, l_i,
    acc, qk_scale, skn, svn, Nk, rule, mod, row_ok,
    T: tl.constexpr, R: tl.constexpr, M: tl.constexpr, W: tl.constexpr,
):  # fmt: skip
    """One key tile of a band walk: the rule (and a boolean mask) is evaluated only on tiles outside
    the FULL run.

    One loop visits every tile of the band, so the software pipeline is filled once per query
    tile (not once per run) and no tile index is loaded. Positive scales only (``NEG`` is false).
    ``EVEN_K``: the key count is a multiple of ``BN``, so no load needs a bounds mask.
    """
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BN: tl.constexpr = T.BN
    DOT_PRECISION: tl.constexpr = T.DOT_PRECISION
    SOFTCAP: tl.constexpr = M.SOFTCAP
    HAS_BIAS: tl.constexpr = M.HAS_BIAS
    HAS_MASK: tl.constexpr = M.HAS_MASK
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    ALIBI_SPLIT: tl.constexpr = HAS_ALIBI and R.CAUSAL and not W.PACK  # _alibi_keys
    TMA: tl.constexpr = W.TMA
    EVEN_K: tl.constexpr = W.EVEN_K
    start_n = t * BN
    cols = start_n + offs_n
    kt, v = _load_kv(
        kd, vd, k_ptrs, v_ptrs, start_n, b, hk, cols, offs_dq, offs_dv, skn, svn, Nk,
        DQK, DV, BDQK, BDV, BN, not EVEN_K, TMA,
    )  # fmt: skip
    qk = _dot(q, kt, DOT_PRECISION)
    if SOFTCAP or HAS_BIAS or HAS_ALIBI:
        bias_ptr, brow, sbn, mask_ptr, mrow, smn, softcap2, slope2, alibi_c = mod
        bias = 0.0
        if HAS_BIAS:
            bias = _row_tile(bias_ptr + brow[:, None] + (cols * sbn)[None, :], row_ok, cols, Nk, start_n, BN,
                             0.0, EVEN_K)  # fmt: skip
        qk, _ = _modify_with(qk, qk_scale, bias, softcap2, SOFTCAP, HAS_BIAS)
        if ALIBI_SPLIT:
            qk = qk + _alibi_keys(cols, alibi_c, slope2, rule)[None, :]
        elif HAS_ALIBI:
            qk = qk - slope2[:, None] * _alibi_dist(offs_m, cols, rule)
        if (t < full_lo) | (t >= full_hi):
            keep = _keep(offs_m, cols, Nk, rule, R)
            if HAS_MASK:
                keep = keep & _mask_tile(mask_ptr + mrow[:, None] + (cols * smn)[None, :], row_ok, cols, Nk,
                                         start_n, BN)  # fmt: skip
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_use[:, None])
    else:
        if (t < full_lo) | (t >= full_hi):
            keep = _keep(offs_m, cols, Nk, rule, R)
            if HAS_MASK:
                bias_ptr, brow, sbn, mask_ptr, mrow, smn, softcap2, slope2, alibi_c = mod
                keep = keep & _mask_tile(mask_ptr + mrow[:, None] + (cols * smn)[None, :], row_ok, cols, Nk,
                                         start_n, BN)  # fmt: skip
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk * qk_scale - m_use[:, None])
    l_i, acc = _accumulate(m_i, m_use, l_i, acc, p, v, DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=FWD_LENGTH_ARGS)
def fwd_kernel(
    Q, K, V, O, LSE, PLAN, plan_stride, sq, sk, sv, so, heads, Nq, Nk, qk_scale, mods, plan_b, plan_h,
    q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
    row_len, window_y, window_x,
    SPLITS, split_strides,
    T: tl.constexpr, R: tl.constexpr, M: tl.constexpr, W: tl.constexpr,
):  # fmt: skip
    """One (query tile, key split, head, batch) program: out and natural-log lse of its rows.

    Arguments: the tensors, the plan (``PLAN`` and its row stride), the element strides of Q, K, V
    and O (``sq``, ``sk``, ``sv``, ``so``: 4-tuples), ``heads`` = (H, GROUP), the lengths, the
    scale, ``mods`` (the §9 operands, unpacked below), the mask plan's strides, the rule's thirteen
    scalars, the split count and ``split_strides``; then the constexprs ``T``, ``R``, ``M`` and ``W``
    (``args.DENSE_FWD``), whose fields are named below without their tuple.

    ``K``/``V`` are tensors, or host-made tensor descriptors where ``TMA``. ``PACK``: GQA rows
    packed into one tile (few queries). ``BAND``: one loop over a contiguous band of key tiles
    (``plan.band_lists``), else the masked tiles' index list then the unmasked run (``plan.rows``).
    With SPLITS > 1 (split-KV, for few query tiles) each program visits every SPLITS-th partial tile
    and one slice of the unmasked run, and writes float32 partial results that ``combine_kernel``
    merges; ``split_strides`` = (o_split, l_split) are the element strides between the splits'
    partial buffers.
    ``SPLIT`` (SPLITS > 1) is the compile-time switch: without it the kernel is built for one split,
    so that the split count itself (a runtime value, like the lengths it follows) compiles nothing.
    ``NQ1``: one query row (decoding a token), which the packed row indexing folds away.

    SPEC §9 (each behind its constexpr, so that other calls compile as before): ``SOFTCAP``
    (``softcap2`` = softcap·log2(e)), ``HAS_BIAS`` (``BIAS`` with element strides ``sb*``, 0 where
    broadcast), ``HAS_MASK`` (a boolean mask read as bytes on the plan's PARTIAL tiles; the plan
    then has one row block per (mask batch, mask head): ``plan_b``/``plan_h`` rows apart) and
    ``HAS_SINKS`` (``SINKS`` (H,) joins the softmax as a zero-value key, in split 0 only).
    """
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BM: tl.constexpr = T.BM
    BN: tl.constexpr = T.BN
    SWAP_HB: tl.constexpr = T.SWAP_HB
    HAS_MASK: tl.constexpr = M.HAS_MASK
    HAS_SINKS: tl.constexpr = M.HAS_SINKS
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    ALIBI_SPLIT: tl.constexpr = HAS_ALIBI and R.CAUSAL and not W.PACK  # _alibi_keys
    CAP_MAX: tl.constexpr = M.CAP_MAX
    PACK: tl.constexpr = W.PACK
    TMA: tl.constexpr = W.TMA
    BAND: tl.constexpr = W.BAND
    SPLIT: tl.constexpr = W.SPLIT
    NQ1: tl.constexpr = W.NQ1
    rule = (q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
            row_len, window_y, window_x)  # fmt: skip
    sqb, sqh, sqn, sqd = sq
    skb, skh, skn, skd = sk
    svb, svh, svn, svd = sv
    sob, soh, son, sod = so
    H, GROUP = heads
    BIAS, sb, MASKP, sm, SINKS, softcap2, ALIBI, sa = mods  # no nested targets: Triton 3.6 cannot parse them
    sbb, sbh, sbm, sbn = sb
    sab, sah = sa
    smb, smh, smm, smn = sm
    o_split, l_split = split_strides
    n_splits = SPLITS if SPLIT else 1
    if NQ1:
        Nq = 1
    pid0 = tl.num_programs(0) - 1 - tl.program_id(0)  # heavy (late) tiles first under causal
    pid_m = pid0 // n_splits
    split = pid0 % n_splits
    ax_h, b = _head_batch(SWAP_HB)
    if PACK:
        # GQA packing (few queries): the rows of one tile are (query head of the group, query),
        # so the kv head's keys are read once for the whole group. Axis 1 is the kv head.
        hk = ax_h
        r = tl.arange(0, BM)
        offs_m = r % Nq
        hrow = hk * GROUP + r // Nq
        row_ok = r < Nq * GROUP
    else:
        h = ax_h
        hk = h // GROUP
        offs_m = pid_m * BM + tl.arange(0, BM)
        hrow = h
        row_ok = offs_m < Nq
    offs_n = tl.arange(0, BN)
    offs_dq = tl.arange(0, BDQK)
    offs_dv = tl.arange(0, BDV)
    if TMA:
        kd = K
        vd = V
        k_ptrs = 0
        v_ptrs = 0
    else:
        kd = 0
        vd = 0
        k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
        v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
        k_ptrs = k_base + offs_n[None, :] * skn + offs_dq[:, None] * skd
        v_ptrs = v_base + offs_n[:, None] * svn + offs_dv[None, :] * svd
    q_rows = Q + b.to(tl.int64) * sqb + tl.cast(hrow, tl.int64) * sqh + offs_m * sqn
    q = tl.load(
        q_rows[:, None] + offs_dq[None, :] * sqd,
        mask=row_ok[:, None] & (offs_dq < DQK)[None, :],
        other=0.0,
    )
    if CAP_MAX:  # softcapped scores never pass softcap2: every row's max from the start
        m_i = tl.zeros([BM], dtype=tl.float32) + softcap2
    else:
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    hrow64 = tl.cast(hrow, tl.int64)
    brow = b.to(tl.int64) * sbb + hrow64 * sbh + offs_m * sbm
    mrow = b.to(tl.int64) * smb + hrow64 * smh + offs_m * smm
    slope2 = 0.0
    alibi_c = 0
    if ALIBI_SPLIT:  # the program's head's ALiBi slope (log2 domain) and the split's origin
        slope2 = tl.load(ALIBI + b * sab + hrow * sah) * LOG2E
        alibi_c = _alibi_origin(pid_m * BM, rule)
    elif HAS_ALIBI:  # the rows' ALiBi slopes, log2 domain
        slope2 = tl.load(ALIBI + b * sab + hrow * sah + offs_m * 0, mask=row_ok, other=0.0) * LOG2E
    mod = (BIAS, brow, sbn, MASKP, mrow, smn, softcap2, slope2, alibi_c)
    if HAS_MASK:  # no PACK: hrow is one head; rows of plan.lists or plan.band_lists
        row = PLAN + (b * plan_b + hrow * plan_h + pid_m).to(tl.int64) * plan_stride
    else:
        row = PLAN + pid_m * plan_stride
    full_lo = tl.load(row)
    full_hi = tl.load(row + 1)
    if BAND:  # plan.band_lists: [full_lo, full_hi, lo, hi], every tile of lo..hi-1 visited
        for t in range(tl.load(row + 2) + split, tl.load(row + 3), n_splits):
            m_i, l_i, acc = _fwd_band_step(
                q, kd, vd, k_ptrs, v_ptrs, b, hk, t, full_lo, full_hi, offs_m, offs_n, offs_dq, offs_dv,
                m_i, l_i, acc, qk_scale, skn, svn, Nk, rule, mod, row_ok,
                T, R, M, W,
            )  # fmt: skip
    else:  # plan.rows: [full_lo, full_hi, count, masked tile indices...]
        count = tl.load(row + 2)
        per = tl.cdiv(full_hi - full_lo, n_splits)
        full_lo = full_lo + split * per
        full_hi = tl.minimum(full_hi, full_lo + per)
        for t in range(split, count, n_splits):
            start_n = tl.load(row + 3 + t) * BN
            m_i, l_i, acc = _fwd_step(
                q, kd, vd, k_ptrs, v_ptrs, b, hk, start_n, offs_m, offs_n, offs_dq, offs_dv, m_i, l_i, acc,
                qk_scale, skn, svn, Nk, rule, mod, row_ok,
                T, R, M, W, True,
            )  # fmt: skip
        for start_n in range(full_lo * BN, full_hi * BN, BN):
            m_i, l_i, acc = _fwd_step(
                q, kd, vd, k_ptrs, v_ptrs, b, hk, start_n, offs_m, offs_n, offs_dq, offs_dv, m_i, l_i, acc,
                qk_scale, skn, svn, Nk, rule, mod, row_ok,
                T, R, M, W, False,
            )  # fmt: skip
    row_term = 0.0
    if ALIBI_SPLIT:  # the logits were taken without the ALiBi split's row term (_alibi_keys)
        row_term = _alibi_rows(offs_m, pid_m * BM, slope2, rule)
    if HAS_SINKS:  # the sink: one more exponential in the row sum, none in the accumulator
        sink = tl.load(SINKS + hrow + offs_m * 0, mask=row_ok, other=float("-inf")).to(tl.float32) * LOG2E
        if ALIBI_SPLIT:
            sink = sink + row_term
        sink = tl.where(split == 0, sink, float("-inf"))
        m_f = tl.maximum(m_i, sink)
        m_fu = tl.where(m_f == float("-inf"), 0.0, m_f)
        alpha = tl.math.exp2(m_i - m_fu)
        l_i = l_i * alpha + tl.math.exp2(sink - m_fu)
        acc = acc * alpha[:, None]
        m_i = m_f
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i)) - row_term) * LN2)
    o_rows = O + split.to(tl.int64) * o_split + b.to(tl.int64) * sob + tl.cast(hrow, tl.int64) * soh
    tl.store(
        (o_rows + offs_m * son)[:, None] + offs_dv[None, :] * sod,
        out.to(O.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv < DV)[None, :],
    )
    lse_rows = LSE + split.to(tl.int64) * l_split + (b.to(tl.int64) * H + hrow) * Nq + offs_m
    tl.store(lse_rows, lse, mask=row_ok)


@triton.jit(do_not_specialize=["SPLITS", *(a for a in FWD_SEQ_ARGS if a == "Nq")])
def combine_kernel(
    OP,
    LP,
    O,
    LSE,
    SPLITS,
    Nq,
    H,
    sob,
    soh,
    son,
    sod,
    o_split,
    l_split,
    DV: tl.constexpr,
    BDV: tl.constexpr,
    BM: tl.constexpr,
    BS: tl.constexpr,
):
    """Merge split-KV partials: lse = logsumexp over splits, out = sum of exp(lse_s - lse) * out_s."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    rows = pid_m * BM + tl.arange(0, BM)
    sp = tl.arange(0, BS)
    offs_d = tl.arange(0, BDV)
    row_ok = rows < Nq
    base = (b.to(tl.int64) * H + h) * Nq
    lp = tl.load(
        LP + sp[:, None].to(tl.int64) * l_split + base + rows[None, :],
        mask=(sp < SPLITS)[:, None] & row_ok[None, :],
        other=float("-inf"),
    )
    m = tl.max(lp, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.sum(tl.exp(lp - m_safe[None, :]), 0)
    lse = tl.where(total == 0.0, float("-inf"), m_safe + tl.log(tl.where(total == 0.0, 1.0, total)))
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    for s in range(0, SPLITS):
        ls = tl.load(LP + s * l_split + base + rows, mask=row_ok, other=float("-inf"))
        w = tl.where(total == 0.0, 0.0, tl.exp(ls - m_safe) / tl.where(total == 0.0, 1.0, total))
        o = tl.load(
            OP + s * o_split + (base + rows[:, None]) * DV + offs_d[None, :],
            mask=row_ok[:, None] & (offs_d < DV)[None, :],
            other=0.0,
        )
        acc += w[:, None] * o
    tl.store(
        O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + rows[:, None] * son + offs_d[None, :] * sod,
        acc.to(O.dtype.element_ty),
        mask=row_ok[:, None] & (offs_d < DV)[None, :],
    )
    tl.store(LSE + base + rows, lse, mask=row_ok)


# --- backward -------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=[a for a in BWD_SEQ_ARGS if a == "Nq"])
def bwd_prep_kernel(
    O,
    DO,
    LSE,
    DELTA,
    LSE2,
    sob,
    soh,
    son,
    sod,
    sdb,
    sdh,
    sdn,
    sdd,
    H,
    Nq,
    DV: tl.constexpr,
    BDV: tl.constexpr,
    BM: tl.constexpr,
):
    """delta = rowsum(dO * O); lse2 = lse * log2(e), with +inf for fully masked rows (p = 0)."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BDV)
    msk = (offs_m < Nq)[:, None] & (offs_d < DV)[None, :]
    o = tl.load(
        O + b.to(tl.int64) * sob + h.to(tl.int64) * soh + offs_m[:, None] * son + offs_d[None, :] * sod,
        mask=msk,
        other=0.0,
    ).to(tl.float32)
    do = tl.load(
        DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + offs_m[:, None] * sdn + offs_d[None, :] * sdd,
        mask=msk,
        other=0.0,
    ).to(tl.float32)
    delta = tl.sum(o * do, 1)
    row = (b.to(tl.int64) * H + h) * Nq + offs_m
    lse = tl.load(LSE + row, mask=offs_m < Nq, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    tl.store(DELTA + row, delta, mask=offs_m < Nq)
    tl.store(LSE2 + row, lse2, mask=offs_m < Nq)


@triton.jit
def _dkdv_step(
    k, v, dk, dv, q_ptrs, do_ptrs, lse2_base, delta_base, start_m, offs_n, offs_mb, offs_dq, offs_dv,
    qk_scale, sqn, sdn, Nq, Nk, rule, mod,
    T: tl.constexpr, R: tl.constexpr, M: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One query tile's contribution to a key tile's dk and dv (the rule, and a boolean mask,
    evaluated where ``MASKED``); ``mod`` as in ``dkdv_kernel``."""
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    DOT_PRECISION: tl.constexpr = T.DOT_PRECISION
    SOFTCAP: tl.constexpr = M.SOFTCAP
    HAS_BIAS: tl.constexpr = M.HAS_BIAS
    HAS_MASK: tl.constexpr = M.HAS_MASK
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    ALIBI_SPLIT: tl.constexpr = HAS_ALIBI and R.CAUSAL  # _alibi_keys
    PADQ: tl.constexpr = BDQK != DQK
    PADV: tl.constexpr = BDV != DV
    rows = start_m + offs_mb
    ok = rows < Nq
    q = _load_tile(
        q_ptrs + tl.cast(start_m, tl.int64) * sqn, ok[:, None], (offs_dq < DQK)[None, :], MASKED, PADQ
    )
    do = _load_tile(
        do_ptrs + tl.cast(start_m, tl.int64) * sdn, ok[:, None], (offs_dv < DV)[None, :], MASKED, PADV
    )
    if MASKED:
        lse2 = tl.load(lse2_base + rows, mask=ok, other=float("inf"))
        delta = tl.load(delta_base + rows, mask=ok, other=0.0)
    else:
        lse2 = tl.load(lse2_base + rows)
        delta = tl.load(delta_base + rows)
    qkt = _dot(k, tl.trans(q), DOT_PRECISION)  # (BN, BM)
    if SOFTCAP or HAS_BIAS or HAS_MASK or HAS_ALIBI:
        bias_base, sbm, sbn, mask_base, smm, smn, softcap2, slope2 = mod
        ld = (offs_n < Nk)[:, None] & ok[None, :]
    if SOFTCAP or HAS_BIAS or HAS_ALIBI:
        st, th = _modify(
            qkt, qk_scale, bias_base + (offs_n * sbn)[:, None] + (rows * sbm)[None, :], ld, softcap2,
            SOFTCAP, HAS_BIAS,
        )  # fmt: skip
        if ALIBI_SPLIT:
            st = st + _alibi_keys(offs_n, _alibi_origin(start_m, rule), slope2, rule)[:, None]
            lse2 = lse2 + _alibi_rows(rows, start_m, slope2, rule)
        elif HAS_ALIBI:
            st = st - slope2 * _alibi_dist(rows, offs_n, rule, True)
        pt = tl.math.exp2(st - lse2[None, :])
    else:
        pt = tl.math.exp2(qkt * qk_scale - lse2[None, :])
    if MASKED:
        keep = tl.trans(_keep(rows, offs_n, Nk, rule, R))
        if HAS_MASK:
            keep = keep & _mask_keep(mask_base + (offs_n * smn)[:, None] + (rows * smm)[None, :], ld)
        pt = tl.where(keep, pt, 0.0)
    dv = _dot(pt.to(do.dtype), do, DOT_PRECISION, dv)
    dpt = _dot(v, tl.trans(do), DOT_PRECISION)
    dst = pt * (dpt - delta[None, :])
    if SOFTCAP:
        dst = dst * (1.0 - th * th)
    dk = _dot(dst.to(q.dtype), q, DOT_PRECISION, dk)
    return dk, dv


@triton.jit(do_not_specialize=BWD_LENGTH_ARGS)
def dkdv_kernel(
    Q, K, V, DO, LSE2, DELTA, DK, DV_, PLAN, plan_stride, sq, sk, sv, sd, heads, Nq, Nk, qk_scale, sm_scale,
    mods, plan_b, plan_h,
    q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
    row_len, window_y, window_x,
    T: tl.constexpr, R: tl.constexpr, M: tl.constexpr,
):  # fmt: skip
    """One (key tile, kv head, batch) program: dk and dv summed over the query heads of its group.

    The §9 modifiers as in ``fwd_kernel``; with ``HAS_MASK`` the plan's rows are per (mask batch,
    mask head, key tile), ``plan_b``/``plan_h`` rows apart.
    """
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BM: tl.constexpr = T.BM
    BN: tl.constexpr = T.BN
    SWAP_HB: tl.constexpr = T.SWAP_HB
    HAS_MASK: tl.constexpr = M.HAS_MASK
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    rule = (q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
            row_len, window_y, window_x)  # fmt: skip
    sqb, sqh, sqn, sqd = sq
    skb, skh, skn, skd = sk
    svb, svh, svn, svd = sv
    sdb, sdh, sdn, sdd = sd
    HQ, HKV, GROUP = heads
    BIAS, sb, MASKP, sm, softcap2, ALIBI, sa = mods
    sbb, sbh, sbm, sbn = sb
    sab, sah = sa
    smb, smh, smm, smn = sm
    pid_n = tl.program_id(0)
    hk, b = _head_batch(SWAP_HB)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_mb = tl.arange(0, BM)
    offs_dq = tl.arange(0, BDQK)
    offs_dv = tl.arange(0, BDV)
    n_ok = offs_n < Nk
    k = tl.load(
        K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh + offs_n[:, None] * skn + offs_dq[None, :] * skd,
        mask=n_ok[:, None] & (offs_dq < DQK)[None, :],
        other=0.0,
    )
    v = tl.load(
        V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh + offs_n[:, None] * svn + offs_dv[None, :] * svd,
        mask=n_ok[:, None] & (offs_dv < DV)[None, :],
        other=0.0,
    )
    dk = tl.zeros([BN, BDQK], dtype=tl.float32)
    dv = tl.zeros([BN, BDV], dtype=tl.float32)
    row = PLAN + pid_n * plan_stride
    full_lo = tl.load(row)
    full_hi = tl.load(row + 1)
    count = tl.load(row + 2)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
        do_base = DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh
        lse2_base = LSE2 + (b.to(tl.int64) * HQ + h) * Nq
        delta_base = DELTA + (b.to(tl.int64) * HQ + h) * Nq
        q_ptrs = q_base + offs_mb[:, None] * sqn + offs_dq[None, :] * sqd
        do_ptrs = do_base + offs_mb[:, None] * sdn + offs_dv[None, :] * sdd
        slope2 = 0.0
        if HAS_ALIBI:
            slope2 = tl.load(ALIBI + b * sab + h * sah) * LOG2E
        mod = (
            BIAS + b.to(tl.int64) * sbb + h.to(tl.int64) * sbh, sbm, sbn,
            MASKP + b.to(tl.int64) * smb + h.to(tl.int64) * smh, smm, smn, softcap2, slope2,
        )  # fmt: skip
        if HAS_MASK:
            row = PLAN + (b * plan_b + h * plan_h + pid_n).to(tl.int64) * plan_stride
            full_lo = tl.load(row)
            full_hi = tl.load(row + 1)
            count = tl.load(row + 2)
        for t in range(0, count):  # query tiles the rule masks in part: plan.cols' index list
            start_m = tl.load(row + 3 + t) * BM
            dk, dv = _dkdv_step(
                k, v, dk, dv, q_ptrs, do_ptrs, lse2_base, delta_base, start_m, offs_n, offs_mb, offs_dq,
                offs_dv, qk_scale, sqn, sdn, Nq, Nk, rule, mod,
                T, R, M, True,
            )  # fmt: skip
        for start_m in range(full_lo * BM, full_hi * BM, BM):  # the unmasked run
            dk, dv = _dkdv_step(
                k, v, dk, dv, q_ptrs, do_ptrs, lse2_base, delta_base, start_m, offs_n, offs_mb, offs_dq,
                offs_dv, qk_scale, sqn, sdn, Nq, Nk, rule, mod,
                T, R, M, False,
            )  # fmt: skip
    dk = dk * sm_scale
    base = (b.to(tl.int64) * HKV + hk) * Nk
    tl.store(
        DK + (base + offs_n[:, None]) * DQK + offs_dq[None, :],
        dk.to(DK.dtype.element_ty),
        mask=n_ok[:, None] & (offs_dq < DQK)[None, :],
    )
    tl.store(
        DV_ + (base + offs_n[:, None]) * DV + offs_dv[None, :],
        dv.to(DV_.dtype.element_ty),
        mask=n_ok[:, None] & (offs_dv < DV)[None, :],
    )


@triton.jit
def _dq_step(
    q, do, dq, lse2, delta, k_ptrs, v_ptrs, start_n, offs_m, offs_n, offs_dq, offs_dv,
    qk_scale, skn, svn, Nk, rule, mod, row_ok,
    T: tl.constexpr, R: tl.constexpr, M: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One key tile's contribution to a query tile's dq (the rule, and a boolean mask, evaluated
    where ``MASKED``); with ``DBIAS`` it also stores dS (natural units) in ``mod``'s
    buffer."""
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    DOT_PRECISION: tl.constexpr = T.DOT_PRECISION
    SOFTCAP: tl.constexpr = M.SOFTCAP
    HAS_BIAS: tl.constexpr = M.HAS_BIAS
    HAS_MASK: tl.constexpr = M.HAS_MASK
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    ALIBI_SPLIT: tl.constexpr = HAS_ALIBI and R.CAUSAL  # _alibi_keys
    DBIAS: tl.constexpr = M.DBIAS
    PADQ: tl.constexpr = BDQK != DQK
    PADV: tl.constexpr = BDV != DV
    cols = start_n + offs_n
    ok = (cols < Nk)[None, :]
    kt = _load_tile(k_ptrs + tl.cast(start_n, tl.int64) * skn, ok, (offs_dq < DQK)[:, None], MASKED, PADQ)
    vt = _load_tile(v_ptrs + tl.cast(start_n, tl.int64) * svn, ok, (offs_dv < DV)[:, None], MASKED, PADV)
    qk = _dot(q, kt, DOT_PRECISION)
    if SOFTCAP or HAS_BIAS or HAS_MASK or HAS_ALIBI:
        bias_ptr, brow, sbn, mask_ptr, mrow, smn, softcap2, db_ptr, dbrow, slope2, alibi_c = mod
        ld = row_ok[:, None] & (cols < Nk)[None, :]
    if SOFTCAP or HAS_BIAS or HAS_ALIBI:
        s, th = _modify(
            qk,
            qk_scale,
            bias_ptr + brow[:, None] + (cols * sbn)[None, :],
            ld,
            softcap2,
            SOFTCAP,
            HAS_BIAS,
        )
        if ALIBI_SPLIT:
            s = s + _alibi_keys(cols, alibi_c, slope2, rule)[None, :]
        elif HAS_ALIBI:
            s = s - slope2 * _alibi_dist(offs_m, cols, rule)
        p = tl.math.exp2(s - lse2[:, None])
    else:
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
    if MASKED:
        keep = _keep(offs_m, cols, Nk, rule, R)
        if HAS_MASK:
            keep = keep & _mask_keep(mask_ptr + mrow[:, None] + (cols * smn)[None, :], ld)
        p = tl.where(keep, p, 0.0)
    dp = _dot(do, vt, DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    if DBIAS:
        tl.store(db_ptr + dbrow[:, None] + cols[None, :], ds.to(db_ptr.dtype.element_ty), mask=ld)
    if SOFTCAP:
        ds = ds * (1.0 - th * th)
    dq = _dot(ds.to(kt.dtype), tl.trans(kt), DOT_PRECISION, dq)
    return dq


@triton.jit(do_not_specialize=BWD_LENGTH_ARGS)
def dq_kernel(
    Q, K, V, DO, LSE2, DELTA, DQ, PLAN, plan_stride, sq, sk, sv, sd, heads, Nq, Nk, qk_scale, sm_scale,
    mods, plan_b, plan_h,
    q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
    row_len, window_y, window_x,
    T: tl.constexpr, R: tl.constexpr, M: tl.constexpr,
):  # fmt: skip
    """One (query tile, head, batch) program: dq of its rows; with ``DBIAS`` also dS into ``DB``
    (B, HQ, Nq, Nk), float32 or the bias's 16-bit dtype. The other §9 modifiers as in ``fwd_kernel``."""
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BM: tl.constexpr = T.BM
    BN: tl.constexpr = T.BN
    SWAP_HB: tl.constexpr = T.SWAP_HB
    HAS_MASK: tl.constexpr = M.HAS_MASK
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    ALIBI_SPLIT: tl.constexpr = HAS_ALIBI and R.CAUSAL  # _alibi_keys
    rule = (q_cols, k_cols, qy_scale, qy_shift, ky_scale, ky_shift, qx_scale, qx_shift, kx_scale, kx_shift,
            row_len, window_y, window_x)  # fmt: skip
    sqb, sqh, sqn, sqd = sq
    skb, skh, skn, skd = sk
    svb, svh, svn, svd = sv
    sdb, sdh, sdn, sdd = sd
    HQ, GROUP = heads
    BIAS, sb, MASKP, sm, DB, softcap2, ALIBI, sa = mods
    sbb, sbh, sbm, sbn = sb
    sab, sah = sa
    smb, smh, smm, smn = sm
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    h, b = _head_batch(SWAP_HB)
    hk = h // GROUP
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_dq = tl.arange(0, BDQK)
    offs_dv = tl.arange(0, BDV)
    ok = offs_m < Nq
    q = tl.load(
        Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh + offs_m[:, None] * sqn + offs_dq[None, :] * sqd,
        mask=ok[:, None] & (offs_dq < DQK)[None, :],
        other=0.0,
    )
    do = tl.load(
        DO + b.to(tl.int64) * sdb + h.to(tl.int64) * sdh + offs_m[:, None] * sdn + offs_dv[None, :] * sdd,
        mask=ok[:, None] & (offs_dv < DV)[None, :],
        other=0.0,
    )
    row_base = (b.to(tl.int64) * HQ + h) * Nq
    lse2 = tl.load(LSE2 + row_base + offs_m, mask=ok, other=float("inf"))
    delta = tl.load(DELTA + row_base + offs_m, mask=ok, other=0.0)
    k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    dq = tl.zeros([BM, BDQK], dtype=tl.float32)
    k_ptrs = k_base + offs_n[None, :] * skn + offs_dq[:, None] * skd
    v_ptrs = v_base + offs_n[None, :] * svn + offs_dv[:, None] * svd
    b64 = b.to(tl.int64)
    slope2 = 0.0
    alibi_c = 0
    if HAS_ALIBI:
        slope2 = tl.load(ALIBI + b * sab + h * sah) * LOG2E
    if ALIBI_SPLIT:  # the split's origin; the rows' lse2 in the logits' split form (_alibi_keys)
        alibi_c = _alibi_origin(pid_m * BM, rule)
        lse2 = lse2 + _alibi_rows(offs_m, pid_m * BM, slope2, rule)
    mod = (
        BIAS, b64 * sbb + h.to(tl.int64) * sbh + offs_m * sbm, sbn,
        MASKP, b64 * smb + h.to(tl.int64) * smh + offs_m * smm, smn, softcap2,
        DB, (row_base + offs_m) * Nk, slope2, alibi_c,
    )  # fmt: skip
    if HAS_MASK:
        row = PLAN + (b * plan_b + h * plan_h + pid_m).to(tl.int64) * plan_stride
    else:
        row = PLAN + pid_m * plan_stride
    full_lo = tl.load(row)
    full_hi = tl.load(row + 1)
    count = tl.load(row + 2)
    for t in range(0, count):  # key tiles the rule masks in part: plan.rows' index list
        start_n = tl.load(row + 3 + t) * BN
        dq = _dq_step(
            q, do, dq, lse2, delta, k_ptrs, v_ptrs, start_n, offs_m, offs_n, offs_dq, offs_dv,
            qk_scale, skn, svn, Nk, rule, mod, ok,
            T, R, M, True,
        )  # fmt: skip
    for start_n in range(full_lo * BN, full_hi * BN, BN):  # the unmasked run
        dq = _dq_step(
            q, do, dq, lse2, delta, k_ptrs, v_ptrs, start_n, offs_m, offs_n, offs_dq, offs_dv,
            qk_scale, skn, svn, Nk, rule, mod, ok,
            T, R, M, False,
        )  # fmt: skip
    dq = dq * sm_scale
    tl.store(
        DQ + (row_base + offs_m[:, None]) * DQK + offs_dq[None, :],
        dq.to(DQ.dtype.element_ty),
        mask=ok[:, None] & (offs_dq < DQK)[None, :],
    )
