"""The ``cuda`` backend: torch CUDA tensors in, NVRTC-compiled CUDA C++ kernels, autograd through the core."""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.errors import AttnhubError
from attnhub.request import Request
from attnhub.rules import Causal, Local
from attnhub_backends.cuda import compiler
from attnhub_backends.cuda.launch import (
    arch_of,
    ceil_div,
    current_stream,
    grid_ok,
    i64,
    launch,
    mask_args,
    ptr,
)

_HALF = ("float16", "bfloat16")


class CudaBackend(Backend):
    """Flash attention in CUDA C++: mma.sync tensor cores for float16/bfloat16 at head dims 64/128,
    a SIMT kernel for float32/float64 (and other head dims up to 128), SIMT backward kernels."""

    name: ClassVar[str] = "cuda"
    priority: ClassVar[int] = 90
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32", "float64")
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "gqa", "lse", "backward"}
    )
    max_head_dim: ClassVar[int | None] = 128
    requires: ClassVar[tuple[str, ...]] = ("torch", "cuda-core", "nvidia-cuda-nvrtc")

    def availability(self) -> str | None:
        # Nothing here imports torch: a NumPy call must not pay for (or load) a framework it never uses.
        if importlib.util.find_spec("torch") is None:
            return "needs torch with CUDA: pip install 'attnhub[cuda]'"
        try:
            compiler._core("Program")
            compiler._include_dirs()
            compiler.nvrtc_version()
        except (ImportError, AttnhubError, RuntimeError, OSError) as exc:
            return f"needs cuda-python's NVRTC (pip install 'attnhub[cuda]'): {exc}"
        return _driver_reason()

    def version(self) -> str | None:
        try:
            return f"nvrtc {compiler.nvrtc_version()}"
        except Exception:  # pragma: no cover - shown by availability()
            return None

    def extra_reasons(self, req: Request) -> list[str]:
        reasons = grid_ok(req, tiles_on_z=use_mma(req) or use_f16x3(req))
        if req.symbolic:
            reasons.append("needs concrete torch tensors")
        if req.device_type == "cuda":
            import torch

            major, _ = torch.cuda.get_device_capability(req.device)
            if major < 8:
                reasons.append(
                    f"needs compute capability 8.0 or newer (cp.async, mma.sync), {req.device} has {major}.x"
                )
            else:
                reasons.extend(_smem_reasons(req))
        return reasons

    # ---------------------------------------------------------------- forward

    def forward_for_grad(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None
    ) -> tuple[Any, Any, Any]:
        """Half inputs: the forward kernel writes a float32 output, which the backward's
        rowsum(dO·O) reads; the caller gets it rounded to the input dtype."""
        if req.dtype not in _HALF:
            return super().forward_for_grad(q, k, v, req, mask)
        import torch

        out32, lse = _forward(q, k, v, req, torch.float32)
        return out32.to(q.dtype), lse, out32

    def forward(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        return _forward(q, k, v, req, q.dtype)

    # ---------------------------------------------------------------- backward

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None
    ) -> tuple[Any, Any, Any]:
        import torch

        dev = q.device
        with torch.cuda.device(dev):
            q, k, v, out, dout = (x.contiguous() for x in (q, k, v, out, dout))
            if use_mma(req) and not _simt_backward_forced():
                return _backward_mma(q, k, v, out, lse, dout, req)
            acc = torch.float64 if req.dtype == "float64" else torch.float32
            lse = lse.to(acc).contiguous()
            delta = torch.empty((req.batch, req.heads_q, req.nq), dtype=acc, device=dev)
            dq = torch.zeros((req.batch, req.heads_q, req.nq, req.dim_qk), dtype=acc, device=dev)
            dk = torch.empty_like(k)
            dv = torch.empty_like(v)
            arch = arch_of(dev)
            var = compiler.bwd_variant(req.dtype, o_f32=out.dtype != q.dtype)
            idx = _device_index(dev)
            rows = req.batch * req.heads_q * req.nq
            pre = compiler.load_kernel(var, "attn_bwd_pre", idx, arch)
            per_block = 8 if req.dtype in _HALF else 256  # warp per row / thread per row
            launch(
                pre,
                dev,
                (ceil_div(rows, per_block),),
                256,
                0,
                ptr(out),
                ptr(dout),
                ptr(delta),
                i64(rows),
                _i32(req.dim_v),
            )
            smem = _simt_bwd_smem(req)
            kern = compiler.load_kernel(var, "attn_bwd_simt", idx, arch, smem)
            launch(
                kern,
                dev,
                (ceil_div(req.nk, 32), req.heads_kv, req.batch),
                256,
                smem,
                ptr(q),
                ptr(k),
                ptr(v),
                ptr(dout),
                ptr(lse),
                ptr(delta),
                ptr(dq),
                ptr(dk),
                ptr(dv),
                _i32(req.heads_q),
                _i32(req.heads_kv),
                _i32(req.nq),
                _i32(req.nk),
                _i32(req.dim_qk),
                _i32(req.dim_v),
                _f64(req.scale),
                *mask_args(req),
            )
            return dq.to(q.dtype), dk, dv


