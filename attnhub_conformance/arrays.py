"""Arrays of one framework and device for the suite: building inputs, reading results, gradients.

Inputs are drawn in NumPy (float64, N(0, 1)), rounded to the test dtype and only then converted,
so the backend and the float64 reference see the same values. Frameworks are imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from attnhub.frameworks import numpy_dtype

FRAMEWORKS = ("numpy", "torch", "tensorflow", "jax")


def round_to(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to ``dtype`` and back to float64 (what the backend and the reference both see)."""
    return a.astype(numpy_dtype(dtype)).astype(np.float64)


def to_layout(a: np.ndarray, seq: tuple[int, ...], layout: str) -> np.ndarray:
    """Canonical (B, H, N, D) -> the user-facing layout with the sequence shape ``seq``."""
    b, h, _, d = a.shape
    x = a.reshape(b, h, *seq, d)
    if layout == "bshd":
        return np.moveaxis(x, 1, -2)
    if layout == "bhds":
        return np.moveaxis(x, -1, 2)
    return x


def from_layout(a: np.ndarray, layout: str) -> np.ndarray:
    """The user-facing layout -> canonical (B, H, N, D)."""
    if layout == "bshd":
        a = np.moveaxis(a, -2, 1)
    elif layout == "bhds":
        a = np.moveaxis(a, 2, -1)
    b, h, d = a.shape[0], a.shape[1], a.shape[-1]
    return a.reshape(b, h, -1, d)


def noncontiguous_np(a: np.ndarray, kind: str) -> np.ndarray:
    """A non-contiguous NumPy view equal to ``a``: a transposed copy viewed back, or a slice of a
    wider NaN-padded buffer (a backend reading past the view's end gets NaN)."""
    if kind == "transposed":
        return np.ascontiguousarray(np.swapaxes(a, 1, 2)).swapaxes(1, 2)
    if kind == "sliced":
        buf = np.full((*a.shape[:-1], a.shape[-1] + 8), np.nan, dtype=a.dtype)
        buf[..., : a.shape[-1]] = a
        return buf[..., : a.shape[-1]]
    return a


