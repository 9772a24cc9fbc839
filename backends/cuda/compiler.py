"""NVRTC compilation of the CUDA kernels through ``cuda.core``, with a disk cache of cubins.

A kernel *variant* is one kernel source plus a few ``#define`` lines (dtype, head dims, tile sizes).
Its cubin is cached under ``$ATTNHUB_CACHE_DIR`` (default ``~/.cache/attnhub/cuda``) in a file named
by the SHA-256 of the full source text, the compiler options, the GPU architecture and the NVRTC
version, so a second process loads the cubin without compiling, and any change to a kernel, an
option or the toolchain compiles afresh. Nothing here needs a GPU except :func:`load_kernel`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnhub.errors import AttnhubError

KERNEL_DIR = Path(__file__).with_name("kernels")
DTYPE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}
#: Head dims (Dqk, Dv) served by the tensor-core kernel; anything else up to 128 uses SIMT.
MMA_DIMS = (64, 128)
# (warps, keys per tile, 16-row blocks per warp), chosen with benchmarks/cuda_tune.py on an H100
# (bf16, L = 4096); see docs/backends/cuda.md.
MMA_CONFIGS = {(64, 64): (4, 128, 2), (64, 128): (8, 64, 1), (128, 64): (8, 64, 1), (128, 128): (4, 64, 2)}
# float32 forward on tensor cores (3xTF32, fwd_tf32.cu): (warps, keys per tile, 16-row blocks per warp),
# chosen with benchmarks/cuda_f32.py on an H100 (L = 4096); see docs/backends/cuda.md.
TF32_CONFIGS = {(64, 64): (4, 64, 2), (64, 128): (8, 64, 1), (128, 64): (8, 64, 1), (128, 128): (8, 32, 2)}
# 8-key blocks per P·V chunk with those tiles where not the kernel's default (4 with one row block per
# warp, else 2): the sweep's fastest (4,64,2/8 and 8,32,2/4; docs/benchmarks.md, 19:44 UTC).
TF32_PVC = {(64, 64): 8, (128, 128): 4}
_STD = "c++17"
_MMA_HEADERS = ("common.cuh", "mma.cuh", "frag.cuh")
_MMA_BWD_HEADERS = (*_MMA_HEADERS, "bwd.cuh")

#: Number of NVRTC compilations this process ran (tests read it to prove cache hits).
COMPILES = 0
_lock = threading.Lock()
_kernels: dict[tuple[str, int], Any] = {}
_smem_allowed: dict[tuple[str, int], int] = {}


@dataclass(frozen=True)
class Variant:
    """One compiled program: a source file, its defines and the kernels it exports."""

    source: str
    defines: tuple[tuple[str, int], ...]
    kernels: tuple[str, ...]
    headers: tuple[str, ...] = ("common.cuh",)

    @property
    def name(self) -> str:
        tail = "_".join(f"{k.lower()}{v}" for k, v in self.defines)
        return f"{Path(self.source).stem}_{tail}"

    def text(self) -> str:
        """The whole translation unit NVRTC compiles (defines, common header, kernel source)."""
        lines = [f"#define {k} {v}" for k, v in self.defines]
        parts = [(KERNEL_DIR / name).read_text() for name in (*self.headers, self.source)]
        return "\n".join(lines) + "\n" + "\n".join(parts)


def _tile_override(var: str) -> tuple[int, int, int] | None:
    """``warps,bn[,rb]`` from the environment variable ``var`` (tuning), or None."""
    env = os.environ.get(var)
    if not env:
        return None
    try:
        vals = [int(x) for x in env.split(",")]
        return vals[0], vals[1], vals[2] if len(vals) > 2 else 1
    except (ValueError, IndexError):
        raise AttnhubError(
            f"{var} takes 'warps,keys_per_tile[,row_blocks]' (integers), got {env!r}"
        ) from None


def mma_config(dqk: int, dv: int) -> tuple[int, int, int]:
    """(warps, keys per tile, row blocks per warp) of the tensor-core forward for (Dqk, Dv).

    ``ATTNHUB_CUDA_MMA=warps,bn[,rb]`` overrides it (tuning)."""
    return _tile_override("ATTNHUB_CUDA_MMA") or MMA_CONFIGS[(dqk, dv)]


def mma_variant(
    dtype: str,
    dqk: int,
    dv: int,
    config: tuple[int, int, int] | None = None,
    o_f32: bool = False,
    scale_pos: bool = True,
) -> Variant:
    """The tensor-core forward; ``o_f32``: it writes a float32 output (kept for a backward);
    ``scale_pos``: the softmax scale is > 0, so it can be folded into exp2's FFMA after the row max."""
    warps, bn, rb = config or mma_config(dqk, dv)
    defines = (
        ("ATT_DTYPE", DTYPE_CODES[dtype]), ("DQK", dqk), ("DV", dv), ("NWARPS", warps), ("BN", bn), ("RB", rb),
    )  # fmt: skip
    if o_f32:
        defines += (("O_F32", 1),)
    if scale_pos:
        defines += (("SCALE_POS", 1),)
    return Variant("fwd_mma.cu", defines, ("attn_fwd_mma",), _MMA_HEADERS)


