"""The ``cuda`` backend: hand-written CUDA C++ attention kernels compiled at first use with NVRTC."""

from __future__ import annotations

from attnhub import hookimpl


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.cuda.backend import CudaBackend

    return [CudaBackend()]