def _smem_reasons(req: Request) -> list[str]:
    """Requests whose kernels need more shared memory than this GPU gives a block."""
    limit = _smem_limit(req.device)
    need = []
    if use_mma(req):
        if _tile_for("mma", req, limit) is None:
            need.append(("forward", compiler.mma_smem_bytes(req.dim_qk, req.dim_v, _MMA_FALLBACKS[-1])))
        if req.needs_grad and not _simt_backward_forced():
            # the split kernels (the fused one, larger, is used only where it fits)
            need.append(("backward", max(compiler.bwd_mma_smem_bytes(req.dim_qk, req.dim_v))))
    elif use_tf32(req):
        if _tile_for("tf32", req, limit) is None:
            need.append(("forward", compiler.tf32_smem_bytes(req.dim_qk, req.dim_v, _TF32_FALLBACKS[-1])))
    elif use_f16x3(req):
        if _tile_for("f16x3", req, limit) is None:
            need.append(("forward", compiler.f16x3_smem_bytes(req.dim_qk, req.dim_v, _F16X3_FALLBACKS[-1])))
    else:
        need.append(("forward", _simt_fwd_smem(req)))
    if req.needs_grad and (not use_mma(req) or _simt_backward_forced()):
        need.append(("backward", _simt_bwd_smem(req)))
    return [
        f"the {what} kernel needs {n} bytes of shared memory per block, {req.device} allows {limit} "
        f"(use smaller head dims{' or float32' if req.dtype == 'float64' else ''})"
        for what, n in need
        if n > limit
    ]


def _simt_backward_forced() -> bool:
    return os.environ.get("ATTNHUB_CUDA_BWD") == "simt"


def _smem_limit(device: Any) -> int:
    """Largest dynamic shared memory a block may opt into on ``device`` (bytes)."""
    return _smem_limit_of(str(device))


@functools.cache
def _smem_limit_of(device: str) -> int:
    import torch
    from cuda.bindings import driver

    dev = torch.device(device)
    index = _device_index(dev)
    attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    driver.cuInit(0)
    err, value = driver.cuDeviceGetAttribute(attr, index)
    if err != driver.CUresult.CUDA_SUCCESS:
        return 48 * 1024
    return int(value)


def _simt_fwd_smem(req: Request) -> int:
    el = 8 if req.dtype == "float64" else 4
    return el * (32 * req.dim_qk + 32 * (req.dim_qk + 1) + 32 * 32 * ceil_div(req.dim_v, 32))


