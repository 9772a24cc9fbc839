"""Framework detection and the few array operations the core needs, without importing frameworks.

As einops does, the framework is found from the array type's module name; a framework module is
only touched through ``sys.modules`` once the caller's array proves it is loaded. Each adapter is
stateless and cached per array type so that dispatch stays cheap.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from attnhub.errors import SpecError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def numpy_dtype(name: str) -> np.dtype:
    """NumPy dtype for one of SPEC's dtype names (bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


class Adapter:
    """Operations on one framework's arrays; subclasses override what differs."""

    name = "numpy"

    def dtype_name(self, x: Any) -> str:
        return x.dtype.name

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(int(s) for s in x.shape)

    def call_key(self, q: Any, k: Any, v: Any) -> tuple:
        """A cheap hashable key of everything about q, k, v that a request depends on."""
        return (type(q), q.shape, q.dtype, type(k), k.shape, k.dtype, type(v), v.shape, v.dtype)

    def device(self, x: Any) -> str:
        return "cpu"

    def requires_grad(self, x: Any) -> bool:
        return False

    def is_concrete(self, x: Any) -> bool:
        """False for symbolic values (a JAX tracer, a TF graph tensor) that hold no data."""
        return True

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def from_numpy(self, a: np.ndarray, dtype: str, like: Any) -> Any:
        return np.asarray(a).astype(numpy_dtype(dtype), copy=False)

    def permute(self, x: Any, axes: tuple[int, ...]) -> Any:
        return x.transpose(axes)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.reshape(shape)

    def full(self, shape: tuple[int, ...], value: float, dtype: str, like: Any) -> Any:
        return self.from_numpy(np.full(shape, value, dtype=np.float64), dtype, like)


class TorchAdapter(Adapter):
    name = "torch"

    def dtype_name(self, x: Any) -> str:
        return str(x.dtype).removeprefix("torch.")

    def device(self, x: Any) -> str:
        return str(x.device)

    def requires_grad(self, x: Any) -> bool:
        return bool(x.requires_grad) and sys.modules["torch"].is_grad_enabled()

    def call_key(self, q: Any, k: Any, v: Any) -> tuple:
        return (
            type(q), q.shape, q.dtype, q.device, q.requires_grad,
            type(k), k.shape, k.dtype, k.device, k.requires_grad,
            type(v), v.shape, v.dtype, v.device, v.requires_grad,
            sys.modules["torch"].is_grad_enabled(),
        )  # fmt: skip

    def to_numpy(self, x: Any) -> np.ndarray:
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        if str(x.dtype) == "torch.bfloat16":
            return x.float().numpy().astype(numpy_dtype("bfloat16"))
        return x.numpy()

    def from_numpy(self, a: np.ndarray, dtype: str, like: Any) -> Any:
        torch = sys.modules["torch"]
        a = np.ascontiguousarray(a)
        if a.dtype.name == "bfloat16":
            a = a.astype(np.float32)
        t = torch.from_numpy(a)
        return t.to(device=like.device, dtype=getattr(torch, dtype))

    def permute(self, x: Any, axes: tuple[int, ...]) -> Any:
        return x.permute(axes)


class TensorFlowAdapter(Adapter):
    name = "tensorflow"

    def shape(self, x: Any) -> tuple[int, ...]:
        dims = tuple(x.shape)
        if any(d is None for d in dims):
            raise SpecError(
                "shape",
                "a fully known static shape (inside tf.function: an input_signature with fixed sizes,"
                " or reduce_retracing=False)",
                dims,
            )
        return tuple(int(d) for d in dims)

    def device(self, x: Any) -> str:
        dev = getattr(x, "device", "") or ""
        low = dev.lower()
        if "gpu" in low:
            return "cuda:" + low.rsplit(":", 1)[-1]
        return "cpu"

    def is_concrete(self, x: Any) -> bool:
        return hasattr(x, "numpy") and sys.modules["tensorflow"].executing_eagerly()

    def call_key(self, q: Any, k: Any, v: Any) -> tuple:
        base = super().call_key(q, k, v)
        return (*base, self.device(q), self.device(k), self.device(v), self.is_concrete(q))

    def to_numpy(self, x: Any) -> np.ndarray:
        return x.numpy()

    def from_numpy(self, a: np.ndarray, dtype: str, like: Any) -> Any:
        tf = sys.modules["tensorflow"]
        return tf.cast(tf.convert_to_tensor(np.asarray(a)), dtype)

    def permute(self, x: Any, axes: tuple[int, ...]) -> Any:
        return sys.modules["tensorflow"].transpose(x, axes)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return sys.modules["tensorflow"].reshape(x, shape)


class JaxAdapter(Adapter):
    name = "jax"

    def device(self, x: Any) -> str:
        try:
            devs = x.devices()
        except Exception:  # a tracer has no devices: it runs where jax's default backend is
            platform = sys.modules["jax"].default_backend()
            return "cpu" if platform == "cpu" else "cuda:0"
        dev = next(iter(devs))
        return "cpu" if dev.platform == "cpu" else f"cuda:{dev.id}"

    def is_concrete(self, x: Any) -> bool:
        core = sys.modules.get("jax.core") or sys.modules["jax"].core
        return not isinstance(x, core.Tracer)

    def call_key(self, q: Any, k: Any, v: Any) -> tuple:
        base = super().call_key(q, k, v)
        return (*base, self.device(q), self.device(k), self.device(v))

    def from_numpy(self, a: np.ndarray, dtype: str, like: Any) -> Any:
        jnp = sys.modules["jax.numpy"]
        return jnp.asarray(np.asarray(a).astype(numpy_dtype(dtype), copy=False))


_ADAPTERS: dict[type, Adapter] = {}
_BY_ROOT = {
    "numpy": Adapter(),
    "ml_dtypes": Adapter(),
    "torch": TorchAdapter(),
    "tensorflow": TensorFlowAdapter(),
    "jax": JaxAdapter(),
    "jaxlib": JaxAdapter(),
}


def adapter_for(x: Any) -> Adapter:
    """The adapter of ``x``'s framework; :class:`SpecError` for anything that is not an array."""
    cls = type(x)
    found = _ADAPTERS.get(cls)
    if found is not None:
        return found
    for klass in cls.__mro__:
        root = (klass.__module__ or "").split(".", 1)[0]
        if root in _BY_ROOT:
            found = _BY_ROOT[root]
            break
    if found is None or not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise SpecError(
            "q/k/v",
            "a NumPy array, torch tensor, TensorFlow tensor or JAX array",
            f"{cls.__module__}.{cls.__qualname__}",
        )
    _ADAPTERS[cls] = found
    return found
