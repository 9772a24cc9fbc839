"""SPEC §9-§12: the arguments beyond q, k, v and mask, validated into request fields and operands.

:func:`parse` turns the caller's ``bias``, ``softcap``, ``sinks``, ``q_lengths``, ``k_lengths``,
``padding_side``, ``q_offset`` and ``k_offset`` into the hashable request fields (what dispatch
depends on) and an :class:`attnhub.operands.Operands` builder (the arrays, canonical and on the
inputs' device). Values that live in arrays (lengths, cu_seqlens, block tables) are checked where
they can be read without stopping a trace or a CUDA graph capture, once per torch tensor version
(:mod:`attnhub.readings`, docs/semantics.md).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnhub.errors import SpecError
from attnhub.frameworks import Adapter, adapter_for
from attnhub.modifiers import ADDED, MODIFIERS, Call
from attnhub.operands import Operands
from attnhub.readings import check_readable, int32_like, reading
from attnhub.readings import host_values as host_values  # re-exported (home: attnhub.readings)

PADDING_SIDES = ("right", "left")


@dataclass(frozen=True, init=False)
class Extras:
    """The caller's §9-§11 arguments of one ``attention`` call, as given."""

    bias: Any = None
    softcap: Any = None
    sinks: Any = None
    q_lengths: Any = None
    k_lengths: Any = None
    padding_side: Any = "right"
    q_offset: Any = 0
    k_offset: Any = 0
    # attention_varlen / attention_kvcache only (see attnhub.ragged)
    cu_seqlens_q: Any = None
    cu_seqlens_k: Any = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    block_table: Any = None
    paged: int = 0
    #: ``(name, value)`` of the score modifiers added since SPEC's first edition (attnhub.modifiers).
    more: tuple = ()

    def __init__(
        self,
        bias: Any = None,
        softcap: Any = None,
        sinks: Any = None,
        q_lengths: Any = None,
        k_lengths: Any = None,
        padding_side: Any = "right",
        q_offset: Any = 0,
        k_offset: Any = 0,
        cu_seqlens_q: Any = None,
        cu_seqlens_k: Any = None,
        max_seqlen_q: int = 0,
        max_seqlen_k: int = 0,
        block_table: Any = None,
        paged: int = 0,
        more: tuple = (),
    ) -> None:
        # Built on every call with §9-§11 arguments: one dict update instead of the generated
        # __init__'s object.__setattr__ per field (a frozen instance still refuses assignment).
        self.__dict__.update(
            bias=bias, softcap=softcap, sinks=sinks, q_lengths=q_lengths, k_lengths=k_lengths,
            padding_side=padding_side, q_offset=q_offset, k_offset=k_offset, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            block_table=block_table, paged=paged, more=more,
        )  # fmt: skip

    @classmethod
    def from_keywords(cls, **kw: Any) -> Extras:
        """Extras from ``attention``'s keywords: an added modifier's (attnhub.modifiers) goes to
        ``more``; any other unknown keyword is a TypeError, as for a Python function."""
        more = added_modifiers("attention", {n: kw.pop(n) for n in list(kw) if n in ADDED})
        return cls(**kw, more=more)

    @property
    def given(self) -> bool:
        return not (
            self.bias is None and self.softcap is None and self.sinks is None and self.q_lengths is None
            and self.k_lengths is None and self.padding_side == "right" and _zero(self.q_offset)
            and _zero(self.k_offset) and not self.more
        )  # fmt: skip

    def key(self, ad: Adapter) -> tuple:
        """A hashable key of everything the request depends on (never the lengths' values). Built
        on every call with §9-§11 arguments, most of them absent: no call for a None."""
        bias, sinks, ql, kl = self.bias, self.sinks, self.q_lengths, self.k_lengths
        cuq, cuk, table = self.cu_seqlens_q, self.cu_seqlens_k, self.block_table
        return (
            None if bias is None else _BIAS.key(bias), self.softcap, type(self.softcap),
            None if sinks is None else _SINKS.key(sinks), None if ql is None else _lengths_key(ql),
            None if kl is None else _lengths_key(kl), self.padding_side, self.q_offset,
            type(self.q_offset), self.k_offset, type(self.k_offset),
            None if cuq is None else _lengths_key(cuq), None if cuk is None else _lengths_key(cuk),
            self.paged, None if table is None else _lengths_key(table),
            tuple((n, MODIFIERS[n].key(x)) for n, x in self.more) if self.more else (),
        )  # fmt: skip


