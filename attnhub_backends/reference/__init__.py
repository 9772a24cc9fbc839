"""The NumPy reference backend, registered through the ``attnhub`` entry point like any plugin."""

from __future__ import annotations

from attnhub import hookimpl


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.reference.backend import ReferenceBackend

    return [ReferenceBackend()]
