"""What a launch needs from the GPU and from torch: the device's architecture, ordinal and
shared-memory limit, torch's current stream as a ``cuda.core`` stream, kernel arguments packed as
NumPy scalars, and the raw launch itself."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from attnhub_backends.cuda import compiler


def arch_of(device: Any) -> str:
    """``sm_XY`` of a torch CUDA device."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def device_index(dev: Any) -> int:
    """The CUDA ordinal of a torch device (``cuda`` alone: the current device)."""
    import torch

    return dev.index if dev.index is not None else torch.cuda.current_device()


def smem_limit(device: Any) -> int:
    """Largest dynamic shared memory a block may opt into on ``device`` (bytes)."""
    return _smem_limit_of(str(device))


@functools.cache
def _smem_limit_of(device: str) -> int:
    import torch
    from cuda.bindings import driver

    dev = torch.device(device)
    index = device_index(dev)
    attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    driver.cuInit(0)
    err, value = driver.cuDeviceGetAttribute(attr, index)
    if err != driver.CUresult.CUDA_SUCCESS:
        return 48 * 1024
    return int(value)


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


def launch(
    kernel: Any, device: Any, grid: tuple[int, ...], block: int, smem: int, *args: Any, stream: Any = None
) -> None:
    """Launch ``kernel`` on ``stream`` (a ``current_stream`` result, looked up when None)."""
    (LaunchConfig, launch_fn) = compiler._core("LaunchConfig", "launch")
    cfg = LaunchConfig(grid=grid, block=block, shmem_size=smem)
    launch_fn(stream if stream is not None else current_stream(device), cfg, kernel, *args)


def strided(x: Any, align: int) -> Any:
    """``x`` itself when its rows are unit-stride and ``align``-element aligned, else a contiguous copy."""
    ok = (
        x.stride(-1) == 1
        and all(s % align == 0 for s in x.stride()[:-1])
        and x.data_ptr() % (x.element_size() * align) == 0
    )
    return x if ok else x.contiguous()


def ptr(t: Any) -> np.uint64:
    return np.uint64(t.data_ptr())


def i64(x: int) -> np.int64:
    return np.int64(x)


def i32(x: int) -> np.int32:
    return np.int32(x)


def f32(x: float) -> np.float32:
    return np.float32(x)


def f64(x: float) -> np.float64:
    return np.float64(x)
