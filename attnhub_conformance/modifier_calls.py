"""The call of a SPEC §9-§11 case: its arrays in the case's framework and the entry point it uses.

``attnhub.attention`` (bias, softcap, sinks, lengths, offsets), ``attnhub.attention_varlen``
(packed "thd" arrays and cu_seqlens) or ``attnhub.attention_kvcache`` (a contiguous or paged cache
with k_lengths). The call also says how to read its results back in the canonical (B, Hq, Nq, D)
form the oracle uses, and which of its arrays the caller differentiates.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import attnhub
from attnhub.dispatch import explain_request
from attnhub.frameworks import adapter_for, numpy_dtype
from attnhub.operands import Operands
from attnhub.request import Request
from attnhub.rules import Full
from attnhub_conformance.arrays import Ops, from_layout, to_layout
from attnhub_conformance.cases import Case
from attnhub_conformance.modifier_data import ModData, bias_dtype


def _thd(a: np.ndarray) -> np.ndarray:
    """Canonical (1, H, T, D) -> packed (T, H, D)."""
    return np.ascontiguousarray(np.swapaxes(a[0], 0, 1))


def _from_thd(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, 0, 1)[None]


class Call:
    """One case's arguments (fresh framework arrays) and its entry point."""

    def __init__(self, ops: Ops, case: Case, d: ModData) -> None:
        self.ops, self.case, self.d = ops, case, d
        torch_grad = case.grad and ops.framework == "torch"
        dt = case.dtype
        a: dict[str, Any] = {}
        q, k, v = d.call_inputs()
        if case.entry == "varlen":
            a["q"], a["k"], a["v"] = (ops.array(_thd(x), dt, grad=torch_grad) for x in (q, k, v))
            a["cu_seqlens_q"] = ops.int_array(d.cu_seqlens_q)
            a["cu_seqlens_k"] = ops.int_array(d.cu_seqlens_k)
        elif case.entry == "kvcache":
            a["q"] = ops.array(q, dt, grad=torch_grad)
            kv = (d.k_blocks, d.v_blocks) if case.paged else (k, v)
            a["k"], a["v"] = (ops.array(x, dt, grad=torch_grad) for x in kv)
        else:
            a["q"], a["k"], a["v"] = (
                ops.array(to_layout(x, seq, case.layout), dt, case.noncontig, grad=torch_grad)
                for x, seq in ((q, case.seq_q), (k, case.seq_k), (v, case.seq_k))
            )
        if d.mask is not None:
            a["mask"] = ops.mask(d.mask, dt)
        if d.bias is not None:
            a["bias"] = ops.array(d.bias, bias_dtype(case), grad=torch_grad and case.bias_grad)
        if d.sinks is not None:
            a["sinks"] = ops.array(d.sinks, dt, grad=torch_grad)
        if d.alibi is not None:  # constants: never differentiated (SPEC §9)
            a["alibi_slopes"] = ops.array(d.alibi, "float32")
        for name in ("q_lengths", "k_lengths", "block_table"):
            if getattr(d, name) is not None:
                a[name] = ops.int_array(getattr(d, name))
        self.arrays = a

    # -- the call -------------------------------------------------------------------------------
    @property
    def differentiated(self) -> list[str]:
        """The arrays the caller differentiates, in the order the gradients are read."""
        names = ["q", "k", "v"]
        if self.case.bias and self.case.bias_grad:
            names.append("bias")
        if self.case.sinks:
            names.append("sinks")
        return names

    def kwargs(self, arrays: dict[str, Any], return_lse: bool) -> dict[str, Any]:
        """Keyword arguments of the entry point (only those the case uses)."""
        c = self.case
        rule = None if isinstance(c.rule, (Full, str)) else c.rule
        kw: dict[str, Any] = {"scale": c.scale, "return_lse": return_lse}
        if c.softcap is not None:
            kw["softcap"] = c.softcap
        if "sinks" in arrays:
            kw["sinks"] = arrays["sinks"]
        if "alibi_slopes" in arrays:
            kw["alibi_slopes"] = arrays["alibi_slopes"]
        if c.entry == "kvcache":
            kw["mask"] = c.rule if rule is not None else Full()
            if "block_table" in arrays:
                kw["block_table"] = arrays["block_table"]
            return kw
        kw["mask"] = arrays.get("mask", rule)
        kw["sync"] = c.sync
        if c.entry == "varlen":
            kw["max_seqlen_q"] = max(c.seqlens_q, default=0)
            kw["max_seqlen_k"] = max(c.seqlens_k, default=0)
            return kw
        kw["layout"] = c.layout
        for name in ("bias", "q_lengths", "k_lengths"):
            if name in arrays:
                kw[name] = arrays[name]
        if c.padding_side != "right":
            kw["padding_side"] = c.padding_side
        if c.q_offset:
            kw["q_offset"] = c.q_offset
        if c.k_offset:
            kw["k_offset"] = c.k_offset
        return kw

    def positional(self, arrays: dict[str, Any]) -> list[Any]:
        extra = {"varlen": ["cu_seqlens_q", "cu_seqlens_k"], "kvcache": ["k_lengths"]}.get(
            self.case.entry, []
        )
        return [arrays[n] for n in ("q", "k", "v", *extra)]

    def entry(self) -> Any:
        name = {"attention": "attention", "varlen": "attention_varlen", "kvcache": "attention_kvcache"}
        return getattr(attnhub, name[self.case.entry])

    def invoke(
        self, backend: str, arrays: dict[str, Any] | None = None, return_lse: bool | None = None
    ) -> Any:
        arrays = self.arrays if arrays is None else arrays
        lse = self.case.lse if return_lse is None else return_lse
        return self.entry()(*self.positional(arrays), backend=backend, **self.kwargs(arrays, lse))

    def explain(self) -> Any:
        """What ``auto`` would choose for this call (``attnhub.explain``, or the entry point's own
        explain where the core has one, else dispatch on :meth:`request`)."""
        if self.case.entry == "attention":
            return attnhub.explain(*self.positional(self.arrays), **self.kwargs(self.arrays, self.case.lse))
        own = getattr(attnhub, f"explain_{self.case.entry}", None)
        if own is not None:
            return own(*self.positional(self.arrays), **self.kwargs(self.arrays, self.case.lse))
        return explain_request(self.request(), "auto")

    def request(self) -> Request:
        """The request the backend is asked about, built as the entry point builds it: varlen is
        attention on the packed arrays viewed as (1, T, H, D) in layout "bshd" with cu_seqlens; a
        contiguous cache is attention with k_lengths and sync none_end; a paged one the same on
        the logical (B, Hkv, L, D) shapes with the block table and the block size."""
        c = self.case
        if c.entry == "attention" or getattr(attnhub, f"explain_{c.entry}", None) is not None:
            return self.explain().request
        a = self.arrays
        kw = {"mask": None if isinstance(c.rule, (Full, str)) else c.rule, "scale": c.scale,
              "return_lse": c.lse}  # fmt: skip
        if c.softcap is not None:
            kw["softcap"] = c.softcap
        if "sinks" in a:
            kw["sinks"] = a["sinks"]
        if "alibi_slopes" in a:
            kw["alibi_slopes"] = a["alibi_slopes"]
        if c.entry == "varlen":
            ad = adapter_for(a["q"])
            q, k, v = (ad.reshape(a[n], (1, *(int(d) for d in a[n].shape))) for n in "qkv")
            return attnhub.explain(
                q, k, v, sync=c.sync, layout="bshd", cu_seqlens_q=a["cu_seqlens_q"], cu_seqlens_k=a["cu_seqlens_k"],
                max_seqlen_q=max(c.seqlens_q, default=0), max_seqlen_k=max(c.seqlens_k, default=0), **kw,
            ).request  # fmt: skip
        k, v = a["k"], a["v"]
        paged = {}
        if c.paged:  # the logical cache's shapes (its values are not read)
            k, v = (self.ops.array(x, c.dtype, grad=False) for x in (self.d.k, self.d.v))
            paged = {"block_table": a["block_table"], "paged": c.paged}
        return attnhub.explain(
            a["q"], k, v, sync="none_end", k_lengths=a["k_lengths"], **paged, **kw
        ).request  # fmt: skip

    def grad_request(self, req: Request) -> Request:
        """The request when the caller differentiates (what ``check`` must accept for grad cases)."""
        c = self.case
        return dataclasses.replace(
            req, needs_grad=True, bias_grad=bool(c.bias and c.bias_grad), sinks_grad=bool(c.sinks)
        )

    # -- reading results ------------------------------------------------------------------------
    def out_shape(self) -> tuple[int, ...]:
        c = self.case
        if c.entry == "varlen":
            return (c.nq, c.heads_q, c.dim_v)
        if c.entry == "kvcache":
            return (c.batch, c.heads_q, c.nq, c.dim_v)
        canon = (c.batch, c.heads_q, c.nq, c.dim_v)
        return to_layout(np.empty(canon, dtype=np.int8), c.seq_q, c.layout).shape

    def lse_shape(self) -> tuple[int, ...]:
        c = self.case
        if c.entry == "varlen":
            return (c.heads_q, c.nq)
        return (c.batch, c.heads_q, *c.seq_q)

    def canonical(self, name: str, x: np.ndarray) -> np.ndarray:
        """An output or a gradient (float64 NumPy) in the oracle's canonical form."""
        c = self.case
        if name in ("dbias", "dsinks"):
            return x
        if name == "lse":
            return x[None] if c.entry == "varlen" else x.reshape(x.shape[0], x.shape[1], -1)
        if c.entry == "varlen":
            return _from_thd(x)
        if c.entry == "kvcache":
            return x
        return from_layout(x, c.layout)

    # -- the caller's arrays --------------------------------------------------------------------
    def named(self) -> list[tuple[str, Any]]:
        return list(self.arrays.items())

    def grad_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (shape, dtype) of each gradient the framework returns."""
        shapes = {}
        for n in self.differentiated:
            x = self.arrays[n]
            dt = bias_dtype(self.case) if n == "bias" else self.case.dtype
            shapes[n] = (tuple(int(s) for s in x.shape), dt)
        return shapes

    # -- NumPy backends: the canonical arrays and operands the core would pass ------------------
    def canonical_inputs(self, req: Request) -> tuple[list[np.ndarray], np.ndarray | None, Operands]:
        """(q, k, v as the backend receives them, the bool mask rank 4, the operands)."""
        c, d = self.case, self.d
        npdt = numpy_dtype(c.dtype)
        q, k, v = d.call_inputs()
        kv = [d.k_blocks, d.v_blocks] if c.paged else [k, v]
        qkv = [np.ascontiguousarray(x.astype(npdt)) for x in (q, *kv)]
        mask = None if d.mask is None else d.mask.copy()
        ops = Operands(
            bias=None if d.bias is None else d.bias.astype(numpy_dtype(bias_dtype(c))),
            sinks=None if d.sinks is None else d.sinks.astype(npdt),
            more=None
            if d.alibi is None
            else {"alibi_slopes": d.alibi.reshape(-1, c.heads_q).astype(np.float32)},
            q_lengths=None if d.q_lengths is None else d.q_lengths.copy(),
            k_lengths=None if d.k_lengths is None else d.k_lengths.copy(),
            cu_seqlens_q=None if d.cu_seqlens_q is None else d.cu_seqlens_q.copy(),
            cu_seqlens_k=None if d.cu_seqlens_k is None else d.cu_seqlens_k.copy(),
            max_seqlen_q=max(c.seqlens_q, default=0),
            max_seqlen_k=max(c.seqlens_k, default=0),
            block_table=None if d.block_table is None else d.block_table.copy(),
        )
        return qkv, mask, ops
