"""Host side of the ragged kernels (SPEC §10-§11): what is declined, the sequence table, tile
configs, split-KV choice and the launches. No length is read back to the host: grids are sized
from the padded length or ``max_seqlen_*`` and the kernels skip what lies past each sequence.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from attnhub import settings
from attnhub.request import Request
from attnhub.rules import Causal, Full, Local
from attnhub_backends.triton import args as kargs
from attnhub_backends.triton.device import DESCRIPTORS, kv_descriptors, tma_mode
from attnhub_backends.triton.device import dot_precision as _dot_precision
from attnhub_backends.triton.device import pad as _pad
from attnhub_backends.triton.loader import interpret_mode, load
from attnhub_backends.triton.loader import kernels as dense_kernels
from attnhub_backends.triton.modifiers import alibi_slopes, dbias_from, ds_dtype, strides4, uses_alibi
from attnhub_backends.triton.relaunch import Relauncher

LOG2E = 1.4426950408889634

#: GPU tile configs (BM, BN, warps, stages) where set, else the defaults below; ``decode`` is
#: (BN, warps, stages) of the packed (few-query) forward and ``fill`` the programs per SM that the
#: split-KV choice aims at. Module state so that benchmarks/ragged.py can sweep them.
#: Defaults from benchmarks/ragged.py's sweep on an H100 (bf16, D=128): decode (128, 4, 3) with fill 4
#: read 2.69 TB/s at Lk=32k; packed causal training: forward as ``_fwd_cfg`` says, backward
#: (64, 64, 4, 2) for both kernels.
#: One (BN, warps, stages) for every cache length: a decode kernel compiled once serves a cache as it
#: grows (tests/test_triton_compile.py). (128, 4, 2) with fill 2 ran 57.0 against 61.2 µs at
#: Lk 8k but 194 against 190 µs at 32k, and a per-length choice would compile a second variant
#: mid-generation when a cache crosses the boundary (tools/dev/probe_s4.py at 0dabcb3, part decodecfg).
#: With TMA descriptor loads (sm90, 16-bit, head dim 64 or 128, not paged) decode takes (64, 2, 3):
#: kernels in CUDA graphs at B 4 (4 splits) Lk 8k / 32k 52.7 / 181.2 µs and B 1 Lk 8k 15.8 µs,
#: against 54.7 / 183.6 / 16.9 with pointers and (128, 4, 3); SDPA 51.8 / 180.2 / 12.9
#: (tools/dev/probe_s5.py at 0dabcb3, part decode, two rounds each, 17:50 UTC).
TUNE: dict[str, Any] = {
    "fwd": None, "dkdv": None, "dq": None, "decode": (128, 4, 3), "decode_tma": (64, 2, 3), "fill": 4,
}  # fmt: skip


def _kernels() -> ModuleType:
    """ragged_kernels.py executed in the current mode (compiled or interpreted; see loader.py)."""
    return load("ragged_kernels.py")


def _rule(req: Request) -> tuple[dict[str, Any], int]:
    """(constexprs NDIM (1), RULE, CAUSAL, LOG2_STRIDE; the window) of the request's rule."""
    rule = req.rule
    kind = "full" if isinstance(rule, Full) else "causal" if isinstance(rule, Causal) else "local"
    causal = isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal)
    window = rule.windows(1)[0] if isinstance(rule, Local) else 1
    stride = rule.log2_stride if isinstance(rule, Local) else 0
    return {"NDIM": 1, "RULE": kind, "CAUSAL": causal, "LOG2_STRIDE": stride}, window


def _mods(req: Request, ops: Any, spare: torch.Tensor, dbias: torch.Tensor | None = None) -> tuple:
    """The kernels' ``mods`` argument (unpacked at the top of each ragged kernel): the bias and its
    rank-4 element strides, the ALiBi slopes and their (batch, head) strides (0 where broadcast:
    packed sequences have one batch entry), the dq kernel's dS buffer and its strides; ``spare``
    where absent."""
    bias = ops.bias if ops is not None and req.bias is not None else None
    if bias is not None and bias.dim() != 4:
        bias = bias.reshape(req.bias)
    slopes = alibi_slopes(ops)
    sb = strides4(bias) if bias is not None else (0, 0, 0, 0)
    sa = strides4(slopes) if slopes is not None else (0, 0)
    sd = strides4(dbias) if dbias is not None else (0, 0, 0, 0)
    return (
        spare if bias is None else bias, sb, spare if slopes is None else slopes, sa,
        spare if dbias is None else dbias, sd,
    )  # fmt: skip