def _simt_bwd_smem(req: Request) -> int:
    el = 8 if req.dtype == "float64" else 4
    return el * (32 * (req.dim_qk + 1) * 2 + 32 * (req.dim_v + 1) * 2 + 2 * 32 * 33 + 64)


#: Smaller forward tiles tried, in order, when the default does not fit the GPU's shared memory:
#: per kernel (mma.sync half types, 3xTF32, 3xFP16), its default tile, the smaller ones and the
#: function giving a tile's dynamic shared memory for (Dqk, Dv).
_MMA_FALLBACKS = ((8, 64, 1), (4, 64, 1), (4, 32, 1))
_TF32_FALLBACKS = ((4, 64, 1), (4, 32, 1))
_F16X3_FALLBACKS = ((8, 32, 1), (4, 32, 1))
_TILES = {
    "mma": (compiler.mma_config, _MMA_FALLBACKS, compiler.mma_smem_bytes),
    "tf32": (compiler.tf32_config, _TF32_FALLBACKS, compiler.tf32_smem_bytes),
    "f16x3": (compiler.f16x3_config, _F16X3_FALLBACKS, compiler.f16x3_smem_bytes),
}


def _tile_for(kernel: str, req: Request, limit: int) -> tuple[int, int, int] | None:
    """The first of ``kernel``'s tiles (its default, then the fallbacks) that fits in ``limit`` bytes of
    shared memory, or None."""
    config, fallbacks, smem = _TILES[kernel]
    for c in (config(req.dim_qk, req.dim_v), *fallbacks):
        if smem(req.dim_qk, req.dim_v, c) <= limit:
            return c
    return None


#: Float32 tensor-core forwards, ATTNHUB_CUDA_F32's values besides ``simt``.
F32_KERNELS = ("f16x3", "tf32")
#: Below this much work, B * Hq * Nq * Nk * (Dqk + Dv), the float32 default is 3xTF32 (one launch)
#: rather than 3xFP16 (three launches, two allocations: 90-150 us more host time per call). H100,
#: B = 1, H = 8, two runs (benchmarks/cuda_f16x3_prep.py, 2026-11-23 04:03 and 04:11 UTC,
#: docs/benchmarks.md): at D = 128, L = 512 (5.4e8) 3xFP16 144 / 292 us against 3xTF32 173 / 173;
#: at D = 64, L = 2048 (4.3e9) 154 / 284 against 247 / 248; at D = 128, L = 2048 (8.6e9) 184 / 290
#: against 666 / 670.
F16X3_MIN_WORK = 4e9


def f32_kernel(req: Request) -> str | None:
    """The tensor-core forward serving a float32 request with head dims 64 / 128: ``f16x3`` (3xFP16)
    from F16X3_MIN_WORK of work on, ``tf32`` (3xTF32) below; ``ATTNHUB_CUDA_F32`` forces either, or
    the SIMT kernel with ``simt`` (then None, as for requests no tensor-core kernel serves)."""
    mode = os.environ.get("ATTNHUB_CUDA_F32", "")
    if mode not in ("", *F32_KERNELS, "simt"):
        raise AttnhubError(f"ATTNHUB_CUDA_F32 takes f16x3, tf32 or simt, got {mode!r}")
    if req.dtype != "float32" or req.dim_qk not in compiler.MMA_DIMS or req.dim_v not in compiler.MMA_DIMS:
        return None
    if mode:
        return None if mode == "simt" else mode
    work = req.batch * req.heads_q * req.nq * req.nk * (req.dim_qk + req.dim_v)
    return "f16x3" if work >= F16X3_MIN_WORK else "tf32"


def use_tf32(req: Request) -> bool:
    """True when the 3xTF32 tensor-core forward serves ``req`` (``ATTNHUB_CUDA_F32=tf32``)."""
    return f32_kernel(req) == "tf32"


def use_f16x3(req: Request) -> bool:
    """True when the 3xFP16 tensor-core forward serves ``req`` (float32, head dims 64 / 128)."""
    return f32_kernel(req) == "f16x3"


