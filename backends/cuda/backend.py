"""The ``cuda`` backend's contract with the core: what it serves, why it declines a request, and
forward / backward handed to the launchers (torch CUDA tensors in, NVRTC-compiled CUDA C++ kernels,
autograd through the core)."""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.errors import AttnhubError
from attnhub.request import Request
from attnhub_backends.cuda import compiler, launch
from attnhub_backends.cuda.choice import HALF, smem_reasons, use_f16x3, use_mma
from attnhub_backends.cuda.device import smem_limit
from attnhub_backends.cuda.grid import grid_ok


class CudaBackend(Backend):
    """Flash attention in CUDA C++: mma.sync tensor cores for float16/bfloat16 at head dims 64/128,
    a SIMT kernel for float32/float64 (and other head dims up to 128), SIMT backward kernels."""

    name: ClassVar[str] = "cuda"
    priority: ClassVar[int] = 90
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32", "float64")
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "gqa", "lse", "backward"}
    )
    max_head_dim: ClassVar[int | None] = 128
    requires: ClassVar[tuple[str, ...]] = ("torch", "cuda-core", "nvidia-cuda-nvrtc")

    def availability(self) -> str | None:
        # Nothing here imports torch: a NumPy call must not pay for (or load) a framework it never uses.
        if importlib.util.find_spec("torch") is None:
            return "needs torch with CUDA: pip install 'attnhub[cuda]'"
        try:
            compiler._core("Program")
            compiler._include_dirs()
            compiler.nvrtc_version()
        except (ImportError, AttnhubError, RuntimeError, OSError) as exc:
            return f"needs cuda-python's NVRTC (pip install 'attnhub[cuda]'): {exc}"
        return _driver_reason()

    def version(self) -> str | None:
        try:
            return f"nvrtc {compiler.nvrtc_version()}"
        except Exception:  # pragma: no cover - shown by availability()
            return None

    def extra_reasons(self, req: Request) -> list[str]:
        reasons = grid_ok(req, tiles_on_z=use_mma(req) or use_f16x3(req))
        if req.symbolic:
            reasons.append("needs concrete torch tensors")
        if req.device_type == "cuda":
            import torch

            major, _ = torch.cuda.get_device_capability(req.device)
            if major < 8:
                reasons.append(
                    f"needs compute capability 8.0 or newer (cp.async, mma.sync), {req.device} has {major}.x"
                )
            else:
                reasons.extend(smem_reasons(req, smem_limit(req.device)))
        return reasons

    def forward_for_grad(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None
    ) -> tuple[Any, Any, Any]:
        """Half inputs: the forward kernel writes a float32 output, which the backward's
        rowsum(dO·O) reads; the caller gets it rounded to the input dtype."""
        if req.dtype not in HALF:
            return super().forward_for_grad(q, k, v, req, mask)
        import torch

        out32, lse = launch.forward(q, k, v, req, torch.float32)
        return out32.to(q.dtype), lse, out32

    def forward(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        return launch.forward(q, k, v, req, q.dtype)

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None
    ) -> tuple[Any, Any, Any]:
        return launch.backward(q, k, v, out, lse, dout, req)


def _driver_reason() -> str | None:
    """None when the CUDA driver sees at least one GPU, else why not (asks the driver, not torch)."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err == driver.CUresult.CUDA_SUCCESS:
            err, count = driver.cuDeviceGetCount()
            if err == driver.CUresult.CUDA_SUCCESS and count > 0:
                return None
        return f"no CUDA GPU is visible to the driver ({err})"
    except Exception as exc:  # no libcuda.so: no NVIDIA driver on this machine
        return f"no NVIDIA driver / CUDA GPU on this machine ({type(exc).__name__})"
