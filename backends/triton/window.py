"""Host side of the Gluon sliding-window forward (``window_kernel.py``): when it applies, its
tensor descriptors and its launch. The kernel module is imported on first use only (it needs
Triton's Gluon and a Hopper GPU)."""

from __future__ import annotations

from typing import Any

import torch

from attnhub.request import Request
from attnhub.rules import Local

BLOCK = 64  # key tile rows; query tiles have 64 rows per warpgroup


def not_applicable(req: Request, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why the Gluon window kernel cannot serve this call (None: it can).

    It serves 1-d causal windows with stride 1 (any sync), 16-bit dtypes, equal head dims of 64 or
    128, a positive scale, and key counts that are a multiple of 64 (its 2-d descriptors would
    otherwise read the next head's rows into the last key tile), on compute capability 9.x.
    """
    rule = req.rule
    if not (isinstance(rule, Local) and rule.causal and rule.log2_stride == 0 and req.ndim == 1):
        return "only 1-d causal windows with stride 1"
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "needs a Hopper GPU (wgmma, TMA)"
    if q.dtype not in (torch.float16, torch.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        return "16-bit q, k, v of one dtype only"
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[-1] in (64, 128)):
        return "head dims 64 or 128, equal for q, k and v"
    if req.scale <= 0:
        return "positive scales only"
    if k.shape[2] % BLOCK:
        return f"key count not a multiple of {BLOCK}"
    for x in (q, k, v):
        if _view(x) is None:
            return "strides a 2-d tensor descriptor cannot describe"
    return None


def _view(x: torch.Tensor) -> tuple[int, int] | None:
    """(rows, columns) of the 2-d row-major view the descriptor walks, or None if there is none.

    Element (b, h, n, d) sits at row ``(b*sb + h*sh) // sn + n`` and column ``(b*sb + h*sh) % sn
    + d``: bhsd tensors give column 0, bshd tensors column ``h * D``. Every (batch, head) slab
    must fit in one row's ``sn`` columns without wrapping.
    """
    bsz, heads, length, d = x.shape
    sb, sh, sn, sd = x.stride()
    size = x.element_size()
    if sd != 1 or sn < d or (sn * size) % 16 or x.data_ptr() % 16:
        return None
    if bsz > 1 and sb % sn:
        return None
    if heads > 1 and sh % sn and sh * (heads - 1) + d > sn:
        return None
    span = (bsz - 1) * sb + (heads - 1) * sh + (length - 1) * sn + d
    rows = -(-span // sn)
    if rows >= 2**31 - 2 * BLOCK:
        return None
    return rows, sn


def descriptor(x: torch.Tensor, rows: int = BLOCK) -> Any:
    """A TMA descriptor of ``x``'s 2-d view with (``rows``, head dim) blocks."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    total, cols = _view(x)
    d = x.shape[-1]
    elem = gl.float16 if x.dtype == torch.float16 else gl.bfloat16
    layout = gl.NVMMASharedLayout.get_default_for([rows, d], elem)
    return TensorDescriptor(x, [total, cols], [cols, 1], [rows, d], layout)


def kernel(ws: bool = False) -> Any:
    from . import window_kernel

    return window_kernel.window_ws_fwd_kernel if ws else window_kernel.window_fwd_kernel