def use_mma(req: Request) -> bool:
    """True when the tensor-core kernel serves ``req`` (half types, head dims 64/128)."""
    return req.dtype in _HALF and req.dim_qk in compiler.MMA_DIMS and req.dim_v in compiler.MMA_DIMS


def _i32(x: int) -> Any:
    import numpy as np

    return np.int32(x)


def _f64(x: float) -> Any:
    import numpy as np

    return np.float64(x)


def _strided(x: Any, align: int) -> Any:
    """``x`` itself when its rows are unit-stride and ``align``-element aligned, else a contiguous copy."""
    ok = (
        x.stride(-1) == 1
        and all(s % align == 0 for s in x.stride()[:-1])
        and x.data_ptr() % (x.element_size() * align) == 0
    )
    return x if ok else x.contiguous()


def _forward(q: Any, k: Any, v: Any, req: Request, out_dtype: Any) -> tuple[Any, Any]:
    """(out, lse) through the kernel that serves ``req``; ``out`` written in ``out_dtype``."""
    import torch

    dev = q.device
    with torch.cuda.device(dev):
        out = torch.empty((req.batch, req.heads_q, req.nq, req.dim_v), dtype=out_dtype, device=dev)
        lse_dtype = torch.float64 if req.dtype == "float64" else torch.float32
        lse = torch.empty((req.batch, req.heads_q, req.nq), dtype=lse_dtype, device=dev)
        if use_mma(req):
            _forward_mma(q, k, v, out, lse, req)
        elif use_f16x3(req):
            _forward_f16x3(q, k, v, out, lse, req)
        elif use_tf32(req):
            _forward_tf32(q, k, v, out, lse, req)
        else:
            _forward_simt(q, k, v, out, lse, req)
    return out, lse


def _wgmma_tile(req: Request, arch: str) -> tuple[int, int] | None:
    """The wgmma forward's (warpgroups, keys per tile) where it serves the half-type request: on
    compute capability 9.0 where its tiles fit, unless ``ATTNHUB_CUDA_FWD=mma`` forces the mma.sync
    kernel (comparisons, tests; ``=wgmma`` is the default); else None (the mma.sync kernel runs)."""
    mode = os.environ.get("ATTNHUB_CUDA_FWD", "")
    if mode not in ("", "mma", "wgmma"):
        raise AttnhubError(f"ATTNHUB_CUDA_FWD takes mma or wgmma, got {mode!r}")
    if mode == "mma" or arch != "sm_90":
        return None
    cfg = compiler.wgmma_config(req.dim_qk, req.dim_v)
    return cfg if compiler.wgmma_smem_bytes(req.dim_qk, req.dim_v, cfg) <= _smem_limit(req.device) else None


def _forward_mma(q: Any, k: Any, v: Any, out: Any, lse: Any, req: Request) -> None:

    q, k, v = (_strided(x, 8) for x in (q, k, v))
    dev = q.device
    idx = _device_index(dev)
    wgmma_cfg = _wgmma_tile(req, arch_of(dev))
    if wgmma_cfg is not None:
        _forward_wgmma(q, k, v, out, lse, req, idx, wgmma_cfg)
        return
    cfg = _tile_for("mma", req, _smem_limit(dev)) or compiler.mma_config(req.dim_qk, req.dim_v)
    var = compiler.mma_variant(
        req.dtype, req.dim_qk, req.dim_v, cfg, o_f32=out.dtype != q.dtype, scale_pos=req.scale > 0
    )
    smem = compiler.mma_smem_bytes(req.dim_qk, req.dim_v, cfg)
    kern = compiler.load_kernel(var, "attn_fwd_mma", idx, arch_of(dev), smem)
    launch(
        kern,
        dev,
        _grid(req, _row_tiles(req, cfg), req.heads_q),
        32 * cfg[0],
        smem,
        *_tiled_forward_args(q, k, v, out, lse, req),
        _i32(_tile_major(req)),
        *mask_args(req),
    )


