"""TensorFlow glue: ``tf.custom_gradient`` around a backend's forward and backward.

The forward is ``forward_for_grad`` (a TensorFlow tape may ask for gradients whenever it watches
the inputs), so ``backward`` receives the ``saved`` output it asked for. The upstream gradient of
lse reaches backends declaring the feature "dlse" (see :meth:`Backend.backward`); for others a
nonzero one is an error (SPEC §5: never a dropped gradient).
An exception in the backend's ``backward`` reaches the caller as :class:`attnhub.BackendError`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from attnhub.request import Request


def run_with_gradient(
    backend: Any, q: Any, k: Any, v: Any, req: Request, mask: Any, operands: Any
) -> tuple[Any, Any]:
    """Run ``backend.forward_for_grad`` so that a GradientTape calls ``backend.backward``; a bias
    and sinks (SPEC §9) are inputs of the gradient too and get the backward's dbias/dsinks."""
    from attnhub.errors import backend_error, passes_through

    with_dlse = "dlse" in backend.features
    extra = {}
    if operands is not None:
        extra = {n: getattr(operands, n) for n in ("bias", "sinks") if getattr(operands, n) is not None}
    names = tuple(extra)

    @tf.custom_gradient
    def _attend(q, k, v, *more):
        ops = None
        if operands is not None:
            ops = dataclasses.replace(operands, **dict(zip(names, more)))
        out, lse, saved = backend.forward_for_grad(q, k, v, req, mask, ops)

        def grad(dout, dlse=None):
            if dout is None:
                dout = tf.zeros_like(out)
            try:
                grads = backend.backward(
                    q, k, v, saved, lse, dout, req, mask, ops, dlse if with_dlse else None
                )
            except Exception as exc:
                if passes_through(exc):
                    raise
                raise backend_error(
                    backend.name, req, f"backward raised {type(exc).__name__}: {exc}"
                ) from exc
            grads = list(grads)
            if dlse is not None and not with_dlse:
                # TensorFlow hands zeros for an lse the loss does not use; anything else would be
                # a dropped gradient (SPEC §5): fail, in eager mode and in a graph alike.
                check = tf.debugging.assert_equal(
                    dlse, tf.zeros_like(dlse),
                    message=f"attnhub backend {backend.name!r} cannot differentiate lse (it does not "
                    "declare 'dlse'), and the loss uses lse: use backend='tf' or detach lse",
                )  # fmt: skip
                with tf.control_dependencies([check]):
                    grads = [tf.identity(g) for g in grads]
            if ops is None:
                return grads[:3]
            found = {
                "bias": grads[3] if len(grads) > 3 else None,
                "sinks": grads[4] if len(grads) > 4 else None,
            }
            rest = []
            for name, x in zip(names, more):
                g = found[name]
                rest.append(tf.zeros_like(x) if g is None else g)
            return [*grads[:3], *rest]

        return (out, lse), grad

    return _attend(q, k, v, *extra.values())
