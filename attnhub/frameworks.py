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

    def dense_problem(self, x: Any) -> str | None:
        """What ``x`` is when it is not a plain dense array (sparse, nested, ...), else None."""
        return None

    def mask_key(self, mask: Any) -> tuple:
        """A cheap hashable key of everything about an explicit mask array a request depends on."""
        return (type(mask), mask.shape, mask.dtype, self.device(mask))

    def mask_needs_grad(self, mask: Any) -> bool:
        """True when the caller may differentiate with respect to this float mask (SPEC §9)."""
        return False

    def result_problem(self, x: Any, shape: tuple[int, ...], dtype: str | None, like: Any) -> str | None:
        """Why a backend's result ``x`` is not a ``shape`` array of ``dtype`` (None: ``like``'s dtype)
        of this framework on ``like``'s device, or None; cheap, as it runs on every call."""
        if dtype is None:
            if type(x) is np.ndarray and x.shape == shape and x.dtype is like.dtype:  # the usual case
                return None
            dtype = self.dtype_name(like)
        found = _ADAPTERS.get(type(x))
        if found is None:
            try:
                found = adapter_for(x)
            except SpecError:
                found = None
        if found is not self:
            return f"a {self.name} array, got {type(x).__module__}.{type(x).__qualname__}"
        if tuple(x.shape) != shape:
            return f"shape {shape}, got {tuple(x.shape)}"
        if self.dtype_name(x) != dtype:
            return f"dtype {dtype}, got {self.dtype_name(x)}"
        if self.device(x) != self.device(like):
            return f"device {self.device(like)}, got {self.device(x)}"
        return None

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
            type(q), q.shape, q.dtype, q.device, q.requires_grad, q.layout,
            type(k), k.shape, k.dtype, k.device, k.requires_grad, k.layout,
            type(v), v.shape, v.dtype, v.device, v.requires_grad, v.layout,
            sys.modules["torch"].is_grad_enabled(),
        )  # fmt: skip

    def dense_problem(self, x: Any) -> str | None:
        torch = sys.modules["torch"]
        if x.layout is not torch.strided:
            return f"a tensor of layout {x.layout}"
        if x.is_nested:
            return "a nested tensor"
        if x.is_quantized:
            return "a quantized tensor"
        return None

    def mask_key(self, mask: Any) -> tuple:
        return (type(mask), mask.shape, mask.dtype, mask.device, mask.requires_grad, mask.layout)

    def mask_needs_grad(self, mask: Any) -> bool:
        return self.requires_grad(mask)

    def result_problem(self, x: Any, shape: tuple[int, ...], dtype: str | None, like: Any) -> str | None:
        if (
            dtype is None
            and x.__class__ is like.__class__
            and x.dtype is like.dtype
            and x.shape == shape
            and x.device == like.device
        ):
            return None  # the usual case (torch dtypes are singletons)
        dtype = dtype or self.dtype_name(like)
        torch = sys.modules["torch"]
        if not isinstance(x, torch.Tensor):
            return f"a torch tensor, got {type(x).__module__}.{type(x).__qualname__}"
        if x.shape != shape:
            return f"shape {shape}, got {tuple(x.shape)}"
        if self.dtype_name(x) != dtype:
            return f"dtype {dtype}, got {self.dtype_name(x)}"
        if x.device != like.device:
            return f"device {like.device}, got {x.device}"
        return None

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

    def mask_key(self, mask: Any) -> tuple:
        # A tape's watching the mask changes the request (mask_needs_grad), so it is in the key.
        return (*super().mask_key(mask), self.mask_needs_grad(mask))

    def mask_needs_grad(self, mask: Any) -> bool:
        """True when a GradientTape records operations on ``mask`` (eagerly, or a tape opened
        inside the same tf.function). A tape outside a tf.function that differentiates with
        respect to an input of that function is not visible while it traces (docs/semantics.md)."""
        if not mask.dtype.is_floating:
            return False
        record = _tf_record()
        if record is None:  # TensorFlow without the probe: assume a tape may watch it
            return True
        tf = sys.modules["tensorflow"]
        try:
            if isinstance(mask, tf.Variable):  # a tape watches trainable variables it sees read
                return bool(mask.trainable and record.could_possibly_record())
            return bool(record.should_record_backprop([mask]))
        except Exception:  # the probe failed: assume a tape may watch it
            return True

    def to_numpy(self, x: Any) -> np.ndarray:
        return x.numpy()

    def result_problem(self, x: Any, shape: tuple[int, ...], dtype: str | None, like: Any) -> str | None:
        dtype = dtype or self.dtype_name(like)
        tf = sys.modules["tensorflow"]
        if not tf.is_tensor(x):
            return f"a TensorFlow tensor, got {type(x).__module__}.{type(x).__qualname__}"
        if not x.shape.is_compatible_with(shape):  # in a graph, a dimension may be unknown
            return f"shape {shape}, got {tuple(x.shape)}"
        if x.dtype.name != dtype:
            return f"dtype {dtype}, got {x.dtype.name}"
        if self.is_concrete(x) and self.device(x) != self.device(like):
            return f"device {self.device(like)}, got {self.device(x)}"
        return None

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

    def mask_needs_grad(self, mask: Any) -> bool:
        """True when ``mask`` is being differentiated now (a JVP or linearize tracer: an argument
        of ``jax.grad``/``jax.vjp``). A mask traced by ``jax.jit`` may still be differentiated
        later (``grad(jit(f))``): the core guards such masks so that asking for their gradient
        raises instead of giving zeros (docs/semantics.md)."""
        return type(mask).__name__ in ("JVPTracer", "LinearizeTracer")

    def from_numpy(self, a: np.ndarray, dtype: str, like: Any) -> Any:
        jnp = sys.modules["jax.numpy"]
        return jnp.asarray(np.asarray(a).astype(numpy_dtype(dtype), copy=False))


