"""The launchers: for each kernel family, the buffers it needs, its compiled variant and the launches
(grid, block, shared memory, arguments) that run it on torch CUDA tensors. Which family and tile run
a request is decided in ``choice.py``; :func:`forward` and :func:`backward` follow that choice."""

from __future__ import annotations

import math
from typing import Any

from attnhub.operands import Operands
from attnhub.request import Request
from attnhub_backends.cuda import compiler, variants
from attnhub_backends.cuda.choice import HALF, BackwardKernel, ForwardKernel, backward_kernel, forward_kernel
from attnhub_backends.cuda.device import (
    arch_of,
    current_stream,
    device_index,
    f32,
    f64,
    i32,
    i64,
    launch,
    ptr,
    smem_limit,
    strided,
)
from attnhub_backends.cuda.grid import (
    MMA_BWD_ORDER,
    WGMMA_BWD_ORDER,
    key_tile_grid,
    row_tiles,
    rule_grid,
    tile_major,
    wgmma_forward_grid,
)
from attnhub_backends.cuda.mask import mask_args
from attnhub_backends.cuda.mods import ScoreMods
from attnhub_backends.cuda.tiles import ceil_div

#: Rows per block of attn_absmax / attn_split (fwd_f16x3.cu's SPLIT_ROWS).
_SPLIT_ROWS = 32


# --------------------------------------------------------------------------------------- forward


def forward(
    q: Any, k: Any, v: Any, req: Request, out_dtype: Any, operands: Operands | None = None
) -> tuple[Any, Any]:
    """(out, lse) through the kernel that serves ``req``; ``out`` written in ``out_dtype``; the bias
    of a request with one in ``operands``."""
    import torch

    dev = q.device
    with torch.cuda.device(dev):
        out = torch.empty((req.batch, req.heads_q, req.nq, req.dim_v), dtype=out_dtype, device=dev)
        lse_dtype = torch.float64 if req.dtype == "float64" else torch.float32
        lse = torch.empty((req.batch, req.heads_q, req.nq), dtype=lse_dtype, device=dev)
        arch = arch_of(dev)
        kernel = forward_kernel(req, arch, smem_limit(dev))
        mods = ScoreMods.of(req, operands, lse_dtype)
        _FORWARDS[kernel.family](q, k, v, out, lse, req, kernel, device_index(dev), arch, mods)
    return out, lse


def _tiled_forward_args(q: Any, k: Any, v: Any, out: Any, lse: Any, req: Request) -> tuple[Any, ...]:
    """The leading arguments of the tensor-core forwards (attn_fwd_mma, attn_fwd_wgmma, attn_fwd_tf32):
    pointers, the (batch, head, row) strides of q, k, v, heads, GQA group, lengths and scale * log2(e)."""
    return (
        ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse),
        *(i64(s) for x in (q, k, v) for s in x.stride()[:3]),
        i32(req.heads_q), i32(req.group), i32(req.nq), i32(req.nk),
        f32(req.scale * math.log2(math.e)),
    )  # fmt: skip


def forward_mma(
    q, k, v, out, lse, req: Request, kernel: ForwardKernel, idx: int, arch: str, mods: ScoreMods | None = None
) -> None:
    """mma.sync forward for float16 / bfloat16 (fwd_mma.cu)."""
    q, k, v = (strided(x, 8) for x in (q, k, v))
    cfg = kernel.tile
    var = variants.mma_variant(
        req.dtype, req.dim_qk, req.dim_v, cfg, o_f32=out.dtype != q.dtype, scale_pos=req.scale > 0
    )
    kern = compiler.load_kernel(var, "attn_fwd_mma", idx, arch, kernel.smem)
    launch(
        kern,
        q.device,
        rule_grid(req, row_tiles(req, cfg), req.heads_q),
        32 * cfg[0],
        kernel.smem,
        *_tiled_forward_args(q, k, v, out, lse, req),
        i32(tile_major(req)),
        *mask_args(req),
    )


def forward_wgmma(
    q, k, v, out, lse, req: Request, kernel: ForwardKernel, idx: int, arch: str, mods: ScoreMods | None = None
) -> None:
    """Warpgroup (wgmma, sm_90a) forward for float16 / bfloat16 (fwd_wgmma.cu)."""
    q, k, v = (strided(x, 8) for x in (q, k, v))
    cfg = kernel.tile
    bits = mods.bits if mods else 0
    var = variants.wgmma_variant(
        req.dtype, req.dim_qk, req.dim_v, cfg, o_f32=out.dtype != q.dtype, scale_pos=req.scale > 0, mods=bits
    )
    kern = compiler.load_kernel(var, "attn_fwd_wgmma", idx, variants.WGMMA_ARCH, kernel.smem)
    grid, major = wgmma_forward_grid(req, cfg[0])
    launch(
        kern,
        q.device,
        grid,
        128 * cfg[0],
        kernel.smem,
        *_tiled_forward_args(q, k, v, out, lse, req),
        i32(major),
        *mask_args(req),
        *(mods.args if mods else ()),
    )