#: Warpgroup forward (fwd_wgmma.cu, sm_90a): (warpgroups per block, keys per tile) per (Dqk, Dv), from
#: benchmarks/cuda_wgmma_probe.py on an H100 (bf16, L = 4k / 16k; docs/benchmarks.md): at D = 64 the
#: 128-key tile needs 158 registers (one block per SM) and ran 0.93-1.02x flash, the 64-key tile 1.04-1.16x.
WGMMA_CONFIGS = {(64, 64): (2, 64), (64, 128): (2, 64), (128, 64): (2, 128), (128, 128): (2, 128)}
#: The architecture the wgmma kernels are built for (sm_90a code runs on compute capability 9.0 only).
WGMMA_ARCH = "sm_90a"
_WGMMA_HEADERS = ("common.cuh", "mma.cuh", "frag.cuh", "wgmma.cuh")
_WGMMA_BWD_HEADERS = (*_WGMMA_HEADERS, "bwd.cuh")


def wgmma_config(dqk: int, dv: int) -> tuple[int, int]:
    """(warpgroups, keys per tile) of the wgmma forward; ``ATTNHUB_CUDA_WGMMA=wg,bn`` overrides it."""
    env = os.environ.get("ATTNHUB_CUDA_WGMMA")
    if not env:
        return WGMMA_CONFIGS[(dqk, dv)]
    try:
        nwg, bn = (int(x) for x in env.split(","))
    except ValueError:
        raise AttnhubError(
            f"ATTNHUB_CUDA_WGMMA takes 'warpgroups,keys_per_tile' (integers), got {env!r}"
        ) from None
    if nwg not in (1, 2, 3) or bn not in (64, 128):
        raise AttnhubError(f"ATTNHUB_CUDA_WGMMA: warpgroups 1-3 and keys per tile 64 or 128, got {env!r}")
    return nwg, bn


def wgmma_variant(
    dtype: str,
    dqk: int,
    dv: int,
    config: tuple[int, int] | None = None,
    o_f32: bool = False,
    scale_pos: bool = True,
) -> Variant:
    """The Hopper forward (wgmma, sm_90a) for half types; arguments as :func:`mma_variant`."""
    nwg, bn = config or wgmma_config(dqk, dv)
    defines = (("ATT_DTYPE", DTYPE_CODES[dtype]), ("DQK", dqk), ("DV", dv), ("NWG", nwg), ("BN", bn))
    if wgmma_pipelined(dqk, dv):
        defines += (("PIPE", 1),)
    if o_f32:
        defines += (("O_F32", 1),)
    if scale_pos:
        defines += (("SCALE_POS", 1),)
    return Variant("fwd_wgmma.cu", defines, ("attn_fwd_wgmma",), _WGMMA_HEADERS)


#: (Dqk, Dv) whose wgmma forward runs the pipelined loop (S of a tile issued with P V of the one
#: before, the softmax overlapping P V; three K / V buffers). H100, bf16 (cuda_wgmma_probe.py, 02:05
#: UTC on 2026-11-23): D = 64 1.04-1.26x flash against 1.03-1.18x; D = 128 mixed (1.03-1.33x against
#: 1.05-1.32x, 0.91x of the plain loop at L = 16k), so plain there.
WGMMA_PIPE_DIMS = frozenset({(64, 64)})


