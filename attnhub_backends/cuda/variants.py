"""The kernel programs: for each kernel family, the source file, headers and ``#define`` lines
(dtype, head dims, tile) of the :class:`~attnhub_backends.cuda.compiler.Variant` that builds it, and
the list of every variant the backend may compile."""

from __future__ import annotations

from attnhub import settings
from attnhub_backends.cuda.compiler import Variant
from attnhub_backends.cuda.tiles import (
    BWD_WGMMA_OVERLAP,
    BWD_WGMMA_WARPGROUPS,
    F16X3_CONFIGS,
    MMA_CONFIGS,
    MMA_DIMS,
    TF32_CONFIGS,
    WGMMA_CONFIGS,
    bwd_config,
    bwd_warps,
    bwd_wgmma_warpgroups,
    f16x3_config,
    mma_config,
    tf32_config,
    tf32_pvc,
    wgmma_config,
    wgmma_pipelined,
)

DTYPE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}
#: Bits of the MODS define (common.cuh): softcap, additive bias, dS recorded per pair (dbias).
MOD_SOFTCAP, MOD_BIAS, MOD_DBIAS = 1, 2, 4
#: Every MODS value a kernel is built with (dbias needs a bias).
MOD_SETS = (1, 2, 3, 6, 7)
#: The architecture the wgmma kernels are built for (sm_90a code runs on compute capability 9.0 only).
WGMMA_ARCH = "sm_90a"
_MMA_HEADERS = ("common.cuh", "mma.cuh", "frag.cuh")
_MMA_BWD_HEADERS = (*_MMA_HEADERS, "bwd.cuh")
_WGMMA_HEADERS = ("common.cuh", "mma.cuh", "frag.cuh", "wgmma.cuh")
_WGMMA_BWD_HEADERS = (*_WGMMA_HEADERS, "bwd.cuh")


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


def wgmma_variant(
    dtype: str,
    dqk: int,
    dv: int,
    config: tuple[int, int] | None = None,
    o_f32: bool = False,
    scale_pos: bool = True,
    mods: int = 0,
) -> Variant:
    """The Hopper forward (wgmma, sm_90a) for half types; arguments as :func:`mma_variant`; ``mods``
    the score modifiers compiled in (:data:`MOD_SOFTCAP` | :data:`MOD_BIAS`; 0: the dense kernel)."""
    nwg, bn = config or wgmma_config(dqk, dv)
    defines = (("ATT_DTYPE", DTYPE_CODES[dtype]), ("DQK", dqk), ("DV", dv), ("NWG", nwg), ("BN", bn))
    if wgmma_pipelined(dqk, dv):
        defines += (("PIPE", 1),)
    if o_f32:
        defines += (("O_F32", 1),)
    if scale_pos and not mods:
        defines += (("SCALE_POS", 1),)
    return Variant("fwd_wgmma.cu", _with_mods(defines, mods), ("attn_fwd_wgmma",), _WGMMA_HEADERS)


def tf32_variant(dqk: int, dv: int, config: tuple[int, int, int] | None = None) -> Variant:
    """The 3xTF32 float32 forward."""
    warps, bn, rb = config or tf32_config(dqk, dv)
    defines = (
        ("ATT_DTYPE", DTYPE_CODES["float32"]),
        ("DQK", dqk),
        ("DV", dv),
        ("NWARPS", warps),
        ("BN", bn),
        ("RB", rb),
    )
    pvc = tf32_pvc(dqk, dv, (warps, bn, rb))
    if pvc:
        defines += (("PVC", pvc),)
    return Variant("fwd_tf32.cu", defines, ("attn_fwd_tf32",), _MMA_HEADERS)


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


def simt_variant(dtype: str, o_f32: bool = False, mods: int = 0) -> Variant:
    """SIMT forward; ``o_f32``: a half-type forward writes a float32 output (kept for a backward);
    ``mods`` as in :func:`wgmma_variant`."""
    defines: tuple[tuple[str, int], ...] = (("ATT_DTYPE", DTYPE_CODES[dtype]),)
    if o_f32:
        defines += (("O_F32", 1),)
    return Variant("fwd_simt.cu", _with_mods(defines, mods), ("attn_fwd_simt",))


