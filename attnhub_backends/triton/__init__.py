"""The ``triton`` backend: FlashAttention-2 forward and backward in Triton, rule masks from positions."""

from __future__ import annotations

from attnhub import hookimpl
from attnhub_backends.triton import knobs  # noqa: F401  (declares its development settings)


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.triton.backend import TritonBackend

    return [TritonBackend()]
