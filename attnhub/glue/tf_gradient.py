"""TensorFlow glue: ``tf.custom_gradient`` around a backend's forward and backward."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from attnhub.request import Request


def run_with_gradient(backend: Any, q: Any, k: Any, v: Any, req: Request, mask: Any) -> tuple[Any, Any]:
    """Run ``backend.forward`` so that a GradientTape calls ``backend.backward``."""

    @tf.custom_gradient
    def _attend(q, k, v):
        out, lse = backend.forward(q, k, v, req, mask)

        def grad(dout, dlse=None):
            return backend.backward(q, k, v, out, lse, dout, req, mask)

        return (out, lse), grad

    return _attend(q, k, v)