def wgmma_pipelined(dqk: int, dv: int) -> bool:
    """Whether the wgmma forward for (Dqk, Dv) runs the pipelined loop; ``ATTNHUB_CUDA_WGMMA_PIPE=0|1``
    overrides ``WGMMA_PIPE_DIMS``."""
    env = os.environ.get("ATTNHUB_CUDA_WGMMA_PIPE", "")
    if env not in ("", "0", "1"):
        raise AttnhubError(f"ATTNHUB_CUDA_WGMMA_PIPE takes 0 or 1, got {env!r}")
    return env == "1" if env else (dqk, dv) in WGMMA_PIPE_DIMS


def wgmma_smem_bytes(dqk: int, dv: int, config: tuple[int, int]) -> int:
    """Dynamic shared memory of the wgmma forward: Q tile, K and V buffers (two, three when pipelined),
    1 KB alignment slack."""
    nwg, bn = config
    stages = 3 if wgmma_pipelined(dqk, dv) else 2
    return 2 * (64 * nwg * dqk + stages * bn * (dqk + dv)) + 1024


def tf32_config(dqk: int, dv: int) -> tuple[int, int, int]:
    """(warps, keys per tile, row blocks per warp) of the 3xTF32 float32 forward for (Dqk, Dv).

    ``ATTNHUB_CUDA_TF32=warps,bn[,rb]`` overrides it (tuning)."""
    return _tile_override("ATTNHUB_CUDA_TF32") or TF32_CONFIGS[(dqk, dv)]


