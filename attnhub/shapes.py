"""Requests described by shapes alone (for ``attnhub explain`` and ``show-mask`` on the CLI)."""

from __future__ import annotations

import dataclasses

import numpy as np

from attnhub.errors import SpecError
from attnhub.frameworks import numpy_dtype
from attnhub.request import Request, build_request


def parse_shape(text: str) -> tuple[int, ...]:
    """'2,8,1024,64' or '4x4' -> a tuple of ints."""
    sep = "x" if "x" in text else ","
    try:
        return tuple(int(p) for p in text.replace(" ", "").split(sep) if p)
    except ValueError:
        raise SpecError("shape", "comma- or x-separated integers such as 2,8,1024,64", text) from None


def _phantom(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A zero-memory NumPy array of ``shape`` (broadcast), enough for validation."""
    return np.broadcast_to(np.zeros((), dtype=numpy_dtype(dtype)), shape)


def request_from_shapes(
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    *,
    dtype: str = "float32",
    framework: str = "numpy",
    device: str = "cpu",
    mask: object = None,
    sync: str = "none_front",
    scale: float | None = None,
    layout: str = "bhsd",
    needs_grad: bool = False,
    return_lse: bool = False,
) -> Request:
    """Validate and describe a request given only shapes and where the arrays would live."""
    if dtype not in ("float16", "bfloat16", "float32", "float64"):
        raise SpecError("dtype", "float16, bfloat16, float32 or float64", dtype)
    arrays = [_phantom(s, dtype) for s in (q_shape, k_shape, v_shape)]
    req, _ = build_request(*arrays, mask, sync, scale, layout, return_lse)
    return dataclasses.replace(req, framework=framework, device=device, needs_grad=needs_grad)
