"""The cuda backend's development settings: pins of its kernel and tile choices for tuning and
experiments (declared here, with the backend, not in the core; ``attnhub info --settings`` lists
them once the backend is loaded). Imported by the package, so declared before any module of it
reads one."""

from __future__ import annotations

from attnhub.settings import declare, parse_bit, parse_choice, parse_digits, parse_ints_n

# fmt: off
declare("ATTNHUB_CUDA_FWD", parse_choice("mma", "wgmma"), None, "force the cuda half-type forward kernel", expects="mma or wgmma")
declare("ATTNHUB_CUDA_BWD", parse_choice("wgmma", "fused", "split", "simt"), None, "force the cuda backward kernel", expects="wgmma, fused, split or simt")
declare("ATTNHUB_CUDA_F32", parse_choice("f16x3", "tf32", "simt"), None, "force the cuda float32 forward kernel", expects="f16x3, tf32 or simt")
declare("ATTNHUB_CUDA_FWD_ORDER", parse_choice("tiles", "heads", "rule"), None, "grid order of the cuda forward", expects="tiles, heads or rule")
declare("ATTNHUB_CUDA_BWD_ORDER", parse_choice("tiles", "heads", "rule"), None, "grid order of the cuda backward", expects="tiles, heads or rule")
_TILE = "'warps,keys_per_tile[,row_blocks]' (integers)"
declare("ATTNHUB_CUDA_MMA", parse_ints_n(2), None, "cuda mma.sync forward tile", expects=_TILE)
declare("ATTNHUB_CUDA_TF32", parse_ints_n(2), None, "cuda 3xTF32 forward tile", expects=_TILE)
declare("ATTNHUB_CUDA_TF32_PVC", parse_digits, 0, "cuda 3xTF32 forward: 8-key blocks per P.V chunk", expects="a divisor of the tile's 8-key blocks")
declare("ATTNHUB_CUDA_F16X3", parse_ints_n(2), None, "cuda 3xFP16 forward tile", expects=_TILE)
declare("ATTNHUB_CUDA_WGMMA", parse_ints_n(2, 2), None, "cuda wgmma forward tile", expects="'warpgroups,keys_per_tile' (integers)")
declare("ATTNHUB_CUDA_WGMMA_PIPE", parse_bit, None, "cuda wgmma forward: pipelined loop", expects="0 or 1")
declare("ATTNHUB_CUDA_BWD_STEPS", parse_ints_n(2), None, "cuda mma backward steps", expects="'kb_q,qb_n[,krb]' (integers)")
declare("ATTNHUB_CUDA_BWD_WARPS", parse_choice("4", "8"), None, "cuda mma backward warps", expects="4 or 8")
declare("ATTNHUB_CUDA_BWD_WG", parse_choice("1", "2"), None, "cuda wgmma backward warpgroups", expects="1 or 2")
declare("ATTNHUB_CUDA_BWD_MINB", parse_choice("1", "2", "3", "4"), None, "cuda wgmma backward: min blocks per SM", expects="one of 1, 2, 3, 4")
declare("ATTNHUB_CUDA_BWD_OVERLAP", parse_choice("0", "1"), None, "cuda wgmma backward: overlapped loop", expects="one of 0, 1")
# fmt: on
