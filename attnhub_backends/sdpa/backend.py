"""torch's SDPA kernels as attnhub backends, each declaring exactly what its kernel computes.

- ``sdpa-cpu``: torch's fused CPU kernel (``aten._scaled_dot_product_flash_attention_for_cpu``, the
  kernel SDPA itself picks on the CPU), called directly: it returns lse, skips SDPA's per-call
  kernel selection, and is exact in float64 (float64 accumulation). SDPA's math kernel computes
  the same function about 5x slower, so it is not offered.
- ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn``: torch's original
  ``scaled_dot_product_attention`` (the C function, never a patched ``torch.nn.functional``
  attribute) with SDPA's kernel flags pinned to one kernel (what ``torch.nn.attention.sdpa_kernel``
  does, in about a tenth of its host time: :class:`_Flags`); on contiguous inputs the bound call
  calls the kernel's own differentiable op, as SDPA does once it has chosen it. Whether the
  kernel takes a request (dtype, head dims, GPU, GQA, mask) is asked of torch itself
  (``torch.backends.cuda.can_use_*``), so the answer follows the installed torch.

Gradients are torch autograd's own through the kernel's backward; lse carries none.

``bind(req)`` (attnhub/fastpath.py) gives the call of one request with every decision that
depends on the request alone taken once: a repeated small call then costs about what calling SDPA
directly costs (issue 21). It falls back to the general path per call for inputs whose strides
the kernels do not take.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import threading
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.request import Request
from attnhub.rules import Full
from attnhub_backends.sdpa import alibi, rows
from attnhub_backends.sdpa.masks import MAX_MASK_ELEMENTS, RulePlan, rule_plan, torch_rule_mask
from attnhub_backends.sdpa.ragged import keep_mask, padded_slots, padding, zero_padded

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


def _contiguous(g: Any) -> Any:
    return g.contiguous()


def _grad_made_contiguous(out: Any) -> Any:
    """``out``, with the gradient that reaches the kernel's backward made contiguous: torch 2.11's
    cuDNN backward gives a wrong dq with GQA when dO's strides are not out's (a bshd or bhds
    caller's out is a transposed view, so its gradient arrives transposed; certify on an H200,
    cuDNN 9.19: dq relative error 1.4)."""
    if out.requires_grad:
        out.register_hook(_contiguous)
    return out


def _grads_by_autograd(backend: Backend, q, k, v, dout, req, mask, operands=None) -> tuple[Any, ...]:
    """(dq, dk, dv), or (dq, dk, dv, dbias, None) where the bias requires grad."""
    import torch

    with torch.enable_grad():
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        bias = operands.bias if operands is not None else None
        if bias is not None and bias.requires_grad:
            leaves.append(bias.detach().requires_grad_(True))
            operands = dataclasses.replace(operands, bias=leaves[-1])
        out, _ = backend._compute(*leaves[:3], req, mask, operands)  # type: ignore[attr-defined]
        grads = torch.autograd.grad(out, leaves, dout)
        return (*grads, None) if len(grads) == 4 else tuple(grads)


class _SdpaBase(Backend):
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    vendor: ClassVar[bool] = True  # torch's own kernels
    #: backward re-runs the kernel under torch autograd (so torch.compile's backward op avoids it)
    backward_by_autograd: ClassVar[bool] = True
    requires: ClassVar[tuple[str, ...]] = ("torch",)

    def version(self) -> str | None:
        return _torch_version()

    def run(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        # torch autograd differentiates the kernel call itself: no attnhub glue in between.
        return self._compute(q, k, v, req, mask, operands)

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        import torch

        with torch.no_grad():
            return self._compute(q, k, v, req, mask, operands)

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None,
        operands: Any = None, dlse: Any = None,
    ) -> tuple[Any, ...]:  # fmt: skip
        return _grads_by_autograd(self, q, k, v, dout, req, mask, operands)

    def _compute(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any, operands: Any = None
    ) -> tuple[Any, Any]:
        raise NotImplementedError

    def bind(self, req: Request) -> Callable[[Any, Any, Any, Any], tuple[Any, Any]]:
        """``fn(q, k, v, mask)``: what ``run(q, k, v, req, mask)`` does, decided once for ``req``."""
        fast = self._bind_fast(req)
        compute = self._compute

        def general(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any]:
            return compute(q, k, v, req, mask)

        bound = general if fast is None else fast(general)
        # torch's ops give a result whose type, shape, dtype and device follow from the inputs'
        # (fixed by the plan's key): attnhub checks it on the plan's first call only.
        bound.fixed_result = True  # type: ignore[attr-defined]
        return bound

    def _bind_fast(self, req: Request) -> Callable[[Any], Any] | None:
        """A maker of the fast call given the general one (used for strides it does not take), or
        None where ``req`` needs the general path."""
        return None


def _math_kernel(req: Request) -> bool:
    """True when ``sdpa-cpu`` runs SDPA's math kernel: a bias (or float mask) that requires grad,
    for which torch's fused CPU kernel has no gradient."""
    return req.bias_grad