def forward_tf32(
    q, k, v, out, lse, req: Request, kernel: ForwardKernel, idx: int, arch: str, mods: ScoreMods | None = None
) -> None:
    """3xTF32 float32 forward (fwd_tf32.cu)."""
    q, k, v = (strided(x, 4) for x in (q, k, v))  # 16-byte rows for cp.async
    cfg = kernel.tile
    var = variants.tf32_variant(req.dim_qk, req.dim_v, cfg)
    kern = compiler.load_kernel(var, "attn_fwd_tf32", idx, arch, kernel.smem)
    launch(
        kern,
        q.device,
        (row_tiles(req, cfg), req.heads_q, req.batch),
        32 * cfg[0],
        kernel.smem,
        *_tiled_forward_args(q, k, v, out, lse, req),
        *mask_args(req),
    )


def forward_f16x3(
    q, k, v, out, lse, req: Request, kernel: ForwardKernel, idx: int, arch: str, mods: ScoreMods | None = None
) -> None:
    """3xFP16: q, k and v split into scaled float16 hi / lo arrays (attn_absmax, then attn_split, one
    launch each for the three; 4 bytes per element in all), then attn_fwd_f16x3 on them."""
    import numpy as np
    import torch

    q, k, v = (strided(x, 4) for x in (q, k, v))  # 16-byte rows for the float4 reads
    dev = q.device
    stream = current_stream(dev)
    cfg = kernel.tile
    var = variants.f16x3_variant(req.dim_qk, req.dim_v, cfg, scale_pos=req.scale > 0)
    absmax = compiler.load_kernel(var, "attn_absmax", idx, arch)
    split = compiler.load_kernel(var, "attn_split", idx, arch)
    kern = compiler.load_kernel(var, "attn_fwd_f16x3", idx, arch, kernel.smem)
    # One float16 buffer holds hi and lo of q, k and v (each part's length a multiple of 8 elements,
    # so every part starts 16-byte aligned), one float32 buffer their (batch, head) maxima.
    shapes = [
        (req.heads_q, req.nq, req.dim_qk),
        (req.heads_kv, req.nk, req.dim_qk),
        (req.heads_kv, req.nk, req.dim_v),
    ]
    sizes = [req.batch * h * n * d for h, n, d in shapes]
    hilo = torch.empty(2 * sum(sizes), dtype=torch.float16, device=dev)
    amax = torch.zeros(sum(req.batch * h for h, _, _ in shapes), dtype=torch.float32, device=dev)
    base, am = hilo.data_ptr(), amax.data_ptr()
    args, parts, amaxes, ends, blocks = [], [], [], [], 0
    for x, (h, n, d), size in zip((q, k, v), shapes, sizes):
        hi, lo = base, base + 2 * size
        base += 4 * size
        args += [ptr(x), *(i64(st) for st in x.stride()[:3]), i32(h), i32(n), i32(d), np.uint64(am)]
        args += [np.uint64(hi), np.uint64(lo)]
        parts += [np.uint64(hi), np.uint64(lo)]
        amaxes.append(np.uint64(am))
        am += 4 * req.batch * h
        blocks += req.batch * h * ceil_div(n, _SPLIT_ROWS)
        ends.append(blocks)
    args += [i64(ends[0]), i64(ends[1])]
    launch(absmax, dev, (blocks,), 256, 0, *args, stream=stream)
    launch(split, dev, (blocks,), 256, 0, *args, stream=stream)
    launch(
        kern,
        dev,
        rule_grid(req, row_tiles(req, cfg), req.heads_q),
        32 * cfg[0],
        kernel.smem,
        *parts, ptr(out), ptr(lse), *amaxes,
        i32(req.heads_q), i32(req.group), i32(req.nq), i32(req.nk),
        f32(req.scale * math.log2(math.e)),
        i32(tile_major(req)),
        *mask_args(req),
        stream=stream,
    )  # fmt: skip