def _mod_consts(req: Request) -> dict[str, bool]:
    return {"HAS_BIAS": req.bias is not None, "HAS_ALIBI": uses_alibi(req)}


@dataclass(frozen=True)
class Table:
    """The per-sequence table on the device and the host-known sizes that shape the grids."""

    tab: torch.Tensor  # (S, 8) int32
    seqs: int  # S
    max_q: int  # longest sequence of queries (grid sizing)
    max_k: int  # longest sequence of keys


#: Sequences per program of the table kernel.
TABLE_BS = 128


@dataclass(frozen=True)
class _TablePlan:
    """The table kernel's launch for one call signature."""

    grid: tuple[int, int, int]
    scalars: tuple  # seqs, Lq, Lk, q_offset, k_offset
    meta: dict[str, Any]  # how entries are computed: the constexprs of _entry (table and forward)
    seqs: int
    max_q: int
    max_k: int


def _table_plan(req: Request, q: torch.Tensor, k: torch.Tensor, ops: Any) -> _TablePlan:
    if req.varlen:
        seqs = ops.cu_seqlens_q.shape[0] - 1
        lq, lk = q.shape[2], k.shape[2]
        max_q = ops.max_seqlen_q or lq
        max_k = ops.max_seqlen_k or lk
    else:
        seqs, lq, lk = req.batch, q.shape[2], req.seq_k[0]
        max_q, max_k = lq, lk
    meta = dict(
        HAS_QL=req.q_lengths, HAS_KL=req.k_lengths, VARLEN=req.varlen, LEFT=req.padding_side == "left",
        SYNC=req.sync,
    )  # fmt: skip
    grid = (max(1, -(-seqs // TABLE_BS)), 1, 1)
    return _TablePlan(grid, (seqs, lq, lk, req.q_offset, req.k_offset), meta, seqs, max_q, max_k)


def _run_table(tp: _TablePlan, req: Request, ops: Any, device: torch.device) -> torch.Tensor:
    """Launch the table kernel of ``tp``: the (S, 8) table on ``device``, no host copy."""
    tab = torch.empty((max(tp.seqs, 1), 8), dtype=torch.int32, device=device)
    ql = ops.q_lengths if req.q_lengths else tab
    kl = ops.k_lengths if req.k_lengths else tab
    cuq = ops.cu_seqlens_q if req.varlen else tab
    cuk = ops.cu_seqlens_k if req.varlen else tab
    _kernels().table_kernel[tp.grid](ql, kl, cuq, cuk, tab, *tp.scalars, **tp.meta, BS=TABLE_BS)
    return tab


def seq_table(req: Request, q: torch.Tensor, k: torch.Tensor, ops: Any) -> Table:
    """Build the sequence table with one launch (no device-to-host copy)."""
    tp = _table_plan(req, q, k, ops)
    return Table(_run_table(tp, req, ops, q.device), tp.seqs, tp.max_q, tp.max_k)


@dataclass
class _FwdPlan:
    """Everything a forward launch needs beyond the tensors, fixed for one call signature (tile
    sizes, split-KV factor, strides, constexprs), with its kernel relaunched without Triton's
    per-call binding (see relaunch.py): decoding steps repeat one signature, and are short enough
    for the host's cost per call to show. A forward is one launch: the kernel computes its table
    entry in place and the last split of each group merges the partials."""

    table: _TablePlan
    out_shape: tuple[int, ...]
    out_dtype: torch.dtype
    zero_fill: bool  # padded query rows that no program writes: out and lse start at 0 and -inf
    need_lse: bool  # else the kernel writes no lse and the forward returns None for it
    tma: bool  # K/V read through host-made tensor descriptors (block rows: fwd_meta["T"].BN)
    splits: int
    grid: tuple[int, int, int]
    fwd_tail: tuple  # fwd_kernel's scalars (and stride tuples) after its pointers
    fwd_meta: dict[str, Any]  # its constexprs (named tuples: args.pack) and launch options
    buf_split: tuple[int, int]  # split-KV partials, (splits, this) each: (S, Hq, MQ, Dv) and
    # (S, Hq, MQ) contiguous at the start of each split's row (see _split_strides)
    counters: int  # split-KV: one done-counter per (sequence, kv head)
    fwd_launcher: Relauncher = field(default_factory=Relauncher)
    #: split-KV workspaces (partials and zeroed counters) by CUDA stream (see _workspace)
    spaces: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class _Plans(OrderedDict):
    """The plans by call signature; clearing them forgets the last plan of each request too."""

    def clear(self) -> None:
        _LAST.clear()
        super().clear()


_PLANS: OrderedDict[tuple, _FwdPlan] = _Plans()
#: The plan that each request object (by id, the object kept) last ran, with the rest of its key
#: and the _PLANS it came from: an attnhub plan passes one request object to every call, so a
#: repeated call compares the rest of its key instead of hashing the request with it (~0.8 us).
_LAST: dict[int, tuple[Request, tuple, _FwdPlan, OrderedDict]] = {}
#: Requests remembered in _LAST at most.
LAST_KEPT = 64
_splits_env = settings.key_reader("ATTNHUB_TRITON_SPLITS")
_tma_env = settings.key_reader("ATTNHUB_TRITON_TMA")


def _signature(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ops: Any,
    out_dtype: Any,
    need_lse: bool,
    strides: tuple[tuple[int, ...], ...],
) -> tuple:
    """Everything besides the request that Triton specialises on (shapes, strides, alignments,
    dtypes), the host-known sizes and the tuning and split settings (built on every call: kept
    lean); a plan's key is (request, this). ``strides``: q's, k's and v's (read by the caller)."""
    qs, ks, vs = strides
    extra: tuple = ()
    if ops is not None:
        # Most operands are absent (a decode step has only k_lengths): no call for a None.
        key = _operand_key
        ql, kl, cuq, cuk, bt, sk = (
            ops.q_lengths, ops.k_lengths, ops.cu_seqlens_q, ops.cu_seqlens_k, ops.block_table, ops.sinks
        )  # fmt: skip
        extra = (
            None if ql is None else key(ql), None if kl is None else key(kl),
            None if cuq is None else key(cuq), None if cuk is None else key(cuk),
            None if bt is None else key(bt), None if sk is None else key(sk),
            ops.max_seqlen_q, ops.max_seqlen_k,
        )  # fmt: skip
    return (
        q.shape, qs, k.shape, ks, v.shape, vs, q.data_ptr() % 16, k.data_ptr() % 16,
        v.data_ptr() % 16, out_dtype, need_lse, extra, _splits_env(), _tma_env(), tuple(TUNE.items()),
        interpret_mode(),
    )  # fmt: skip


def _operand_key(x: Any) -> Any:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype, x.data_ptr() % 16)
    return x


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """``x`` with a unit stride along the head dim (the kernels index it directly)."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _on_gpu(device: torch.device) -> bool:
    """A CUDA device (compiled kernels): tile configs and split-KV are chosen for it."""
    return device.type == "cuda"


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _fwd_cfg(x: torch.Tensor, d: int, tma: bool = False) -> tuple[int, int, int, int]:
    """(BM, BN, warps, stages) of the query-tiled forward. (64, 64, 4, 3) with TMA loads and for
    16-bit inputs at head dim 64. H100: padded causal batch at D 128 0.873 -> 0.758 ms, packed
    varlen 0.531 -> 0.482 ms against the pointer path's best (128, 64, 8, 3)
    (``tools/dev/probe_s3.py --part raggedcfg`` at 0dabcb3); at D 64 (B 4, H 32, L 4k) 0.671 -> 0.579 ms
    with pointers, 0.546 with TMA (``tools/dev/probe_s4.py --part d64`` at 0dabcb3)."""
    if interpret_mode() or not _on_gpu(x.device):
        return 16, 16, 1, 1
    if TUNE["fwd"] is not None:
        return TUNE["fwd"]
    if tma:
        return 64, 64, 4, 3
    if x.element_size() == 4:
        return 64, 32, 4, 2
    if d <= 64:  # 16-bit at head dim 64 with pointer loads (unaligned views)
        return 64, 64, 4, 3
    if d > 128:
        return 64, 64, 8, 2
    return 128, 64, 8, 3


def _decode_cfg(x: torch.Tensor, d_sum: int, tma: bool = False) -> tuple[int, int, int]:
    """(BN, warps, stages) of the packed forward: TUNE's (``decode_tma`` with descriptor loads),
    with smaller key tiles or fewer stages where the K and V tiles buffered ahead (stages - 1 of
    them) would pass 160 KiB of shared memory (Triton's pipeliner used 70 KiB at BN=64, 3 stages,
    bf16, D=128)."""
    bn, warps, stages = TUNE["decode_tma" if tma else "decode"]
    while bn > 32 and bn * d_sum * x.element_size() * (stages - 1) > 160 * 1024:
        bn //= 2
    while stages > 1 and bn * d_sum * x.element_size() * (stages - 1) > 160 * 1024:
        stages -= 1
    return bn, warps, stages


#: Most split-KV chunks a decode forward uses (unless ATTNHUB_TRITON_SPLITS forces more): the last
#: split of each group reads every split's partials, so more would lengthen that tail.
MAX_SPLITS = 128


#: Elements of one (splits, rows, head dim) block of the split merge (see _plan_forward). On the
#: H100 512 to 8192 gave the same decode times within noise (tools/dev/probe_s3.py at 0dabcb3, part merge).
MERGE_BLOCK = 8192


def _split_strides(seqs: int, hq: int, max_q: int, dv: int) -> tuple[int, int]:
    """Element strides between the splits' partial outputs and lse: their sizes rounded up to a
    multiple of 16, so that Triton's divisibility specialisation does not follow the lengths."""
    return -(-seqs * hq * max_q * dv // 16) * 16, -(-seqs * hq * max_q // 16) * 16


#: Split-KV decode programs resident on one SM at once (2 warps, ~64 KiB of shared memory each).
#: H200, GQA 32/8, D 128, bf16, (64, 2, 3) tiles, TMA (``tools/dev/decode_sweep.py --cases
#: 4x8192,8x8192,16x8192,8x32768,4x32768 --tma 3 --cfgs 64:2:3``, 2026-11-28): the fastest split
#: count gave about 256 programs at every batch (B 4: 8 splits, 49.3 / 139.2 us at Lk 8k / 32k
#: against 50.8 / 143.9 with the 4 of one program per SM; B 8: 4 splits, 80.2 / 256.5 against
#: 82.0 / 268.1; B 16: 2 splits, 139.2 against 140.6; SDPA cuDNN 49.6 / 138.9, 79.8 / 256.6, 135.4).
DECODE_PROGRAMS_PER_SM = 2

#: The per-program overhead of a split-KV decode program (its start, its partial result, the merge)
#: in key tiles of the decode config: what one more wave of programs costs (see _splits).
WAVE_COST_TILES = 4


def _splits(tiles: int, programs: int, device: torch.device) -> int:
    """Split-KV factor for packed (decode) programs. ``ATTNHUB_TRITON_SPLITS`` forces it (also under
    the interpreter).

    Fewer (kv head, sequence) groups than SMs: the factor whose programs run in the fewest waves of
    the least work each, counting WAVE_COST_TILES of overhead per wave: one wave of about
    DECODE_PROGRAMS_PER_SM programs per SM where it fits. H100 (one program per SM then), B 4,
    Hkv 8, D 128, bf16 (32 groups, CUDA graphs): 4 splits (one wave of 128) 54.6 / 97.9 / 183.3 µs
    at Lk 8k / 16k / 32k against 61.2 / 105.5 / 190.1 with 16 (four waves); SDPA 51.9 / 94.6 / 180.4
    (tools/dev/probe_s5.py at 0dabcb3, part decode). More groups than SMs (large or ragged batches, whose lengths the host does not know): enough programs for
    ``TUNE["fill"]`` per SM, so that short sequences' programs leave room for long ones'."""
    forced = settings.raw("ATTNHUB_TRITON_SPLITS")
    if forced:
        return max(1, min(int(forced), tiles))
    if not _on_gpu(device):
        return 1
    sms = _sm_count(device)
    most = max(1, min(tiles // 4, MAX_SPLITS))
    if 0 < programs <= sms:
        slots = DECODE_PROGRAMS_PER_SM * sms
        return min(
            range(1, most + 1), key=lambda s: -(-programs * s // slots) * (tiles / s + WAVE_COST_TILES)
        )
    want = -(-TUNE["fill"] * sms // max(programs, 1))
    return max(1, min(want, most))


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    req: Request,
    ops: Any,
    out_dtype: torch.dtype | None = None,
    need_lse: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, lse) of a ragged request; padded query rows give out 0 and lse -inf. Without
    ``need_lse`` lse is neither allocated nor written (None): a decode step wants only out."""
    strides = q.stride(), k.stride(), v.stride()  # read once: for _unit_last and the key
    if strides[0][-1] != 1 or strides[1][-1] != 1 or strides[2][-1] != 1:
        q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
        strides = q.stride(), k.stride(), v.stride()
    out_dtype = out_dtype or q.dtype
    rest = _signature(q, k, v, ops, out_dtype, need_lse, strides)
    last = _LAST.get(id(req))
    if last is not None and last[0] is req and last[3] is _PLANS and last[1] == rest:
        plan = last[2]
    else:
        key = (req, rest)
        plan = _PLANS.get(key)
        if plan is None:
            plan = _PLANS[key] = _plan_forward(q, k, v, req, ops, out_dtype, need_lse)
            if len(_PLANS) > 256:
                _PLANS.popitem(last=False)
        _LAST.pop(id(req), None)
        _LAST[id(req)] = (req, rest, plan, _PLANS)
        if len(_LAST) > LAST_KEPT:  # the oldest goes (another thread may race: harmless)
            with contextlib.suppress(RuntimeError, StopIteration, KeyError):
                _LAST.pop(next(iter(_LAST)))
    return _run_forward(plan, q, k, v, req, ops)


#: Decode over a K/V cache smaller than this reads K and V through pointers, not TMA: the step is
#: host-bound, and Triton's launcher spends ~10 us more per call on a kernel with descriptor
#: arguments. H200, bf16, GQA 32/8, D 128, ``benchmarks/kvcache_decode.py`` (2026-11-28): B 1 at
#: Lk 8k (33.5 MB) 49.0 us a call with pointers against 55-66 us with TMA; B 8 at 8k (268 MB)
#: equal (73.3 / 74.4 us); B 64 at 4k (1.07 GB) TMA faster (254.8 against 269.5 us).
SMALL_DECODE_CACHE_BYTES = 64 * 2**20


def small_decode_cache(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a decode step over this K/V cache is host-bound enough to load through pointers."""
    return k.numel() * k.element_size() + v.numel() * v.element_size() < SMALL_DECODE_CACHE_BYTES


def _plan_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    req: Request,
    ops: Any,
    out_dtype: torch.dtype,
    need_lse: bool = True,
) -> _FwdPlan:
    tp = _table_plan(req, q, k, ops)
    b, hq, nq, dqk = q.shape
    dv = v.shape[-1]
    hkv = k.shape[2] if req.paged else k.shape[1]
    group = hq // hkv
    consts, window = _rule(req)
    cap = float(req.softcap) if req.softcap is not None else 1.0
    seq_stride = 0 if req.varlen else 1  # packed sequences share batch entry 0
    if req.paged:  # raw (num_blocks, block_size, Hkv, D): block, row and head strides
        kb, kn, kh = k.stride(0), k.stride(1), k.stride(2)
        vb, vn, vh = v.stride(0), v.stride(1), v.stride(2)
        sbt = ops.block_table.stride(0)
    else:
        kb, kh, kn = k.stride(0) * seq_stride, k.stride(1), k.stride(2)
        vb, vh, vn = v.stride(0) * seq_stride, v.stride(1), v.stride(2)
        sbt = 0
    pack = tp.max_q * group <= 64
    # K/V through TMA on sm90 for 16-bit at head dims 64 and 128 (device.tma_mode), packed
    # (decode) programs included, except over a small cache (see SMALL_DECODE_CACHE_BYTES); not for
    # paged caches (their rows are scattered over blocks).
    small = pack and small_decode_cache(k, v)
    tma = not req.paged and tma_mode(q, k, v, packed=small, dims=(64, 128)) == DESCRIPTORS
    interp = interpret_mode() or not _on_gpu(q.device)
    if pack:
        bm = max(16, _pow2(tp.max_q * group))
        bn, warps, stages = (16, 1, 1) if interp else _decode_cfg(q, _pad(dqk) + _pad(dv), tma)
        tiles = -(-tp.max_k // bn)
        splits = _splits(tiles, tp.seqs * hkv, q.device)
        chunk = -(-tiles // splits) if tiles else 0
        splits = -(-tiles // chunk) if tiles else 1
        grid = (splits, hkv, tp.seqs)
    else:
        bm, bn, warps, stages = _fwd_cfg(q, max(_pad(dqk), _pad(dv)), tma)
        splits, chunk = 1, 0
        grid = (-(-tp.max_q // bm), hq, tp.seqs)
    # Query-tiled programs over per-entry lengths write the padded rows themselves (FILL_PADDED).
    fill_padded = bool(req.q_lengths) and not pack and not req.varlen
    # The split merge reads (BSP splits, BR rows, Dv) blocks of MERGE_BLOCK elements: a few memory
    # round trips. BSP does not follow the split count, so that a new cache length compiles nothing.
    br = _pow2(tp.max_q * group) if pack else 16
    bsp = max(1, min(MAX_SPLITS, MERGE_BLOCK // (br * _pad(dv))))
    meta = dict(
        BR=br, BSP=bsp, DQK=dqk, DV=dv, BDQK=_pad(dqk), BDV=_pad(dv), BM=bm, BN=bn, **consts, PACK=pack,
        SPLIT=splits > 1, PAGED=bool(req.paged), BLOCK=req.paged or 1, SOFTCAP=req.softcap is not None,
        SINK=req.sinks, DOT_PRECISION=_dot_precision(q), WRITE_LSE=need_lse, TMA=tma,
        FILL_PADDED=fill_padded, POS_SCALE=req.scale > 0, **_mod_consts(req), num_warps=warps,
        num_stages=stages,
    )  # fmt: skip
    qs = (q.stride(0) * seq_stride, q.stride(1), q.stride(2))
    # Outputs are allocated contiguous: (B, Hq, Nq, Dv) and (B, Hq, Nq); partials likewise.
    out_strides = (hq * nq * dv * seq_stride, nq * dv, dv)
    lse_strides = (hq * nq * seq_stride, nq)
    if splits > 1:
        o_split, l_split = _split_strides(tp.seqs, hq, tp.max_q, dv)
    else:
        o_split, l_split = 0, 0
    tail = (
        qs, (kb, kh, kn), (vb, vh, vn), out_strides, *lse_strides, sbt, (o_split, l_split), group, tp.max_q,
        chunk, *tp.scalars[1:], req.scale * LOG2E, cap, window,
    )  # fmt: skip
    return _FwdPlan(
        tp, (b, hq, nq, dv), out_dtype, req.q_lengths and not fill_padded, need_lse, tma, splits, grid, tail,
        kargs.pack({**meta, **tp.meta}, kargs.RAGGED_FWD),
        (o_split, l_split), tp.seqs * hkv if splits > 1 else 0,
    )  # fmt: skip


def _workspace(plan: _FwdPlan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(partial outs, partial lse, counters) of a split-KV forward.

    The kernel leaves its counters at zero, so on a GPU one workspace per stream serves every call
    of the plan (calls on one stream run in order); a CUDA graph capture gets its own (the graph
    keeps it), and the interpreter a fresh one per call."""
    stream = -1
    # device.type, not _on_gpu: tests that pretend a GPU for CPU tensors patch _on_gpu
    if device.type == "cuda" and not torch._C._cuda_isCurrentStreamCapturing():
        stream = torch._C._cuda_getCurrentRawStream(device.index)
        found = plan.spaces.get(stream)
        if found is not None:
            return found
    o_split, l_split = plan.buf_split
    made = (
        torch.empty((plan.splits, o_split), dtype=torch.float32, device=device),
        torch.empty((plan.splits, l_split), dtype=torch.float32, device=device),
        torch.zeros((plan.counters,), dtype=torch.int32, device=device),
    )
    if stream != -1:
        if len(plan.spaces) >= 8:  # streams come and go: keep a few
            plan.spaces.pop(next(iter(plan.spaces)))
        plan.spaces[stream] = made
    return made


def _run_forward(
    plan: _FwdPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, req: Request, ops: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    dev = q.device
    shape = plan.out_shape
    lse = None
    if plan.zero_fill:
        out = torch.zeros(shape, dtype=plan.out_dtype, device=dev)
        if plan.need_lse:
            lse = torch.full(shape[:3], float("-inf"), dtype=torch.float32, device=dev)
    else:  # sizes as separate arguments: torch parses them faster than a tuple (~0.5 us)
        out = torch.empty(*shape, dtype=plan.out_dtype, device=dev)
        if plan.need_lse:
            lse = torch.empty(*shape[:3], dtype=torch.float32, device=dev)
    if plan.table.seqs == 0 or 0 in shape[1:3]:
        return out, lse
    # Pointers a constexpr leaves unread get ``out`` (Triton needs some tensor there).
    spare = out
    ql = ops.q_lengths if req.q_lengths else spare
    kl = ops.k_lengths if req.k_lengths else spare
    cuq = ops.cu_seqlens_q if req.varlen else spare
    cuk = ops.cu_seqlens_k if req.varlen else spare
    bt = ops.block_table if req.paged else spare
    sk = ops.sinks if req.sinks else spare
    o_buf, l_buf, cnt = _workspace(plan, dev) if plan.splits > 1 else (spare, spare, spare)
    if plan.tma:
        k, v = kv_descriptors(k, v, plan.fwd_meta["T"].BN)
    args = (q, k, v, out, spare if lse is None else lse, o_buf, l_buf, cnt, ql, kl, cuq, cuk, bt, sk,
            _mods(req, ops, spare), *plan.fwd_tail)  # fmt: skip
    if req.bias is not None or req.more:  # tensors whose layouts vary per call: Triton binds each launch
        _kernels().fwd_kernel[plan.grid](*args, **plan.fwd_meta)
    else:
        plan.fwd_launcher(_kernels().fwd_kernel, plan.grid, args, plan.fwd_meta)
    return out, lse


def forward_for_grad(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, req: Request, ops: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, saved): half-precision inputs keep a float32 output for the backward's
    rowsum(dO·O) (see Backend.forward_for_grad)."""
    if q.element_size() >= 4:
        out, lse = forward(q, k, v, req, ops)
        return out, lse, out
    out32, lse = forward(q, k, v, req, ops, out_dtype=torch.float32)
    return out32.to(q.dtype), lse, out32


def _rows3(x: torch.Tensor, batch: int) -> tuple[int, int, int]:
    """(batch, head, row) element strides of a (B, H, L, D) tensor, the batch's times ``batch`` (0:
    packed sequences, which all sit in batch entry 0)."""
    return (x.stride(0) * batch, x.stride(1), x.stride(2))


def _bwd_cfgs(x: torch.Tensor, d: int) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """(BM, BN, warps, stages) of the dk/dv and dq kernels."""
    if interpret_mode() or not _on_gpu(x.device):
        return (16, 16, 1, 1), (16, 16, 1, 1)
    if TUNE["dkdv"] is not None and TUNE["dq"] is not None:
        return TUNE["dkdv"], TUNE["dq"]
    if x.element_size() == 4:
        return (32, 64, 4, 1), (64, 32, 4, 1)
    if d > 128:
        return (32, 64, 4, 1), (64, 32, 4, 1)
    return (64, 64, 4, 2), (64, 64, 4, 2)


def backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    req: Request,
    ops: Any,
) -> tuple:
    """(dq, dk, dv), plus (dbias, dsinks) for a request with a bias or sinks (each None where not
    differentiated). Padded rows and keys get zero gradients (they are never visited; their
    gradient buffers start at zero), and so do the padded pairs of dbias."""
    kern = _kernels()
    q, k, v, dout = _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(dout)
    t = seq_table(req, q, k, ops)
    b, hq, nq, dqk = q.shape
    hkv, nk, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    lse = lse.contiguous()
    delta = torch.empty((b, hq, nq), dtype=torch.float32, device=q.device)
    lse2 = torch.empty_like(delta)
    alloc = torch.zeros if (req.q_lengths or req.k_lengths) else torch.empty
    dbias_full = None
    if req.bias is not None and req.bias_grad:
        # dS per pair (float32, or the bias's 16-bit dtype): pairs no program visits (padding,
        # the rule's skipped tiles, other packed sequences) stay 0.
        dbias_full = torch.zeros((b, hq, nq, nk), dtype=ds_dtype(ops.bias), device=q.device)
    dq = alloc((b, hq, nq, dqk), dtype=q.dtype, device=q.device)
    dk = alloc((b, hkv, nk, dqk), dtype=q.dtype, device=q.device)
    dvv = alloc((b, hkv, nk, dv), dtype=q.dtype, device=q.device)
    if nq and hq and t.seqs:
        bm_prep = 32 if interpret_mode() else 64
        dense_kernels().bwd_prep_kernel[(-(-nq // bm_prep), hq, b)](
            out, dout, lse, delta, lse2, *out.stride(), *dout.stride(), hq, nq,
            DV=dv, BDV=_pad(dv), BM=bm_prep,
        )  # fmt: skip
        consts, window = _rule(req)
        ss = 0 if req.varlen else 1
        cap = float(req.softcap) if req.softcap is not None else 1.0
        common = dict(
            DQK=dqk, DV=dv, BDQK=_pad(dqk), BDV=_pad(dv), **consts, SOFTCAP=req.softcap is not None,
            DOT_PRECISION=_dot_precision(q), **_mod_consts(req),
        )  # fmt: skip
        # (batch, head, row) strides of each tensor (batch 0 for packed sequences), then lse's and
        # delta's (batch, head) strides, which follow the total token count: separate, unspecialised.
        strides = (
            *(_rows3(x, ss) for x in (q, k, v, dout)), delta.stride(0) * ss, delta.stride(1),
        )  # fmt: skip
        (bm1, bn1, w1, s1), (bm2, bn2, w2, s2) = _bwd_cfgs(q, max(_pad(dqk), _pad(dv)))
        mods = _mods(req, ops, delta, dbias_full)
        kern.dkdv_kernel[(-(-t.max_k // bn1), hkv, t.seqs)](
            q, k, v, dout, lse2, delta, dk, dvv, t.tab, mods, *strides, _rows3(dk, ss), _rows3(dvv, ss),
            group, req.scale * LOG2E, req.scale, cap, window,
            **kargs.pack(dict(common, BM=bm1, BN=bn1, num_warps=w1, num_stages=s1), kargs.RAGGED_BWD),
        )  # fmt: skip
        dq_consts = dict(common, BM=bm2, BN=bn2, num_warps=w2, num_stages=s2, DBIAS=dbias_full is not None)
        kern.dq_kernel[(-(-t.max_q // bm2), hq, t.seqs)](
            q, k, v, dout, lse2, delta, dq, t.tab, mods, *strides, _rows3(dq, ss),
            group, req.scale * LOG2E, req.scale, cap, window, **kargs.pack(dq_consts, kargs.RAGGED_BWD),
        )  # fmt: skip
    if not req.sinks and req.bias is None:
        return dq, dk, dvv
    dbias = None
    if dbias_full is not None:
        dbias = dbias_from(dbias_full, req.bias, ops.bias.dtype)
    dsinks = None
    if req.sinks_grad:
        # d lse / d sink = p_sink = exp(sink - lse); dL/dsink = -sum over rows of p_sink * delta.
        s32 = ops.sinks.float()[None, :, None]
        p_sink = torch.where(torch.isfinite(lse), torch.exp(s32 - lse), 0.0)
        dsinks = (-(p_sink * delta).sum(dim=(0, 2))).to(ops.sinks.dtype)
    return dq, dk, dvv, dbias, dsinks