#: Default grid order of the mma.sync backward's key-tile kernels (dK/dV, fused): ``rule`` (the
#: forward's); ATTNHUB_CUDA_BWD_ORDER overrides it. ``tiles`` measured mixed on the H100 (02:20 UTC,
#: 2026-11-23, docs/benchmarks.md): causal L = 2k / 4k faster (fused D = 64 0.57 -> 0.87x flash at 2k),
#: L = 16k slower (split D = 64 0.65 -> 0.58x), where its 64-key blocks leave a tail of heavy blocks.
MMA_BWD_ORDER = "rule"


def _use_wgmma_backward(arch: str) -> bool:
    """The wgmma backward serves half types on compute capability 9.0 unless ``ATTNHUB_CUDA_BWD`` names
    another kernel (fused, split: mma.sync; simt)."""
    return arch == "sm_90" and os.environ.get("ATTNHUB_CUDA_BWD", "") in ("", "wgmma")


def _order_tile_major(req: Request, var: str, default: str) -> bool:
    """Grid order of a Hopper kernel from ``var`` (else ``default``): ``tiles`` puts the tiles of one
    head next to each other (they share its K / V, or Q / dO, in L2; the heaviest causal tile of each
    head still starts first), ``heads`` the heaviest tile of every head first, ``rule`` follows
    ``_tile_major`` (heads under causal rules)."""
    order = os.environ.get(var, "") or default
    if order not in ("tiles", "heads", "rule"):
        raise AttnhubError(f"{var} takes tiles, heads or rule, got {order!r}")
    return _tile_major(req) if order == "rule" else order == "heads"


def _bwd_tile_major(req: Request, default: str = "tiles") -> bool:
    """Grid order of the backward's key-tile kernels (``ATTNHUB_CUDA_BWD_ORDER``). The Hopper kernel's
    default is ``tiles``: H100, bf16 causal (benchmarks/cuda_wgmma_probe.py --bwd): 0.80-0.84x flash at
    D = 64 with the heads order, whose concurrent blocks each stream a different head's Q / dO from
    memory, 0.95-1.00x with tiles."""
    return _order_tile_major(req, "ATTNHUB_CUDA_BWD_ORDER", default)


def _key_tile_grid(req: Request, block_keys: int, default: str) -> tuple[tuple[int, int, int], bool]:
    """(grid, tile_major) of a backward kernel with one block per key tile of a kv head."""
    tiles, major = ceil_div(req.nk, block_keys), _bwd_tile_major(req, default)
    return _grid_order(tiles, req.heads_kv, req.batch, major), major


def _forward_wgmma(
    q: Any, k: Any, v: Any, out: Any, lse: Any, req: Request, idx: int, cfg: tuple[int, int]
) -> None:
    var = compiler.wgmma_variant(
        req.dtype, req.dim_qk, req.dim_v, cfg, o_f32=out.dtype != q.dtype, scale_pos=req.scale > 0
    )
    smem = compiler.wgmma_smem_bytes(req.dim_qk, req.dim_v, cfg)
    kern = compiler.load_kernel(var, "attn_fwd_wgmma", idx, compiler.WGMMA_ARCH, smem)
    tiles, major = ceil_div(req.nq, 64 * cfg[0]), _order_tile_major(req, "ATTNHUB_CUDA_FWD_ORDER", "rule")
    launch(
        kern,
        q.device,
        _grid_order(tiles, req.heads_q, req.batch, major),
        128 * cfg[0],
        smem,
        *_tiled_forward_args(q, k, v, out, lse, req),
        _i32(major),
        *mask_args(req),
    )


