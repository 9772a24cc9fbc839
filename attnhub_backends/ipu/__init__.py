"""The ``ipu`` backend (PopTorch / Graphcore IPUs, with a CPU emulation mode), registered by entry point."""

from __future__ import annotations

from attnhub import hookimpl


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.ipu.backend import IpuBackend

    return [IpuBackend()]