def forward_simt(
    q, k, v, out, lse, req: Request, kernel: ForwardKernel, idx: int, arch: str, mods: ScoreMods | None = None
) -> None:
    """SIMT forward for every dtype and head dims up to 128 (fwd_simt.cu)."""
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    var = variants.simt_variant(req.dtype, o_f32=out.dtype != q.dtype, mods=mods.bits if mods else 0)
    kern = compiler.load_kernel(var, "attn_fwd_simt", idx, arch, kernel.smem)
    launch(
        kern,
        q.device,
        (ceil_div(req.nq, 32), req.heads_q, req.batch),
        256,
        kernel.smem,
        ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse),
        *(i64(s) for x in (q, k, v) for s in x.stride()[:3]),
        i32(req.heads_q), i32(req.group), i32(req.nq), i32(req.nk), i32(req.dim_qk), i32(req.dim_v),
        f64(req.scale),
        *mask_args(req),
        *(mods.args if mods else ()),
    )  # fmt: skip


_FORWARDS = {
    "mma": forward_mma,
    "wgmma": forward_wgmma,
    "tf32": forward_tf32,
    "f16x3": forward_f16x3,
    "simt": forward_simt,
}


# -------------------------------------------------------------------------------------- backward


def backward(
    q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, operands: Operands | None = None
) -> tuple[Any, ...]:
    """(dq, dk, dv) through the backward kernel that serves ``req``; for a request with a bias
    (dq, dk, dv, dbias, None), dbias (the bias's shape and dtype) when ``req.bias_grad`` else None."""
    import torch

    dev = q.device
    with torch.cuda.device(dev):
        q, k, v, out, dout = (x.contiguous() for x in (q, k, v, out, dout))
        arch = arch_of(dev)
        kernel = backward_kernel(req, arch, smem_limit(dev))
        run = backward_simt if kernel.family == "simt" else backward_mma
        acc = torch.float64 if req.dtype == "float64" else torch.float32
        mods = ScoreMods.of(req, operands, acc, grad=True)
        grads = run(q, k, v, out, lse, dout, req, kernel, device_index(dev), arch, mods)
        if req.bias is None and not req.sinks:
            return grads
        return (*grads, mods.dbias(operands.bias) if mods and req.bias_grad else None, None)


def _delta(delta: Any, out: Any, dout: Any, req: Request, o_f32: bool, idx: int, arch: str, per_block: int):
    """Fill ``delta`` with rowsum(dO * O) per query row (attn_bwd_pre, ``per_block`` rows per block)."""
    rows = req.batch * req.heads_q * req.nq
    pre = compiler.load_kernel(variants.bwd_variant(req.dtype, o_f32=o_f32), "attn_bwd_pre", idx, arch)
    launch(
        pre, out.device, (ceil_div(rows, per_block),), 256, 0, ptr(out), ptr(dout), ptr(delta), i64(rows),
        i32(req.dim_v),
    )  # fmt: skip


def backward_simt(
    q, k, v, out, lse, dout, req: Request, kernel: BackwardKernel, idx: int, arch: str,
    mods: ScoreMods | None = None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """SIMT backward for every dtype and head dims up to 128 (bwd_simt.cu): delta, then one kernel per
    32-key tile adding dQ into a float32 (float64) buffer."""
    import torch

    dev = q.device
    acc = torch.float64 if req.dtype == "float64" else torch.float32
    lse = lse.to(acc).contiguous()
    delta = torch.empty((req.batch, req.heads_q, req.nq), dtype=acc, device=dev)
    dq = torch.zeros((req.batch, req.heads_q, req.nq, req.dim_qk), dtype=acc, device=dev)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    per_block = 8 if req.dtype in HALF else 256  # warp per row / thread per row
    _delta(delta, out, dout, req, out.dtype != q.dtype, idx, arch, per_block)
    var = variants.bwd_variant(req.dtype, o_f32=out.dtype != q.dtype, mods=mods.bits if mods else 0)
    kern = compiler.load_kernel(var, "attn_bwd_simt", idx, arch, kernel.smem)
    launch(
        kern,
        dev,
        (ceil_div(req.nk, kernel.block_keys), req.heads_kv, req.batch),
        kernel.threads,
        kernel.smem,
        ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), ptr(delta), ptr(dq), ptr(dk), ptr(dv),
        i32(req.heads_q), i32(req.heads_kv), i32(req.nq), i32(req.nk), i32(req.dim_qk), i32(req.dim_v),
        f64(req.scale),
        *mask_args(req),
        *(mods.args if mods else ()),
    )  # fmt: skip
    return dq.to(q.dtype), dk, dv


