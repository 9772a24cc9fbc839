"""torch's SDPA kernels as attnhub backends, each declaring exactly what its kernel computes.

- ``sdpa-cpu``: torch's fused CPU kernel (``aten._scaled_dot_product_flash_attention_for_cpu``, the
  kernel SDPA itself picks on the CPU), called directly: it returns lse, skips SDPA's per-call
  kernel selection, and is exact in float64 (float64 accumulation). SDPA's math kernel computes
  the same function about 5x slower, so it is not offered.
- ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn``: torch's original
  ``scaled_dot_product_attention`` (the C function, never a patched ``torch.nn.functional``
  attribute) inside ``torch.nn.attention.sdpa_kernel`` pinned to one kernel. Whether the kernel
  takes a request (dtype, head dims, GPU, GQA, mask) is asked of torch itself
  (``torch.backends.cuda.can_use_*``), so the answer follows the installed torch.

Gradients are torch autograd's own through the kernel's backward; lse carries none.
"""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.request import Request
from attnhub_backends.sdpa.masks import rule_plan, torch_rule_mask

_HALF = ("float16", "bfloat16")


def _torch_available() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed: pip install torch"
    return None


def _torch_version() -> str:
    import torch

    return f"torch {torch.__version__}"


def _empty_rows(mask: Any) -> Any:
    """(…, Nq) True where a rank-4 mask (bool: True attends; float: -inf excludes) leaves no key."""
    import torch

    if mask.dtype == torch.bool:
        return ~mask.any(dim=-1)
    return torch.isneginf(mask).all(dim=-1)


def _positive_scale(q: Any, scale: float, causal: bool) -> tuple[Any, float]:
    """(q, scale) or (-q, -scale) for a negative scale under ``is_causal``: the same logits exactly
    (negation is exact), and torch's CPU kernel gives NaN for is_causal with a negative scale."""
    if causal and scale < 0:
        return -q, -scale
    return q, scale


def _grads_by_autograd(backend: Backend, q, k, v, dout, req, mask) -> tuple[Any, Any, Any]:
    import torch

    with torch.enable_grad():
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        out, _ = backend._compute(*leaves, req, mask)  # type: ignore[attr-defined]
        return tuple(torch.autograd.grad(out, leaves, dout))  # type: ignore[return-value]


class _SdpaBase(Backend):
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    #: backward re-runs the kernel under torch autograd (so torch.compile's backward op avoids it)
    backward_by_autograd: ClassVar[bool] = True
    requires: ClassVar[tuple[str, ...]] = ("torch",)

    def version(self) -> str | None:
        return _torch_version()

    def run(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        # torch autograd differentiates the kernel call itself: no attnhub glue in between.
        return self._compute(q, k, v, req, mask)

    def forward(self, q: Any, k: Any, v: Any, req: Request, mask: Any = None) -> tuple[Any, Any]:
        import torch

        with torch.no_grad():
            return self._compute(q, k, v, req, mask)

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None
    ) -> tuple[Any, Any, Any]:
        return _grads_by_autograd(self, q, k, v, dout, req, mask)

    def _compute(self, q: Any, k: Any, v: Any, req: Request, mask: Any) -> tuple[Any, Any]:
        raise NotImplementedError


class SdpaCpu(_SdpaBase):
    """torch's fused CPU attention kernel for torch CPU tensors."""

    name: ClassVar[str] = "sdpa-cpu"
    priority: ClassVar[int] = 30
    device_types: ClassVar[tuple[str, ...]] = ("cpu",)
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32", "float64")
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward"}
    )

    def availability(self) -> str | None:
        why = _torch_available()
        if why:
            return why
        import torch

        if not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
            return f"torch {torch.__version__} has no fused CPU attention kernel (torch >= 2.3 has)"
        return None

    def extra_reasons(self, req: Request) -> list[str]:
        plan = rule_plan(req)
        return [plan.why_not] if plan.why_not else []

    def note(self, req: Request) -> str | None:
        plan = rule_plan(req)
        how = "is_causal" if plan.causal else "rule mask" if plan.materialise else None
        pad = " (head dims padded with zeros to match)" if req.dim_qk != req.dim_v else ""
        return (how or "") + pad or None

    def _compute(self, q: Any, k: Any, v: Any, req: Request, mask: Any) -> tuple[Any, Any]:
        import torch
        import torch.nn.functional as F

        plan = rule_plan(req)
        # Masks in the accumulation dtype: the kernel adds them in float32 for half inputs.
        mdtype = torch.float32 if req.dtype in _HALF else q.dtype
        attn_mask = None
        if plan.materialise:
            attn_mask = torch_rule_mask(req, q.device, mdtype)
        elif mask is not None:
            if mask.dtype == torch.bool:
                attn_mask = torch.zeros(mask.shape, dtype=mdtype).masked_fill_(~mask, float("-inf"))
            else:
                attn_mask = mask if mask.dtype == mdtype else mask.to(mdtype)
        # The kernel reads rows as if the last dim were contiguous: it returns wrong values for a
        # view whose last stride is not 1 (the bhds layout's canonical view).
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        in_dtype = q.dtype
        if req.needs_grad and req.dtype in _HALF and torch.is_grad_enabled():
            # The kernel's backward forms rowsum(dO·O) from O in the input dtype; on rows whose
            # probability sits on one key that cancellation costs dq more than SPEC's tolerance
            # (tests/test_peaked_row_gradients.py). Run it in float32 and round the output once.
            q, k, v = (x.float() for x in (q, k, v))
        dv = req.dim_v
        if req.dim_qk != dv:
            # The kernel needs one head dim: zero columns add exactly 0 to every q·k and give output
            # columns that are sliced off, so padding is exact (scale is passed explicitly).
            d = max(req.dim_qk, dv)
            q, k = F.pad(q, (0, d - req.dim_qk)), F.pad(k, (0, d - req.dim_qk))
            v = F.pad(v, (0, d - dv))
        q, scale = _positive_scale(q, req.scale, plan.causal)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, plan.causal, attn_mask=attn_mask, scale=scale
        )
        if out.shape[-1] != dv:
            out = out[..., :dv]
        if out.dtype != in_dtype:
            out = out.to(in_dtype)
        if req.return_lse and plan.empty_rows:
            # The kernel gives out = 0 on a row that attends no key, but lse = 0: SPEC wants -inf.
            empty = _empty_rows(attn_mask if plan.materialise else mask)
            lse = lse.masked_fill(empty.expand(lse.shape), float("-inf"))
        return out, lse