def _tiled_forward_args(q: Any, k: Any, v: Any, out: Any, lse: Any, req: Request) -> tuple[Any, ...]:
    """The leading arguments of both tensor-core forwards (attn_fwd_mma, attn_fwd_tf32): pointers,
    the (batch, head, row) strides of q, k, v, heads, GQA group, lengths and scale * log2(e)."""
    import numpy as np

    return (
        ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse),
        *(i64(s) for x in (q, k, v) for s in x.stride()[:3]),
        _i32(req.heads_q), _i32(req.group), _i32(req.nq), _i32(req.nk),
        np.float32(req.scale * math.log2(math.e)),
    )  # fmt: skip


def _tile_major(req: Request) -> bool:
    """Causal rules: work grows with the query tile, so tiles go on the grid's z axis (heaviest first
    for every head); otherwise heads do, and the blocks running together share K and V in L2."""
    rule = req.rule
    return isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal)


def _device_index(dev: Any) -> int:
    """The CUDA ordinal of a torch device (``cuda`` alone: the current device)."""
    import torch

    return dev.index if dev.index is not None else torch.cuda.current_device()


def _row_tiles(req: Request, cfg: tuple[int, ...]) -> int:
    """Query tiles of an mma.sync-style forward config ``(warps, bn, row blocks)``: each warp's row
    block holds 16 query rows."""
    return ceil_div(req.nq, 16 * cfg[0] * cfg[2])


def _grid(req: Request, tiles: int, heads: int) -> tuple[int, int, int]:
    """The (x, y, z) grid of the tensor-core kernels, as ``_tile_major`` orders it."""
    return _grid_order(tiles, heads, req.batch, _tile_major(req))


def _grid_order(tiles: int, heads: int, batch: int, tile_major: bool) -> tuple[int, int, int]:
    """(heads, batch, tiles) when ``tile_major``, else (tiles, heads, batch): the layouts the kernels'
    GridPos decodes."""
    return (heads, batch, tiles) if tile_major else (tiles, heads, batch)


def _forward_tf32(q: Any, k: Any, v: Any, out: Any, lse: Any, req: Request) -> None:

    q, k, v = (_strided(x, 4) for x in (q, k, v))  # 16-byte rows for cp.async
    dev = q.device
    idx = _device_index(dev)
    cfg = _tile_for("tf32", req, _smem_limit(dev)) or compiler.tf32_config(req.dim_qk, req.dim_v)
    var = compiler.tf32_variant(req.dim_qk, req.dim_v, cfg)
    smem = compiler.tf32_smem_bytes(req.dim_qk, req.dim_v, cfg)
    kern = compiler.load_kernel(var, "attn_fwd_tf32", idx, arch_of(dev), smem)
    launch(
        kern,
        dev,
        (_row_tiles(req, cfg), req.heads_q, req.batch),
        32 * cfg[0],
        smem,
        *_tiled_forward_args(q, k, v, out, lse, req),
        *mask_args(req),
    )


def _forward_f16x3(q: Any, k: Any, v: Any, out: Any, lse: Any, req: Request) -> None:
    """3xFP16: q, k and v split into scaled float16 hi / lo arrays (attn_absmax, then attn_split, one
    launch each for the three; 4 bytes per element in all), then attn_fwd_f16x3 on them."""
    import numpy as np
    import torch

    q, k, v = (_strided(x, 4) for x in (q, k, v))  # 16-byte rows for the float4 reads
    dev = q.device
    idx = _device_index(dev)
    arch = arch_of(dev)
    stream = current_stream(dev)
    cfg = _tile_for("f16x3", req, _smem_limit(dev)) or compiler.f16x3_config(req.dim_qk, req.dim_v)
    var = compiler.f16x3_variant(req.dim_qk, req.dim_v, cfg, scale_pos=req.scale > 0)
    smem = compiler.f16x3_smem_bytes(req.dim_qk, req.dim_v, cfg)
    absmax = compiler.load_kernel(var, "attn_absmax", idx, arch)
    split = compiler.load_kernel(var, "attn_split", idx, arch)
    kern = compiler.load_kernel(var, "attn_fwd_f16x3", idx, arch, smem)
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
        args += [ptr(x), *(i64(st) for st in x.stride()[:3]), _i32(h), _i32(n), _i32(d), np.uint64(am)]
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
        _grid(req, _row_tiles(req, cfg), req.heads_q),
        32 * cfg[0],
        smem,
        *parts, ptr(out), ptr(lse), *amaxes,
        _i32(req.heads_q), _i32(req.group), _i32(req.nq), _i32(req.nk),
        np.float32(req.scale * math.log2(math.e)),
        _i32(_tile_major(req)),
        *mask_args(req),
        stream=stream,
    )  # fmt: skip


