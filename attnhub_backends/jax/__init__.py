"""The ``jax`` backend (JAX arrays, CPU and NVIDIA GPUs), registered through the ``attnhub`` entry point."""

from __future__ import annotations

from attnhub import hookimpl
from attnhub_backends.jax import knobs  # noqa: F401  (declares its development settings)


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.jax.backend import JaxBackend

    return [JaxBackend()]
