"""Triton kernels for ragged sequences (SPEC §10-§11): per-entry lengths, packed sequences, paged
KV caches and split-KV decoding, 1-d only.

Every kernel works from a sequence's table entry ``q_start, q_len, k_start, k_len, aq, bq, ak, bk``
(:func:`_entry`, from the lengths or cu_seqlens on the device): the forward computes its program's
entry in place (one launch), the backward kernels read the (S, 8) int32 table ``TAB`` that
``table_kernel`` writes once per backward (``ragged_launch.seq_table``). Sequence ``s``
is rows ``q_start .. q_start + q_len`` of batch entry ``s`` of q (``sqb = 0`` for packed
sequences, where ``q_start`` is the cu_seqlens offset) against rows ``k_start .. k_start + k_len``
of k and v. Within the valid segment, query ``i`` sits at position ``aq * i + bq`` and key ``j``
at ``ak * j + bk`` (the sync mode evaluated on the segment's lengths, offsets folded in); rules
are evaluated from those positions, and each program computes the band of tiles its rows can
reach from them, so tiles outside a sequence or outside the rule are never visited. Programs whose
tile lies past their sequence's length return at once: the grid is sized from the longest sequence
and no length is read on the host.

Logits are kept in the log2 domain (``log2(e)`` folded into ``qk_scale``) for ``exp2``. With
``SOFTCAP`` the logit is ``softcap * tanh(scale * q·k / softcap)``. This module is executed once
per mode (compiled or ``TRITON_INTERPRET=1``) by ``ragged_launch._kernels``; the helpers it shares
with the dense kernels (``_dot``) come from ``tiles.py``, loaded in the same mode.
"""

import os

import triton
import triton.language as tl

from attnhub_backends.triton.loader import load

_tiles = load("tiles.py", os.environ.get("TRITON_INTERPRET") == "1")
_dot = _tiles._dot
LN2 = _tiles.LN2

# Integer arguments that follow the lengths, which Triton must not specialise on (it compiles a
# variant per integer equal to 1 or divisible by 16): the padded lengths, offsets and sequence
# count of the table kernel, the longest sequence ``MQ``, the split chunk and count, the window,
# the block table's width ``sbt`` (max_seqlen_k / block size) and the lse/delta row strides
# ``slb``/``slh`` (they follow Lq, the total token count of packed sequences: each new batch).
# Per-sequence lengths are read from the table on the device and never compile anything. Other
# strides, head counts and scales stay specialised; the split-KV partials' strides are rounded
# to multiples of 16 on the host instead.
LSE_STRIDE_ARGS = ["slb", "slh"]
TABLE_LENGTH_ARGS = ["S", "Lq", "Lk", "q_offset", "k_offset"]
FWD_LENGTH_ARGS = ["MQ", "CHUNK", "Lq", "Lk", "q_offset", "k_offset", "window", "sbt", *LSE_STRIDE_ARGS]
BWD_LENGTH_ARGS = ["window", *LSE_STRIDE_ARGS]


@triton.jit
def _load(ptrs, mask, other, CHECK: tl.constexpr):
    """``tl.load`` with ``mask`` only where ``CHECK`` (unmasked loads vectorise and skip the test)."""
    if CHECK:
        return tl.load(ptrs, mask=mask, other=other)
    else:
        return tl.load(ptrs)


@triton.jit
def _seq(TAB, s):
    """The eight table entries of sequence ``s``."""
    row = TAB + s * 8
    return (
        tl.load(row), tl.load(row + 1), tl.load(row + 2), tl.load(row + 3),
        tl.load(row + 4), tl.load(row + 5), tl.load(row + 6), tl.load(row + 7),
    )  # fmt: skip


