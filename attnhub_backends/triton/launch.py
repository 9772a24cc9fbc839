"""The dense kernels' launches: a forward's launch plan per call signature (kept, so that repeated
calls pay for the launch alone), the forward and its split-KV merge, and the backward. What the
device offers is ``device``'s, the tile and split choice ``shape``'s, the arguments ``args``'."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from attnhub import settings
from attnhub.request import Request
from attnhub.rules import ExplicitMask, Full
from attnhub_backends.triton import args as kargs
from attnhub_backends.triton import configs, device, mask_summary, plan, shape
from attnhub_backends.triton.loader import interpret_mode, kernels
from attnhub_backends.triton.modifiers import Mods, dbias_from, ds_dtype, plan_rule, runtime_args, uses_alibi
from attnhub_backends.triton.relaunch import Relauncher

LOG2E = 1.4426950408889634


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


def _make_launch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, req: Request, cfg: configs.Cfg
) -> _FwdLaunch:
    """The launch of ``cfg`` for this call signature: its shape (``shape.fwd_shape``) and the kernels'
    keywords, flat and packed (``args.pack``)."""
    b, hq, nq, dqk = q.shape
    dv = v.shape[3]
    sh = shape.fwd_shape(q, k, v, req, cfg)
    scalars, consts = kargs.rule_args(req)
    has_mask = isinstance(req.rule, ExplicitMask)
    # Element strides between the splits' partial buffers (made in _launch_forward), rounded up to
    # a multiple of 16 so that Triton's divisibility specialisation does not follow the lengths.
    o_split, l_split = (
        (shape.round16(b * hq * nq * dv), shape.round16(b * hq * nq)) if sh.splits > 1 else (0, 0)
    )
    kwargs = dict(
        **scalars, SPLITS=sh.splits, split_strides=(o_split, l_split),
        DQK=dqk, DV=dv, BDQK=device.pad(dqk), BDV=device.pad(dv), BM=sh.bm, BN=cfg.bn, **consts,
        DOT_PRECISION=device.dot_precision(q), NEG=req.scale < 0, PACK=sh.pack, TMA=sh.tma == device.DESCRIPTORS,
        BAND=sh.band, EVEN_K=shape.even_k(sh.band, sh.tma, k.shape[2], cfg.bn), SPLIT=sh.splits > 1,
        NQ1=sh.pack and nq == 1, num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip
    if req.modified or has_mask:
        kwargs.update(
            SOFTCAP=req.softcap is not None, HAS_BIAS=req.bias is not None, HAS_MASK=has_mask,
            HAS_SINKS=req.sinks, CAP_MAX=shape.cap_max(req, q), HAS_ALIBI=uses_alibi(req),
        )  # fmt: skip
    if cfg.maxnreg:
        kwargs["maxnreg"] = cfg.maxnreg
    if sh.swap:
        kwargs["SWAP_HB"] = True
    combine_kwargs = dict(DV=dv, BDV=device.pad(dv), BM=16, BS=shape.combine_bs(sh.splits))
    return _FwdLaunch(
        cfg, sh.rows, sh.grid, sh.splits, sh.tma, req.scale * LOG2E, kwargs, kargs.pack(kwargs, kargs.DENSE_FWD),
        combine_kwargs,
    )  # fmt: skip


#: Largest softcap·log2(e) for which the forward takes the bound as every row's max (``shape.cap_max``).
CAP_MAX_LOG2 = 60.0


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

    cfg = configs.choose(
        shape.config_key("fwd", req, q),
        shape.candidates("fwd", req, q),
        run,
        shape.work(req),
        shape.persist(q),
    )
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
    kk, vv = device.kv_descriptors(k, v, fl.cfg.bn) if fl.tma == device.DESCRIPTORS else (k, v)
    rows, plan_b, plan_h, kwargs = fl.rows, 0, 0, fl.packed
    if mods.mask is not None:
        mp = mask_summary.mask_plan(
            mods.mask, plan_rule(req), req.seq_q, req.seq_k, req.sync, fl.kwargs["BM"], fl.cfg.bn
        )
        rows, plan_b, plan_h = mp.rows, mp.plan_b, mp.plan_h
        if fl.cfg.band and mp.band is not None and req.scale > 0:  # this mask's visits are bands
            rows = mp.band
            band = dict(fl.kwargs, BAND=True, EVEN_K=shape.even_k(True, fl.tma, nk, fl.cfg.bn))
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
        fl.combine_launcher(kern.combine_kernel, (shape.triton_cdiv(nq, 16), hq, b), args, fl.combine_kwargs)


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
    kern.bwd_prep_kernel[(shape.triton_cdiv(nq, bm_prep), hq, b)](
        out, dout, lse, delta, lse2, *out.stride(), *dout.stride(), hq, nq,
        DV=dv, BDV=device.pad(dv), BM=bm_prep,
    )  # fmt: skip
    dq = torch.empty((b, hq, nq, dqk), dtype=q.dtype, device=q.device)
    dk = torch.empty((b, hkv, nk, dqk), dtype=q.dtype, device=q.device)
    dvv = torch.empty((b, hkv, nk, dv), dtype=q.dtype, device=q.device)
    scalars, consts = kargs.rule_args(req)
    qk_scale = req.scale * LOG2E
    rule = plan_rule(req)
    common = dict(
        **scalars, DQK=dqk, DV=dv, BDQK=device.pad(dqk), BDV=device.pad(dv), **consts, DOT_PRECISION=device.dot_precision(q)
    )  # fmt: skip
    if mods.any:
        common.update(mods.consts())
    swap = shape.swap_heads_batch(req)
    if swap:
        common["SWAP_HB"] = True
    dbias_full = None
    if req.bias is not None and req.bias_grad:
        # dS per element (modifiers.ds_dtype). Every (query tile, key tile) pair the dq kernel skips
        # holds dS = 0.
        skips = not isinstance(rule, Full) or mods.mask is not None or req.ndim != 1
        alloc = torch.zeros if skips else torch.empty
        dbias_full = alloc((b, hq, nq, nk), dtype=ds_dtype(mods.bias), device=q.device)

    def tiles(cfg: configs.Cfg, transposed: bool) -> tuple[torch.Tensor, int, int]:
        if mods.mask is not None:
            mp = mask_summary.mask_plan(
                mods.mask, rule, req.seq_q, req.seq_k, req.sync, cfg.bm, cfg.bn, transposed
            )
            return mp.rows, mp.plan_b, mp.plan_h
        pl = plan.plan(
            rule, req.seq_q, req.seq_k, req.sync, cfg.bm, cfg.bn, q.device, transposed=transposed,
            offsets=shape.offsets(req),
        )  # fmt: skip
        return (pl.cols if transposed else pl.rows), 0, 0

    def run_dkdv(cfg: configs.Cfg) -> None:
        rows, plan_b, plan_h = tiles(cfg, True)
        grid = (shape.triton_cdiv(nk, cfg.bn), *((b, hkv) if swap else (hkv, b)))
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
        grid = (shape.triton_cdiv(nq, cfg.bm), *((b, hq) if swap else (hq, b)))
        kern.dq_kernel[grid](
            q, k, v, dout, lse2, delta, dq, rows, rows.stride(0),
            q.stride(), k.stride(), v.stride(), dout.stride(), (hq, group), nq, nk, qk_scale, req.scale,
            *runtime_args(mods, q, plan_b, plan_h, extra=dbias_full),
            **kargs.pack(
                dict(common, BM=cfg.bm, BN=cfg.bn, num_warps=cfg.warps, num_stages=cfg.stages, **extra),
                kargs.DENSE_BWD,
            ),
        )  # fmt: skip

    work, persist = shape.work(req), shape.persist(q)
    run_dkdv(
        configs.choose(
            shape.config_key("dkdv", req, q), shape.candidates("dkdv", req, q), run_dkdv, work, persist
        )
    )
    run_dq(
        configs.choose(shape.config_key("dq", req, q), shape.candidates("dq", req, q), run_dq, work, persist)
    )
    if req.bias is None and not req.sinks:
        return dq, dk, dvv
    dbias = None
    if dbias_full is not None:
        dbias = dbias_from(dbias_full, req.bias, mods.bias.dtype if mods.bias is not None else q.dtype)
    dsinks = None
    if req.sinks and req.sinks_grad and mods.sinks is not None:
        p_sink = torch.exp(mods.sinks.float()[None, :, None] - lse)
        dsinks = (-(p_sink * delta).sum(dim=(0, 2))).to(mods.sinks.dtype)
    return dq, dk, dvv, dbias, dsinks
