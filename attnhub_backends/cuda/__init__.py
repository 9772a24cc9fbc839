"""The ``cuda`` backend: hand-written CUDA C++ attention kernels compiled at first use with NVRTC."""

from __future__ import annotations

from attnhub import hookimpl
from attnhub_backends.cuda import knobs  # noqa: F401  (declares its development settings)


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.cuda.backend import CudaBackend

    return [CudaBackend()]