#: Rows per block of attn_absmax / attn_split (fwd_f16x3.cu's SPLIT_ROWS).
_SPLIT_ROWS = 32


def _forward_simt(q: Any, k: Any, v: Any, out: Any, lse: Any, req: Request) -> None:

    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    dev = q.device
    idx = _device_index(dev)
    var = compiler.simt_variant(req.dtype, o_f32=out.dtype != q.dtype)
    smem = _simt_fwd_smem(req)
    kern = compiler.load_kernel(var, "attn_fwd_simt", idx, arch_of(dev), smem)
    launch(
        kern,
        dev,
        (ceil_div(req.nq, 32), req.heads_q, req.batch),
        256,
        smem,
        ptr(q),
        ptr(k),
        ptr(v),
        ptr(out),
        ptr(lse),
        *(i64(s) for x in (q, k, v) for s in x.stride()[:3]),
        _i32(req.heads_q),
        _i32(req.group),
        _i32(req.nq),
        _i32(req.nk),
        _i32(req.dim_qk),
        _i32(req.dim_v),
        _f64(req.scale),
        *mask_args(req),
    )


def _backward_mma(
    q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request
) -> tuple[Any, Any, Any]:
    """Tensor-core backward (half types, head dims 64/128): delta, then the dK/dV and dQ kernels."""
    import numpy as np
    import torch

    dev = q.device
    idx = _device_index(dev)
    arch = arch_of(dev)
    lse = lse.float().contiguous()
    delta = torch.empty((req.batch, req.heads_q, req.nq), dtype=torch.float32, device=dev)
    rows = req.batch * req.heads_q * req.nq
    pre = compiler.load_kernel(
        compiler.bwd_variant(req.dtype, o_f32=out.dtype != q.dtype), "attn_bwd_pre", idx, arch
    )
    launch(
        pre, dev, (ceil_div(rows, 8),), 256, 0, ptr(out), ptr(dout), ptr(delta), i64(rows), _i32(req.dim_v)
    )
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    scales = (np.float32(req.scale), np.float32(req.scale * math.log2(math.e)))
    common = (ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), ptr(delta))
    nwg = compiler.bwd_wgmma_warpgroups(req.dim_qk, req.dim_v)
    smem = compiler.bwd_wgmma_smem_bytes(req.dim_qk, req.dim_v, nwg)
    if _use_wgmma_backward(arch) and smem <= _smem_limit(dev):
        # Hopper: one wgmma kernel over the (key tile, query tile) pairs.
        var = compiler.bwd_wgmma_variant(req.dtype, req.dim_qk, req.dim_v, nwg)
        grid, major = _key_tile_grid(req, 64 * nwg, "tiles")
        fused = compiler.load_kernel(var, "attn_bwd_fused_wgmma", idx, compiler.WGMMA_ARCH, smem)
        convert = compiler.load_kernel(var, "attn_bwd_dq_convert", idx, compiler.WGMMA_ARCH)
        _backward_fused(fused, convert, grid, major, 128 * nwg, smem, common, dq, dk, dv, scales, req)
        return dq, dk, dv
    var = compiler.bwd_mma_variant(req.dtype, req.dim_qk, req.dim_v)
    smem_kv, smem_q = compiler.bwd_mma_smem_bytes(req.dim_qk, req.dim_v)
    block_keys = compiler.bwd_block_keys(req.dim_qk, req.dim_v)  # keys per dK/dV (or fused) block
    threads = 32 * compiler.bwd_warps(req.dim_qk, req.dim_v)
    smem = compiler.bwd_fused_smem_bytes(req.dim_qk, req.dim_v)
    if compiler.bwd_fused(req.dim_qk, req.dim_v, arch) and smem <= _smem_limit(dev):
        # One pass over the (key tile, query tile) pairs.
        # (At head dim 128 on parts with 99 KiB per block, sm_86 / sm_89, the split kernels run.)
        grid, major = _key_tile_grid(req, block_keys, MMA_BWD_ORDER)
        fused = compiler.load_kernel(var, "attn_bwd_fused_mma", idx, arch, smem)
        convert = compiler.load_kernel(var, "attn_bwd_dq_convert", idx, arch)
        _backward_fused(fused, convert, grid, major, threads, smem, common, dq, dk, dv, scales, req)
        return dq, dk, dv
    kern = compiler.load_kernel(var, "attn_bwd_dkdv_mma", idx, arch, smem_kv)
    grid, major = _key_tile_grid(req, block_keys, MMA_BWD_ORDER)
    launch(
        kern, dev, grid, threads, smem_kv, *common, ptr(dk),
        ptr(dv),
        _i32(req.heads_q), _i32(req.heads_kv), _i32(req.nq), _i32(req.nk), *scales, _i32(major),
        *mask_args(req),
    )  # fmt: skip
    kern = compiler.load_kernel(var, "attn_bwd_dq_mma", idx, arch, smem_q)
    launch(
        kern, dev, _grid(req, ceil_div(req.nq, 64), req.heads_q), 128, smem_q, *common, ptr(dq),
        _i32(req.heads_q), _i32(req.group), _i32(req.nq), _i32(req.nk), *scales, _i32(_tile_major(req)),
        *mask_args(req),
    )  # fmt: skip
    return dq, dk, dv


