"""Tile sizes of every cuda kernel family and the shared memory each tile needs.

One table per family gives its default tile for each (Dqk, Dv); a tuning setting
(attnhub/settings.py) may override it; a ``*_smem_bytes`` function gives a tile's dynamic shared memory; and
:func:`tile_for` walks a forward's default and smaller fallback tiles to the first that fits a GPU.
The measurements behind the defaults are in docs/backends/cuda.md and docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Any

from attnhub import settings
from attnhub.errors import AttnhubError
from attnhub.request import Request


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


#: Head dims (Dqk, Dv) served by the tensor-core kernels; anything else up to 128 uses SIMT.
MMA_DIMS = (64, 128)

# --- forwards: (warps, keys per tile, 16-row blocks per warp) -----------------------------------

#: mma.sync forward for float16 / bfloat16 (fwd_mma.cu), from tools/dev/cuda_tune.py (bf16, L = 4096).
MMA_CONFIGS = {(64, 64): (4, 128, 2), (64, 128): (8, 64, 1), (128, 64): (8, 64, 1), (128, 128): (4, 64, 2)}
#: float32 forward on tensor cores in 3xTF32 (fwd_tf32.cu), from tools/dev/cuda_f32.py (L = 4096).
TF32_CONFIGS = {(64, 64): (4, 64, 2), (64, 128): (8, 64, 1), (128, 64): (8, 64, 1), (128, 128): (8, 32, 2)}
#: 8-key blocks per P.V chunk with those tiles where not the kernel's default (4 with one row block per
#: warp, else 2): the fastest of a sweep of the chunk sizes.
TF32_PVC = {(64, 64): 8, (128, 128): 4}
#: float32 forward on float16 tensor cores in 3xFP16 (fwd_f16x3.cu), from tools/dev/cuda_f32.py. At
#: D = 128 the tile needs 192 KB of shared memory (smaller GPUs fall back); the mixed head dims take
#: D = 128's tile (not measured).
F16X3_CONFIGS = {(64, 64): (4, 64, 2), (64, 128): (8, 64, 1), (128, 64): (8, 64, 1), (128, 128): (8, 64, 1)}
#: Warpgroup forward (fwd_wgmma.cu, sm_90a): (warpgroups per block, keys per tile), from
#: tools/dev/cuda_wgmma_probe.py (bf16); at D = 64 the 128-key tile needs too many registers for two
#: blocks per SM and ran slower than the 64-key one.
WGMMA_CONFIGS = {(64, 64): (2, 64), (64, 128): (2, 64), (128, 64): (2, 128), (128, 128): (2, 128)}
#: (Dqk, Dv) whose wgmma forward runs the pipelined loop (S of a tile issued with P V of the one
#: before, the softmax overlapping P V; three K / V buffers): faster at D = 64, mixed at D = 128.
WGMMA_PIPE_DIMS = frozenset({(64, 64)})

#: Smaller forward tiles tried, in order, when the default does not fit the GPU's shared memory.
MMA_FALLBACKS = ((8, 64, 1), (4, 64, 1), (4, 32, 1))
TF32_FALLBACKS = ((4, 64, 1), (4, 32, 1))
F16X3_FALLBACKS = ((8, 32, 1), (4, 32, 1))

# --- backwards ------------------------------------------------------------------------------------

#: (query rows per dK/dV step, keys per dQ step) of the mma.sync backward, bwd_mma.cu's KB_Q / QB_N;
#: (64, 64) was faster than (32, 32) (tools/dev/cuda_sweep.py).
BWD_STEPS = (64, 64)
#: (KB_Q, QB_N, KRB) per (Dqk, Dv) where it differs from (*BWD_STEPS, 1); KRB = 16-key row blocks per
#: warp in the dK/dV kernel (2 halves its shared-memory reads per mma, and needs the registers of D = 64).
BWD_CONFIGS: dict[tuple[int, int], tuple[int, int, int]] = {}
#: Warpgroups (64 keys each) per block of the Hopper backward (bwd_wgmma.cu) per (Dqk, Dv); each
#: warpgroup adds Dqk / warpgroups columns of dQ. Two were faster than one at both head dims
#: (tools/dev/cuda_wgmma_probe.py --bwd).
BWD_WGMMA_WARPGROUPS = {(64, 64): 2, (64, 128): 2, (128, 64): 2, (128, 128): 2}
#: (Dqk, Dv) whose Hopper backward issues the dQ products while dK / dV's are in flight (BWD_OVERLAP:
#: more registers; a little faster at D = 64, no change at D = 128).
BWD_WGMMA_OVERLAP = frozenset({(64, 64)})


# --- the tiles, with their overrides ---------------------------------------------------------------


def _tile_override(name: str) -> tuple[int, int, int] | None:
    """``warps,bn[,rb]`` from the setting ``name`` (tuning), or None."""
    vals = settings.value(name)
    if vals is None:
        return None
    return vals[0], vals[1], vals[2] if len(vals) > 2 else 1


def mma_config(dqk: int, dv: int) -> tuple[int, int, int]:
    """(warps, keys per tile, row blocks per warp) of the tensor-core forward for (Dqk, Dv).

    ``ATTNHUB_CUDA_MMA=warps,bn[,rb]`` overrides it (tuning)."""
    return _tile_override("ATTNHUB_CUDA_MMA") or MMA_CONFIGS[(dqk, dv)]


def tf32_config(dqk: int, dv: int) -> tuple[int, int, int]:
    """(warps, keys per tile, row blocks per warp) of the 3xTF32 float32 forward for (Dqk, Dv).

    ``ATTNHUB_CUDA_TF32=warps,bn[,rb]`` overrides it (tuning)."""
    return _tile_override("ATTNHUB_CUDA_TF32") or TF32_CONFIGS[(dqk, dv)]


def tf32_pvc(dqk: int, dv: int, config: tuple[int, int, int]) -> int:
    """8-key blocks per P V chunk of the 3xTF32 forward with tile ``config``: ``ATTNHUB_CUDA_TF32_PVC``
    (tuning), else TF32_PVC for the default tile, else 0 (the kernel's default: 4 with one row block
    per warp, else 2)."""
    warps, bn, rb = config
    try:
        pvc = settings.value("ATTNHUB_CUDA_TF32_PVC")
    except settings.SettingError:
        pvc = -1  # reported below, with the tile's count of 8-key blocks
    if pvc < 0 or (pvc and (bn // 8) % pvc):
        text = settings.raw("ATTNHUB_CUDA_TF32_PVC")
        raise AttnhubError(
            f"ATTNHUB_CUDA_TF32_PVC takes a divisor of the tile's {bn // 8} 8-key blocks, got {text!r}"
        )
    if not pvc and (warps, bn, rb) == TF32_CONFIGS.get((dqk, dv)):
        pvc = TF32_PVC.get((dqk, dv), 0)
    return pvc


def f16x3_config(dqk: int, dv: int) -> tuple[int, int, int]:
    """(warps, keys per tile, row blocks per warp) of the 3xFP16 float32 forward for (Dqk, Dv).

    ``ATTNHUB_CUDA_F16X3=warps,bn[,rb]`` overrides it (tuning)."""
    return _tile_override("ATTNHUB_CUDA_F16X3") or F16X3_CONFIGS[(dqk, dv)]


def wgmma_config(dqk: int, dv: int) -> tuple[int, int]:
    """(warpgroups, keys per tile) of the wgmma forward; ``ATTNHUB_CUDA_WGMMA=wg,bn`` overrides it."""
    vals = settings.value("ATTNHUB_CUDA_WGMMA")
    if vals is None:
        return WGMMA_CONFIGS[(dqk, dv)]
    nwg, bn = vals
    if nwg not in (1, 2, 3) or bn not in (64, 128):
        text = settings.raw("ATTNHUB_CUDA_WGMMA")
        raise AttnhubError(f"ATTNHUB_CUDA_WGMMA: warpgroups 1-3 and keys per tile 64 or 128, got {text!r}")
    return nwg, bn


def wgmma_pipelined(dqk: int, dv: int) -> bool:
    """Whether the wgmma forward for (Dqk, Dv) runs the pipelined loop; ``ATTNHUB_CUDA_WGMMA_PIPE=0|1``
    overrides ``WGMMA_PIPE_DIMS``."""
    pipe = settings.value("ATTNHUB_CUDA_WGMMA_PIPE")
    return pipe if pipe is not None else (dqk, dv) in WGMMA_PIPE_DIMS


def bwd_config(dqk: int, dv: int) -> tuple[int, int, int]:
    """(KB_Q, QB_N, KRB) of the tensor-core backward for (Dqk, Dv).

    ``ATTNHUB_CUDA_BWD_STEPS=kb_q,qb_n[,krb]`` overrides it (tuning)."""
    vals = settings.value("ATTNHUB_CUDA_BWD_STEPS")
    if vals is None:
        return BWD_CONFIGS.get((dqk, dv), (*BWD_STEPS, 1))
    kb_q, qb_n = vals[0], vals[1]
    krb = vals[2] if len(vals) > 2 else 1
    if kb_q not in (16, 32, 64) or qb_n not in (16, 32, 64) or krb not in (1, 2) or len(vals) > 3:
        text = settings.raw("ATTNHUB_CUDA_BWD_STEPS")
        raise AttnhubError(f"ATTNHUB_CUDA_BWD_STEPS: steps must be 16, 32 or 64 and krb 1 or 2, got {text!r}")
    return kb_q, qb_n, krb


def bwd_warps(dqk: int, dv: int) -> int:
    """Warps of the dK/dV and fused backward kernels: 4 (each owns 16 keys per row block), or 4 / 8
    from ``ATTNHUB_CUDA_BWD_WARPS``. 8 warps make a block own twice the keys: half the Q / dO tile
    loads per key and, fused, half the dQ atomics; it was slower for the default forms (fused at
    D = 64, split at D = 128; docs/benchmarks.md), so 4 is the default."""
    warps = settings.value("ATTNHUB_CUDA_BWD_WARPS")
    return 4 if warps is None else int(warps)


def bwd_block_keys(dqk: int, dv: int) -> int:
    """Keys per block of the dK/dV and fused kernels (16 per row block, KRB row blocks per warp)."""
    return 16 * bwd_warps(dqk, dv) * bwd_config(dqk, dv)[2]


def bwd_wgmma_warpgroups(dqk: int, dv: int) -> int:
    """Warpgroups of the Hopper backward; ``ATTNHUB_CUDA_BWD_WG=1|2`` overrides."""
    nwg = settings.value("ATTNHUB_CUDA_BWD_WG")
    return BWD_WGMMA_WARPGROUPS[(dqk, dv)] if nwg is None else int(nwg)


# --- shared memory ---------------------------------------------------------------------------------


def mma_smem_bytes(dqk: int, dv: int, config: tuple[int, int, int]) -> int:
    """Dynamic shared memory of the tensor-core forward: Q tile plus double-buffered K and V tiles."""
    warps, bn, rb = config
    return 2 * (16 * rb * warps * dqk + 2 * bn * (dqk + dv))


def tf32_smem_bytes(dqk: int, dv: int, config: tuple[int, int, int]) -> int:
    """Dynamic shared memory of the 3xTF32 forward: Q tile plus double-buffered K and V tiles (rows
    padded by 4 floats)."""
    warps, bn, rb = config
    return 4 * (16 * rb * warps * (dqk + 4) + 2 * bn * (dqk + 4 + dv + 4))


def f16x3_smem_bytes(dqk: int, dv: int, config: tuple[int, int, int]) -> int:
    """Dynamic shared memory of the 3xFP16 forward: Q hi / lo plus double-buffered K, V hi / lo
    (float16)."""
    warps, bn, rb = config
    return 2 * (2 * 16 * rb * warps * dqk + 2 * 2 * bn * (dqk + dv))


def wgmma_smem_bytes(dqk: int, dv: int, config: tuple[int, int]) -> int:
    """Dynamic shared memory of the wgmma forward: Q tile, K and V buffers (two, three when pipelined),
    1 KB alignment slack."""
    nwg, bn = config
    stages = 3 if wgmma_pipelined(dqk, dv) else 2
    return 2 * (64 * nwg * dqk + stages * bn * (dqk + dv)) + 1024


def simt_fwd_smem_bytes(dtype: str, dqk: int, dv: int) -> int:
    """Dynamic shared memory of the SIMT forward (fwd_simt.cu's tiles of 32 rows)."""
    el = 8 if dtype == "float64" else 4
    return el * (32 * dqk + 32 * (dqk + 1) + 32 * 32 * ceil_div(dv, 32))


def bwd_mma_smem_bytes(dqk: int, dv: int) -> tuple[int, int]:
    """Dynamic shared memory of the dK/dV and dQ tensor-core kernels (tile sizes of bwd_mma.cu)."""
    kb_q, qb_n, _ = bwd_config(dqk, dv)
    dkdv = 2 * (bwd_block_keys(dqk, dv) * (dqk + dv) + 2 * kb_q * (dqk + dv)) + 4 * 4 * kb_q
    dq = 2 * (64 * (dqk + dv) + 2 * qb_n * (dqk + dv))
    return dkdv, dq


def bwd_fused_smem_bytes(dqk: int, dv: int) -> int:
    """Dynamic shared memory of the fused backward: the dK/dV kernel's plus the staged dS tile."""
    return bwd_mma_smem_bytes(dqk, dv)[0] + 2 * bwd_block_keys(dqk, dv) * bwd_config(dqk, dv)[0]


def bwd_wgmma_smem_bytes(dqk: int, dv: int, nwg: int) -> int:
    """Dynamic shared memory of the Hopper backward: K, V, two Q and dO tiles, dS^T, lse and delta
    (two 64-query buffers each), 1 KB alignment slack."""
    kb_n = 64 * nwg
    return 2 * (kb_n * (dqk + dv) + 2 * 64 * (dqk + dv) + kb_n * 64) + 4 * 4 * 64 + 1024


def simt_bwd_smem_bytes(dtype: str, dqk: int, dv: int) -> int:
    """Dynamic shared memory of the SIMT backward (bwd_simt.cu's tiles of 32 keys)."""
    el = 8 if dtype == "float64" else 4
    return el * (32 * (dqk + 1) * 2 + 32 * (dv + 1) * 2 + 2 * 32 * 33 + 64)


# --- fitting a forward tile to a GPU ---------------------------------------------------------------

#: Per tiled forward family: its tile (default or override), its fallbacks and its shared memory.
FORWARD_TILES: dict[str, tuple[Any, tuple[tuple[int, int, int], ...], Any]] = {
    "mma": (mma_config, MMA_FALLBACKS, mma_smem_bytes),
    "tf32": (tf32_config, TF32_FALLBACKS, tf32_smem_bytes),
    "f16x3": (f16x3_config, F16X3_FALLBACKS, f16x3_smem_bytes),
}


def tile_for(family: str, req: Request, limit: int) -> tuple[int, int, int] | None:
    """The first of ``family``'s tiles (its default, then the fallbacks) that fits in ``limit`` bytes
    of shared memory, or None."""
    config, fallbacks, smem = FORWARD_TILES[family]
    for c in (config(req.dim_qk, req.dim_v), *fallbacks):
        if smem(req.dim_qk, req.dim_v, c) <= limit:
            return c
    return None