@triton.jit
def _count_upto(pos, a):
    """Number of indices ``j >= 0`` with ``a * j <= pos`` (0 when pos < 0)."""
    return tl.where(pos < 0, 0, pos // a + 1)


@triton.jit
def _count_below(pos, a):
    """Number of indices ``j >= 0`` with ``a * j < pos`` (the first index at or past ``pos``)."""
    return tl.where(pos <= 0, 0, (pos + a - 1) // a)


@triton.jit
def _key_band(pq_lo, pq_hi, k_len, ak, bk, window, R: tl.constexpr):
    """Keys reachable from query positions ``pq_lo..pq_hi``: ``[n_lo, n_hi)``, and ``n_full``: keys
    below it (from n_lo) are attended by every query of that range (no mask needed)."""
    RULE: tl.constexpr = R.RULE
    CAUSAL: tl.constexpr = R.CAUSAL
    LOG2_STRIDE: tl.constexpr = R.LOG2_STRIDE
    n_lo = 0
    n_hi = k_len
    if CAUSAL:
        n_hi = tl.minimum(n_hi, _count_upto(pq_hi - bk, ak))
    if RULE == "local":
        reach = (window - 1) << LOG2_STRIDE
        n_lo = _count_below(pq_lo - reach - bk, ak)
        if not CAUSAL:
            n_hi = tl.minimum(n_hi, _count_upto(pq_hi + reach - bk, ak))
        n_full = n_lo
    elif CAUSAL:
        n_full = tl.minimum(n_hi, _count_upto(pq_lo - bk, ak))
    else:
        n_full = n_hi
    return n_lo, n_hi, n_full


@triton.jit
def _query_band(pk_lo, pk_hi, q_len, aq, bq, window, R: tl.constexpr):
    """Queries that reach key positions ``pk_lo..pk_hi``: ``[i_lo, i_hi)``, and ``i_full``: queries
    from it on attend every key of that range (causal and full rules; local: ``i_hi``)."""
    RULE: tl.constexpr = R.RULE
    CAUSAL: tl.constexpr = R.CAUSAL
    LOG2_STRIDE: tl.constexpr = R.LOG2_STRIDE
    i_lo = 0
    i_hi = q_len
    if CAUSAL:
        i_lo = _count_below(pk_lo - bq, aq)
    if RULE == "local":
        reach = (window - 1) << LOG2_STRIDE
        i_hi = tl.minimum(i_hi, _count_upto(pk_hi + reach - bq, aq))
        if not CAUSAL:
            i_lo = _count_below(pk_lo - reach - bq, aq)
        i_full = i_hi
    elif CAUSAL:
        i_full = tl.minimum(q_len, tl.maximum(i_lo, _count_below(pk_hi - bq, aq)))
    else:
        i_full = i_lo
    return tl.minimum(i_lo, i_hi), i_hi, i_full


@triton.jit
def _keep(i, j, q_len, k_len, aq, bq, ak, bk, window, R: tl.constexpr):
    """(len(i), len(j)) booleans: valid query ``i`` attends valid key ``j`` by the rule."""
    RULE: tl.constexpr = R.RULE
    CAUSAL: tl.constexpr = R.CAUSAL
    LOG2_STRIDE: tl.constexpr = R.LOG2_STRIDE
    keep = (i < q_len)[:, None] & (j < k_len)[None, :]
    pq = aq * i + bq
    pk = ak * j + bk
    if CAUSAL:
        keep = keep & (pq[:, None] >= pk[None, :])
    if RULE == "local":
        d = tl.abs(pq[:, None] - pk[None, :])
        keep = keep & ((d & ((1 << LOG2_STRIDE) - 1)) == 0) & ((d >> LOG2_STRIDE) < window)
    return keep


@triton.jit
def _softcap(qk, qk_scale, cap):
    """(log2-domain logits, tanh) of ``cap * tanh(qk * scale / cap)``; ``qk_scale`` = scale·log2(e)."""
    x = qk * (qk_scale * 0.6931471805599453 / cap)
    th = 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)  # 2·log2(e)
    return th * (cap * 1.4426950408889634), th


@triton.jit
def _add_mods(x, xm, i, j, q_len, k_len, k_start, aq, bq, ak, bk,
              HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, KEYS_FIRST: tl.constexpr = False):  # fmt: skip
    """SPEC §9's bias and ALiBi added to log2-domain logits ``x`` of valid queries ``i`` and keys
    ``j`` ((len(i), len(j)), or (len(j), len(i)) with ``KEYS_FIRST``). ``xm`` = (bias row pointers
    of the rows ``i`` (their batch, head and padded row folded in), the bias's key stride, the rows'
    ALiBi slopes·log2(e), which rows exist). The bias is read at the padded key row ``k_start + j``,
    only for valid pairs (padding may hold anything); ALiBi is ``slope·|P(i) − R(j)|`` on the
    segment's positions."""
    brow, sbn, slope2, row_ok = xm
    if HAS_BIAS:
        ld = (row_ok & (i < q_len))[:, None] & (j < k_len)[None, :]
        ptrs = brow[:, None] + ((k_start + j).to(tl.int64) * sbn)[None, :]
        b = tl.load(ptrs, mask=ld, other=0.0).to(tl.float32) * 1.4426950408889634
        if KEYS_FIRST:  # noqa: SIM108 (a constexpr branch, which Triton resolves at compile time)
            x = x + tl.trans(b)
        else:
            x = x + b
    if HAS_ALIBI:
        # Per-row and per-column float positions from the keys' origin (``kernels._alibi_dist``).
        pq = (aq * i + (bq - bk)).to(tl.float32)
        pk = (ak * j).to(tl.float32)
        if KEYS_FIRST:
            x = x - slope2[None, :] * tl.abs(pk[:, None] - pq[None, :])
        else:
            x = x - slope2[:, None] * tl.abs(pq[:, None] - pk[None, :])
    return x


@triton.jit
def _kv_rows(K, V, BT, s, hk, rows, sk, sv, sbt, k_start, PAGED: tl.constexpr, BLOCK: tl.constexpr):
    """Row pointers of keys ``rows`` (within the sequence) in K and V.

    Contiguous: batch entry ``s``, rows ``k_start + rows``. ``PAGED``: key j is row ``j % BLOCK`` of
    block ``BT[s, j // BLOCK]`` (``sk``/``sv``: (block, head, row) strides; contiguous: (batch, head,
    row) strides).
    """
    skb, skh, skn = sk
    svb, svh, svn = sv
    if PAGED:
        blk = tl.load(BT + s.to(tl.int64) * sbt + rows // BLOCK).to(tl.int64)
        r = rows % BLOCK
        k_rows = K + blk * skb + hk.to(tl.int64) * skh + r * skn
        v_rows = V + blk * svb + hk.to(tl.int64) * svh + r * svn
    else:
        r = (k_start + rows).to(tl.int64)
        k_rows = K + s.to(tl.int64) * skb + hk.to(tl.int64) * skh + r * skn
        v_rows = V + s.to(tl.int64) * svb + hk.to(tl.int64) * svh + r * svn
    return k_rows, v_rows


@triton.jit
def _entry(QL, KL, CUQ, CUK, s, ok, Lq, Lk, q_offset, k_offset,
           HAS_QL: tl.constexpr, HAS_KL: tl.constexpr, VARLEN: tl.constexpr, LEFT: tl.constexpr,
           SYNC: tl.constexpr):  # fmt: skip
    """The table entries of sequence(s) ``s`` (a scalar or a block; ``ok``: which exist) from
    lengths or cu_seqlens: ``q_start, q_len, k_start, k_len, aq, bq, ak, bk``.

    Positions follow SPEC §2 on each valid segment (``M = max(q_len, k_len)``), offsets added
    (none_front); ``LEFT``: valid tokens at the end of the padded rows.
    """
    zero = s * 0
    if VARLEN:
        q_start = tl.load(CUQ + s, mask=ok, other=0)
        q_len = tl.load(CUQ + s + 1, mask=ok, other=0) - q_start
        k_start = tl.load(CUK + s, mask=ok, other=0)
        k_len = tl.load(CUK + s + 1, mask=ok, other=0) - k_start
    else:
        q_len = zero + Lq
        k_len = zero + Lk
        # Clamped to [0, L]: lengths the core could not read (under a trace, a graph capture or
        # ATTNHUB_TRUST_LENGTHS) never move a program outside its arrays.
        if HAS_QL:
            q_len = tl.minimum(tl.maximum(tl.load(QL + s, mask=ok, other=0).to(tl.int32), 0), Lq)
        if HAS_KL:
            k_len = tl.minimum(tl.maximum(tl.load(KL + s, mask=ok, other=0).to(tl.int32), 0), Lk)
        q_start = zero
        k_start = zero
        if LEFT:
            q_start = Lq - q_len
            k_start = Lk - k_len
    m = tl.maximum(q_len, k_len)
    aq = zero + 1
    ak = zero + 1
    bq = zero + q_offset
    bk = zero + k_offset
    if SYNC == "none_end":
        bq = m - q_len
        bk = m - k_len
    elif SYNC == "scale_front" or SYNC == "scale_end":
        aq = m // tl.maximum(q_len, 1)
        ak = m // tl.maximum(k_len, 1)
        if SYNC == "scale_end":
            bq = aq - 1
            bk = ak - 1
        else:
            bq = zero
            bk = zero
    return q_start, q_len, k_start, k_len, aq, bq, ak, bk


@triton.jit(do_not_specialize=TABLE_LENGTH_ARGS)
def table_kernel(
    QL, KL, CUQ, CUK, TAB, S, Lq, Lk, q_offset, k_offset,
    HAS_QL: tl.constexpr, HAS_KL: tl.constexpr, VARLEN: tl.constexpr, LEFT: tl.constexpr,
    SYNC: tl.constexpr, BS: tl.constexpr,
):  # fmt: skip
    """The sequence table (see the module docstring) of the backward kernels, in one launch (the
    forward computes its program's entry in place: :func:`_entry`)."""
    s = tl.program_id(0) * BS + tl.arange(0, BS)
    ok = s < S
    q_start, q_len, k_start, k_len, aq, bq, ak, bk = _entry(
        QL, KL, CUQ, CUK, s, ok, Lq, Lk, q_offset, k_offset, HAS_QL, HAS_KL, VARLEN, LEFT, SYNC
    )
    row = TAB + s * 8
    tl.store(row, q_start, mask=ok)
    tl.store(row + 1, q_len, mask=ok)
    tl.store(row + 2, k_start, mask=ok)
    tl.store(row + 3, k_len, mask=ok)
    tl.store(row + 4, aq, mask=ok)
    tl.store(row + 5, bq, mask=ok)
    tl.store(row + 6, ak, mask=ok)
    tl.store(row + 7, bk, mask=ok)


# --- forward --------------------------------------------------------------------------------------


@triton.jit
def _fwd_tile(
    q, K, V, BT, s, hk, n0, i, m_i, l_i, acc, q_len, k_len, k_start, aq, bq, ak, bk, window,
    sk, sv, sbt, qk_scale, cap, kv_b, xm, T: tl.constexpr, R: tl.constexpr, F: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One key tile (keys ``n0 .. n0 + BN``) of the online softmax; the rule applied if ``MASKED``.
    ``POS_SCALE``: the scale is positive (unmasked tiles then fold it into exp2's argument).

    ``TMA``: ``K``/``V`` are host-made 4-d (B, Hkv, L, D) tensor descriptors read at batch entry
    ``kv_b``, rows ``k_start + n0 ..`` (zero-filled past L). Rows past ``k_len`` inside L are the
    caller's padding and may hold anything: their logits are masked, their values zeroed (0·NaN
    would be NaN); only masked tiles reach past ``k_len``."""
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BN: tl.constexpr = T.BN
    DOT_PRECISION: tl.constexpr = T.DOT_PRECISION
    PAGED: tl.constexpr = F.PAGED
    BLOCK: tl.constexpr = F.BLOCK
    SOFTCAP: tl.constexpr = F.SOFTCAP
    TMA: tl.constexpr = F.TMA
    POS_SCALE: tl.constexpr = F.POS_SCALE
    HAS_BIAS: tl.constexpr = F.HAS_BIAS
    HAS_ALIBI: tl.constexpr = F.HAS_ALIBI
    j = n0 + tl.arange(0, BN)
    dq_ = tl.arange(0, BDQK)
    dv_ = tl.arange(0, BDV)
    j_ok = j < k_len
    if TMA:
        kt = tl.trans(K.load([kv_b, hk, k_start + n0, 0]).reshape(BN, BDQK))
        v = V.load([kv_b, hk, k_start + n0, 0]).reshape(BN, BDV)
        if MASKED:
            v = tl.where(j_ok[:, None], v, 0.0)
    else:
        k_rows, v_rows = _kv_rows(K, V, BT, s, hk, j, sk, sv, sbt, k_start, PAGED, BLOCK)
        check = MASKED or BDQK != DQK or BDV != DV  # unmasked tiles lie below k_len
        kt = _load(k_rows[None, :] + dq_[:, None], j_ok[None, :] & (dq_ < DQK)[:, None], 0.0, check)
        v = _load(v_rows[:, None] + dv_[None, :], j_ok[:, None] & (dv_ < DV)[None, :], 0.0, check)
    qk = _dot(q, kt, DOT_PRECISION)
    if not MASKED and not SOFTCAP and POS_SCALE and not HAS_BIAS and not HAS_ALIBI:
        # Every logit of an unmasked tile is finite: the scale folds into exp2's argument (one
        # FMA per logit) and the row max needs no -inf guard (max(qk)·scale: scale > 0).
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(v.dtype), v, DOT_PRECISION, acc * alpha[:, None])
        return m_new, l_i, acc
    if SOFTCAP:
        qk, _ = _softcap(qk, qk_scale, cap)
    else:
        qk = qk * qk_scale
    if HAS_BIAS or HAS_ALIBI:
        qk = _add_mods(qk, xm, i, j, q_len, k_len, k_start, aq, bq, ak, bk, HAS_BIAS, HAS_ALIBI)
    if MASKED:
        keep = _keep(i, j, q_len, k_len, aq, bq, ak, bk, window, R)
        qk = tl.where(keep, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(qk - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _dot(p.to(v.dtype), v, DOT_PRECISION, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit(do_not_specialize=FWD_LENGTH_ARGS)
def fwd_kernel(
    Q, K, V, O, LSE, OP, LP, CNT, QL, KL, CUQ, CUK, BT, SINKS, mods, sq, sk, sv, so, slb, slh, sbt, split_strides,
    GROUP, MQ, CHUNK, Lq, Lk, q_offset, k_offset, qk_scale, cap, window,
    T: tl.constexpr, R: tl.constexpr, E: tl.constexpr, F: tl.constexpr,
):  # fmt: skip
    """One (query tile or key chunk, head, sequence) program: out and lse of its rows (lse only
    with ``WRITE_LSE``: a forward whose caller wants neither lse nor a backward skips it).

    Strides come as (batch, head, row) tuples ``sq``, ``sk``, ``sv``, ``so`` (a paged cache's
    ``sk``/``sv``: (block, head, row)), lse's as ``slb``/``slh`` and the block table's row as
    ``sbt`` (separate: they follow the lengths and are not specialised), the partials' as
    ``split_strides`` = (o_split, l_split); the constexprs as ``T``, ``R``, ``E`` (how entries are
    computed) and ``F`` (the rest: ``args.RAGGED_FWD``), whose fields are named below without their
    tuple.

    The program's table entry is computed in place from the lengths (:func:`_entry`), so a
    forward is one launch. ``PACK`` (few queries): axis 1 is the kv head and the tile's rows are
    (query head of the group, query), so the keys are read once for the group; axis 0 is then the
    key chunk (``SPLIT``: chunks of ``CHUNK`` key tiles). A split writes float32 partial results to
    ``OP``/``LP`` ((S, H, MQ, DV) and (S, H, MQ) per split, ``o_split``/``l_split`` elements apart)
    and counts itself done in ``CNT`` (one int32 per (sequence, kv head), zero on entry); the last
    split of a group merges the partials into ``O`` and ``LSE`` (:func:`_merge_splits`) and sets its
    counter back to zero. Otherwise axis 1 is the query head and axis 0 the query tile, and results
    go straight to the rows of ``O``/``LSE``.

    ``TMA`` (query-tiled, not paged): ``K``/``V`` are tensor descriptors (see :func:`_fwd_tile`).
    ``FILL_PADDED`` (query-tiled, per-entry ``q_lengths``, not packed sequences): the programs also
    write out 0 and lse -inf on the padded query rows (relative rows ``q_len .. Lq``, which sit at
    ``q_start + i`` on the right and ``q_start + i - Lq`` on the left), so the host allocates the
    outputs without filling them.
    """
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BM: tl.constexpr = T.BM
    BN: tl.constexpr = T.BN
    HAS_QL: tl.constexpr = E.HAS_QL
    HAS_KL: tl.constexpr = E.HAS_KL
    VARLEN: tl.constexpr = E.VARLEN
    LEFT: tl.constexpr = E.LEFT
    SYNC: tl.constexpr = E.SYNC
    PACK: tl.constexpr = F.PACK
    SPLIT: tl.constexpr = F.SPLIT
    SINK: tl.constexpr = F.SINK
    BR: tl.constexpr = F.BR
    BSP: tl.constexpr = F.BSP
    WRITE_LSE: tl.constexpr = F.WRITE_LSE
    FILL_PADDED: tl.constexpr = F.FILL_PADDED
    HAS_BIAS: tl.constexpr = F.HAS_BIAS
    HAS_ALIBI: tl.constexpr = F.HAS_ALIBI
    # ``mods`` = (BIAS, its (batch, head, row, key) strides, ALIBI, its (batch, head) strides, the dq
    # kernel's dS buffer and its strides), strides 0 where broadcast. Unpacked before any early
    # return: Triton 3.6 turns a specialised tuple member unpacked after one into None.
    BIAS, sb, ALIBI, sa, DB, sdbs = mods
    sbb, sbh, sbm, sbn = sb
    sab, sah = sa
    sqb, sqh, sqn = sq
    sob, soh, son = so
    o_split, l_split = split_strides
    s = tl.program_id(2)
    q_start, q_len, k_start, k_len, aq, bq, ak, bk = _entry(
        QL, KL, CUQ, CUK, s, s >= 0, Lq, Lk, q_offset, k_offset, HAS_QL, HAS_KL, VARLEN, LEFT, SYNC
    )
    r = tl.arange(0, BM)
    if PACK:
        hk = tl.program_id(1)
        i = r % MQ
        h = hk * GROUP + r // MQ
        row_ok = (i < q_len) & (r < MQ * GROUP)
        i_first = 0
        i_last = tl.minimum(q_len, MQ) - 1
    else:
        h = tl.program_id(1) + r * 0
        hk = tl.program_id(1) // GROUP
        tile = tl.num_programs(0) - 1 - tl.program_id(0)  # heavy (late) causal tiles first
        i = tile * BM + r
        row_ok = i < q_len
        i_first = tile * BM
        i_last = tl.minimum(q_len, i_first + BM) - 1
    if FILL_PADDED:
        pad = (i >= q_len) & (i < Lq)
        pad_row = q_start + i
        if LEFT:
            pad_row = pad_row - Lq
        dv0 = tl.arange(0, BDV)
        o_pad = O + s.to(tl.int64) * sob + h.to(tl.int64) * soh + pad_row.to(tl.int64) * son
        tl.store(o_pad[:, None] + dv0[None, :], tl.zeros([BM, BDV], dtype=O.dtype.element_ty),
                 mask=pad[:, None] & (dv0 < DV)[None, :])  # fmt: skip
        if WRITE_LSE:
            lse_pad = LSE + s.to(tl.int64) * slb + h.to(tl.int64) * slh + pad_row
            tl.store(lse_pad, tl.full([BM], float("-inf"), dtype=tl.float32), mask=pad)
    if i_first >= q_len:
        return  # past this sequence's queries (padded rows: written above, or by the host)
    n_lo, n_hi, n_full = _key_band(aq * i_first + bq, aq * i_last + bq, k_len, ak, bk, window, R)
    t_lo = n_lo // BN
    t_hi = tl.cdiv(n_hi, BN)
    t_full = tl.maximum(t_lo, n_full // BN)  # tiles t_lo .. t_full-1 need no mask
    split = 0
    if SPLIT:
        split = tl.program_id(0)
        t_lo = t_lo + split * CHUNK
        t_hi = tl.minimum(t_hi, t_lo + CHUNK)
        t_full = tl.maximum(t_lo, tl.minimum(t_full, t_hi))
    dq_ = tl.arange(0, BDQK)
    dv_ = tl.arange(0, BDV)
    kv_b = s * 0 if VARLEN else s  # packed sequences share batch entry 0
    q_rows = Q + s.to(tl.int64) * sqb + h.to(tl.int64) * sqh + (q_start + i).to(tl.int64) * sqn
    q = tl.load(q_rows[:, None] + dq_[None, :], mask=row_ok[:, None] & (dq_ < DQK)[None, :], other=0.0)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    # §9's bias and ALiBi (``_add_mods``): the rows' bias pointers and slopes.
    brow = BIAS
    if HAS_BIAS:
        brow = BIAS + s.to(tl.int64) * sbb + h.to(tl.int64) * sbh + (q_start + i).to(tl.int64) * sbm
    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(ALIBI + s * sab + h * sah, mask=row_ok, other=0.0) * 1.4426950408889634
    xm = (brow, sbn, slope2, row_ok)
    for t in range(t_lo, t_full):
        m_i, l_i, acc = _fwd_tile(
            q, K, V, BT, s, hk, t * BN, i, m_i, l_i, acc, q_len, k_len, k_start, aq, bq, ak, bk, window,
            sk, sv, sbt, qk_scale, cap, kv_b, xm, T, R, F, False,
        )  # fmt: skip
    for t in range(t_full, t_hi):
        m_i, l_i, acc = _fwd_tile(
            q, K, V, BT, s, hk, t * BN, i, m_i, l_i, acc, q_len, k_len, k_start, aq, bq, ak, bk, window,
            sk, sv, sbt, qk_scale, cap, kv_b, xm, T, R, F, True,
        )  # fmt: skip
    if SINK and not SPLIT:  # the sink: a virtual key of logit sinks[h] and value 0
        sink2 = tl.load(SINKS + h, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        m_new = tl.maximum(m_i, sink2)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.math.exp2(sink2 - m_new)
        acc = acc * alpha[:, None]
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * LN2)
    d_ok = (dv_ < DV)[None, :]
    if SPLIT:
        prow = (s.to(tl.int64) * (GROUP * tl.num_programs(1)) + h) * MQ + i  # partial rows, from 0
        tl.store(OP + split * o_split + prow[:, None] * DV + dv_[None, :], out, mask=row_ok[:, None] & d_ok)
        tl.store(LP + split * l_split + prow, lse, mask=row_ok)
        tl.debug_barrier()  # every thread's partial is written before the count says so
        counter = CNT + s * tl.num_programs(1) + hk
        if tl.atomic_add(counter, 1, sem="acq_rel") == tl.num_programs(0) - 1:
            _merge_splits(
                OP, LP, O, LSE, SINKS, s, hk, q_start, q_len, GROUP, MQ, o_split, l_split, sob, soh, son, slb,
                slh, DV, BDV, BR, BSP, SINK, WRITE_LSE,
            )  # fmt: skip
            tl.atomic_xchg(counter, 0)  # ready for the next launch on this workspace
    else:
        o_rows = O + s.to(tl.int64) * sob + h.to(tl.int64) * soh + (q_start + i).to(tl.int64) * son
        tl.store(o_rows[:, None] + dv_[None, :], out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok)
        if WRITE_LSE:
            tl.store(LSE + s.to(tl.int64) * slb + h.to(tl.int64) * slh + q_start + i, lse, mask=row_ok)


@triton.jit
def _merge_splits(
    OP, LP, O, LSE, SINKS, s, hk, q_start, q_len, GROUP, MQ, o_split, l_split, sob, soh, son, slb, slh,
    DV: tl.constexpr, BDV: tl.constexpr, BR: tl.constexpr, BSP: tl.constexpr, SINK: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):  # fmt: skip
    """Merge every split's partials of the (sequence ``s``, kv head ``hk``) group into O and LSE:
    lse = logsumexp of the splits' lse (and the sink's logit), out = their outs weighted by
    exp(lse_split - lse).

    Rows are the packed forward's (query head of the group, query), ``BR`` of them; ``BSP`` splits
    are read at once as a (split, row, head dim) block, so the merge costs a few memory round trips,
    not two per split. Read through L2 (``.cg``): other programs wrote the partials.
    """
    splits = tl.num_programs(0)
    r = tl.arange(0, BR)
    h = hk * GROUP + r // MQ
    i = r % MQ
    ok = (i < q_len) & (r < MQ * GROUP)
    prow = (s.to(tl.int64) * (GROUP * tl.num_programs(1)) + h) * MQ + i
    sp = tl.arange(0, BSP)
    dv_ = tl.arange(0, BDV)
    m = tl.full([BR], float("-inf"), dtype=tl.float32)
    for c in range(0, splits, BSP):
        at = ((c + sp) < splits)[:, None] & ok[None, :]
        lk = tl.load(LP + (c + sp).to(tl.int64)[:, None] * l_split + prow[None, :], mask=at,
                     other=float("-inf"), cache_modifier=".cg")  # fmt: skip
        m = tl.maximum(m, tl.max(lk, 0))
    if SINK:
        sink = tl.load(SINKS + h, mask=ok, other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, sink)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BR], dtype=tl.float32)
    acc = tl.zeros([BR, BDV], dtype=tl.float32)
    for c in range(0, splits, BSP):
        at = ((c + sp) < splits)[:, None] & ok[None, :]
        lk = tl.load(LP + (c + sp).to(tl.int64)[:, None] * l_split + prow[None, :], mask=at,
                     other=float("-inf"), cache_modifier=".cg")  # fmt: skip
        o_ptrs = (
            OP
            + (c + sp).to(tl.int64)[:, None, None] * o_split
            + prow[None, :, None] * DV
            + dv_[None, None, :]
        )
        o = tl.load(o_ptrs, mask=at[:, :, None] & (dv_ < DV)[None, None, :], other=0.0, cache_modifier=".cg")
        w = tl.exp(lk - m_safe[None, :])
        total += tl.sum(w, 0)
        acc += tl.sum(w[:, :, None] * o, 0)
    if SINK:
        total += tl.exp(sink - m_safe)
    empty = total == 0.0
    out = acc / tl.where(empty, 1.0, total)[:, None]
    lse = tl.where(empty, float("-inf"), m_safe + tl.log(tl.where(empty, 1.0, total)))
    rows = (q_start + i).to(tl.int64)
    o_rows = O + s.to(tl.int64) * sob + h.to(tl.int64) * soh + rows * son
    tl.store(
        o_rows[:, None] + dv_[None, :], out.to(O.dtype.element_ty), mask=ok[:, None] & (dv_ < DV)[None, :]
    )
    if WRITE_LSE:
        tl.store(LSE + s.to(tl.int64) * slb + h.to(tl.int64) * slh + rows, lse, mask=ok)


# --- backward -------------------------------------------------------------------------------------


@triton.jit
def _dkdv_tile(
    k, v, dk, dv, Q, DO, LSE2, DELTA, s, h, m0, j, q_start, q_len, k_start, k_len, aq, bq, ak, bk, window,
    sq, sd, slb, slh, qk_scale, cap, xk,
    T: tl.constexpr, R: tl.constexpr, M: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One query tile's (rows ``m0 .. m0 + BM`` of head h) contribution to a key tile's dk, dv."""
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BM: tl.constexpr = T.BM
    DOT_PRECISION: tl.constexpr = T.DOT_PRECISION
    SOFTCAP: tl.constexpr = M.SOFTCAP
    HAS_BIAS: tl.constexpr = M.HAS_BIAS
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    sqb, sqh, sqn = sq
    sdb, sdh, sdn = sd
    i = m0 + tl.arange(0, BM)
    ok = i < q_len
    dq_ = tl.arange(0, BDQK)
    dv_ = tl.arange(0, BDV)
    rows = (q_start + i).to(tl.int64)
    check = MASKED or BDQK != DQK or BDV != DV  # unmasked tiles are whole tiles below q_len
    q = _load(Q + s.to(tl.int64) * sqb + h.to(tl.int64) * sqh + rows[:, None] * sqn + dq_[None, :],
              ok[:, None] & (dq_ < DQK)[None, :], 0.0, check)  # fmt: skip
    do = _load(DO + s.to(tl.int64) * sdb + h.to(tl.int64) * sdh + rows[:, None] * sdn + dv_[None, :],
               ok[:, None] & (dv_ < DV)[None, :], 0.0, check)  # fmt: skip
    l_rows = s.to(tl.int64) * slb + h.to(tl.int64) * slh + rows
    lse2 = _load(LSE2 + l_rows, ok, float("inf"), MASKED)
    delta = _load(DELTA + l_rows, ok, 0.0, MASKED)
    qkt = _dot(k, tl.trans(q), DOT_PRECISION)  # (BN, BM)
    if SOFTCAP:
        qkt, th = _softcap(qkt, qk_scale, cap)
    else:
        qkt = qkt * qk_scale
    if HAS_BIAS or HAS_ALIBI:
        bh, sbm, sbn, sl2 = xk  # head h's bias pointer and strides, its slope (dkdv_kernel)
        brow = bh
        if HAS_BIAS:
            brow = bh + rows * sbm
        xm = (brow, sbn, sl2 + tl.zeros([BM], dtype=tl.float32), ok)
        qkt = _add_mods(qkt, xm, i, j, q_len, k_len, k_start, aq, bq, ak, bk, HAS_BIAS, HAS_ALIBI, True)
    pt = tl.math.exp2(qkt - lse2[None, :])
    if MASKED:
        keep = _keep(i, j, q_len, k_len, aq, bq, ak, bk, window, R)
        pt = tl.where(tl.trans(keep), pt, 0.0)
    dv = _dot(pt.to(do.dtype), do, DOT_PRECISION, dv)
    dpt = _dot(v, tl.trans(do), DOT_PRECISION)
    dst = pt * (dpt - delta[None, :])
    if SOFTCAP:
        dst = dst * (1.0 - th * th)
    dk = _dot(dst.to(q.dtype), q, DOT_PRECISION, dk)
    return dk, dv


@triton.jit(do_not_specialize=BWD_LENGTH_ARGS)
def dkdv_kernel(
    Q, K, V, DO, LSE2, DELTA, DK, DV_, TAB, mods, sq, sk, sv, sd, slb, slh, sdk, sdv,
    GROUP, qk_scale, sm_scale, cap, window, T: tl.constexpr, R: tl.constexpr, M: tl.constexpr,
):  # fmt: skip
    """One (key tile, kv head, sequence) program: dk and dv summed over the group's query heads,
    visiting only the query tiles that reach the key tile."""
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BM: tl.constexpr = T.BM
    BN: tl.constexpr = T.BN
    RULE: tl.constexpr = R.RULE
    HAS_BIAS: tl.constexpr = M.HAS_BIAS
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    BIAS, sb, ALIBI, sa, DB, sdbs = mods  # before any early return (see fwd_kernel)
    sbb, sbh, sbm, sbn = sb
    sab, sah = sa
    skb, skh, skn = sk
    svb, svh, svn = sv
    sdkb, sdkh, sdkn = sdk
    sdvb, sdvh, sdvn = sdv
    s = tl.program_id(2)
    hk = tl.program_id(1)
    q_start, q_len, k_start, k_len, aq, bq, ak, bk = _seq(TAB, s)
    n0 = tl.program_id(0) * BN
    if n0 >= k_len:
        return  # past this sequence's keys (their gradients were zeroed by the host)
    j = n0 + tl.arange(0, BN)
    j_ok = j < k_len
    dq_ = tl.arange(0, BDQK)
    dv_ = tl.arange(0, BDV)
    k_rows = (k_start + j).to(tl.int64)
    k = tl.load(K + s.to(tl.int64) * skb + hk.to(tl.int64) * skh + k_rows[:, None] * skn + dq_[None, :],
                mask=j_ok[:, None] & (dq_ < DQK)[None, :], other=0.0)  # fmt: skip
    v = tl.load(V + s.to(tl.int64) * svb + hk.to(tl.int64) * svh + k_rows[:, None] * svn + dv_[None, :],
                mask=j_ok[:, None] & (dv_ < DV)[None, :], other=0.0)  # fmt: skip
    n_last = tl.minimum(k_len, n0 + BN) - 1
    i_lo, i_hi, i_full = _query_band(ak * n0 + bk, ak * n_last + bk, q_len, aq, bq, window, R)
    m_lo = (i_lo // BM) * BM
    # Query tiles from m_full on (whole tiles below q_len) attend every key of a whole key tile.
    m_full = tl.maximum(m_lo, tl.cdiv(i_full, BM) * BM)
    m_full = tl.minimum(m_full, tl.maximum(m_lo, tl.cdiv(i_hi, BM) * BM))
    if RULE == "local":
        m_end = m_full
    else:
        m_end = tl.where(n0 + BN <= k_len, tl.maximum((q_len // BM) * BM, m_full), m_full)
    dk = tl.zeros([BN, BDQK], dtype=tl.float32)
    dv = tl.zeros([BN, BDV], dtype=tl.float32)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        bh = BIAS
        if HAS_BIAS:
            bh = BIAS + s.to(tl.int64) * sbb + h.to(tl.int64) * sbh
        sl2 = 0.0
        if HAS_ALIBI:
            sl2 = tl.load(ALIBI + s * sab + h * sah) * 1.4426950408889634
        xk = (bh, sbm, sbn, sl2)
        for m0 in range(m_lo, m_full, BM):
            dk, dv = _dkdv_tile(
                k, v, dk, dv, Q, DO, LSE2, DELTA, s, h, m0, j, q_start, q_len, k_start, k_len, aq, bq, ak, bk,
                window, sq, sd, slb, slh, qk_scale, cap, xk, T, R, M, True,
            )  # fmt: skip
        for m0 in range(m_full, m_end, BM):
            dk, dv = _dkdv_tile(
                k, v, dk, dv, Q, DO, LSE2, DELTA, s, h, m0, j, q_start, q_len, k_start, k_len, aq, bq, ak, bk,
                window, sq, sd, slb, slh, qk_scale, cap, xk, T, R, M, False,
            )  # fmt: skip
        for m0 in range(m_end, tl.cdiv(i_hi, BM) * BM, BM):
            dk, dv = _dkdv_tile(
                k, v, dk, dv, Q, DO, LSE2, DELTA, s, h, m0, j, q_start, q_len, k_start, k_len, aq, bq, ak, bk,
                window, sq, sd, slb, slh, qk_scale, cap, xk, T, R, M, True,
            )  # fmt: skip
    dk = dk * sm_scale
    tl.store(DK + s.to(tl.int64) * sdkb + hk.to(tl.int64) * sdkh + k_rows[:, None] * sdkn + dq_[None, :],
             dk.to(DK.dtype.element_ty), mask=j_ok[:, None] & (dq_ < DQK)[None, :])  # fmt: skip
    tl.store(DV_ + s.to(tl.int64) * sdvb + hk.to(tl.int64) * sdvh + k_rows[:, None] * sdvn + dv_[None, :],
             dv.to(DV_.dtype.element_ty), mask=j_ok[:, None] & (dv_ < DV)[None, :])  # fmt: skip


@triton.jit
def _dq_tile(
    q, do, dq, lse2, delta, K, V, s, hk, n0, i, q_len, k_len, k_start, aq, bq, ak, bk, window,
    sk, sv, qk_scale, cap, xm, dbrow, sdbn,
    T: tl.constexpr, R: tl.constexpr, M: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """One key tile's contribution to a query tile's dq; with ``DBIAS`` its dS (natural units, the
    bias's gradient) stored at ``dbrow`` (the rows' pointers) and key stride ``sdbn``."""
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BN: tl.constexpr = T.BN
    DOT_PRECISION: tl.constexpr = T.DOT_PRECISION
    SOFTCAP: tl.constexpr = M.SOFTCAP
    HAS_BIAS: tl.constexpr = M.HAS_BIAS
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    DBIAS: tl.constexpr = M.DBIAS
    j = n0 + tl.arange(0, BN)
    j_ok = j < k_len
    dq_ = tl.arange(0, BDQK)
    dv_ = tl.arange(0, BDV)
    k_rows, v_rows = _kv_rows(K, V, K, s, hk, j, sk, sv, 0, k_start, False, 1)
    check = MASKED or BDQK != DQK or BDV != DV  # unmasked tiles lie below k_len
    kt = _load(k_rows[None, :] + dq_[:, None], j_ok[None, :] & (dq_ < DQK)[:, None], 0.0, check)
    vt = _load(v_rows[None, :] + dv_[:, None], j_ok[None, :] & (dv_ < DV)[:, None], 0.0, check)
    qk = _dot(q, kt, DOT_PRECISION)
    if SOFTCAP:
        qk, th = _softcap(qk, qk_scale, cap)
    else:
        qk = qk * qk_scale
    if HAS_BIAS or HAS_ALIBI:
        qk = _add_mods(qk, xm, i, j, q_len, k_len, k_start, aq, bq, ak, bk, HAS_BIAS, HAS_ALIBI)
    p = tl.math.exp2(qk - lse2[:, None])
    if MASKED:
        keep = _keep(i, j, q_len, k_len, aq, bq, ak, bk, window, R)
        p = tl.where(keep, p, 0.0)
    dp = _dot(do, vt, DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    if DBIAS:
        ld = (i < q_len)[:, None] & j_ok[None, :]
        dptrs = dbrow[:, None] + ((k_start + j).to(tl.int64) * sdbn)[None, :]
        tl.store(dptrs, ds.to(dbrow.dtype.element_ty), mask=ld)
    if SOFTCAP:
        ds = ds * (1.0 - th * th)
    return _dot(ds.to(kt.dtype), tl.trans(kt), DOT_PRECISION, dq)


@triton.jit(do_not_specialize=BWD_LENGTH_ARGS)
def dq_kernel(
    Q, K, V, DO, LSE2, DELTA, DQ, TAB, mods, sq, sk, sv, sd, slb, slh, sdq,
    GROUP, qk_scale, sm_scale, cap, window, T: tl.constexpr, R: tl.constexpr, M: tl.constexpr,
):  # fmt: skip
    """One (query tile, head, sequence) program: dq of its rows over the key tiles they reach;
    with ``DBIAS`` also dS of every pair it visits into the dS buffer of ``mods``."""
    DQK: tl.constexpr = T.DQK
    DV: tl.constexpr = T.DV
    BDQK: tl.constexpr = T.BDQK
    BDV: tl.constexpr = T.BDV
    BM: tl.constexpr = T.BM
    BN: tl.constexpr = T.BN
    HAS_BIAS: tl.constexpr = M.HAS_BIAS
    HAS_ALIBI: tl.constexpr = M.HAS_ALIBI
    BIAS, sb, ALIBI, sa, DB, sdbs = mods  # before any early return (see fwd_kernel)
    sbb, sbh, sbm, sbn = sb
    sab, sah = sa
    sdbb, sdbh, sdbm, sdbn = sdbs
    sqb, sqh, sqn = sq
    sdb, sdh, sdn = sd
    sdqb, sdqh, sdqn = sdq
    s = tl.program_id(2)
    h = tl.program_id(1)
    hk = h // GROUP
    q_start, q_len, k_start, k_len, aq, bq, ak, bk = _seq(TAB, s)
    m0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BM  # heavy (late) causal tiles first
    if m0 >= q_len:
        return
    i = m0 + tl.arange(0, BM)
    ok = i < q_len
    dq_ = tl.arange(0, BDQK)
    dv_ = tl.arange(0, BDV)
    rows = (q_start + i).to(tl.int64)
    q = tl.load(Q + s.to(tl.int64) * sqb + h.to(tl.int64) * sqh + rows[:, None] * sqn + dq_[None, :],
                mask=ok[:, None] & (dq_ < DQK)[None, :], other=0.0)  # fmt: skip
    do = tl.load(DO + s.to(tl.int64) * sdb + h.to(tl.int64) * sdh + rows[:, None] * sdn + dv_[None, :],
                 mask=ok[:, None] & (dv_ < DV)[None, :], other=0.0)  # fmt: skip
    l_rows = s.to(tl.int64) * slb + h.to(tl.int64) * slh + rows
    lse2 = tl.load(LSE2 + l_rows, mask=ok, other=float("inf"))
    delta = tl.load(DELTA + l_rows, mask=ok, other=0.0)
    i_last = tl.minimum(q_len, m0 + BM) - 1
    n_lo, n_hi, n_full = _key_band(aq * m0 + bq, aq * i_last + bq, k_len, ak, bk, window, R)
    t_lo = n_lo // BN
    t_full = tl.maximum(t_lo, n_full // BN)
    dq = tl.zeros([BM, BDQK], dtype=tl.float32)
    brow = BIAS
    if HAS_BIAS:
        brow = BIAS + s.to(tl.int64) * sbb + h.to(tl.int64) * sbh + rows * sbm
    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(ALIBI + s * sab + h * sah + rows * 0, mask=ok, other=0.0) * 1.4426950408889634
    xm = (brow, sbn, slope2, ok)
    dbrow = DB + s.to(tl.int64) * sdbb + h.to(tl.int64) * sdbh + rows * sdbm
    for t in range(t_lo, t_full):
        dq = _dq_tile(
            q, do, dq, lse2, delta, K, V, s, hk, t * BN, i, q_len, k_len, k_start, aq, bq, ak, bk, window,
            sk, sv, qk_scale, cap, xm, dbrow, sdbn, T, R, M, False,
        )  # fmt: skip
    for t in range(t_full, tl.cdiv(n_hi, BN)):
        dq = _dq_tile(
            q, do, dq, lse2, delta, K, V, s, hk, t * BN, i, q_len, k_len, k_start, aq, bq, ak, bk, window,
            sk, sv, qk_scale, cap, xm, dbrow, sdbn, T, R, M, True,
        )  # fmt: skip
    dq = dq * sm_scale
    tl.store(DQ + s.to(tl.int64) * sdqb + h.to(tl.int64) * sdqh + rows[:, None] * sdqn + dq_[None, :],
             dq.to(DQ.dtype.element_ty), mask=ok[:, None] & (dq_ < DQK)[None, :])  # fmt: skip