def bwd_mma_variant(dtype: str, dqk: int, dv: int) -> Variant:
    """The mma.sync backward: dK/dV, dQ and (with 64-query steps) fused kernels, and dQ's conversion."""
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


def bwd_wgmma_variant(dtype: str, dqk: int, dv: int, nwg: int | None = None, mods: int = 0) -> Variant:
    """The Hopper backward (wgmma, sm_90a, dQ by reductions into float32) and its dQ conversion;
    ``mods``: score modifiers, with :data:`MOD_DBIAS` dS recorded per pair."""
    nwg = nwg or bwd_wgmma_warpgroups(dqk, dv)
    defines = (("ATT_DTYPE", DTYPE_CODES[dtype]), ("DQK", dqk), ("DV", dv), ("NWG", nwg))
    minb, overlap = settings.value("ATTNHUB_CUDA_BWD_MINB"), settings.value("ATTNHUB_CUDA_BWD_OVERLAP")
    if (dqk, dv) in BWD_WGMMA_OVERLAP and overlap is None:
        defines += (("BWD_OVERLAP", 1),)
    # tuning switches: blocks per SM the registers are capped for, dQ products overlapping dK / dV's
    if minb is not None:
        defines += (("MINB", int(minb)),)
    if overlap is not None:
        defines += (("BWD_OVERLAP", int(overlap)),)
    return Variant(
        "bwd_wgmma.cu",
        _with_mods(defines, mods),
        ("attn_bwd_fused_wgmma", "attn_bwd_dq_convert"),
        _WGMMA_BWD_HEADERS,
    )


def bwd_variant(dtype: str, o_f32: bool = False, mods: int = 0) -> Variant:
    """SIMT backward and the delta kernel; ``o_f32``: delta reads a float32 output; ``mods`` as in
    :func:`bwd_wgmma_variant`."""
    defines: tuple[tuple[str, int], ...] = (("ATT_DTYPE", DTYPE_CODES[dtype]),)
    if o_f32:
        defines += (("O_F32", 1),)
    return Variant("bwd_simt.cu", _with_mods(defines, mods), ("attn_bwd_pre", "attn_bwd_simt"))


def _with_mods(defines: tuple[tuple[str, int], ...], mods: int) -> tuple[tuple[str, int], ...]:
    """``defines`` plus MODS when score modifiers are compiled in (the dense kernel has none)."""
    return (*defines, ("MODS", mods)) if mods else defines


def mod_variants() -> list[Variant]:
    """The SIMT kernels with score modifiers, every dtype and modifier set (sm_80+)."""
    return [
        f(dt, o_f32=o32, mods=mods)
        for f in (simt_variant, bwd_variant)
        for dt in DTYPE_CODES
        for o32 in ((False, True) if dt in ("float16", "bfloat16") else (False,))
        for mods in MOD_SETS
        if not (f is simt_variant and mods & MOD_DBIAS)
    ]


def wgmma_mod_variants() -> list[Variant]:
    """The wgmma kernels with score modifiers (sm_90a): forwards (both outputs) and backwards."""
    out = []
    for dt in ("float16", "bfloat16"):
        for a in MMA_DIMS:
            for b in MMA_DIMS:
                for mods in MOD_SETS:
                    if not mods & MOD_DBIAS:
                        out += [
                            wgmma_variant(dt, a, b, WGMMA_CONFIGS[(a, b)], o_f32=o, mods=mods)
                            for o in (False, True)
                        ]
                    out.append(bwd_wgmma_variant(dt, a, b, BWD_WGMMA_WARPGROUPS[(a, b)], mods=mods))
    return out


def all_variants() -> list[Variant]:
    """Every program the backend may compile for sm_80+ (the CI compile check walks this list)."""
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
