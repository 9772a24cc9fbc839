"""The ``cuda`` backend's contract with the core: what it serves, why it declines a request, and
forward / backward handed to the launchers (torch CUDA tensors in, NVRTC-compiled CUDA C++ kernels,
autograd through the core)."""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.errors import AttnhubError
from attnhub.operands import Operands
from attnhub.request import Request
from attnhub.rules import ExplicitMask
from attnhub_backends.cuda import compiler, launch
from attnhub_backends.cuda.choice import HALF, smem_reasons, use_f16x3, use_mma
from attnhub_backends.cuda.device import smem_limit
from attnhub_backends.cuda.grid import grid_ok
from attnhub_backends.cuda.mask import offset_reasons


class CudaBackend(Backend):
    """Flash attention in CUDA C++: mma.sync tensor cores for float16/bfloat16 at head dims 64/128,
    a SIMT kernel for float32/float64 (and other head dims up to 128), SIMT backward kernels."""

    name: ClassVar[str] = "cuda"
    priority: ClassVar[int] = 90
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32", "float64")
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "gqa", "lse", "backward", "given_lse"}
        # "bias"/"dbias": the MODS bias path gave NaN on the H100 for rows a -inf bias excludes
        # entirely and for a 2-d causal bias with a negative scale (tests/test_cuda_modifiers_gpu.py,
        # 2026-11-24); it stays undeclared, so auto and certify never route a bias here, until fixed.
        | {"softcap", "offsets"}
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
        reasons.extend(offset_reasons(req))
        reasons.extend(unserved_reasons(req))
        if req.softcap is not None and req.dtype != "float64" and req.softcap > _SOFTCAP_MAX:
            reasons.append(
                f"holds the softcap in float32: a softcap above 2**100 (given {req.softcap:g}) that can "
                "still change a logit would be inf there (use float64 inputs)"
            )
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
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Operands | None = None
    ) -> tuple[Any, Any, Any]:
        """Half inputs: the forward kernel writes a float32 output, which the backward's
        rowsum(dO·O) reads; the caller gets it rounded to the input dtype."""
        if req.dtype not in HALF:
            out, lse = self.forward(q, k, v, req, mask, operands)
            return out, lse, out
        import torch

        out32, lse = launch.forward(q, k, v, req, torch.float32, operands)
        return out32.to(q.dtype), lse, out32

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Operands | None = None
    ) -> tuple[Any, Any]:
        return launch.forward(q, k, v, req, q.dtype, operands)

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None,
        operands: Operands | None = None, dlse: Any = None,
    ) -> tuple[Any, ...]:  # fmt: skip
        """(dq, dk, dv), or (dq, dk, dv, dbias, None) for a request with a bias (SPEC §9); ``dlse``
        is always None (no "dlse" feature)."""
        return launch.backward(q, k, v, out, lse, dout, req, operands)


#: What to use instead for the SPEC §9-§11 arguments the cuda kernels do not take.
_ELSEWHERE = "use backend='triton' (or backend='auto', which picks a backend that takes it)"


#: The largest softcap the float32 kernels take: far from float32's max, so that the cap and
#: u/cap stay finite and normal (attnhub.modifiers.softcap.effective_softcap drops caps that cannot matter).
_SOFTCAP_MAX = 2.0**100


def unserved_reasons(req: Request) -> list[str]:
    """Where to go for what the cuda backend declines beyond its declared features: sinks, lengths,
    packed and paged sequences and boolean masks (the base check already names the missing feature)."""
    uses = {
        "attention sinks": req.sinks,
        "q_lengths/k_lengths": req.q_lengths or req.k_lengths,
        "packed sequences (attention_varlen)": req.varlen,
        "paged KV caches": bool(req.paged),
        "boolean mask arrays": isinstance(req.rule, ExplicitMask),
    }
    return [f"the cuda kernels do not take {what}: {_ELSEWHERE}" for what, used in uses.items() if used]


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
