"""How the core runs a backend's forward for a request: through the framework's autograd glue when
a gradient may be asked for, unless the backend differentiates its own forward (its ``run``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from attnhub.request import Request


def runner(backend: Any, req: Request) -> Callable[..., tuple[Any, Any]]:
    """``fn(q, k, v, req, mask, operands)`` -> (out, lse) for ``req``, decided once per plan:

    - a backend that defines ``run`` (its framework differentiates its forward: the jax, sdpa and
      ipu backends) is called through it;
    - a backend declaring ``backward`` gets torch's autograd glue when a torch input, bias or sinks
      require grad, and TensorFlow's ``tf.custom_gradient`` glue for every TensorFlow request (a
      tape may watch any input);
    - any other call runs ``forward``."""
    own = getattr(backend, "run", None)
    if own is not None:
        return own
    if "backward" in backend.features:
        if req.framework == "torch" and (req.needs_grad or req.bias_grad or req.sinks_grad):
            from attnhub.glue.torch_autograd import run_with_autograd

            return functools.partial(run_with_autograd, backend)
        if req.framework == "tensorflow":
            from attnhub.glue.tf_gradient import run_with_gradient

            return functools.partial(run_with_gradient, backend)
    return backend.forward