class Ops:
    """Framework- and device-specific operations used by the runner."""

    def __init__(self, framework: str, device: str) -> None:
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
        self.framework = framework
        self.device = device
        self.cuda = device.startswith("cuda")
        if framework == "torch":
            import torch

            self.torch = torch
            self.torch_device = torch.device(device)
        elif framework == "tensorflow":
            import tensorflow as tf

            self.tf = tf
            self.tf_device = "/GPU:0" if self.cuda else "/CPU:0"
        elif framework == "jax":
            import jax
            import jax.numpy as jnp

            # float64 cases need real float64 arrays: without x64, jnp.asarray silently gives float32.
            jax.config.update("jax_enable_x64", True)
            self.jax, self.jnp = jax, jnp
            self.jax_device = jax.devices("gpu" if self.cuda else "cpu")[0]
        elif self.cuda:
            raise ValueError("NumPy arrays live on the CPU; use --framework torch or jax for CUDA")

    # -- building -------------------------------------------------------------------------------
    def array(self, a: np.ndarray, dtype: str, noncontig: str = "", grad: bool = False) -> Any:
        """Convert float64 (already rounded) ``a`` to the framework in ``dtype``; maybe a strided view."""
        fw = self.framework
        if fw == "numpy":
            return noncontiguous_np(a.astype(numpy_dtype(dtype)), noncontig)
        if fw == "torch":
            torch = self.torch
            tdt = getattr(torch, dtype)
            if noncontig == "transposed":
                base = torch.from_numpy(np.ascontiguousarray(np.swapaxes(a, 1, 2)))
                base = base.to(device=self.torch_device, dtype=tdt).requires_grad_(grad)
                return base.transpose(1, 2)
            if noncontig == "sliced":
                buf = np.full((*a.shape[:-1], a.shape[-1] + 8), np.nan)
                buf[..., : a.shape[-1]] = a
                base = torch.from_numpy(buf).to(device=self.torch_device, dtype=tdt).requires_grad_(grad)
                return base[..., : a.shape[-1]]
            t = torch.from_numpy(np.ascontiguousarray(a)).to(device=self.torch_device, dtype=tdt)
            return t.requires_grad_(grad)
        if fw == "tensorflow":
            tf = self.tf
            with tf.device(self.tf_device):
                return tf.cast(tf.constant(a), dtype)
        jnp = self.jnp
        return self.jax.device_put(jnp.asarray(a.astype(numpy_dtype(dtype))), self.jax_device)

    def mask(self, m: np.ndarray, dtype: str) -> Any:
        """An explicit mask (bool, or additive float64 already rounded) in the framework."""
        if m.dtype == np.bool_:
            if self.framework == "numpy":
                return m.copy()
            if self.framework == "torch":
                return self.torch.from_numpy(m.copy()).to(self.torch_device)
            if self.framework == "tensorflow":
                with self.tf.device(self.tf_device):
                    return self.tf.constant(m)
            return self.jax.device_put(self.jnp.asarray(m), self.jax_device)
        return self.array(m, dtype)

    def int_array(self, a: np.ndarray) -> Any:
        """An integer array (lengths, cu_seqlens, a block table) in the framework, on the device."""
        a = np.array(a, copy=True)
        if self.framework == "numpy":
            return a
        if self.framework == "torch":
            return self.torch.from_numpy(a).to(self.torch_device)
        if self.framework == "tensorflow":
            with self.tf.device(self.tf_device):
                return self.tf.constant(a)
        return self.jax.device_put(self.jnp.asarray(a), self.jax_device)

    # -- reading --------------------------------------------------------------------------------
    def to_numpy(self, x: Any) -> np.ndarray:
        """A NumPy copy in the array's own dtype (bfloat16 through ml_dtypes)."""
        fw = self.framework
        if fw == "numpy":
            return np.array(x, copy=True)
        if fw == "torch":
            t = x.detach().cpu()
            if t.dtype == self.torch.bfloat16:
                return t.float().numpy().astype(numpy_dtype("bfloat16"))
            return t.numpy().copy()
        if fw == "tensorflow":
            return np.array(x.numpy(), copy=True)
        return np.array(x, copy=True)

    def to_f64(self, x: Any) -> np.ndarray:
        return self.to_numpy(x).astype(np.float64)

    def framework_of(self, x: Any) -> str:
        from attnhub.frameworks import adapter_for

        return adapter_for(x).name

    # -- hygiene --------------------------------------------------------------------------------
    def poison(self, nbytes: int) -> None:
        """Fill the torch CUDA caching allocator's free blocks with NaN so unwritten output shows.

        A large NaN tensor (large pool) and a few 1 MiB ones (small pool) are allocated and freed;
        the allocator hands their blocks to the backend's next allocations.
        """
        if not (self.framework == "torch" and self.cuda):
            return
        torch = self.torch
        big = max(64 << 20, 4 * nbytes)
        blocks = [torch.full((big // 4,), float("nan"), device=self.torch_device)]
        blocks += [torch.full(((1 << 20) // 4,), float("nan"), device=self.torch_device) for _ in range(8)]
        torch.cuda.synchronize(self.torch_device)
        del blocks

    # -- gradients ------------------------------------------------------------------------------
    def grads(self, fn: Callable[..., Any], inputs: Sequence[Any], dout: Any) -> list[Any]:
        """d(fn(*inputs) . dout) / d inputs, computed by the framework's own autodiff."""
        fw = self.framework
        if fw == "torch":
            out = fn(*inputs)
            return list(self.torch.autograd.grad(out, list(inputs), grad_outputs=dout))
        if fw == "tensorflow":
            tf = self.tf
            with tf.GradientTape() as tape:
                for x in inputs:
                    tape.watch(x)
                out = fn(*inputs)
            return list(tape.gradient(out, list(inputs), output_gradients=dout))
        if fw == "jax":
            _, vjp = self.jax.vjp(fn, *inputs)
            return list(vjp(dout))
        raise ValueError("NumPy has no autodiff: the runner calls backend.backward directly")

    # -- traced calls ---------------------------------------------------------------------------
    @property
    def tracer(self) -> str:
        """What traces a call in this framework ("" for NumPy, which has none)."""
        if self.framework == "torch":
            return f"torch.compile(backend={self._compile_backend()!r})"
        return {"jax": "jax.jit", "tensorflow": "tf.function"}.get(self.framework, "")

    def tracer_obstacle(self) -> str:
        """Why traced calls cannot run in this process ("" when they can)."""
        if not self.tracer:
            return f"{self.framework} inputs: no tracer (traced cases need torch, tf or jax)"
        import sys

        if self.framework == "torch" and "tensorflow" in sys.modules and "triton" not in sys.modules:
            return (
                "torch.compile loads triton, whose native library aborts a process that has loaded "
                "TensorFlow (certify with --framework torch to run it)"
            )
        return ""

    def _compile_backend(self) -> str:
        """inductor on CUDA; aot_eager on the CPU (dynamo and AOTAutograd trace the forward and the
        backward as inductor does, without compiling C++ for minutes per shape)."""
        return "inductor" if self.cuda else "aot_eager"

    def _traced(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` wrapped by the framework's tracer (a fresh trace: no cache from another case)."""
        fw = self.framework
        if fw == "jax":
            return self.jax.jit(fn)
        if fw == "tensorflow":
            return self.tf.function(fn)
        if fw == "torch":
            self.torch._dynamo.reset()  # per-code-object recompile limits would fall back to eager
            return self.torch.compile(fn, backend=self._compile_backend())
        raise ValueError("NumPy has no tracer: traced cases need torch, tensorflow or jax inputs")

    def traced_call(self, fn: Callable[..., Any], inputs: Sequence[Any]) -> Any:
        """``fn(*inputs)`` run through the framework's tracer (jax.jit, tf.function, torch.compile)."""
        if self.framework == "tensorflow":
            with self.tf.device(self.tf_device):
                return self._traced(fn)(*inputs)
        return self._traced(fn)(*inputs)

    def traced_grads(self, fn: Callable[..., Any], inputs: Sequence[Any], dout: Any, ones: bool) -> list[Any]:
        """Gradients of ``fn(q, k, v).sum()`` (``ones``) or of ``(fn(q, k, v) * dout).sum()`` with
        respect to the three inputs, traced as :meth:`traced_grads_of` traces them."""
        return self.traced_grads_of(fn, inputs, (0, 1, 2), dout, ones)

    def traced_grads_of(
        self, fn: Callable[..., Any], inputs: Sequence[Any], wrt: Sequence[int], dout: Any, ones: bool
    ) -> list[Any]:
        """Gradients of ``fn(*inputs).sum()`` (``ones``) or of ``(fn(*inputs) * dout).sum()`` with
        respect to ``inputs[i]`` for ``i`` in ``wrt``: the loss and its gradient traced together,
        as a training step under the framework's tracer is, every input traced (lengths, tables
        and slopes too, as a jitted step receives them)."""
        fw = self.framework
        wrt = tuple(wrt)

        def loss(*args: Any) -> Any:
            *xs, d = args
            out = fn(*xs)
            if fw == "tensorflow":
                return self.tf.reduce_sum(out if ones else out * d)
            return (out if ones else out * d).sum()

        if fw == "jax":
            return list(self.jax.jit(self.jax.grad(loss, argnums=wrt))(*inputs, dout))
        if fw == "tensorflow":
            tf = self.tf

            def step(*args: Any) -> Any:
                with tf.GradientTape() as tape:
                    tape.watch([args[i] for i in wrt])
                    value = loss(*args)
                return tape.gradient(value, [args[i] for i in wrt])

            return list(self.traced_call(step, [*inputs, dout]))
        if fw == "torch":
            value = self._traced(loss)(*inputs, dout)
            return list(self.torch.autograd.grad(value, [inputs[i] for i in wrt]))
        raise ValueError("NumPy has no tracer: traced cases need torch, tensorflow or jax inputs")
