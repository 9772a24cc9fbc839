"""Validation of a modifier's float array (SPEC §9): framework, device, dtype and broadcast shape."""

from __future__ import annotations

from typing import Any

from attnhub.errors import SpecError
from attnhub.frameworks import FLOAT_DTYPES, Adapter, adapter_like


def check_float_array(
    name: str,
    x: Any,
    ad: Adapter,
    device: str,
    dtype: str,
    target: tuple[int, ...] | None,
    any_float: bool = False,
) -> tuple[int, ...]:
    """A float array of q's framework and device, float32 or q's dtype (any float dtype with
    ``any_float``: a float ``mask`` keeps its meaning); with ``target`` it must broadcast to it and
    its rank-4 (left-padded) shape is returned, else its shape."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise SpecError(name, f"a {ad.name} array", x)
    xad = adapter_like(x, name, ad)
    why = xad.dense_problem(x)
    if why is not None:
        raise SpecError(name, f"a dense {ad.name} array", why)
    if xad.is_concrete(x) and xad.device(x) != device:
        raise SpecError(f"{name}.device", device, xad.device(x))
    dt = xad.dtype_name(x)
    if dt not in FLOAT_DTYPES or not (any_float or dt in ("float32", dtype)):
        allowed = "float32" if dtype == "float32" else f"float32 or {dtype}"
        raise SpecError(f"{name}.dtype", f"{allowed} (the dtype of q)", dt)
    shape = tuple(int(d) for d in xad.shape(x))
    if target is None:
        return shape
    if len(shape) > 4:
        raise SpecError(f"{name}.shape", f"broadcastable to (B, Hq, Nq, Nk) = {target}", shape)
    full = (1,) * (4 - len(shape)) + shape
    for have, want in zip(full, target, strict=True):
        if have not in (1, want):
            raise SpecError(f"{name}.shape", f"broadcastable to (B, Hq, Nq, Nk) = {target}", shape)
    return full  # type: ignore[return-value]
