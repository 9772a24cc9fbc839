"""TensorFlow glue: ``tf.custom_gradient`` around a backend's forward and backward.

The forward is ``forward_for_grad`` (a TensorFlow tape may ask for gradients whenever it watches
the inputs), so ``backward`` receives the ``saved`` output it asked for. The upstream gradient of
lse reaches backends whose ``backward`` takes a ``dlse`` argument (see :meth:`Backend.backward`).
An exception in the backend's ``backward`` reaches the caller as :class:`attnhub.BackendError`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from attnhub.backend import takes_dlse
from attnhub.request import Request


def run_with_gradient(backend: Any, q: Any, k: Any, v: Any, req: Request, mask: Any) -> tuple[Any, Any]:
    """Run ``backend.forward_for_grad`` so that a GradientTape calls ``backend.backward``."""
    from attnhub.api import backend_error, passes_through

    with_dlse = takes_dlse(backend)

    @tf.custom_gradient
    def _attend(q, k, v):
        out, lse, saved = backend.forward_for_grad(q, k, v, req, mask)

        def grad(dout, dlse=None):
            if dout is None:
                dout = tf.zeros_like(out)
            try:
                if with_dlse:
                    return backend.backward(q, k, v, saved, lse, dout, req, mask, dlse=dlse)
                return backend.backward(q, k, v, saved, lse, dout, req, mask)
            except Exception as exc:
                if passes_through(exc):
                    raise
                raise backend_error(
                    backend.name, req, f"backward raised {type(exc).__name__}: {exc}"
                ) from exc

        return (out, lse), grad

    return _attend(q, k, v)
