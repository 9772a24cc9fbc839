"""Checks of what a backend returned: an ``out`` (and ``lse``) of the framework, shape, dtype and
device the request promises, before it reaches the caller."""

from __future__ import annotations

from typing import Any

from attnhub.errors import backend_error
from attnhub.frameworks import Adapter
from attnhub.request import Request


def check_result(
    ad: Adapter, name: str, req: Request, out: Any, lse: Any, shape: tuple, with_lse: bool, like: Any
) -> None:
    """Raise :class:`BackendError` unless ``out`` is a ``shape`` array of ``like``'s framework,
    dtype and device (and, with ``with_lse``, lse one of ``shape[:3]`` in float32, float64 for
    float64); cheap in the usual case, as it runs on every call."""
    why = ad.result_problem(out, shape, None, like)  # like's dtype: req.dtype
    if why is None:
        if not with_lse:
            return
        why = ad.result_problem(lse, shape[:3], "float64" if req.dtype == "float64" else "float32", like)
        if why is None:
            return
        why = "lse: expected " + why
    else:
        why = "out: expected " + why
    raise backend_error(name, req, f"returned a wrong result ({why})")
