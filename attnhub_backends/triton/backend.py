"""The ``triton`` backend class: what it declares, when it says no, and the calls into ``launch``."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.request import Request
from attnhub_backends.triton.loader import interpret_mode


class TritonBackend(Backend):
    """FlashAttention-2 in Triton for torch CUDA tensors (CPU tensors under ``TRITON_INTERPRET=1``)."""

    name: ClassVar[str] = "triton"
    priority: ClassVar[int] = 100
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32")
    features: ClassVar[frozenset[str]] = frozenset(
        {
            "1d",
            "given_lse",
            "2d",
            "full",
            "causal",
            "local",
            "gqa",
            "lse",
            "backward",
            "deterministic",
            "explicit_mask",
            "bias",
            "dbias",
            "softcap",
            "sinks",
            "offsets",
            "lengths",  # SPEC §10: ragged_launch
            "varlen",
            "paged",
            "alibi",  # SPEC §9, dense kernels (modifiers.reasons says where not)
        }  # fmt: skip
    )
    max_head_dim: ClassVar[int | None] = 256
    requires: ClassVar[tuple[str, ...]] = ("torch", "triton")

    @property  # type: ignore[override]
    def device_types(self) -> tuple[str, ...]:
        """CUDA devices; also the CPU while ``TRITON_INTERPRET=1`` (Triton's interpreter, for CI)."""
        return ("cuda", "cpu") if interpret_mode() else ("cuda",)

    def tuning(self) -> Any:
        """Config tuning (:func:`attnhub_backends.triton.configs.tuning`) while ``attnhub tune`` runs."""
        from attnhub_backends.triton import configs

        return configs.tuning()

    compiles_ahead: ClassVar[bool] = True

    def warmup(self, dtypes: list[str], head_dims: list[int], tune: bool, echo: Any) -> None:
        """The first calls of the common kernel classes (attnhub_backends/triton/warmup.py)."""
        from attnhub_backends.triton import warmup

        warmup.warmup(dtypes, head_dims, tune, echo)

    def tuned_configs(self) -> dict[str, str]:
        """The configs the tuner picked in this process (none where it did not run)."""
        mod = sys.modules.get("attnhub_backends.triton.configs")
        if mod is None:
            return {}
        return {" ".join(map(str, k)): str(v) for k, v in mod.chosen().items()}

    def availability(self) -> str | None:
        for mod in ("torch", "triton"):
            if importlib.util.find_spec(mod) is None:
                return f"{mod} is not installed: pip install 'attnhub[triton]'"
        if "tensorflow" in sys.modules and "triton" not in sys.modules:
            # Both bundle LLVM: importing triton after tensorflow aborts the whole process
            # ("Option ... registered more than once!", tensorflow 2.21 with triton 3.x).
            return (
                "TensorFlow is loaded in this process and Triton is not: importing Triton now would "
                "abort the process (both bundle LLVM); import triton before tensorflow"
            )
        if interpret_mode():
            return None
        import torch

        if not torch.cuda.is_available():
            return (
                "no CUDA GPU is visible to torch (set TRITON_INTERPRET=1 to run the kernels "
                "slowly on the CPU under Triton's interpreter)"
            )
        return None

    def version(self) -> str | None:
        # From the package metadata: importing triton into a process that loaded TensorFlow first
        # can abort LLVM, and ``attnhub info`` asks every backend.
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"triton {version('triton')}" + (" (interpreter)" if interpret_mode() else "")
        except PackageNotFoundError:
            return None

    def extra_reasons(self, req: Request) -> list[str]:
        reasons: list[str] = []
        if req.device_type == "cuda" and req.dtype == "bfloat16" and not interpret_mode():
            import torch

            index = int(req.device.split(":", 1)[1]) if ":" in req.device else None
            major, minor = torch.cuda.get_device_capability(index)
            if major < 8:
                reasons.append(f"bfloat16 needs compute capability 8.0 or newer, the GPU has {major}.{minor}")
        if req.nq >= (1 << 31) or req.nk >= (1 << 31):
            reasons.append("sequence lengths must stay under 2**31 (int32 positions)")
        if req.ragged:
            from attnhub_backends.triton.ragged_checks import reasons as ragged_reasons

            reasons.extend(ragged_reasons(req))
            if req.more:
                from attnhub_backends.triton.modifiers import alibi_reasons

                reasons.extend(alibi_reasons(req))
        else:
            from attnhub_backends.triton import modifiers

            reasons.extend(modifiers.reasons(req))
        return reasons

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        req, operands = _as_lengths(req, mask, operands)
        if req.ragged:
            req, operands = _mask_as_bias(req, mask, operands)
            return _ragged().forward(q, k, v, req, operands, need_lse=req.return_lse)
        from attnhub_backends.triton import launch, modifiers

        return launch.forward(q, k, v, req, mods=modifiers.from_call(req, mask, operands))

    def forward_for_grad(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any, Any]:
        """Half-precision inputs: the kernel writes a float32 output; the backward's rowsum(dO·O)
        reads it, the caller gets it rounded to the input dtype (the same rounding as forward). A
        padding-shaped mask runs forward as lengths; the backward keeps the mask kernels (faster
        there on the H100), which read the same lse."""
        req, operands = _as_lengths(req, mask, operands)
        if req.ragged:
            req, operands = _mask_as_bias(req, mask, operands)
            return _ragged().forward_for_grad(q, k, v, req, operands)
        import torch

        from attnhub_backends.triton import launch, modifiers

        mods = modifiers.from_call(req, mask, operands)
        if q.element_size() >= 4:
            out, lse = launch.forward(q, k, v, req, mods=mods)
            return out, lse, out
        out32, lse = launch.forward(q, k, v, req, out_dtype=torch.float32, mods=mods)
        return out32.to(q.dtype), lse, out32

    def backward(
        self,
        q: Any,
        k: Any,
        v: Any,
        out: Any,
        lse: Any,
        dout: Any,
        req: Request,
        mask: Any = None,
        operands: Any = None,
        dlse: Any = None,
    ) -> tuple[Any, ...]:
        """(dq, dk, dv), or (dq, dk, dv, dbias, dsinks) for a request with a bias or sinks (``dlse``
        is always None: the backend does not declare "dlse")."""
        if req.ragged:
            combined, ops = _mask_as_bias(req, mask, operands)
            grads = _ragged().backward(q, k, v, out, lse, dout, combined, ops)
            if combined is req:
                return grads
            from attnhub_backends.triton import mask_bias

            return mask_bias.user_dbias(grads, req, combined, operands)
        from attnhub_backends.triton import launch, modifiers

        return launch.backward(q, k, v, out, lse, dout, req, mods=modifiers.from_call(req, mask, operands))


def _as_lengths(req: Request, mask: Any, operands: Any) -> tuple[Request, Any]:
    """(request, operands) as lengths where ``mask`` is a padding pattern (mask_forms.py), else as
    given."""
    if mask is None:  # every call without a mask array (decode steps): no import statement
        return req, operands
    from attnhub_backends.triton import mask_forms

    if not mask_forms.eligible(req):
        return req, operands
    form = mask_forms.lengths_form(mask.reshape(req.rule.shape), req)  # type: ignore[union-attr]
    if form is None:
        return req, operands
    from attnhub_backends.triton.ragged_checks import reasons

    as_lengths = form.request(req)
    if reasons(as_lengths):
        return req, operands
    return as_lengths, form.operands()


def _mask_as_bias(req: Request, mask: Any, operands: Any) -> tuple[Request, Any]:
    """A boolean mask with lengths as an additive bias (mask_bias.py), else (req, operands)."""
    if mask is None or not req.ragged:
        return req, operands
    from attnhub_backends.triton import mask_bias

    return mask_bias.as_bias(req, mask, operands) if mask_bias.applies(req) else (req, operands)


_ragged_launch: ModuleType | None = None


def _ragged() -> ModuleType:
    """ragged_launch (it imports torch: loaded on first use, then kept; an import statement costs
    ~0.4 us per call)."""
    global _ragged_launch
    if _ragged_launch is None:
        from attnhub_backends.triton import ragged_launch

        _ragged_launch = ragged_launch
    return _ragged_launch