def _backward_fused(
    fused: Any, convert: Any, grid: tuple[int, int, int], major: bool, threads: int, smem: int,
    common: tuple[Any, ...], dq: Any, dk: Any, dv: Any, scales: tuple[Any, Any], req: Request,
) -> None:  # fmt: skip
    """A fused backward kernel (wgmma or mma.sync) writing dK, dV and adding dQ's shares into a zeroed
    float32 buffer, then attn_bwd_dq_convert scaling and rounding that buffer into ``dq``."""
    import torch

    dev = dq.device
    dqacc = torch.zeros((req.batch, req.heads_q, req.nq, req.dim_qk), dtype=torch.float32, device=dev)
    launch(
        fused, dev, grid, threads, smem, *common, ptr(dk),
        ptr(dv), ptr(dqacc), _i32(req.heads_q), _i32(req.heads_kv), _i32(req.nq), _i32(req.nk), *scales,
        _i32(major), *mask_args(req),
    )  # fmt: skip
    n = dqacc.numel()
    launch(convert, dev, (ceil_div(n, 4 * 256),), 256, 0, ptr(dqacc), ptr(dq), i64(n), scales[0])


def _driver_reason() -> str | None:
    """None when the CUDA driver sees at least one GPU, else why not (asks the driver, not torch)."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err == driver.CUresult.CUDA_SUCCESS:
            err, count = driver.cuDeviceGetCount()
            if err == driver.CUresult.CUDA_SUCCESS and count > 0:
                return None
        return f"no CUDA GPU is visible to the driver ({err})"
    except Exception as exc:  # no libcuda.so: no NVIDIA driver on this machine
        return f"no NVIDIA driver / CUDA GPU on this machine ({type(exc).__name__})"
