"""torch's own SDPA kernels as attnhub backends: ``sdpa-cpu``, ``sdpa-flash``, ``sdpa-efficient``,
``sdpa-cudnn``, registered through the ``attnhub`` entry point like any plugin."""

from __future__ import annotations

from attnhub import hookimpl


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.sdpa.backend import SdpaCpu, SdpaCudnn, SdpaEfficient, SdpaFlash

    return [SdpaCpu(), SdpaFlash(), SdpaEfficient(), SdpaCudnn()]