def _top_left(nq: int, nk: int, device: Any) -> Any:
    """(Nq, Nk) bool: SDPA's ``is_causal`` (query i attends keys j <= i)."""
    import torch

    return torch.ones(nq, nk, dtype=torch.bool, device=device).tril()


def _unit_last_stride(q: Any, k: Any, v: Any) -> bool:
    """True when the kernels read q, k, v as they are (``is_contiguous`` first: cheaper to ask)."""
    return (
        (q.is_contiguous() or q.stride(-1) == 1) and (k.is_contiguous() or k.stride(-1) == 1)
        and (v.is_contiguous() or v.stride(-1) == 1)
    )  # fmt: skip


def _plain(req: Request, plan: RulePlan) -> bool:
    """True for a request the fast calls serve: no mask array, no materialised rule mask, equal head
    dims, and no negative scale under is_causal (negated at call time by the general path)."""
    return (
        plan.why_not is None and not plan.materialise and not plan.explicit and req.dim_qk == req.dim_v
        and not (plan.causal and req.scale < 0)
    )  # fmt: skip


class SdpaCpu(_SdpaBase):
    """torch's fused CPU attention kernel for torch CPU tensors.

    SPEC §9-§11 arguments that an attention mask expresses reach the kernel as one: a bias (or a
    float mask) as the additive mask, lengths and offsets as the boolean mask of each entry's
    valid segment (:mod:`attnhub_backends.sdpa.ragged`), composed with the rule and a boolean
    mask. The fused kernel takes no gradient for its mask: a bias that requires grad runs SDPA's
    math kernel, as SDPA itself does for such a mask (``dbias`` is torch autograd's, summed over
    the bias's broadcast dims). Packed sequences run one dense request per sequence (``_packed``).
    softcap, sinks and paged caches: declined.
    """

    name: ClassVar[str] = "sdpa-cpu"
    priority: ClassVar[int] = 30
    device_types: ClassVar[tuple[str, ...]] = ("cpu",)
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32", "float64")
    features: ClassVar[frozenset[str]] = frozenset(
        {
            "1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward",
            "bias", "dbias", "lengths", "offsets", "varlen", "alibi",
        }
    )  # fmt: skip

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
        if plan.why_not:
            return [plan.why_not]
        if why := alibi.reasons(req):
            return why
        if _math_kernel(req) and plan.causal and req.nq * req.nk > MAX_MASK_ELEMENTS:
            return [
                "a bias that requires grad runs SDPA's math kernel, which needs the causal rule as a "
                f"materialised Nq x Nk mask of {req.nq * req.nk} elements (limit {MAX_MASK_ELEMENTS})"
            ]
        return []

    def note(self, req: Request) -> str | None:
        plan = rule_plan(req)
        parts = [
            "is_causal" if plan.causal and not _math_kernel(req) else "",
            "rule mask" if plan.materialise or (plan.causal and _math_kernel(req)) else "",
            "lengths/offsets mask" if plan.ragged else "",
            "bias as attn_mask" if req.bias is not None else "",
            "ALiBi term as attn_mask" if alibi.used(req) else "",
            "SDPA math kernel (dbias)" if _math_kernel(req) else "",
            "head dims padded with zeros to match" if req.dim_qk != req.dim_v else "",
        ]
        return ", ".join(p for p in parts if p) or None

    def _compute(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any, operands: Any = None
    ) -> tuple[Any, Any]:
        import torch
        import torch.nn.functional as F

        if req.varlen:
            return self._packed(q, k, v, req, operands)
        plan = rule_plan(req)
        bias = operands.bias if operands is not None else None
        grads = torch.is_grad_enabled() and (req.needs_grad or (bias is not None and bias.requires_grad))
        math = grads and bias is not None and bias.requires_grad
        # Masks in the accumulation dtype: the kernel adds them in float32 for half inputs.
        mdtype = torch.float32 if req.dtype in _HALF else q.dtype
        causal = plan.causal and not math  # the math kernel takes a mask or is_causal, not both
        keep = None  # boolean, True = attended
        pad = padding(req, operands, q) if plan.ragged and mask is None and not math else None
        if pad is not None:  # a key mask and is_causal: no (B, 1, Nq, Nk) mask (ragged.Padding)
            keep, causal = pad.key_keep, pad.causal
        elif plan.ragged:
            keep = keep_mask(req, operands, q)
        elif plan.materialise or (plan.causal and math):
            keep = torch_rule_mask(req, q.device, torch.bool)
        if mask is not None:
            keep = mask if keep is None else keep & mask
        bias = alibi.with_alibi(bias, req, operands, q, mdtype)
        if bias is not None:
            bias = bias if bias.dtype == mdtype else bias.to(mdtype)
            attn_mask = bias if keep is None else torch.where(keep, bias, float("-inf"))
        elif plan.materialise and mask is None:
            attn_mask = torch_rule_mask(req, q.device, mdtype)  # cached across calls
        elif keep is not None:
            attn_mask = torch.zeros(keep.shape, dtype=mdtype).masked_fill_(~keep, float("-inf"))
        else:
            attn_mask = None
        # The kernel reads rows as if the last dim were contiguous: it returns wrong values for a
        # view whose last stride is not 1 (the bhds layout's canonical view).
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        if plan.ragged and operands is not None:  # what padded slots hold never matters (NaN included)
            q, k, v = _zero_padded_slots(req, operands, q, k, v)
        in_dtype = q.dtype
        if grads and req.dtype in _HALF:
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
        q, scale = _positive_scale(q, req.scale, causal)

        def kernel(q: Any, k: Any) -> tuple[Any, Any]:
            if math:
                out, _ = torch.ops.aten._scaled_dot_product_attention_math(
                    q, k, v, attn_mask, 0.0, False, scale=scale, enable_gqa=req.heads_q != req.heads_kv
                )
                lse = None
                if req.return_lse:
                    with torch.no_grad():
                        _, lse = _cpu_kernel()(q, k, v, 0.0, False, attn_mask=attn_mask, scale=scale)
                return out, lse
            return _cpu_kernel()(q, k, v, 0.0, causal, attn_mask=attn_mask, scale=scale)

        out, lse = kernel(q, k)
        suspect = rows.suspect_rows(lse, out if math else None)
        q_valid = _valid_query_rows(req, operands, q) if plan.ragged else None
        if suspect is not None and q_valid is not None:
            suspect = suspect & q_valid[..., 0]  # padded query rows: zeroed below, no keys (lse 0)
        if suspect is not None and suspect.any():
            out, lse = _redo_rows(kernel, q, k, v, out, lse, suspect, (attn_mask, causal, scale), q_valid)
        if out.shape[-1] != dv:
            out = out[..., :dv]
        if out.dtype != in_dtype:
            out = out.to(in_dtype)
        if pad is not None and pad.q_valid is not None:
            # Padded query rows: 0, and so zero gradients. In place where autograd keeps no
            # reference to the kernel's output (its backward reads it).
            if out.requires_grad:
                out = out.masked_fill(~pad.q_valid, 0.0)
            else:
                for b, start, stop in pad.q_padded:  # contiguous row ranges: cheaper than a mask
                    out[b, :, start:stop].zero_()
        if req.return_lse and attn_mask is not None and (plan.empty_rows or bias is not None):
            # The kernel gives out = 0 on a row that attends no key, but lse = 0: SPEC wants -inf.
            # (With is_causal the mask alone may leave keys a causal row cannot see: fold it in;
            # a Padding's key mask says nothing of padded query rows: they are rows of no key.)
            seen = attn_mask.detach().expand(*attn_mask.shape[:-2], req.nq, req.nk)
            if causal:
                seen = seen.masked_fill(~_top_left(req.nq, req.nk, q.device), float("-inf"))
            empty = _empty_rows(seen)
            if pad is not None and pad.q_valid is not None:
                empty = empty | ~pad.q_valid[..., 0]
            lse = lse.masked_fill(empty.expand(lse.shape), float("-inf"))
        return out, lse

    def _packed(self, q: Any, k: Any, v: Any, req: Request, operands: Any) -> tuple[Any, Any]:
        """Packed sequences (``attention_varlen``, q (1, Hq, Tq, D)): each sequence its own dense
        request (SPEC §10: rule and sync mode on its own lengths), the outputs concatenated along
        the token axis; the work follows the sequences' own Lq·Lk, with no Tq x Tk mask."""
        import torch

        cq, ck = operands.cu_seqlens_q.tolist(), operands.cu_seqlens_k.tolist()
        outs, lses = [], []
        for n in range(len(cq) - 1):
            (qs, qe), (ks, ke) = (cq[n], cq[n + 1]), (ck[n], ck[n + 1])
            if qe == qs:
                continue
            if ke == ks:  # no keys: every row attends nothing (out 0, lse -inf)
                outs.append(q.new_zeros(1, req.heads_q, qe - qs, req.dim_v))
                lses.append(
                    torch.full(
                        (1, req.heads_q, qe - qs),
                        float("-inf"),
                        dtype=torch.float32 if req.dtype != "float64" else torch.float64,
                    )
                )
                continue
            sub = dataclasses.replace(req, seq_q=(qe - qs,), seq_k=(ke - ks,), varlen=False)
            out, lse = self._compute(q[:, :, qs:qe], k[:, :, ks:ke], v[:, :, ks:ke], sub, None)
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs, dim=2), torch.cat(lses, dim=2) if req.return_lse else None

    def _bind_fast(self, req: Request) -> Callable[[Any], Any] | None:
        plan = rule_plan(req)
        if not _plain(req, plan) or (req.needs_grad and req.dtype in _HALF):
            return None  # masks, padding, negation, the float32 backward: the general path
        kernel, causal, scale = _cpu_kernel(), plan.causal, req.scale

        def make(general: Callable) -> Callable:
            def fast(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any]:
                if _unit_last_stride(q, k, v):
                    out, lse = kernel(q, k, v, 0.0, causal, scale=scale)
                    # No row here attends no key, so lse = 0 flags a row the kernel zeroed
                    # (all-NaN logits, or an exact 0), and lse = ±inf one it zeroed for a +Inf
                    # logit (half inputs): the general path redoes them (rows.py).
                    if lse.all() and not lse.isinf().any():
                        return out, lse
                return general(q, k, v, mask)

            return fast

        return make