_ADAPTERS: dict[type, Adapter] = {}
_JAX = JaxAdapter()  # one instance: jax arrays (jaxlib) and tracers (jax) are the same framework
_BY_ROOT = {
    "numpy": Adapter(),
    "ml_dtypes": Adapter(),
    "torch": TorchAdapter(),
    "tensorflow": TensorFlowAdapter(),
    "jax": _JAX,
    "jaxlib": _JAX,
}


#: Array types of a known framework that are not dense arrays; rejected by name (SPEC §12).
_NOT_DENSE = {
    "numpy.ma.MaskedArray": "a masked array",
    "numpy.matrix": "a numpy.matrix",
    "tensorflow.SparseTensor": "a tf.SparseTensor",
    "tensorflow.RaggedTensor": "a tf.RaggedTensor",
    "tensorflow.IndexedSlices": "a tf.IndexedSlices",
}


def _not_dense(cls: type) -> str | None:
    for klass in cls.__mro__:
        mod = klass.__module__ or ""
        name = klass.__qualname__
        for prefix, what in _NOT_DENSE.items():
            pmod, pname = prefix.rsplit(".", 1)
            if name == pname and mod.split(".", 1)[0] == pmod.split(".", 1)[0]:
                return what
        if mod.startswith("jax.experimental.sparse"):
            return "a jax.experimental.sparse array"
    return None


def adapter_for(x: Any, name: str = "q") -> Adapter:
    """The adapter of ``x``'s framework; :class:`SpecError` naming ``name`` for anything that is
    not a dense array of a supported framework."""
    cls = type(x)
    found = _ADAPTERS.get(cls)
    if found is not None:
        return found
    for klass in cls.__mro__:
        root = (klass.__module__ or "").split(".", 1)[0]
        if root in _BY_ROOT:
            found = _BY_ROOT[root]
            break
    expected = "a NumPy array, torch tensor, TensorFlow tensor or JAX array"
    if found is None or not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise SpecError(name, expected, f"{cls.__module__}.{cls.__qualname__}")
    what = _not_dense(cls)
    if what is not None:
        raise SpecError(name, "a dense " + expected.removeprefix("a "), what)
    _ADAPTERS[cls] = found
    return found


def adapter_like(x: Any, name: str, like: Adapter) -> Adapter:
    """``x``'s adapter, which must be ``like``'s framework (q's): :class:`SpecError` naming ``name``
    otherwise (SPEC §12: inputs of different frameworks, whatever their order)."""
    xad = adapter_for(x, name)
    if xad.name != like.name:
        raise SpecError(name, f"a {like.name} array like q", f"a {xad.name} array")
    return xad


def _tf_record() -> Any:
    try:
        from tensorflow.python.eager import record
    except ImportError:
        return None
    return record if hasattr(record, "should_record_backprop") else None
