"""Host side of the CUDA kernels: mask parameters, argument packing, launches on torch's stream."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnhub.positions import axis_affine
from attnhub.request import Request
from attnhub.rules import Causal, Full, Local
from attnhub_backends.cuda import compiler

#: Largest window value passed to the kernels (larger windows behave identically: no position is farther).
_WINDOW_CAP = 1 << 30


def mask_args(req: Request) -> list[np.int32]:
    """The 16 integers of the kernels' ``Mask`` struct for ``req`` (1-d requests as 2-d with Y = 1)."""
    seq_q, seq_k = req.seq_q, req.seq_k
    if len(seq_q) == 1:
        seq_q, seq_k = (1, *seq_q), (1, *seq_k)
    (lqy, lqx), (lky, lkx) = seq_q, seq_k
    aqy, bqy, aky, bky = axis_affine(lqy, lky, req.sync)
    aqx, bqx, akx, bkx = axis_affine(lqx, lkx, req.sync)
    mx = max(lqx, lkx)
    rule = req.rule
    wy = wx = 1
    log2s = lcausal = 0
    if isinstance(rule, Full):
        code = 0
    elif isinstance(rule, Causal):
        code = 1
    elif isinstance(rule, Local):
        code = 2
        ws = rule.windows(req.ndim)
        ws = (1, *ws) if len(ws) == 1 else ws
        wy, wx = (min(w, _WINDOW_CAP) for w in ws)
        log2s, lcausal = rule.log2_stride, int(rule.causal)
    else:  # pragma: no cover - explicit masks are declined by check()
        raise TypeError(f"the cuda backend cannot evaluate {rule!r}")
    vals = [lqx, lkx, aqy, bqy, aqx, bqx, aky, bky, akx, bkx, mx, code, wy, wx, log2s, lcausal]
    return [np.int32(x) for x in vals]


class _StreamRef:
    """A foreign stream for ``cuda.core`` (the ``__cuda_stream__`` protocol)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


_streams: dict[int, Any] = {}


def current_stream(device: Any) -> Any:
    """The caller's current torch stream on ``device``, as a ``cuda.core`` stream."""
    import torch

    handle = int(torch.cuda.current_stream(device).cuda_stream)
    st = _streams.get(handle)
    if st is None:
        (Device,) = compiler._core("Device")
        dev = Device(device.index if device.index is not None else torch.cuda.current_device())
        dev.set_current()
        st = dev.create_stream(_StreamRef(handle))
        _streams[handle] = st
    return st


def arch_of(device: Any) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def launch(
    kernel: Any, device: Any, grid: tuple[int, ...], block: int, smem: int, *args: Any, stream: Any = None
) -> None:
    """Launch ``kernel`` on ``stream`` (a ``current_stream`` result, looked up when None)."""
    (LaunchConfig, launch_fn) = compiler._core("LaunchConfig", "launch")
    cfg = LaunchConfig(grid=grid, block=block, shmem_size=smem)
    launch_fn(stream if stream is not None else current_stream(device), cfg, kernel, *args)


def ptr(t: Any) -> np.uint64:
    return np.uint64(t.data_ptr())


def i64(x: int) -> np.int64:
    return np.int64(x)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


#: Largest y / z extent of a CUDA grid.
MAX_GRID_YZ = 65535


def grid_ok(req: Request, tiles_on_z: bool = False) -> list[str]:
    """Limits of the launch grid and of 32-bit index arithmetic. ``tiles_on_z``: the kernels may put
    64-row (or larger) tiles on the grid's z axis (the tensor-core kernels under causal rules)."""
    reasons = []
    if max(req.nq, req.nk) >= 1 << 30:
        reasons.append(f"sequences up to 2**30 positions, got Nq={req.nq} Nk={req.nk}")
    if tiles_on_z and max(req.nq, req.nk) > MAX_GRID_YZ * 64:
        reasons.append(f"sequences longer than {MAX_GRID_YZ * 64} (a CUDA grid's z extent of 64-row tiles)")
    if req.heads_q > MAX_GRID_YZ or req.batch > MAX_GRID_YZ:
        reasons.append(f"batch and heads up to {MAX_GRID_YZ}, got B={req.batch} Hq={req.heads_q}")
    return reasons
