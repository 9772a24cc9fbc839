"""The ``cudnn`` backend: scaled-dot-product attention as a cuDNN graph, built and run through
NVIDIA's cuDNN frontend Python API (``pip install 'attnhub[cudnn]'``, import name ``cudnn``).

Registering imports neither torch nor ``cudnn``: both load on first use."""

from __future__ import annotations

from attnhub import hookimpl


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.cudnn.backend import Cudnn

    return [Cudnn()]
