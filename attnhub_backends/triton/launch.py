"""Host side: mask parameters from the request, tile plans, configs, and the kernel launches."""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from attnhub import settings
from attnhub.errors import AttnhubError
from attnhub.positions import axis_affine
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local
from attnhub_backends.triton import args as kargs
from attnhub_backends.triton import configs, mask_summary, plan
from attnhub_backends.triton.loader import interpret_mode, kernels
from attnhub_backends.triton.modifiers import Mods, plan_rule, runtime_args, uses_alibi
from attnhub_backends.triton.relaunch import Relauncher

LOG2E = 1.4426950408889634


def rule_args(req: Request) -> tuple[dict[str, int], dict[str, Any]]:
    """The rule's kernel arguments: runtime scalars and constexprs, by kernel parameter name.

    Scalars (see kernels.py): each grid's row length (2-d), the affine position maps ``scale *
    index + shift`` per axis (``positions.axis_affine``), the causal order's row length and the
    window per axis. Constexprs: ``NDIM``, ``RULE`` ("full", "causal" or "local"), ``CAUSAL`` and
    ``LOG2_STRIDE``. SPEC §11's offsets (1-d, none_front) add to the shifts; a boolean mask rides
    on the rule Full (``modifiers.plan_rule``).
    """
    rule = plan_rule(req)
    if req.ndim == 2:
        (yq, xq), (yk, xk) = req.seq_q, req.seq_k
        ay = axis_affine(yq, yk, req.sync)
    else:
        (xq,), (xk,) = req.seq_q, req.seq_k
        ay = (1, 0, 1, 0)
    ax = axis_affine(xq, xk, req.sync)
    if req.q_offset or req.k_offset:
        ax = (ax[0], ax[1] + req.q_offset, ax[2], ax[3] + req.k_offset)
    wy = wx = 1
    log2_stride = 0
    if isinstance(rule, Local):
        windows = rule.windows(req.ndim)
        wy, wx = (windows[0], windows[1]) if req.ndim == 2 else (1, windows[0])
        log2_stride = rule.log2_stride
    scalars = dict(
        q_cols=xq, k_cols=xk,
        qy_scale=ay[0], qy_shift=ay[1], ky_scale=ay[2], ky_shift=ay[3],
        qx_scale=ax[0], qx_shift=ax[1], kx_scale=ax[2], kx_shift=ax[3],
        row_len=max(xq, xk), window_y=wy, window_x=wx,
    )  # fmt: skip
    kind = "full" if isinstance(rule, Full) else "causal" if isinstance(rule, Causal) else "local"
    causal = isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal)
    consts = {"NDIM": req.ndim, "RULE": kind, "CAUSAL": causal, "LOG2_STRIDE": log2_stride}
    return scalars, consts


def _dot_precision(x: torch.Tensor) -> str:
    """kernels._dot's mode: exact float32 for float32 inputs, tensor cores in the input dtype for
    16-bit ones, except bfloat16 under the interpreter (upcast: its bfloat16 product is wrong)."""
    if x.dtype == torch.float32:
        return "ieee"
    if x.dtype == torch.bfloat16 and interpret_mode():
        return "ieee_upcast"
    return "native"


def _pad(d: int) -> int:
    return max(16, 1 << math.ceil(math.log2(d)))


def _on_gpu(device: torch.device) -> bool:
    """A CUDA device (compiled kernels): configs, split-KV and TMA are chosen for it."""
    return device.type == "cuda"


def _capability(device: torch.device) -> tuple[int, int]:
    if _on_gpu(device):
        return torch.cuda.get_device_capability(device)
    return (0, 0)


def _cfgs(kernel: str, req: Request, x: torch.Tensor) -> list[configs.Cfg]:
    forced = configs.forced(kernel)
    if forced is not None:
        return [forced]
    if interpret_mode() or not _on_gpu(x.device):
        return [configs.INTERPRET[kernel]]
    d = max(_pad(req.dim_qk), _pad(req.dim_v))
    if kernel == "fwd" and req.nq <= 16:
        return configs.small_q_candidates(d, x.element_size())
    if kernel == "fwd" and isinstance(req.rule, ExplicitMask):
        found = configs.mask_candidates(d, x.element_size(), _capability(x.device))
        if found is not None:
            return found
    if kernel == "fwd" and isinstance(req.rule, Local) and x.element_size() == 2 and d <= 128:
        return configs.local_candidates(d, _capability(x.device))
    if kernel == "fwd" and req.softcap is not None:
        found = configs.softcap_candidates(d, x.element_size(), _capability(x.device))
        if found is not None:
            return found
    return configs.candidates(kernel, d, x.element_size(), _capability(x.device))


