"""SPEC §9 score modifiers and boolean masks as the kernels' runtime arguments and constexprs.

The kernels take the same three runtime arguments after their scales whether or not a modifier is
used (dense calls pass placeholders that no compiled code reads, their constexprs off): the tuple
``mods`` of the bias pointer and its four element strides (0 where it broadcasts), the mask (as
bytes) and its strides, the sinks (or the dq kernel's dbias buffer) and softcap·log2(e); then the
mask plan's row strides (``mask_summary``), separate arguments that Triton does not specialise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from attnhub.modifiers.alibi import MODIFIER as ALIBI_MODIFIER
from attnhub.modifiers.alibi import float32_alibi_problem
from attnhub.request import Request
from attnhub.rules import ExplicitMask, Full, Rule

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Mods:
    """The modifier tensors of one call (None where absent), canonical and on the inputs' device."""

    bias: Any = None
    mask: Any = None  # rank-4 bool, viewed as uint8
    sinks: Any = None
    softcap: float | None = None
    alibi: Any = None  # (B | 1, Hq) float32 ALiBi slopes

    @property
    def any(self) -> bool:
        return (
            self.bias is not None
            or self.mask is not None
            or self.sinks is not None
            or (self.softcap is not None)
            or self.alibi is not None
        )

    def consts(self) -> dict[str, bool]:
        """The constexprs shared by every kernel (``HAS_SINKS`` is the forward's own)."""
        return {
            "SOFTCAP": self.softcap is not None,
            "HAS_BIAS": self.bias is not None,
            "HAS_MASK": self.mask is not None,
            "HAS_ALIBI": self.alibi is not None,
        }


def from_call(req: Request, mask: Any, operands: Any) -> Mods:
    """The :class:`Mods` of a call: the bias and sinks from ``operands``, a bool mask from ``mask``."""
    bias = getattr(operands, "bias", None) if req.bias is not None else None
    sinks = getattr(operands, "sinks", None) if req.sinks else None
    bmask = None
    if isinstance(req.rule, ExplicitMask) and req.rule.kind == "bool":
        bmask = mask.reshape(req.rule.shape)
        if bmask.dtype != _bool_dtype():
            bmask = bmask != 0
        bmask = bmask.view(_u8())
    if bias is not None and bias.dim() != 4:
        bias = bias.reshape(req.bias)
    return Mods(bias=bias, mask=bmask, sinks=sinks, softcap=req.softcap, alibi=alibi_slopes(operands))


def uses_alibi(req: Request) -> bool:
    return ALIBI_MODIFIER.used(req)


def alibi_slopes(operands: Any) -> Any:
    """The (B | 1, Hq) ALiBi slopes of a call (contiguous), or None."""
    slopes = operands.more.get(ALIBI_MODIFIER.name) if operands is not None and operands.more else None
    return slopes if slopes is None or slopes.is_contiguous() else slopes.contiguous()


def ds_dtype(bias: Any) -> Any:
    """The dtype of the per-pair dS buffer a bias gradient is summed from: the bias's own 16-bit
    dtype (half the bytes to write and to sum, torch sums it in float32), else float32."""
    import torch

    dt = bias.dtype if bias is not None else torch.float32
    return dt if dt in (torch.float16, torch.bfloat16) else torch.float32


def dbias_from(ds: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """The bias's gradient from the per-pair dS (B, Hq, Nq, Nk): summed over the dimensions the
    bias broadcasts along, in the bias's ``shape`` and ``dtype``."""
    dims = [d for d in range(4) if shape[d] == 1 and ds.shape[d] != 1]
    red = ds.sum(dim=dims, keepdim=True) if dims else ds
    return red.reshape(shape).to(dtype)


def _bool_dtype() -> Any:
    import torch

    return torch.bool


def _u8() -> Any:
    import torch

    return torch.uint8


def plan_rule(req: Request) -> Rule:
    """The rule whose host plan the kernels walk: a boolean mask rides on the rule Full."""
    return Full() if isinstance(req.rule, ExplicitMask) else req.rule


def strides4(x: Any) -> tuple[int, ...]:
    """Element strides of a broadcastable tensor (rank 4, or the (B | 1, Hq) slopes), 0 along its
    size-1 dimensions."""
    return tuple(0 if n == 1 else s for n, s in zip(x.shape, x.stride(), strict=True))  # type: ignore[return-value]


def runtime_args(mods: Mods, dummy: Any, plan_b: int = 0, plan_h: int = 0, extra: Any = None) -> tuple:
    """``(BIAS, (sbb, sbh, sbm, sbn), MASKP, (smb, smh, smm, smn), <extra>, softcap2, ALIBI, (sab, sah)),
    plan_b, plan_h``: the kernels' ``mods`` tuple and the plan strides; ``extra`` is the forward's
    SINKS or the dq kernel's dbias buffer (``dummy`` where absent), and the dk/dv kernel takes none
    (pass ``extra=False``); ALIBI the (B | 1, Hq) slopes (stride 0 along a broadcast batch)."""
    bias = mods.bias if mods.bias is not None else dummy
    sb = strides4(mods.bias) if mods.bias is not None else (0, 0, 0, 0)
    mask = mods.mask if mods.mask is not None else dummy
    sm = strides4(mods.mask) if mods.mask is not None else (0, 0, 0, 0)
    softcap2 = mods.softcap * LOG2E if mods.softcap is not None else 1.0
    mid: tuple = () if extra is False else (dummy if extra is None else extra,)
    alibi = mods.alibi if mods.alibi is not None else dummy
    sa = strides4(mods.alibi) if mods.alibi is not None else (0, 0)
    return (bias, sb, mask, sm, *mid, softcap2, alibi, sa), plan_b, plan_h


def reasons(req: Request) -> list[str]:
    """What the triton kernels cannot compute of a §9-§11 request."""
    out = []
    rule = req.rule
    if isinstance(rule, ExplicitMask) and rule.kind != "bool":
        out.append("reads boolean masks only; pass a float mask as bias=")
    if (req.q_offset or req.k_offset) and (req.ndim != 1 or req.sync != "none_front"):
        out.append("takes q_offset/k_offset for 1-d sequences with sync none_front only")
    if req.softcap is not None and not (math.isfinite(req.softcap) and req.softcap > 0):
        out.append("applies a finite positive softcap only")
    out.extend(alibi_reasons(req))
    if req.softcap is not None and req.softcap > (cap := softcap_limit(req.dtype)):
        out.append(
            f"computes tanh as 1 − 2/(e^2x + 1), which loses t/softcap below float32's rounding for a "
            f"softcap above {cap:g} with {req.dtype} inputs (logit error ~ softcap·2**-23); the cuda "
            "backend computes it exactly"
        )
    return out


def alibi_reasons(req: Request) -> list[str]:
    """Why the kernels' float32 ALiBi term cannot serve ``req`` within SPEC §6 (empty when it can)."""
    why = float32_alibi_problem(req) if uses_alibi(req) else None
    return [why] if why else []


def softcap_limit(dtype: str) -> float:
    """The largest softcap the kernels' tanh keeps within SPEC §6 for ``dtype`` inputs: the error
    of a logit is about softcap·2**-23 (measured under the interpreter in float32: 7.9e-6 of the
    output at 100, 3.8e-5 at 1000, against float32's 2e-5); half inputs allow 2e-3 or more."""
    return 128.0 if dtype in ("float32", "float64") else 4096.0