def tf32_variant(dqk: int, dv: int, config: tuple[int, int, int] | None = None) -> Variant:
    warps, bn, rb = config or tf32_config(dqk, dv)
    defines = (
        ("ATT_DTYPE", DTYPE_CODES["float32"]),
        ("DQK", dqk),
        ("DV", dv),
        ("NWARPS", warps),
        ("BN", bn),
        ("RB", rb),
    )
    # 8-key blocks per P V chunk: the environment (tuning), else TF32_PVC for the default tile, else
    # the kernel's default (4 with one row block per warp, else 2)
    env = os.environ.get("ATTNHUB_CUDA_TF32_PVC", "") or "0"
    if not env.isdigit() or (int(env) and (bn // 8) % int(env)):
        raise AttnhubError(
            f"ATTNHUB_CUDA_TF32_PVC takes a divisor of the tile's {bn // 8} 8-key blocks, got {env!r}"
        )
    pvc = int(env)
    if not pvc and (warps, bn, rb) == TF32_CONFIGS.get((dqk, dv)):
        pvc = TF32_PVC.get((dqk, dv), 0)
    if pvc:
        defines += (("PVC", pvc),)
    return Variant("fwd_tf32.cu", defines, ("attn_fwd_tf32",), _MMA_HEADERS)


def tf32_smem_bytes(dqk: int, dv: int, config: tuple[int, int, int]) -> int:
    """Dynamic shared memory of the 3xTF32 forward: Q tile plus double-buffered K and V tiles (rows
    padded by 4 floats)."""
    warps, bn, rb = config
    return 4 * (16 * rb * warps * (dqk + 4) + 2 * bn * (dqk + 4 + dv + 4))


#: float32 forward on float16 tensor cores (3xFP16, fwd_f16x3.cu): (warps, keys per tile, 16-row blocks
#: per warp) per (Dqk, Dv). H100, L = 4096, B x H = 4 x 2048 / D (benchmarks/cuda_f32.py, 2026-11-23
#: 03:04 UTC, docs/benchmarks.md): D = 64 (4, 64, 2) 117.7 TFLOP/s against 98-108 for the other tiles;
#: D = 128 (8, 64, 1) 112.0 against 79-105 (192 KB of shared memory: smaller GPUs fall back). The
#: mixed head dims take D = 128's tile (not measured).
F16X3_CONFIGS = {(64, 64): (4, 64, 2), (64, 128): (8, 64, 1), (128, 64): (8, 64, 1), (128, 128): (8, 64, 1)}


def f16x3_config(dqk: int, dv: int) -> tuple[int, int, int]:
    """(warps, keys per tile, row blocks per warp) of the 3xFP16 float32 forward for (Dqk, Dv).

    ``ATTNHUB_CUDA_F16X3=warps,bn[,rb]`` overrides it (tuning)."""
    return _tile_override("ATTNHUB_CUDA_F16X3") or F16X3_CONFIGS[(dqk, dv)]


def f16x3_variant(
    dqk: int, dv: int, config: tuple[int, int, int] | None = None, scale_pos: bool = True
) -> Variant:
    """The 3xFP16 float32 forward and its two preparation kernels (absmax, split); ``scale_pos`` as
    in ``mma_variant``."""
    warps, bn, rb = config or f16x3_config(dqk, dv)
    defines = (
        ("ATT_DTYPE", DTYPE_CODES["float16"]), ("O_F32", 1), ("DQK", dqk), ("DV", dv),
        ("NWARPS", warps), ("BN", bn), ("RB", rb),
    )  # fmt: skip
    if scale_pos:
        defines += (("SCALE_POS", 1),)
    return Variant("fwd_f16x3.cu", defines, ("attn_absmax", "attn_split", "attn_fwd_f16x3"), _MMA_HEADERS)


def f16x3_smem_bytes(dqk: int, dv: int, config: tuple[int, int, int]) -> int:
    """Dynamic shared memory of the 3xFP16 forward: Q hi / lo plus double-buffered K, V hi / lo
    (float16)."""
    warps, bn, rb = config
    return 2 * (2 * 16 * rb * warps * dqk + 2 * 2 * bn * (dqk + dv))


#: (query rows per dK/dV step, keys per dQ step) of the tensor-core backward, bwd_mma.cu's KB_Q / QB_N;
#: (64, 64) was 7-19 % faster than (32, 32) on an H100 (benchmarks/cuda_sweep.py, docs/benchmarks.md).
BWD_STEPS = (64, 64)
#: (KB_Q, QB_N, KRB) per (Dqk, Dv) where it differs from (*BWD_STEPS, 1); KRB = 16-key row blocks per
#: warp in the dK/dV kernel (2 halves its shared-memory reads per mma, and needs the registers of D = 64).
BWD_CONFIGS: dict[tuple[int, int], tuple[int, int, int]] = {}


def bwd_config(dqk: int, dv: int) -> tuple[int, int, int]:
    """(KB_Q, QB_N, KRB) of the tensor-core backward for (Dqk, Dv).

    ``ATTNHUB_CUDA_BWD_STEPS=kb_q,qb_n[,krb]`` overrides it (tuning)."""
    env = os.environ.get("ATTNHUB_CUDA_BWD_STEPS")
    if not env:
        return BWD_CONFIGS.get((dqk, dv), (*BWD_STEPS, 1))
    try:
        vals = [int(x) for x in env.split(",")]
        kb_q, qb_n = vals[0], vals[1]
        krb = vals[2] if len(vals) > 2 else 1
    except (ValueError, IndexError):
        raise AttnhubError(
            f"ATTNHUB_CUDA_BWD_STEPS takes 'kb_q,qb_n[,krb]' (integers), got {env!r}"
        ) from None
    if kb_q not in (16, 32, 64) or qb_n not in (16, 32, 64) or krb not in (1, 2) or len(vals) > 3:
        raise AttnhubError(f"ATTNHUB_CUDA_BWD_STEPS: steps must be 16, 32 or 64 and krb 1 or 2, got {env!r}")
    return kb_q, qb_n, krb


def bwd_warps(dqk: int, dv: int) -> int:
    """Warps of the dK/dV and fused backward kernels: 4 (each owns 16 keys per row block), or 4 / 8
    from ``ATTNHUB_CUDA_BWD_WARPS``. 8 warps make a block own twice the keys: half the Q / dO tile
    loads per key and, fused, half the dQ atomics; on the H100 it was slower for the default forms
    (fused at D = 64, split at D = 128; docs/benchmarks.md), so 4 is the default."""
    env = os.environ.get("ATTNHUB_CUDA_BWD_WARPS")
    if not env:
        return 4
    if env not in ("4", "8"):
        raise AttnhubError(f"ATTNHUB_CUDA_BWD_WARPS takes 4 or 8, got {env!r}")
    return int(env)


def bwd_block_keys(dqk: int, dv: int) -> int:
    """Keys per block of the dK/dV and fused kernels (16 per row block, KRB row blocks per warp)."""
    return 16 * bwd_warps(dqk, dv) * bwd_config(dqk, dv)[2]


def bwd_mma_variant(dtype: str, dqk: int, dv: int) -> Variant:
    defines = (("ATT_DTYPE", DTYPE_CODES[dtype]), ("DQK", dqk), ("DV", dv))
    kb_q, qb_n, krb = bwd_config(dqk, dv)
    defines += (("KB_Q", kb_q), ("QB_N", qb_n), ("KRB", krb))
    warps = bwd_warps(dqk, dv)
    if warps != 4:
        defines += (("NWK", warps),)
    names = ("attn_bwd_dkdv_mma", "attn_bwd_dq_mma", "attn_bwd_dq_convert")
    if kb_q == 64:  # the fused kernel's dQ step gives each of the 4 warps 16 of the KB_Q queries
        names += ("attn_bwd_fused_mma",)
    return Variant("bwd_mma.cu", defines, names, _MMA_BWD_HEADERS)


def simt_variant(dtype: str, o_f32: bool = False) -> Variant:
    """SIMT forward; ``o_f32``: a half-type forward writes a float32 output (kept for a backward)."""
    defines: tuple[tuple[str, int], ...] = (("ATT_DTYPE", DTYPE_CODES[dtype]),)
    if o_f32:
        defines += (("O_F32", 1),)
    return Variant("fwd_simt.cu", defines, ("attn_fwd_simt",))


def bwd_variant(dtype: str, o_f32: bool = False) -> Variant:
    """SIMT backward and the delta kernel; ``o_f32``: delta reads a float32 output."""
    defines: tuple[tuple[str, int], ...] = (("ATT_DTYPE", DTYPE_CODES[dtype]),)
    if o_f32:
        defines += (("O_F32", 1),)
    return Variant("bwd_simt.cu", defines, ("attn_bwd_pre", "attn_bwd_simt"))


def all_variants() -> list[Variant]:
    """Every program the backend may compile (the CI compile check walks this list)."""
    out = [
        mma_variant(dt, a, b, MMA_CONFIGS[(a, b)])
        for dt in ("float16", "bfloat16")
        for a in MMA_DIMS
        for b in MMA_DIMS
    ]
    out += [tf32_variant(a, b, TF32_CONFIGS[(a, b)]) for a in MMA_DIMS for b in MMA_DIMS]
    out += [f16x3_variant(a, b, F16X3_CONFIGS[(a, b)]) for a in MMA_DIMS for b in MMA_DIMS]
    out += [f16x3_variant(64, 64, F16X3_CONFIGS[(64, 64)], scale_pos=False)]
    out += [simt_variant(dt) for dt in DTYPE_CODES]
    out += [bwd_variant(dt) for dt in DTYPE_CODES]
    # half inputs with a gradient to follow: float32 output and the delta kernel that reads it
    out += [
        mma_variant(dt, a, b, MMA_CONFIGS[(a, b)], o_f32=True)
        for dt in ("float16", "bfloat16")
        for a in MMA_DIMS
        for b in MMA_DIMS
    ]
    # a scale <= 0 (allowed by SPEC, rare): scaled before the row max
    out += [mma_variant(dt, 64, 64, MMA_CONFIGS[(64, 64)], scale_pos=False) for dt in ("float16", "bfloat16")]
    out += [bwd_variant(dt, o_f32=True) for dt in ("float16", "bfloat16")]
    out += [simt_variant(dt, o_f32=True) for dt in ("float16", "bfloat16")]
    out += [bwd_mma_variant(dt, a, b) for dt in ("float16", "bfloat16") for a in MMA_DIMS for b in MMA_DIMS]
    return out


#: Warpgroups (64 keys each) per block of the Hopper backward (bwd_wgmma.cu) per (Dqk, Dv); each
#: warpgroup adds Dqk / warpgroups columns of dQ. H100, bf16, L = 4k / 16k (benchmarks/cuda_wgmma_probe.py
#: --bwd, docs/benchmarks.md): two warpgroups ran 0.80-0.93x flash at D = 64 against one's 0.60-0.82x,
#: 1.05-1.09x at D = 128 against 0.67-0.87x.
BWD_WGMMA_WARPGROUPS = {(64, 64): 2, (64, 128): 2, (128, 64): 2, (128, 128): 2}
#: (Dqk, Dv) whose backward issues the dQ products while dK / dV's are in flight (BWD_OVERLAP: more
#: registers; 1-2 % faster at D = 64 in the same run, no change at D = 128).
BWD_WGMMA_OVERLAP = frozenset({(64, 64)})


def bwd_wgmma_warpgroups(dqk: int, dv: int) -> int:
    """Warpgroups of the Hopper backward; ``ATTNHUB_CUDA_BWD_WG=1|2`` overrides."""
    env = os.environ.get("ATTNHUB_CUDA_BWD_WG")
    if not env:
        return BWD_WGMMA_WARPGROUPS[(dqk, dv)]
    if env not in ("1", "2"):
        raise AttnhubError(f"ATTNHUB_CUDA_BWD_WG takes 1 or 2, got {env!r}")
    return int(env)


def bwd_wgmma_variant(dtype: str, dqk: int, dv: int, nwg: int | None = None) -> Variant:
    """The Hopper backward (wgmma, sm_90a, dQ by reductions into float32) and its dQ conversion."""
    nwg = nwg or bwd_wgmma_warpgroups(dqk, dv)
    defines = (("ATT_DTYPE", DTYPE_CODES[dtype]), ("DQK", dqk), ("DV", dv), ("NWG", nwg))
    if (dqk, dv) in BWD_WGMMA_OVERLAP and "ATTNHUB_CUDA_BWD_OVERLAP" not in os.environ:
        defines += (("BWD_OVERLAP", 1),)
    # tuning switches: blocks per SM the registers are capped for, dQ products overlapping dK / dV's
    for var, name, allowed in (
        ("ATTNHUB_CUDA_BWD_MINB", "MINB", ("1", "2", "3", "4")),
        ("ATTNHUB_CUDA_BWD_OVERLAP", "BWD_OVERLAP", ("0", "1")),
    ):
        env = os.environ.get(var)
        if env:
            if env not in allowed:
                raise AttnhubError(f"{var} takes one of {', '.join(allowed)}, got {env!r}")
            defines += ((name, int(env)),)
    return Variant(
        "bwd_wgmma.cu", defines, ("attn_bwd_fused_wgmma", "attn_bwd_dq_convert"), _WGMMA_BWD_HEADERS
    )


def bwd_wgmma_smem_bytes(dqk: int, dv: int, nwg: int) -> int:
    """Dynamic shared memory of the Hopper backward: K, V, two Q and dO tiles, dS^T, lse and delta
    (two 64-query buffers each), 1 KB alignment slack."""
    kb_n = 64 * nwg
    return 2 * (kb_n * (dqk + dv) + 2 * 64 * (dqk + dv) + kb_n * 64) + 4 * 4 * 64 + 1024


def wgmma_variants() -> list[Variant]:
    """The wgmma kernels (built for WGMMA_ARCH only): forwards for half types, every head-dim pair, both
    outputs; the backward for every head-dim pair."""
    return (
        [
            wgmma_variant(dt, a, b, WGMMA_CONFIGS[(a, b)], o_f32=o32)
            for dt in ("float16", "bfloat16")
            for a in MMA_DIMS
            for b in MMA_DIMS
            for o32 in (False, True)
        ]
        + [
            wgmma_variant(dt, 64, 64, WGMMA_CONFIGS[(64, 64)], scale_pos=False)
            for dt in ("float16", "bfloat16")
        ]
        + [
            bwd_wgmma_variant(dt, a, b, BWD_WGMMA_WARPGROUPS[(a, b)])
            for dt in ("float16", "bfloat16")
            for a in MMA_DIMS
            for b in MMA_DIMS
        ]
    )


def bwd_mma_smem_bytes(dqk: int, dv: int) -> tuple[int, int]:
    """Dynamic shared memory of the dK/dV and dQ tensor-core kernels (tile sizes of bwd_mma.cu)."""
    kb_q, qb_n, _ = bwd_config(dqk, dv)
    dkdv = 2 * (bwd_block_keys(dqk, dv) * (dqk + dv) + 2 * kb_q * (dqk + dv)) + 4 * 4 * kb_q
    dq = 2 * (64 * (dqk + dv) + 2 * qb_n * (dqk + dv))
    return dkdv, dq


def bwd_fused_smem_bytes(dqk: int, dv: int) -> int:
    """Dynamic shared memory of the fused backward: the dK/dV kernel's plus the staged dS tile."""
    return bwd_mma_smem_bytes(dqk, dv)[0] + 2 * bwd_block_keys(dqk, dv) * bwd_config(dqk, dv)[0]


#: Head dims (Dqk) whose tensor-core backward runs fused by default on sm_90+ (vector reductions).
#: H100, L = 4096, bf16, flash / cuda (benchmarks/cuda_sweep.py --no-fwd, 2026-11-22 23:31 UTC):
#: D = 64 fused 0.77 / 0.74 (full / causal) against split 0.71 / 0.73; D = 128 fused 0.69 / 0.63
#: against split 0.75 / 0.80 (its dQ atomics cost more than the two recomputed products save).
BWD_FUSED_DIMS = frozenset({64})


def bwd_fused(dqk: int, dv: int, arch: str = "sm_90") -> bool:
    """Whether the tensor-core backward runs fused (one kernel, dQ added into a float32 buffer with
    atomics) rather than split (dK/dV and dQ kernels, deterministic). ``ATTNHUB_CUDA_BWD=fused`` or
    ``=split`` chooses; by default fused for ``BWD_FUSED_DIMS`` on sm_90+ (on older parts each dQ
    pair is two scalar atomics: not measured, so split). The fused kernel needs 64-query steps."""
    mode = os.environ.get("ATTNHUB_CUDA_BWD", "")
    if mode not in ("", "wgmma", "fused", "split", "simt"):
        raise AttnhubError(f"ATTNHUB_CUDA_BWD takes wgmma, fused, split or simt, got {mode!r}")
    if bwd_config(dqk, dv)[0] != 64 or mode == "split":
        return False
    return mode == "fused" or (dqk in BWD_FUSED_DIMS and int(arch.removeprefix("sm_")[:-1] or 0) >= 9)


def mma_smem_bytes(dqk: int, dv: int, config: tuple[int, int, int]) -> int:
    """Dynamic shared memory of the tensor-core forward: Q tile plus double-buffered K and V tiles."""
    warps, bn, rb = config
    return 2 * (16 * rb * warps * dqk + 2 * bn * (dqk + dv))


def _core(*names: str) -> tuple[Any, ...]:
    """Objects of ``cuda.core`` (``cuda.core.experimental`` in cuda-core < 0.4)."""
    try:
        import cuda.core as core

        getattr(core, names[0])
    except (ImportError, AttributeError):
        import cuda.core.experimental as core  # type: ignore[no-redef]
    return tuple(getattr(core, n) for n in names)


def cache_dir() -> Path:
    env = os.environ.get("ATTNHUB_CACHE_DIR")
    if env:
        return Path(env) / "cuda"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnhub" / "cuda"


def _include_dirs() -> list[str]:
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise AttnhubError(
            "the cuda backend needs cuda-pathfinder to find cuda_fp16.h/cuda_bf16.h: pip install 'attnhub[cuda]'"
        ) from exc
    inc = find_nvidia_header_directory("cudart")
    if inc is None:
        raise AttnhubError(
            "cuda_fp16.h/cuda_bf16.h not found: install the CUDA runtime headers "
            "(pip install nvidia-cuda-runtime-cu12, part of 'attnhub[cuda]')"
        )
    return [str(inc)]


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _options(arch: str) -> tuple[str, ...]:
    return (f"arch={arch}", f"std={_STD}", f"nvrtc={nvrtc_version()}")


def cache_key(variant: Variant, arch: str) -> str:
    h = hashlib.sha256()
    h.update(variant.text().encode())
    h.update(repr(_options(arch)).encode())
    return h.hexdigest()


def compile_variant(variant: Variant, arch: str) -> bytes:
    """Compile ``variant`` for ``arch`` (e.g. ``"sm_90"``) with NVRTC; AttnhubError with the log on failure."""
    global COMPILES
    Program, ProgramOptions = _core("Program", "ProgramOptions")

    opts = ProgramOptions(arch=arch, std=_STD, include_path=_include_dirs(), name=variant.name)
    try:
        prog = Program(variant.text(), "c++", options=opts)
        obj = prog.compile("cubin")
    except Exception as exc:
        raise AttnhubError(
            f"NVRTC could not compile the cuda kernel {variant.name} for {arch}:\n{exc}"
        ) from exc
    with _lock:
        COMPILES += 1
    return bytes(obj.code)


def get_cubin(variant: Variant, arch: str) -> bytes:
    """The cubin of ``variant`` for ``arch``: from the disk cache, else compiled and stored there."""
    path = cache_dir() / f"{cache_key(variant, arch)}.cubin"
    try:
        return path.read_bytes()
    except OSError:
        pass
    data = compile_variant(variant, arch)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a compile per process
    return data


def load_kernel(variant: Variant, name: str, device_index: int, arch: str, smem: int = 0) -> Any:
    """A launchable ``cuda.core`` kernel for the current device, allowing ``smem`` bytes of dynamic smem."""
    key = (f"{variant.name}:{name}:{arch}", device_index)
    kern = _kernels.get(key)
    if kern is not None:
        if smem > _smem_allowed.get(key, 48 * 1024):
            _allow_smem(kern, smem, device_index)
            _smem_allowed[key] = smem
        return kern
    Device, ObjectCode = _core("Device", "ObjectCode")

    Device(device_index).set_current()
    obj = ObjectCode.from_cubin(get_cubin(variant, arch))
    kern = obj.get_kernel(name)
    if smem > 48 * 1024:
        _allow_smem(kern, smem, device_index)
        _smem_allowed[key] = smem
    _kernels[key] = kern
    _kernels[(key[0] + ":obj", device_index)] = obj  # keep the module alive
    return kern


def _allow_smem(kern: Any, smem: int, device_index: int) -> None:
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = kern.handle
    if isinstance(handle, driver.CUkernel):
        dev = driver.CUdevice(device_index)
        (err,) = driver.cuKernelSetAttribute(attr, smem, handle, dev)
    else:
        (err,) = driver.cuFuncSetAttribute(handle, attr, smem)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise AttnhubError(f"cannot allow {smem} bytes of shared memory for the cuda kernel: {err}")


def _compile_job(job: tuple[Variant, str]) -> tuple[str, str, int]:
    variant, arch = job
    return variant.name, arch, len(get_cubin(variant, arch))


def precompile(archs: tuple[str, ...], workers: int | None = None) -> list[tuple[str, str, int]]:
    """Compile every variant for ``archs`` into the disk cache, in parallel processes."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(v, a) for v in all_variants() for a in archs]
    if "sm_90" in archs:
        jobs += [(v, WGMMA_ARCH) for v in wgmma_variants()]
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        return [_compile_job(j) for j in jobs]
    with ProcessPoolExecutor(workers) as ex:
        return list(ex.map(_compile_job, jobs))


if __name__ == "__main__":  # python -m attnhub_backends.cuda.compiler sm_90 [sm_80 ...]
    import sys
    import time

    t0 = time.perf_counter()
    for row in precompile(tuple(sys.argv[1:]) or ("sm_90",)):
        print(*row)
    print(f"compiled into {cache_dir()} in {time.perf_counter() - t0:.1f} s")
