"""attnhub plugin: registers the toy backend and its broken variants (entry-point group ``attnhub``)."""

from __future__ import annotations

from attnhub import hookimpl


@hookimpl
def attnhub_backends() -> list:
    from attnhub_toy.backend import VARIANTS

    return [cls() for cls in VARIANTS]