# The forward's K/V load paths (ATTNHUB_TRITON_TMA's values); see kernels._load_kv.
POINTERS = 0
DESCRIPTORS = 3  # host-made 4-d (B, H, L, D) tensor descriptors: TMA loads


def _tma_mode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packed: bool = False,
    dims: tuple[int, ...] = (128,),
    bias: bool = False,
) -> int:
    """The forward's K/V load path: ``DESCRIPTORS`` where TMA's rules hold, else ``POINTERS``.

    Descriptors need 16-byte aligned bases and outer strides, a contiguous head dim and a head dim
    that is its own power-of-two tile (no padding). By default they are used on sm90+ for 16-bit
    dtypes at the head dims ``dims`` where they were measured faster (the dense forward: 128; the
    ragged forward, its decode programs included: 64 and 128), except for the dense forward's
    decode-shaped calls (``packed``: GQA rows packed into one tile, split-KV), where pointer loads
    were faster (docs/backends/triton.md), and forwards that read a ``bias`` tile per key tile: on
    the pointer path a key count that is a multiple of the key tile (EVEN_K, off under TMA) lets
    every bias load go unmasked and pipelined (H100, B 4, H 16, L 4k, D 128, (1, H, L, L) bias:
    1.46 against 2.16 ms, tools/dev/probe_s5.py at 0dabcb3, part biascfg). The interpreter always uses
    pointers. ``ATTNHUB_TRITON_TMA=0`` or ``=3`` forces a path where it is allowed (packed and bias
    calls too).
    """
    env = settings.raw("ATTNHUB_TRITON_TMA")
    if not env:  # unset (or set empty): the default
        if packed or bias or interpret_mode() or not _on_gpu(q.device) or _capability(q.device)[0] < 9:
            return 0
        if q.dtype not in (torch.float16, torch.bfloat16):
            return 0
        if q.shape[-1] not in dims or v.shape[-1] != q.shape[-1]:
            return 0  # where no gain was measured (the dense forward at 64: docs/benchmarks.md)
        mode = DESCRIPTORS
    else:
        try:
            mode = int(env)
        except ValueError:
            mode = -1
        if mode not in (POINTERS, DESCRIPTORS):
            raise AttnhubError(
                f"ATTNHUB_TRITON_TMA takes 0 (pointers) or 3 (descriptors), the K/V load path, got {env!r}"
            )
    if mode == POINTERS or interpret_mode():
        return POINTERS
    size = k.element_size()
    for x in (k, v):
        d = x.shape[-1]
        if x.stride(-1) != 1 or d != _pad(d) or d * size < 16 or x.data_ptr() % 16:
            return 0
        if any((s * size) % 16 for s in x.stride()[:-1]):
            return 0
    return mode


def kv_descriptors(k: torch.Tensor, v: torch.Tensor, bn: int) -> tuple[Any, Any]:
    """Host-made 4-d tensor descriptors of K and V (their own shapes and strides) whose blocks are
    ``bn`` keys of one (batch entry, head): what the forwards' TMA loads read. Callers have checked
    TMA's alignment rules for these tensors (``_tma_mode``, part of their plan's signature)."""
    return _descriptor(k, bn), _descriptor(v, bn)


#: Checked descriptors without a tensor, by (shape, strides, dtype, block rows): a call copies one
#: and sets its base (0.4 µs) instead of building and checking a new one (2.7 µs on this
#: repository's CPU; a decode step builds two per launch).
_DESCRIPTORS: dict[tuple, Any] = {}


def _descriptor(x: torch.Tensor, bn: int) -> Any:
    key = (x.shape, x.stride(), x.dtype, bn)
    template = _DESCRIPTORS.get(key)
    if template is None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        made = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, bn, x.shape[-1]])
        if not hasattr(made, "__dict__"):  # a Triton whose descriptors have slots: no templates
            return made
        made.base = None  # the cache must not keep a caller's tensor alive
        if len(_DESCRIPTORS) >= 64:
            _DESCRIPTORS.clear()
        template = _DESCRIPTORS[key] = made
    desc = object.__new__(type(template))
    desc.__dict__.update(template.__dict__)
    desc.base = x
    return desc