def _zero_padded_slots(req: Request, operands: Any, q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    """q, k, v with zeros in their padded slots (copies where there are some, SPEC §10)."""
    q_spans = padded_slots(req, operands, req.nq, operands.q_lengths)
    k_spans = padded_slots(req, operands, req.nk, operands.k_lengths)
    return zero_padded(q, q_spans), zero_padded(k, k_spans), zero_padded(v, k_spans)


def _valid_query_rows(req: Request, operands: Any, like: Any) -> Any:
    """(B, 1, Nq, 1) bool, False on padded query rows; None where none is padded."""
    import torch

    spans = padded_slots(req, operands, req.nq, operands.q_lengths) if operands is not None else []
    if not spans:
        return None
    valid = torch.ones(req.batch, 1, req.nq, 1, dtype=torch.bool, device=like.device)
    for b, start, stop in spans:
        valid[b, :, start:stop] = False
    return valid


def _redo_rows(
    kernel: Callable[[Any, Any], tuple[Any, Any]], q: Any, k: Any, v: Any, out: Any, lse: Any, suspect: Any,
    logits: tuple[Any, bool, float], q_valid: Any,
) -> tuple[Any, Any]:  # fmt: skip
    """``kernel``'s (out, lse) with the rows it gets wrong on non-finite inputs redone
    (:mod:`attnhub_backends.sdpa.rows`): ``suspect`` rows (lse 0 or NaN) that attend keys are
    recomputed exactly; fully masked ones the kernel filled with NaN give 0 again. ``logits``:
    the kernel's (attn_mask, is_causal, scale)."""
    import torch

    attn_mask, causal, scale = logits
    empty = rows.empty_rows(attn_mask, causal, tuple(suspect.shape), q_valid)
    fix = suspect & ~empty
    nan_empty = empty & suspect & torch.isnan(out.detach()).any(dim=-1)
    redo = fix | nan_empty
    if not redo.any():
        return out, lse
    bad_k = ~torch.isfinite(k)
    if bad_k.any():  # the rerun zeroes them: every row attending one is recomputed exactly
        fix = fix | (rows.rows_reading(bad_k.any(dim=-1), attn_mask, causal, tuple(suspect.shape)) & ~empty)
        redo = fix | nan_empty
    # Rerun with those rows' q and non-finite k zeroed: finite there, forward and backward (their
    # output is replaced, so the kernel's backward sees a zero upstream gradient on them).
    out, lse = kernel(q.masked_fill(redo[..., None], 0.0), k.masked_fill(bad_k, 0.0))
    out = out.masked_fill(nan_empty[..., None], 0.0)
    if fix.any():
        exact, exact_lse = rows.exact_rows(q, k, v, fix, attn_mask, causal, scale)
        where = fix.nonzero(as_tuple=True)
        out = out.index_put(where, exact.to(out.dtype))
        if lse is not None:
            lse = lse.index_put(where, exact_lse.detach().to(lse.dtype))
    return out, lse


@lru_cache(maxsize=1)
def _cpu_kernel() -> Callable[..., Any]:
    """torch's fused CPU kernel through its generated Python binding (``torch._scaled_dot_product_
    flash_attention_for_cpu``: about 2 us less host time a call than ``torch.ops.aten``'s)."""
    import torch

    found = getattr(torch, "_scaled_dot_product_flash_attention_for_cpu", None)
    return found if found is not None else torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


class _Flags:
    """SDPA's kernel flags, pinned to one kernel and restored: what
    ``torch.nn.attention.sdpa_kernel(kernel)`` does (it sets the same flags) without its generator,
    list and enum work (about 10 us of host time a call on a slow CPU). Each pin returns the state
    it replaced, so nested and concurrent pins restore what they found, as ``sdpa_kernel``'s do."""

    __slots__ = ("getters", "setters", "wanted")

    def __init__(self, kernel: str) -> None:
        import torch
        from torch.nn.attention import _backend_names

        names = list(_backend_names.items())
        self.getters = [getattr(torch._C, f"_get_{n}_sdp_enabled") for n, _ in names]
        self.setters = [getattr(torch._C, f"_set_sdp_use_{n}") for n, _ in names]
        self.wanted = [member == kernel for _, member in names]

    def pin(self) -> list[bool]:
        saved = [g() for g in self.getters]
        for setter, on in zip(self.setters, self.wanted):
            setter(on)
        return saved

    def restore(self, saved: list[bool]) -> None:
        for setter, on in zip(self.setters, saved):
            setter(on)

    def around(self, fn: Callable[[Any, Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
        """``fn(q, k, v)`` run pinned; unrolled for torch's five flags (a third of the loops' cost)."""
        if len(self.getters) != 5:

            def pinned(q: Any, k: Any, v: Any) -> Any:
                saved = self.pin()
                try:
                    return fn(q, k, v)
                finally:
                    self.restore(saved)

            return pinned
        g0, g1, g2, g3, g4 = self.getters
        s0, s1, s2, s3, s4 = self.setters
        w0, w1, w2, w3, w4 = self.wanted

        def pinned5(q: Any, k: Any, v: Any) -> Any:
            a, b, c, d, e = g0(), g1(), g2(), g3(), g4()
            s0(w0), s1(w1), s2(w2), s3(w3), s4(w4)
            try:
                return fn(q, k, v)
            finally:
                s0(a), s1(b), s2(c), s3(d), s4(e)

        return pinned5


@lru_cache(maxsize=8)
def _flags(kernel: str) -> _Flags | None:
    """The flags pinning ``kernel`` (an ``SDPBackend`` member name); None where this torch keeps
    them differently (``sdpa_kernel`` is used then)."""
    try:
        return _Flags(kernel)
    except (ImportError, AttributeError):
        return None


_PROBE_LOCK = threading.Lock()


class _SdpaCuda(_SdpaBase):
    """One of SDPA's CUDA kernels, pinned with :class:`_Flags` (``sdpa_kernel``'s flags)."""

    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    priority: ClassVar[int] = 40
    #: The ``SDPBackend`` member and the ``torch.backends.cuda.can_use_*`` probe of the kernel.
    kernel: ClassVar[str] = ""
    #: The kernel's own differentiable torch op (a ``torch`` attribute), if it has one.
    direct_name: ClassVar[str] = ""
    probe: ClassVar[str] = ""
    #: Whether the kernel takes SDPA's ``attn_mask`` (explicit masks and materialised rule masks).
    takes_mask: ClassVar[bool] = True
    #: Whether the kernel returns out = 0 (and zero gradients) on a query row that attends no key;
    #: requests that may have such rows are declined where it does not.
    zero_rows: ClassVar[bool] = False
    #: Whether inputs that require grad are made contiguous first (a kernel whose backward
    #: mishandles strided views).
    contiguous_for_grad: ClassVar[bool] = False

    def availability(self) -> str | None:
        why = _torch_available()
        if why:
            return why
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU is visible to torch"
        from torch.nn.attention import SDPBackend

        if not hasattr(SDPBackend, self.kernel) or not hasattr(torch.backends.cuda, self.probe):
            return f"torch {torch.__version__} has no SDPA {self.kernel} kernel"
        return None

    def extra_reasons(self, req: Request) -> list[str]:
        plan = rule_plan(req)
        if plan.why_not:
            return [plan.why_not]
        reasons: list[str] = []
        if req.bias is not None and not isinstance(req.rule, Full):
            reasons.append(
                f"takes a bias (or float mask) only with the rule Full: SDPA's attn_mask does not "
                f"combine with {req.rule.describe()}; use backend='triton' (or 'auto')"
            )
        if (plan.explicit or plan.materialise) and not self.takes_mask:
            what = "an explicit mask" if plan.explicit else f"{req.rule.describe()} with sync={req.sync}"
            reasons.append(
                f"the {self.kernel} kernel takes no attn_mask, and {what} is not SDPA's top-left "
                "is_causal; use sdpa-efficient or sdpa-cudnn"
            )
        elif plan.empty_rows and not self.zero_rows:
            reasons.append(
                f"the {self.kernel} kernel does not give out = 0 on query rows that attend no key "
                "(SPEC §4), which this mask may have"
            )
        if reasons:
            return reasons
        mode = self._gqa_mode(req)
        if isinstance(mode, list):
            return mode
        return []

    def note(self, req: Request) -> str | None:
        plan = rule_plan(req)
        how = "is_causal" if plan.causal else "rule mask" if plan.materialise else ""
        mode = self._gqa_mode(req)
        gqa = {"gqa": " enable_gqa", "repeat": " k/v repeated per query head"}.get(mode, "")  # type: ignore[call-overload]
        return (how + gqa).strip() or None

    def light_call(self, req: Request) -> bool:
        """No light call where GQA is served by repeating K and V (a copy and two launches more)."""
        return self.light_calls and self._gqa_mode(req) != "repeat"

    def _gqa_mode(self, req: Request) -> str | list[str]:
        """ "none" / "gqa" (``enable_gqa=True``) / "repeat" (k and v repeated to Hq heads, exact), or
        torch's reasons why the kernel takes neither."""
        first = _probe(self, req, gqa=req.heads_q != req.heads_kv, repeat=False)
        if not first:
            return "gqa" if req.heads_q != req.heads_kv else "none"
        if req.heads_q == req.heads_kv:
            return first
        if not _probe(self, req, gqa=False, repeat=True):
            return "repeat"
        return first

    def _compute(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any, operands: Any = None
    ) -> tuple[Any, Any]:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        plan = rule_plan(req)
        attn_mask = mask if operands is None or operands.bias is None else operands.bias
        if plan.materialise:
            attn_mask = torch_rule_mask(req, q.device, torch.bool)
        elif attn_mask is not None and attn_mask.dtype != torch.bool and attn_mask.dtype != q.dtype:
            # SDPA takes a float mask in the query's dtype only.
            attn_mask = attn_mask.to(q.dtype)
        mode = self._gqa_mode(req)
        if mode == "repeat":
            k = k.repeat_interleave(req.group, dim=1)
            v = v.repeat_interleave(req.group, dim=1)
        # The kernels need unit-stride head dims (layout "bhds" arrives transposed); the capability
        # probe assumed them.
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        contiguous = self.contiguous_for_grad and torch.is_grad_enabled() and req.needs_grad
        if contiguous:
            q, k, v = (x.contiguous() for x in (q, k, v))
        q, scale = _positive_scale(q, req.scale, plan.causal)
        flags = _flags(self.kernel)
        if flags is None:
            with sdpa_kernel(getattr(SDPBackend, self.kernel)):
                out = torch._C._nn.scaled_dot_product_attention(
                    q, k, v, attn_mask, 0.0, plan.causal, scale=scale, enable_gqa=mode == "gqa"
                )
        else:
            saved = flags.pin()
            try:
                out = torch._C._nn.scaled_dot_product_attention(
                    q, k, v, attn_mask, 0.0, plan.causal, scale=scale, enable_gqa=mode == "gqa"
                )
            finally:
                flags.restore(saved)
        return (_grad_made_contiguous(out) if contiguous else out), None

    def _bind_fast(self, req: Request) -> Callable[[Any], Any] | None:
        import torch

        plan = rule_plan(req)
        flags = _flags(self.kernel)
        if flags is None or not _plain(req, plan) or self._gqa_mode(req) not in ("none", "gqa"):
            return None
        sdpa = torch._C._nn.scaled_dot_product_attention
        causal, scale, gqa = plan.causal, req.scale, self._gqa_mode(req) == "gqa"
        contiguous = self.contiguous_for_grad and req.needs_grad
        direct = None
        if not gqa and req.heads_q == req.heads_kv and req.dim_qk % 8 == 0:
            direct = self._direct_op(causal, scale, req.needs_grad)

        def make(general: Callable) -> Callable:
            def kernel(q: Any, k: Any, v: Any) -> Any:
                return sdpa(q, k, v, None, 0.0, causal, scale=scale, enable_gqa=gqa)

            pinned = flags.around(kernel)

            def fast(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any]:
                strided = contiguous and not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous())
                if _unit_last_stride(q, k, v) and not strided:
                    out = pinned(q, k, v)
                    return (_grad_made_contiguous(out) if contiguous else out), None
                return general(q, k, v, mask)

            if direct is None:
                return fast

            def fastest(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any]:
                if q.is_contiguous() and k.is_contiguous() and v.is_contiguous():
                    out = direct(q, k, v)
                    return (_grad_made_contiguous(out) if contiguous else out), None
                return fast(q, k, v, mask)

            return fastest

        return make

    def _direct_args(self, causal: bool, lse: bool) -> tuple:
        """The op's arguments after q, k, v (dropout 0, no mask)."""
        raise NotImplementedError

    def _direct_op(self, causal: bool, scale: float, lse: bool) -> Callable[[Any, Any, Any], Any] | None:
        """``out = fn(q, k, v)`` through the kernel's own differentiable torch op, or None.

        For contiguous inputs of equal head counts and a head dim divisible by 8 this is the call
        SDPA makes once it has chosen the kernel (it pads nothing and copies nothing there), so the
        result and its gradient are SDPA's; skipping SDPA's selection and the flag pinning saves
        host time on every call. ``lse``: the op computes the logsumexp its backward reads (SDPA
        asks for it when an input requires grad under grad mode; the plan's key fixes both)."""
        import torch

        op = getattr(torch, self.direct_name, None) if self.direct_name else None
        if op is None:
            return None
        args = self._direct_args(causal, lse)

        def direct(q: Any, k: Any, v: Any) -> Any:
            return op(q, k, v, *args, scale=scale)[0]

        return direct


@lru_cache(maxsize=512)
def _probe(backend: _SdpaCuda, req: Request, gqa: bool, repeat: bool) -> list[str]:
    """torch's own verdict on whether ``backend``'s kernel takes ``req`` (empty: it does), asked
    with inputs of the request's shapes (zero-stride views, no memory) under the pinned kernel."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = getattr(torch, req.dtype)
    dev = torch.device(req.device)
    grad = req.needs_grad
    hkv = req.heads_q if repeat else req.heads_kv

    def like(h: int, n: int, d: int) -> Any:
        base = torch.empty((1, 1, 1, d), dtype=dtype, device=dev, requires_grad=grad)
        return base.expand(req.batch, h, n, d)

    q = like(req.heads_q, req.nq, req.dim_qk)
    k = like(hkv, req.nk, req.dim_qk)
    v = like(hkv, req.nk, req.dim_v)
    plan = rule_plan(req)
    mask = None
    if plan.materialise:
        mask = torch.empty((1, 1, 1, 1), dtype=torch.bool, device=dev).expand(1, 1, req.nq, req.nk)
    elif plan.explicit:
        shape = req.rule.shape  # type: ignore[union-attr]
        mdtype = torch.bool if req.rule.kind == "bool" else dtype  # type: ignore[union-attr]
        mask = torch.empty((1, 1, 1, 1), dtype=mdtype, device=dev).expand(*shape)
    elif req.bias is not None:  # a float mask (SPEC §9: a bias) reaches the kernel as attn_mask
        mask = torch.empty((1, 1, 1, 1), dtype=dtype, device=dev).expand(*req.bias)
    params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, plan.causal, gqa)
    check = getattr(torch.backends.cuda, backend.probe)
    kernel = sdpa_kernel(getattr(SDPBackend, backend.kernel))
    with _PROBE_LOCK, kernel:
        if check(params, debug=False):  # quiet: debug=True prints torch's reasons to stderr
            return []
        said = _reasons_printed(lambda: check(params, debug=True))
    return [f"torch's {backend.kernel} kernel does not take this request: {said or 'no reason given'}"]


def _reasons_printed(ask: Callable[[], Any]) -> str:
    """What torch says while ``ask()`` runs: its C++ warnings (written to file descriptor 2, past
    Python's ``warnings``, which get the rest), captured instead of reaching the user's terminal.
    Asked only for a kernel that declines; another thread's stderr in that moment is captured too."""
    import os
    import re
    import sys
    import tempfile

    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            ask()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    said = [str(w.message).strip() for w in caught]
    said += [m.strip() for m in re.findall(r"Warning: (.*?)(?: \(function \w+\))?$", text, re.MULTILINE)]
    return "; ".join(dict.fromkeys(s for s in said if s))


class SdpaFlash(_SdpaCuda):
    """SDPA's FlashAttention-2 kernel."""

    name: ClassVar[str] = "sdpa-flash"
    priority: ClassVar[int] = 41
    kernel: ClassVar[str] = "FLASH_ATTENTION"
    probe: ClassVar[str] = "can_use_flash_attention"
    dtypes: ClassVar[tuple[str, ...]] = _HALF
    features: ClassVar[frozenset[str]] = frozenset({"1d", "2d", "full", "causal", "gqa", "backward"})
    takes_mask: ClassVar[bool] = False

    direct_name: ClassVar[str] = "_scaled_dot_product_flash_attention"

    def _direct_args(self, causal: bool, lse: bool) -> tuple:
        return (0.0, causal, False)  # the op always returns the logsumexp


class SdpaEfficient(_SdpaCuda):
    """SDPA's memory-efficient kernel."""

    name: ClassVar[str] = "sdpa-efficient"
    #: The fastest loop of small calls on the H100 and H200 (1, 8, 1, 512) and (1, 8, 128, 128)
    #: (attnhub/profiles: its host classes); at (8, 12, 512, 512) cuDNN or flash are faster.
    light_calls: ClassVar[bool] = True
    kernel: ClassVar[str] = "EFFICIENT_ATTENTION"
    probe: ClassVar[str] = "can_use_efficient_attention"
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16", "float32")
    #: A bias (or float mask) with the rule Full reaches the kernel as SDPA's float ``attn_mask``;
    #: its gradient is not taken (no "dbias"): sdpa-cpu, triton or cuda compute it.
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "backward", "bias"}
    )
    zero_rows: ClassVar[bool] = True

    direct_name: ClassVar[str] = "_scaled_dot_product_efficient_attention"

    def _direct_args(self, causal: bool, lse: bool) -> tuple:
        return (None, lse, 0.0, causal)


class SdpaCudnn(_SdpaCuda):
    """SDPA's cuDNN kernel."""

    name: ClassVar[str] = "sdpa-cudnn"
    priority: ClassVar[int] = 42
    kernel: ClassVar[str] = "CUDNN_ATTENTION"
    probe: ClassVar[str] = "can_use_cudnn_attention"
    dtypes: ClassVar[tuple[str, ...]] = _HALF
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "backward"}
    )

    #: torch plans a cuDNN graph for each new shape: on an H200 a decode loop whose cache grows by
    #: one key a step ran 2.5 ms a call against sdpa-flash's 47 us (tools/dev/decode_new_shapes.py),
    #: so small calls lead with the other SDPA kernels, as for the cudnn backend.
    heavy_calls_from: ClassVar[float] = 2e10
    builds_per_shape: ClassVar[bool] = True
    direct_name: ClassVar[str] = "_scaled_dot_product_cudnn_attention"
    #: torch 2.11's cuDNN backward returns wrong dq for transposed (bshd/bhds views) inputs, or a
    #: transposed dO, with GQA (certify on an H200, cuDNN 9.19: dq relative error 1.38 and 1.4);
    #: copies make them contiguous (:func:`_grad_made_contiguous` for dO).
    contiguous_for_grad: ClassVar[bool] = True

    def _direct_args(self, causal: bool, lse: bool) -> tuple:
        return (None, lse, 0.0, causal, False)