NONE = Extras()
_BIAS, _SINKS = MODIFIERS["bias"], MODIFIERS["sinks"]


def added_modifiers(fn: str, keywords: dict[str, Any]) -> tuple:
    """``(name, value)`` of the added score modifiers (attnhub.modifiers.ADDED) among ``fn``'s
    extra keywords, absent ones dropped; any other keyword is a TypeError, as Python raises it."""
    for name in keywords:
        if name not in ADDED:
            raise TypeError(f"{fn}() got an unexpected keyword argument {name!r}")
    return tuple((n, x) for n, x in keywords.items() if not ADDED[n].absent(x))


def _zero(x: Any) -> bool:
    return type(x) is int and x == 0


def _lengths_key(x: Any) -> Any:
    if x is None:
        return None
    cls = type(x)
    if cls.__module__ == "torch":  # torch.Tensor: its Size, dtype and device hash as they are
        return (cls, x.shape, x.dtype, x.device)
    if isinstance(x, (list, tuple)):
        return (cls, len(x))
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return (cls, tuple(x.shape), str(x.dtype), str(getattr(x, "device", "")))
    raise TypeError


def int_arg(name: str, x: Any) -> int:
    """``x`` as a Python int; SpecError for a bool, a float or a non-number (SPEC §12)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise SpecError(name, "an int (not a bool or float)", x)
    return int(x)


@dataclass(frozen=True)
class Fields:
    """The request fields of :class:`Extras`, plus how to build the operands."""

    bias: tuple[int, int, int, int] | None
    bias_grad: bool
    softcap: float | None
    sinks: bool
    sinks_grad: bool
    q_lengths: bool
    k_lengths: bool
    padding_side: str
    q_offset: int
    k_offset: int
    varlen: bool
    paged: int
    more: tuple

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def parse(
    ex: Extras, ad: Adapter, q: Any, batch: int, hq: int, nq: int, nk: int, ndim: int, sync: str,
    device: str, dtype: str, from_mask: bool = False,
) -> Fields:  # fmt: skip
    """Validate ``ex`` against the call (SPEC §9-§12) and return its request fields."""
    call = Call(ad, q, batch, hq, nq, nk, ndim, sync, device, dtype)
    softcap = MODIFIERS["softcap"].signature(ex.softcap, call)
    q_offset = int_arg("q_offset", ex.q_offset)
    k_offset = int_arg("k_offset", ex.k_offset)
    if not isinstance(ex.padding_side, str) or ex.padding_side not in PADDING_SIDES:
        raise SpecError("padding_side", '"right" or "left"', ex.padding_side)
    ragged = ex.q_lengths is not None or ex.k_lengths is not None
    if ndim != 1:
        for name, used in (
            ("q_lengths", ex.q_lengths is not None), ("k_lengths", ex.k_lengths is not None),
            ("q_offset", q_offset != 0), ("k_offset", k_offset != 0),
        ):  # fmt: skip
            if used:
                raise SpecError(name, "only with 1-d sequences (SPEC §10-§11)", "a 2-d sequence")
    if (q_offset or k_offset) and sync != "none_front":
        raise SpecError("sync", "none_front with q_offset/k_offset (SPEC §11)", sync)
    bias_shape, bias_grad = None, False
    if ex.bias is not None:
        bias_shape, bias_grad = MODIFIERS["bias"].signature(ex.bias, call, from_mask)  # type: ignore[call-arg]
    sinks_grad = False
    if ex.sinks is not None:
        sinks_grad = MODIFIERS["sinks"].signature(ex.sinks, call)
    more = tuple((n, ADDED[n].signature(x, call)) for n, x in ex.more)
    for name, x in (("q_lengths", ex.q_lengths), ("k_lengths", ex.k_lengths)):
        if x is not None:
            check_int_array(name, x, ad, (batch,))
    varlen = ex.cu_seqlens_q is not None
    return Fields(
        bias=bias_shape, bias_grad=bias_grad, softcap=softcap, sinks=ex.sinks is not None,
        sinks_grad=sinks_grad, q_lengths=ex.q_lengths is not None, k_lengths=ex.k_lengths is not None,
        padding_side=ex.padding_side if ragged else "right", q_offset=q_offset, k_offset=k_offset,
        varlen=varlen, paged=ex.paged, more=more,
    )  # fmt: skip


def check_int_array(name: str, x: Any, ad: Adapter, shape: tuple[int, ...] | None) -> None:
    """An integer array (any framework or device, or a Python sequence of ints: SPEC §10's
    lengths are host-side) of ``shape`` whose values can be read (not a meta tensor)."""
    if isinstance(x, (list, tuple)):
        if any(isinstance(i, (bool, np.bool_)) or not isinstance(i, numbers.Integral) for i in x):
            raise SpecError(name, "a sequence of ints", x)
        found: tuple[int, ...] = (len(x),)
    elif hasattr(x, "shape") and hasattr(x, "dtype"):
        check_readable(name, x)
        dt = str(x.dtype).removeprefix("torch.").removeprefix("<dtype: '").removesuffix("'>")
        if not any(dt.startswith(p) for p in ("int", "uint")):
            raise SpecError(f"{name}.dtype", "an integer dtype", dt)
        found = tuple(int(d) for d in x.shape)
    else:
        raise SpecError(name, "an integer array or a sequence of ints", x)
    if shape is not None and found != shape:
        raise SpecError(f"{name}.shape", str(shape), found)


def check_range(name: str, x: Any, hi: int) -> None:
    """``0 <= x <= hi`` elementwise (where the values can be read; once per torch tensor version).
    A Python sequence's items are checked to be ints here, on every call: the plan's key holds only
    its length."""
    if isinstance(x, (list, tuple)):
        check_int_array(name, x, None, None)  # type: ignore[arg-type]
    r = reading(x)
    if r is None or r.values is None or not r.values.size:
        return
    span = r.facts.get("range")
    if span is None:
        span = r.facts["range"] = (int(r.values.min()), int(r.values.max()))
    if span[0] < 0 or span[1] > hi:
        raise SpecError(name, f"values in [0, {hi}]", f"values in [{span[0]}, {span[1]}]")


def _true() -> bool:
    return True


def operands_for(ex: Extras, ad: Adapter, q: Any, req: Any) -> Operands:
    """The canonical operands of one call (lengths checked against the request's sizes)."""
    bias = None
    if ex.bias is not None:
        bias = adapter_for(ex.bias, "bias").reshape(ex.bias, req.bias)
    ql = kl = None
    if ex.q_lengths is not None:
        check_range("q_lengths", ex.q_lengths, req.nq)
        ql = int32_like(ex.q_lengths, q)
    if ex.k_lengths is not None:
        check_range("k_lengths", ex.k_lengths, req.nk)
        kl = int32_like(ex.k_lengths, q)
    cq = ck = table = None
    if ex.cu_seqlens_q is not None:
        cq, ck = int32_like(ex.cu_seqlens_q, q), int32_like(ex.cu_seqlens_k, q)
    if ex.block_table is not None:
        table = int32_like(ex.block_table, q)
    sinks = ex.sinks
    if sinks is not None and not getattr(sinks, "is_contiguous", _true)():  # torch: a strided view
        sinks = sinks.contiguous()  # the kernels index sinks[h] directly
    more = None
    if ex.more:
        sigs = dict(req.more)
        more = {n: ADDED[n].operand(x, ad, q, sigs[n]) for n, x in ex.more}
    return Operands(
        bias=bias, sinks=sinks, q_lengths=ql, k_lengths=kl, cu_seqlens_q=cq, cu_seqlens_k=ck,
        max_seqlen_q=ex.max_seqlen_q, max_seqlen_k=ex.max_seqlen_k, block_table=table, more=more,
    )  # fmt: skip
