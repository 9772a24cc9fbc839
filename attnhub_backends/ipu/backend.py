"""The ``ipu`` backend: chunked flash attention in torch operations for PopTorch (Graphcore IPUs).

On an IPU (tensors on the ``ipu`` device inside a PopTorch model) the chunked graph of
:mod:`attnhub_backends.ipu.graph` is traced and compiled by PopTorch like any other torch code.
Without poptorch the backend is unavailable, unless emulation is on (``ATTNHUB_IPU_EMULATE=1``):
then the very same graph runs on torch CPU tensors, so that it can be certified on any machine.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Any, ClassVar

from attnhub import settings
from attnhub.backend import Backend
from attnhub.request import Request

NO_POPTORCH = "poptorch is not installed; it ships with the Poplar SDK"


def emulation_enabled() -> bool:
    """True when ``ATTNHUB_IPU_EMULATE`` is set to a true value (1, true, yes, on)."""
    return settings.value("ATTNHUB_IPU_EMULATE")


def poptorch_installed() -> bool:
    return importlib.util.find_spec("poptorch") is not None


def running_on_ipu() -> bool:
    """``poptorch.isRunningOnIpu()`` when the caller has imported poptorch (never imports it)."""
    poptorch = sys.modules.get("poptorch")
    if poptorch is None:
        return False
    try:
        return bool(poptorch.isRunningOnIpu())
    except Exception:  # a poptorch without it, or one that cannot answer outside a model
        return False


class IpuBackend(Backend):
    """Chunked online-softmax attention for torch tensors on an IPU, or on the CPU in emulation."""

    name: ClassVar[str] = "ipu"
    # The only backend for tensors on the ipu device; for CPU tensors (emulation mode) it ranks
    # above the float64 NumPy reference (0) and below every native CPU backend.
    priority: ClassVar[int] = 5
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "float32")
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "gqa", "lse", "backward"}
    )
    requires: ClassVar[tuple[str, ...]] = ("poptorch",)
    #: backward recomputes the forward under torch autograd, which torch.compile's backward op
    #: cannot run (auto then takes another backend; named explicitly, ipu declines)
    backward_by_autograd: ClassVar[bool] = True

    def __init__(self) -> None:
        self._modules: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    @property
    def device_types(self) -> tuple[str, ...]:  # type: ignore[override]
        """``("ipu",)``; ``("cpu", "ipu")`` in emulation mode or while PopTorch traces a model.

        PopTorch versions that trace with CPU tensors report ``poptorch.isRunningOnIpu()`` while
        they do; such tensors are accepted then (name the backend, see docs/backends/ipu.md).
        """
        return ("cpu", "ipu") if emulation_enabled() or running_on_ipu() else ("ipu",)

    def availability(self) -> str | None:
        if emulation_enabled() or poptorch_installed():
            return None
        return f"{NO_POPTORCH} (or set ATTNHUB_IPU_EMULATE=1 to run its graph on the CPU)"

    def version(self) -> str | None:
        parts = []
        if poptorch_installed():
            import poptorch

            parts.append(f"poptorch {getattr(poptorch, '__version__', '?')}")
        if emulation_enabled():
            import torch

            parts.append(f"cpu-emulation (torch {torch.__version__})")
        return " + ".join(parts) or None

    def extra_reasons(self, req: Request) -> list[str]:
        reasons = []
        if req.symbolic:
            reasons.append("needs torch tensors, got symbolic inputs")
        if req.device_type == "ipu" and not poptorch_installed():
            reasons.append(NO_POPTORCH)
        return reasons

    # -- compute -------------------------------------------------------------------------------

    def module(self, req: Request, device: Any) -> Any:
        """The chunked module for this request's static signature on ``device`` (cached on the CPU)."""
        from attnhub_backends.ipu.graph import ChunkedAttention
        from attnhub_backends.ipu.plan import choose_chunks, make_plan

        cq, ck = choose_chunks(req.nq, req.nk, req.dim_qk)
        key = (req.batch, req.heads_q, req.heads_kv, req.seq_q, req.seq_k, req.dim_v, req.rule,
               req.sync, req.scale, cq, ck, str(device))  # fmt: skip
        found = self._modules.get(key)
        if found is None:
            plan = make_plan(req.rule, req.seq_q, req.seq_k, req.sync, cq, ck)
            found = ChunkedAttention(plan, req.batch, req.heads_q, req.heads_kv, req.dim_v, req.scale, device)
            if str(device).split(":")[0] != "cpu":
                # On the ipu device the mask constants belong to the graph PopTorch is tracing;
                # a later trace (another model, a recompilation) gets its own.
                return found
            with self._lock:
                if len(self._modules) >= 64:
                    self._modules.clear()
                self._modules[key] = found
        return found

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        if mask is not None:
            raise ValueError("the ipu backend does not read explicit masks")
        return self.module(req, q.device)(q, k, v)

    def run(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        """Forward with plain torch autograd through the chunked operations.

        PopTorch differentiates the traced graph itself (custom ``autograd.Function`` backward
        passes do not reach the IPU), so the backend never goes through the backward glue.
        """
        return self.forward(q, k, v, req, mask, operands)

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None,
        operands: Any = None, dlse: Any = None,
    ) -> tuple[Any, Any, Any]:  # fmt: skip
        """(dq, dk, dv) by recomputing the chunked forward under autograd (for direct callers)."""
        import torch

        with torch.enable_grad():
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
            recomputed, _ = self.forward(*leaves, req, mask)
            grads = torch.autograd.grad(recomputed, leaves, dout, allow_unused=True)
        return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, (q, k, v)))  # type: ignore[return-value]