def backward_mma(
    q, k, v, out, lse, dout, req: Request, kernel: BackwardKernel, idx: int, arch: str,
    mods: ScoreMods | None = None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """Tensor-core backward (half types, head dims 64/128): delta, then the wgmma kernel, the fused
    mma.sync kernel or the split dK/dV and dQ kernels."""
    import numpy as np
    import torch

    dev = q.device
    lse = lse.float().contiguous()
    delta = torch.empty((req.batch, req.heads_q, req.nq), dtype=torch.float32, device=dev)
    _delta(delta, out, dout, req, out.dtype != q.dtype, idx, arch, 8)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    scales = (np.float32(req.scale), np.float32(req.scale * math.log2(math.e)))
    common = (ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), ptr(delta))
    if kernel.family == "wgmma":
        # Hopper: one wgmma kernel over the (key tile, query tile) pairs.
        bits = mods.bits if mods else 0
        var = variants.bwd_wgmma_variant(req.dtype, req.dim_qk, req.dim_v, kernel.warpgroups, mods=bits)
        grid, major = key_tile_grid(req, kernel.block_keys, WGMMA_BWD_ORDER)
        fused = compiler.load_kernel(var, "attn_bwd_fused_wgmma", idx, variants.WGMMA_ARCH, kernel.smem)
        convert = compiler.load_kernel(var, "attn_bwd_dq_convert", idx, variants.WGMMA_ARCH)
        _backward_fused(fused, convert, grid, major, kernel, common, dq, dk, dv, scales, req, mods)
        return dq, dk, dv
    assert mods is None, "score modifiers run on the wgmma or SIMT backward (choice.backward_kernel)"
    var = variants.bwd_mma_variant(req.dtype, req.dim_qk, req.dim_v)
    if kernel.family == "fused":
        # One pass over the (key tile, query tile) pairs.
        grid, major = key_tile_grid(req, kernel.block_keys, MMA_BWD_ORDER)
        fused = compiler.load_kernel(var, "attn_bwd_fused_mma", idx, arch, kernel.smem)
        convert = compiler.load_kernel(var, "attn_bwd_dq_convert", idx, arch)
        _backward_fused(fused, convert, grid, major, kernel, common, dq, dk, dv, scales, req)
        return dq, dk, dv
    kern = compiler.load_kernel(var, "attn_bwd_dkdv_mma", idx, arch, kernel.smem)
    grid, major = key_tile_grid(req, kernel.block_keys, MMA_BWD_ORDER)
    launch(
        kern, dev, grid, kernel.threads, kernel.smem, *common, ptr(dk), ptr(dv),
        i32(req.heads_q), i32(req.heads_kv), i32(req.nq), i32(req.nk), *scales, i32(major),
        *mask_args(req),
    )  # fmt: skip
    kern = compiler.load_kernel(var, "attn_bwd_dq_mma", idx, arch, kernel.dq_smem)
    launch(
        kern, dev, rule_grid(req, ceil_div(req.nq, 64), req.heads_q), 128, kernel.dq_smem, *common, ptr(dq),
        i32(req.heads_q), i32(req.group), i32(req.nq), i32(req.nk), *scales, i32(tile_major(req)),
        *mask_args(req),
    )  # fmt: skip
    return dq, dk, dv


def _backward_fused(
    fused: Any, convert: Any, grid: tuple[int, int, int], major: bool, kernel: BackwardKernel,
    common: tuple[Any, ...], dq: Any, dk: Any, dv: Any, scales: tuple[Any, Any], req: Request,
    mods: ScoreMods | None = None,
) -> None:  # fmt: skip
    """A fused backward kernel (wgmma or mma.sync) writing dK, dV and adding dQ's shares into a zeroed
    float32 buffer, then attn_bwd_dq_convert scaling and rounding that buffer into ``dq``."""
    import torch

    dev = dq.device
    dqacc = torch.zeros((req.batch, req.heads_q, req.nq, req.dim_qk), dtype=torch.float32, device=dev)
    launch(
        fused, dev, grid, kernel.threads, kernel.smem, *common, ptr(dk), ptr(dv), ptr(dqacc),
        i32(req.heads_q), i32(req.heads_kv), i32(req.nq), i32(req.nk), *scales, i32(major), *mask_args(req),
        *(mods.args if mods else ()),
    )  # fmt: skip
    n = dqacc.numel()
    launch(convert, dev, (ceil_div(n, 4 * 256),), 256, 0, ptr(dqacc), ptr(dq), i64(n), scales[0])
