"""torch's own SDPA CPU kernel as an attnhub backend, ``sdpa-cpu``, registered through the ``attnhub``
entry point like any plugin. (The CUDA kernels as backends, ``sdpa-flash`` / ``-efficient`` /
``-cudnn``, failed their first GPU certification and are not shipped yet: docs/backends/sdpa.md.)"""

from __future__ import annotations

from attnhub import hookimpl


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.sdpa.backend import SdpaCpu

    return [SdpaCpu()]
