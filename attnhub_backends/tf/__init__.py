"""The ``tf`` backend: blockwise flash attention in TensorFlow ops (eager, tf.function, XLA)."""

from __future__ import annotations

from attnhub import hookimpl


@hookimpl
def attnhub_backends() -> list:
    from attnhub_backends.tf.backend import TFBackend

    return [TFBackend()]