#: Fewest key tiles per program worth splitting: below it a program's loop lasts a few µs, less
#: than the combine launch and the two partial buffers cost the host (small decode steps).
MIN_SPLIT_VISITS = 16


def _splits(programs: int, visits: int, device: torch.device) -> int:
    """Split-KV factor: >1 when too few (query tile, head) programs would fill the GPU and each
    has a long enough key loop."""
    forced = settings.raw("ATTNHUB_TRITON_SPLITS")
    if forced:
        return max(1, min(int(forced), max(1, visits)))
    if not _on_gpu(device) or programs >= 2 * _sm_count(device) or visits < MIN_SPLIT_VISITS:
        return 1
    return max(1, min(triton_cdiv(4 * _sm_count(device), programs), visits // 4, 32))


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _key(kernel: str, req: Request, x: torch.Tensor) -> tuple:
    """The shape class a config is chosen (and tuned) for. No lengths: a call that differs only in
    its lengths gets the same config, hence the same compiled kernel. Forwards of at most 16 query
    rows (decoding) have their own candidates (``_cfgs``), so their own class."""
    rule = req.rule
    return (
        kernel, str(x.device), _capability(x.device), req.dtype, _pad(req.dim_qk), _pad(req.dim_v),
        type(rule).__name__, getattr(rule, "causal", False), req.ndim, kernel == "fwd" and req.nq <= 16,
        interpret_mode(), _window_key(rule, req.ndim),
        settings.raw("ATTNHUB_TRITON_TMA"), settings.raw(configs.CFG_SETTING[kernel]),
        req.softcap is not None, req.bias is not None, req.sinks, req.bias_grad,
    )  # fmt: skip


def _window_key(rule: Any, ndim: int) -> tuple:
    """Local windows tune apart by power-of-two bucket of each window, and by stride."""
    if not isinstance(rule, Local):
        return ()
    return (tuple(configs.bucket(w) for w in rule.windows(ndim)), rule.log2_stride)


def _persist(x: torch.Tensor) -> bool:
    """Compiled GPU calls use (and tuning records) picks on disk; the interpreter does not."""
    return _on_gpu(x.device) and not interpret_mode()


def _work(req: Request) -> int:
    return req.batch * req.heads_q * req.nq * req.nk * (req.dim_qk + req.dim_v)


@dataclass(frozen=True)
class _FwdLaunch:
    """What a forward launch needs beyond the tensors, fixed for one call signature: computed once
    (plan, split-KV factor, tuned config, rule scalars, the kernels' constexprs and options) so that
    repeated calls, such as decoding steps, pay only for the output allocations and the launches."""

    cfg: configs.Cfg
    rows: torch.Tensor
    grid: tuple[int, int, int]
    splits: int
    tma: int
    qk_scale: float
    kwargs: dict[str, Any]  # fwd_kernel's arguments after plan_h (rule scalars, split count and
    # strides), its constexprs one keyword each, and launch options
    packed: dict[str, Any]  # the same as fwd_kernel takes them (constexprs in named tuples: args.pack)
    combine_kwargs: dict[str, Any]  # combine_kernel's (used when splits > 1)
    fwd_launcher: Relauncher = field(default_factory=Relauncher)
    combine_launcher: Relauncher = field(default_factory=Relauncher)


_FWD_LAUNCHES: OrderedDict[tuple, _FwdLaunch] = OrderedDict()
_FWD_LAUNCHES_SIZE = 256


def _offsets(req: Request) -> tuple[int, int]:
    return (req.q_offset, req.k_offset)


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    req: Request,
    out_dtype: torch.dtype | None = None,
    mods: Mods | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) for canonical torch tensors (any strides); ``out`` in ``out_dtype`` (default q's);
    ``mods``: the §9 modifiers and a boolean mask (``modifiers.from_call``)."""
    mods = mods or Mods()
    b, hq, nq, dqk = q.shape
    dv = v.shape[3]
    out = torch.empty((b, hq, nq, dv), dtype=out_dtype or q.dtype, device=q.device)
    lse = torch.empty((b, hq, nq), dtype=torch.float32, device=q.device)
    # The call signature: the request, the layouts, the base alignments (TMA needs 16 bytes) and
    # the environment variables that steer the choices.
    sig = (
        req, q.stride(), k.stride(), v.stride(), q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16,
        settings.raw("ATTNHUB_TRITON_TMA"), settings.raw("ATTNHUB_TRITON_FWD_CFG"),
        settings.raw("ATTNHUB_TRITON_SPLITS"), settings.raw("ATTNHUB_TRITON_TUNE"),
    )  # fmt: skip
    fl = _FWD_LAUNCHES.get(sig)
    if fl is None:
        fl = _prepare_forward(q, k, v, out, lse, req, mods)
        _FWD_LAUNCHES[sig] = fl
        if len(_FWD_LAUNCHES) > _FWD_LAUNCHES_SIZE:
            _FWD_LAUNCHES.popitem(last=False)
    _launch_forward(fl, q, k, v, out, lse, mods, req)
    return out, lse


@dataclass(frozen=True)
class _FwdShape:
    """The forward's tiling for one config: GQA packing and the query tile, the plan's rows, the
    grid, the split-KV factor, the K/V load path and the walk."""

    pack: bool  # GQA rows packed into one tile (few queries)
    bm: int  # query tile (rows)
    rows: torch.Tensor  # the plan rows the kernel walks: band lists where ``band``, else index lists
    splits: int  # split-KV factor
    tma: int  # K/V load path: POINTERS or DESCRIPTORS
    band: bool  # one loop over a band of key tiles
    grid: tuple[int, int, int]
    swap: bool  # grid (tiles, batch, heads): SWAP_HB


def _fwd_shape(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, req: Request, cfg: configs.Cfg
) -> _FwdShape:
    """The tile, split-KV and load-path choice of a forward with config ``cfg``."""
    b, hq, nq, _ = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    has_mask = isinstance(req.rule, ExplicitMask)
    # GQA packing: with few queries, one tile holds every (query head of a group, query) row
    # (not with a boolean mask: its plan rows are per head).
    pack = group > 1 and nq * group <= 64 and not has_mask
    bm = max(16, 1 << math.ceil(math.log2(nq * group))) if pack else cfg.bm
    pl = plan.plan(
        plan_rule(req), req.seq_q, req.seq_k, req.sync, nq if pack else bm, cfg.bn, q.device,
        offsets=_offsets(req),
    )  # fmt: skip
    tiles = 1 if pack else triton_cdiv(nq, bm)
    heads = hkv if pack else hq
    splits = _splits(tiles * heads * b, pl.max_visits, q.device)
    tma = _tma_mode(q, k, v, packed=pack, bias=req.bias is not None)
    # The band walk needs contiguous visits (pl.band) and a positive scale (its -inf masking).
    band = cfg.band and not pack and pl.band is not None and req.scale > 0 and not has_mask
    swap = not pack and _swap_heads_batch(req)
    grid = (tiles * splits, b, heads) if swap else (tiles * splits, heads, b)
    return _FwdShape(pack, bm, pl.band if band else pl.rows, splits, tma, band, grid, swap)


def _make_launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, req: Request, cfg: configs.Cfg
) -> _FwdLaunch:
    """The launch of ``cfg`` for this call signature: its shape (``_fwd_shape``) and the kernels'
    keywords, flat and packed (``args.pack``)."""
    b, hq, nq, dqk = q.shape
    dv = v.shape[3]
    sh = _fwd_shape(q, k, v, req, cfg)
    scalars, consts = rule_args(req)
    has_mask = isinstance(req.rule, ExplicitMask)
    # Element strides between the splits' partial buffers (made in _launch_forward), rounded up to
    # a multiple of 16 so that Triton's divisibility specialisation does not follow the lengths.
    o_split, l_split = (_round16(b * hq * nq * dv), _round16(b * hq * nq)) if sh.splits > 1 else (0, 0)
    kwargs = dict(
        **scalars, SPLITS=sh.splits, split_strides=(o_split, l_split),
        DQK=dqk, DV=dv, BDQK=_pad(dqk), BDV=_pad(dv), BM=sh.bm, BN=cfg.bn, **consts,
        DOT_PRECISION=_dot_precision(q), NEG=req.scale < 0, PACK=sh.pack, TMA=sh.tma == DESCRIPTORS,
        BAND=sh.band, EVEN_K=_even_k(sh.band, sh.tma, k.shape[2], cfg.bn), SPLIT=sh.splits > 1,
        NQ1=sh.pack and nq == 1, num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip
    if req.modified or has_mask:
        kwargs.update(
            SOFTCAP=req.softcap is not None, HAS_BIAS=req.bias is not None, HAS_MASK=has_mask,
            HAS_SINKS=req.sinks, CAP_MAX=_cap_max(req, q), HAS_ALIBI=uses_alibi(req),
        )  # fmt: skip
    if cfg.maxnreg:
        kwargs["maxnreg"] = cfg.maxnreg
    if sh.swap:
        kwargs["SWAP_HB"] = True
    combine_kwargs = dict(DV=dv, BDV=_pad(dv), BM=16, BS=_combine_bs(sh.splits))
    return _FwdLaunch(
        cfg, sh.rows, sh.grid, sh.splits, sh.tma, req.scale * LOG2E, kwargs, kargs.pack(kwargs, kargs.DENSE_FWD),
        combine_kwargs,
    )  # fmt: skip


#: Largest softcap·log2(e) for which the forward takes the bound as every row's max (``_cap_max``).
CAP_MAX_LOG2 = 60.0


def _cap_max(req: Request, q: torch.Tensor) -> bool:
    """Whether the forward uses softcap's bound as the running max of every row (no max taken, no
    rescaling; ``kernels._softcap_probs``). Exact: any reference at or above a row's max gives the
    same softmax. Its exponentials reach down to 2^(-2·softcap·log2 e), which must stay normal in
    P's dtype: bfloat16 (float32's exponent range) and float32 only, softcap·log2 e ≤ 60 (softcap
    up to about 41; Grok's 30 yes, Gemma 2's 50 no); no bias (it moves the bound), positive scale."""
    return (
        req.softcap is not None and req.bias is None and not uses_alibi(req) and req.scale > 0
        and q.dtype in (torch.bfloat16, torch.float32) and req.softcap * LOG2E <= CAP_MAX_LOG2
    )  # fmt: skip


def _swap_heads_batch(req: Request) -> bool:
    """Grid axes (tiles, batch, heads) for a bias shared across batch entries (T5's position bias,
    ALiBi-style slopes made into a (1, H, L, L) tensor): the programs of one head for every batch
    entry then run at once and read the head's bias rows from L2, not once per batch entry from
    DRAM (kernels._head_batch)."""
    return req.bias is not None and req.bias[0] == 1 and req.batch > 1


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def _even_k(band: bool, tma: int, nk: int, bn: int) -> bool:
    """The band walk's "no bounds masks on K/V loads" switch. TMA loads ignore it (descriptors
    zero-fill past the end), so there it is always False: one compiled kernel for every key count.
    Pointer loads keep it (a kernel for key counts that are a multiple of the key tile, one for the
    others): the masks cost time on every visited tile."""
    return band and tma != DESCRIPTORS and nk % bn == 0


#: Split-KV factors up to this many are merged by one compiled combine kernel.
COMBINE_SPLITS = 32


def _combine_bs(splits: int) -> int:
    """combine_kernel's split tile: fixed (not the split count's power of two, which follows the key
    count) so that a new length compiles no new combine kernel; larger only for forced factors."""
    return max(COMBINE_SPLITS, 1 << math.ceil(math.log2(splits)))


def _prepare_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    req: Request,
    mods: Mods,
) -> _FwdLaunch:
    """Choose (tuning where it pays) and return the launch of a new call signature."""
    launches: dict[configs.Cfg, _FwdLaunch] = {}

    def run(cfg: configs.Cfg) -> None:
        if cfg not in launches:
            launches[cfg] = _make_launch(q, k, v, req, cfg)
        _launch_forward(launches[cfg], q, k, v, out, lse, mods, req)

    cfg = configs.choose(_key("fwd", req, q), _cfgs("fwd", req, q), run, _work(req), _persist(q))
    return launches.get(cfg) or _make_launch(q, k, v, req, cfg)


def _launch_forward(
    fl: _FwdLaunch,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mods: Mods,
    req: Request,
) -> None:
    kern = kernels()
    b, hq, nq, dqk = q.shape
    hkv, nk, dv = k.shape[1], k.shape[2], v.shape[3]
    splits = fl.splits
    if splits == 1:
        o_buf, l_buf = out, lse
    else:  # fl.kwargs' split strides are these buffers' stride(0)
        o_split, l_split = fl.kwargs["split_strides"]
        o_buf = torch.empty((splits, o_split), dtype=torch.float32, device=q.device)
        o_buf = o_buf[:, : b * hq * nq * dv].view(splits, b, hq, nq, dv)
        l_buf = torch.empty((splits, l_split), dtype=torch.float32, device=q.device)
        l_buf = l_buf[:, : b * hq * nq].view(splits, b, hq, nq)
    o_strides = out.stride() if splits == 1 else o_buf.stride()[1:]
    kk, vv = kv_descriptors(k, v, fl.cfg.bn) if fl.tma == DESCRIPTORS else (k, v)
    rows, plan_b, plan_h, kwargs = fl.rows, 0, 0, fl.packed
    if mods.mask is not None:
        mp = mask_summary.mask_plan(
            mods.mask, plan_rule(req), req.seq_q, req.seq_k, req.sync, fl.kwargs["BM"], fl.cfg.bn
        )
        rows, plan_b, plan_h = mp.rows, mp.plan_b, mp.plan_h
        if fl.cfg.band and mp.band is not None and req.scale > 0:  # this mask's visits are bands
            rows = mp.band
            band = dict(fl.kwargs, BAND=True, EVEN_K=_even_k(True, fl.tma, nk, fl.cfg.bn))
            kwargs = kargs.pack(band, kargs.DENSE_FWD)
    args = (
        q, kk, vv, o_buf, l_buf, rows, rows.stride(0), q.stride(), k.stride(), v.stride(), o_strides,
        (hq, hq // hkv), nq, nk, fl.qk_scale, *runtime_args(mods, q, plan_b, plan_h, extra=mods.sinks),
    )  # fmt: skip
    if mods.any:  # tensors whose layouts vary per call: Triton specialises each launch
        kern.fwd_kernel[fl.grid](*args, **kwargs)
    else:
        fl.fwd_launcher(kern.fwd_kernel, fl.grid, args, fl.packed)
    if splits > 1:
        args = (o_buf, l_buf, out, lse, splits, nq, hq, *out.stride(), o_buf.stride(0), l_buf.stride(0))
        fl.combine_launcher(kern.combine_kernel, (triton_cdiv(nq, 16), hq, b), args, fl.combine_kwargs)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    req: Request,
    mods: Mods | None = None,
) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv): FA2 backward, deterministic (no atomics; GQA summed inside the dk/dv program).

    With a bias or sinks in the request, (dq, dk, dv, dbias, dsinks): ``dbias`` (the bias's shape,
    its dtype) when ``req.bias_grad``, from the per-element dS the dq kernel stores in float32 and
    torch sums over the broadcast dimensions; ``dsinks`` (H,) when ``req.sinks_grad``, from
    dsinks[h] = -sum over rows of exp(sinks[h] - lse) * rowsum(dO·O).
    """
    mods = mods or Mods()
    kern = kernels()
    b, hq, nq, dqk = q.shape
    hkv, nk, dv = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    lse = lse.contiguous()
    delta = torch.empty((b, hq, nq), dtype=torch.float32, device=q.device)
    lse2 = torch.empty_like(delta)
    bm_prep = 64 if not interpret_mode() else 32
    kern.bwd_prep_kernel[(triton_cdiv(nq, bm_prep), hq, b)](
        out, dout, lse, delta, lse2, *out.stride(), *dout.stride(), hq, nq,
        DV=dv, BDV=_pad(dv), BM=bm_prep,
    )  # fmt: skip
    dq = torch.empty((b, hq, nq, dqk), dtype=q.dtype, device=q.device)
    dk = torch.empty((b, hkv, nk, dqk), dtype=q.dtype, device=q.device)
    dvv = torch.empty((b, hkv, nk, dv), dtype=q.dtype, device=q.device)
    scalars, consts = rule_args(req)
    qk_scale = req.scale * LOG2E
    rule = plan_rule(req)
    common = dict(
        **scalars, DQK=dqk, DV=dv, BDQK=_pad(dqk), BDV=_pad(dv), **consts, DOT_PRECISION=_dot_precision(q)
    )  # fmt: skip
    if mods.any:
        common.update(mods.consts())
    swap = _swap_heads_batch(req)
    if swap:
        common["SWAP_HB"] = True
    dbias_full = None
    if req.bias is not None and req.bias_grad:
        # dS per element in the bias's dtype (16-bit biases: half the bytes to write and to sum,
        # the sum accumulated in float32), float32 for a float32 bias. Every (query tile, key tile) pair
        # the dq kernel skips holds dS = 0.
        skips = not isinstance(rule, Full) or mods.mask is not None or req.ndim != 1
        alloc = torch.zeros if skips else torch.empty
        bdt = mods.bias.dtype if mods.bias is not None else torch.float32
        bdt = bdt if bdt in (torch.float16, torch.bfloat16) else torch.float32
        dbias_full = alloc((b, hq, nq, nk), dtype=bdt, device=q.device)

    def tiles(cfg: configs.Cfg, transposed: bool) -> tuple[torch.Tensor, int, int]:
        if mods.mask is not None:
            mp = mask_summary.mask_plan(
                mods.mask, rule, req.seq_q, req.seq_k, req.sync, cfg.bm, cfg.bn, transposed
            )
            return mp.rows, mp.plan_b, mp.plan_h
        pl = plan.plan(
            rule, req.seq_q, req.seq_k, req.sync, cfg.bm, cfg.bn, q.device, transposed=transposed,
            offsets=_offsets(req),
        )  # fmt: skip
        return (pl.cols if transposed else pl.rows), 0, 0

    def run_dkdv(cfg: configs.Cfg) -> None:
        rows, plan_b, plan_h = tiles(cfg, True)
        grid = (triton_cdiv(nk, cfg.bn), *((b, hkv) if swap else (hkv, b)))
        kern.dkdv_kernel[grid](
            q, k, v, dout, lse2, delta, dk, dvv, rows, rows.stride(0),
            q.stride(), k.stride(), v.stride(), dout.stride(), (hq, hkv, group), nq, nk, qk_scale, req.scale,
            *runtime_args(mods, q, plan_b, plan_h, extra=False),
            **kargs.pack(
                dict(common, BM=cfg.bm, BN=cfg.bn, num_warps=cfg.warps, num_stages=cfg.stages), kargs.DENSE_BWD
            ),
        )  # fmt: skip

    def run_dq(cfg: configs.Cfg) -> None:
        rows, plan_b, plan_h = tiles(cfg, False)
        extra = {"DBIAS": True} if dbias_full is not None else {}
        grid = (triton_cdiv(nq, cfg.bm), *((b, hq) if swap else (hq, b)))
        kern.dq_kernel[grid](
            q, k, v, dout, lse2, delta, dq, rows, rows.stride(0),
            q.stride(), k.stride(), v.stride(), dout.stride(), (hq, group), nq, nk, qk_scale, req.scale,
            *runtime_args(mods, q, plan_b, plan_h, extra=dbias_full),
            **kargs.pack(
                dict(common, BM=cfg.bm, BN=cfg.bn, num_warps=cfg.warps, num_stages=cfg.stages, **extra),
                kargs.DENSE_BWD,
            ),
        )  # fmt: skip

    work, persist = _work(req), _persist(q)
    run_dkdv(configs.choose(_key("dkdv", req, q), _cfgs("dkdv", req, q), run_dkdv, work, persist))
    run_dq(configs.choose(_key("dq", req, q), _cfgs("dq", req, q), run_dq, work, persist))
    if req.bias is None and not req.sinks:
        return dq, dk, dvv
    dbias = None
    if dbias_full is not None:
        dims = [d for d in range(4) if req.bias[d] == 1 and dbias_full.shape[d] != 1]
        # torch sums 16-bit tensors in float32 and rounds once into their dtype: no float32 copy.
        red = dbias_full.sum(dim=dims, keepdim=True) if dims else dbias_full
        dbias = red.reshape(req.bias).to(mods.bias.dtype if mods.bias is not None else q.dtype)
    dsinks = None
    if req.sinks and req.sinks_grad and mods.sinks is not None:
        p_sink = torch.exp(mods.sinks.float()[None, :, None] - lse)
        dsinks = (-(p_sink * delta).sum(dim=(0, 2))).to(mods.sinks.dtype)
    return dq, dk, dvv, dbias, dsinks
