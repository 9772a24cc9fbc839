"""Which kernel runs a request: :func:`forward_kernel` and :func:`backward_kernel` take a request, the
GPU's architecture and its shared-memory limit and return the kernel family and the tile that serve
it; :func:`smem_reasons` says which requests no tile fits. The tiles themselves are in ``tiles.py``.

Forward families: ``wgmma`` (half types, sm_90), ``mma`` (half types, mma.sync), ``f16x3`` and
``tf32`` (float32 on tensor cores), ``simt`` (everything else). Backward families: ``wgmma``
(sm_90), ``fused`` and ``split`` (mma.sync), ``simt``.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnhub import settings
from attnhub.request import Request
from attnhub_backends.cuda.tiles import (
    F16X3_FALLBACKS,
    FORWARD_TILES,
    MMA_DIMS,
    MMA_FALLBACKS,
    TF32_FALLBACKS,
    bwd_block_keys,
    bwd_config,
    bwd_fused_smem_bytes,
    bwd_mma_smem_bytes,
    bwd_warps,
    bwd_wgmma_smem_bytes,
    bwd_wgmma_warpgroups,
    f16x3_smem_bytes,
    mma_smem_bytes,
    simt_bwd_smem_bytes,
    simt_fwd_smem_bytes,
    tf32_smem_bytes,
    tile_for,
    wgmma_config,
    wgmma_smem_bytes,
)

HALF = ("float16", "bfloat16")
#: Float32 tensor-core forwards, ATTNHUB_CUDA_F32's values besides ``simt``.
F32_KERNELS = ("f16x3", "tf32")
#: Below this much work, B * Hq * Nq * Nk * (Dqk + Dv), the float32 default is 3xTF32 (one launch)
#: rather than 3xFP16 (three launches and two allocations, which cost more host time than small
#: calls save; tools/dev/cuda_f16x3_prep.py, docs/benchmarks.md).
F16X3_MIN_WORK = 4e9
#: Head dims (Dqk) whose mma.sync backward runs fused by default on sm_90+ (vector reductions): at
#: D = 128 its dQ atomics cost more than the two recomputed products save (tools/dev/cuda_sweep.py).
BWD_FUSED_DIMS = frozenset({64})


@dataclass(frozen=True)
class ForwardKernel:
    """The forward that serves a request: its family, its tile and its dynamic shared memory.

    ``tile``: (warps, keys per tile, row blocks per warp) for mma / tf32 / f16x3, (warpgroups, keys
    per tile) for wgmma, None for simt."""

    family: str
    tile: tuple[int, ...] | None
    smem: int


@dataclass(frozen=True)
class BackwardKernel:
    """The backward that serves a request. ``smem``, ``block_keys`` and ``threads`` are those of the
    kernel with one block per key tile (wgmma, fused, split's dK/dV, simt); ``dq_smem`` is split's dQ
    kernel's; ``warpgroups`` the wgmma kernel's."""

    family: str
    smem: int
    block_keys: int
    threads: int
    dq_smem: int = 0
    warpgroups: int = 0


def modified(req: Request) -> bool:
    """True when ``req`` has score modifiers (softcap, bias: SPEC §9). Only the wgmma (half types,
    sm_90) and SIMT kernels are built with them: such a request runs on those."""
    return req.softcap is not None or req.bias is not None


def use_mma(req: Request) -> bool:
    """True when a tensor-core kernel serves the half-type ``req`` (head dims 64/128)."""
    return req.dtype in HALF and req.dim_qk in MMA_DIMS and req.dim_v in MMA_DIMS


def f32_kernel(req: Request) -> str | None:
    """The tensor-core forward serving a float32 request with head dims 64 / 128: ``f16x3`` (3xFP16)
    from F16X3_MIN_WORK of work on, ``tf32`` (3xTF32) below; ``ATTNHUB_CUDA_F32`` forces either, or
    the SIMT kernel with ``simt`` (then None, as for requests no tensor-core kernel serves)."""
    mode = settings.value("ATTNHUB_CUDA_F32")
    if req.dtype != "float32" or req.dim_qk not in MMA_DIMS or req.dim_v not in MMA_DIMS:
        return None
    if mode:
        return None if mode == "simt" else mode
    work = req.batch * req.heads_q * req.nq * req.nk * (req.dim_qk + req.dim_v)
    return "f16x3" if work >= F16X3_MIN_WORK else "tf32"


def use_tf32(req: Request) -> bool:
    """True when the 3xTF32 tensor-core forward serves ``req``."""
    return f32_kernel(req) == "tf32"


def use_f16x3(req: Request) -> bool:
    """True when the 3xFP16 tensor-core forward serves ``req`` (float32, head dims 64 / 128)."""
    return f32_kernel(req) == "f16x3"


def simt_backward_forced() -> bool:
    """``ATTNHUB_CUDA_BWD=simt``. Read as text: a misspelt value is reported where the mma.sync
    backward is chosen (:func:`bwd_fused`), not by ``check()``."""
    return settings.raw("ATTNHUB_CUDA_BWD") == "simt"


def wgmma_forward_tile(req: Request, arch: str, limit: int) -> tuple[int, int] | None:
    """The wgmma forward's (warpgroups, keys per tile) where it serves the half-type request: on
    compute capability 9.0 where its tiles fit, unless ``ATTNHUB_CUDA_FWD=mma`` forces the mma.sync
    kernel (comparisons, tests; ``=wgmma`` is the default); else None (the mma.sync kernel runs)."""
    mode = settings.value("ATTNHUB_CUDA_FWD")
    if mode == "mma" or arch != "sm_90":
        return None
    cfg = wgmma_config(req.dim_qk, req.dim_v)
    return cfg if wgmma_smem_bytes(req.dim_qk, req.dim_v, cfg) <= limit else None


def forward_kernel(req: Request, arch: str, limit: int) -> ForwardKernel:
    """The forward kernel and tile for ``req`` on a GPU of ``arch`` with ``limit`` bytes of shared
    memory per block: wgmma or mma.sync for half types at head dims 64 / 128, 3xFP16 or 3xTF32 for
    float32 there, SIMT otherwise. A tiled forward takes its default tile, else the first fallback
    that fits, else its default (``check()`` declines such requests first: :func:`smem_reasons`)."""
    dqk, dv = req.dim_qk, req.dim_v
    if use_mma(req):
        wg = wgmma_forward_tile(req, arch, limit)
        if wg is not None:
            return ForwardKernel("wgmma", wg, wgmma_smem_bytes(dqk, dv, wg))
        family = "mma"
    else:
        family = f32_kernel(req) or "simt"
    if modified(req):
        family = "simt"
    if family == "simt":
        return ForwardKernel("simt", None, simt_fwd_smem_bytes(req.dtype, dqk, dv))
    config, _, smem = FORWARD_TILES[family]
    cfg = tile_for(family, req, limit) or config(dqk, dv)
    return ForwardKernel(family, cfg, smem(dqk, dv, cfg))


def use_wgmma_backward(arch: str) -> bool:
    """The wgmma backward serves half types on compute capability 9.0 unless ``ATTNHUB_CUDA_BWD`` names
    another kernel (fused, split: mma.sync; simt). Read as text, as :func:`simt_backward_forced`."""
    return arch == "sm_90" and (settings.raw("ATTNHUB_CUDA_BWD") or "") in ("", "wgmma")


def bwd_fused(dqk: int, dv: int, arch: str = "sm_90") -> bool:
    """Whether the mma.sync backward runs fused (one kernel, dQ added into a float32 buffer with
    atomics) rather than split (dK/dV and dQ kernels, deterministic). ``ATTNHUB_CUDA_BWD=fused`` or
    ``=split`` chooses; by default fused for ``BWD_FUSED_DIMS`` on sm_90+ (on older parts each dQ
    pair is two scalar atomics: not measured, so split). The fused kernel needs 64-query steps."""
    mode = settings.value("ATTNHUB_CUDA_BWD") or ""
    if bwd_config(dqk, dv)[0] != 64 or mode == "split":
        return False
    return mode == "fused" or (dqk in BWD_FUSED_DIMS and int(arch.removeprefix("sm_")[:-1] or 0) >= 9)


def backward_kernel(req: Request, arch: str, limit: int) -> BackwardKernel:
    """The backward kernel for ``req`` on a GPU of ``arch`` with ``limit`` bytes of shared memory per
    block: for half types at head dims 64 / 128 the wgmma kernel on sm_90 where it fits, else the
    fused mma.sync kernel where :func:`bwd_fused` and its shared memory allow, else the split ones;
    SIMT for everything else and under ``ATTNHUB_CUDA_BWD=simt``."""
    dqk, dv = req.dim_qk, req.dim_v
    simt = BackwardKernel("simt", simt_bwd_smem_bytes(req.dtype, dqk, dv), 32, 256)
    if not use_mma(req) or simt_backward_forced():
        return simt
    nwg = bwd_wgmma_warpgroups(dqk, dv)
    smem = bwd_wgmma_smem_bytes(dqk, dv, nwg)
    if use_wgmma_backward(arch) and smem <= limit:
        return BackwardKernel("wgmma", smem, 64 * nwg, 128 * nwg, warpgroups=nwg)
    if modified(req):
        return simt
    smem_kv, smem_q = bwd_mma_smem_bytes(dqk, dv)
    block_keys = bwd_block_keys(dqk, dv)
    threads = 32 * bwd_warps(dqk, dv)
    smem = bwd_fused_smem_bytes(dqk, dv)
    if bwd_fused(dqk, dv, arch) and smem <= limit:
        return BackwardKernel("fused", smem, block_keys, threads)
    return BackwardKernel("split", smem_kv, block_keys, threads, dq_smem=smem_q)


def smem_reasons(req: Request, limit: int) -> list[str]:
    """Requests whose kernels need more shared memory than ``limit``, the GPU's per-block maximum."""
    need = []
    if modified(req):
        # the SIMT kernels serve what the wgmma ones (where they fit) do not
        need.append(("forward", simt_fwd_smem_bytes(req.dtype, req.dim_qk, req.dim_v)))
        if req.needs_grad or req.bias_grad:
            need.append(("backward", simt_bwd_smem_bytes(req.dtype, req.dim_qk, req.dim_v)))
    elif use_mma(req):
        if tile_for("mma", req, limit) is None:
            need.append(("forward", mma_smem_bytes(req.dim_qk, req.dim_v, MMA_FALLBACKS[-1])))
        if req.needs_grad and not simt_backward_forced():
            # the split kernels (the fused one, larger, is used only where it fits)
            need.append(("backward", max(bwd_mma_smem_bytes(req.dim_qk, req.dim_v))))
    elif use_tf32(req):
        if tile_for("tf32", req, limit) is None:
            need.append(("forward", tf32_smem_bytes(req.dim_qk, req.dim_v, TF32_FALLBACKS[-1])))
    elif use_f16x3(req):
        if tile_for("f16x3", req, limit) is None:
            need.append(("forward", f16x3_smem_bytes(req.dim_qk, req.dim_v, F16X3_FALLBACKS[-1])))
    else:
        need.append(("forward", simt_fwd_smem_bytes(req.dtype, req.dim_qk, req.dim_v)))
    if req.needs_grad and not modified(req) and (not use_mma(req) or simt_backward_forced()):
        need.append(("backward", simt_bwd_smem_bytes(req.dtype, req.dim_qk, req.dim_v)))
    return [
        f"the {what} kernel needs {n} bytes of shared memory per block, {req.device} allows {limit} "
        f"(use smaller head dims{' or float32' if req.dtype == 'float64' else ''})"
        for what, n in need
        if n > limit
    ]
