"""SPEC §10 entry points: ``attention_varlen`` (packed sequences) and ``attention_kvcache``.

Both reduce to the core's request and plan: packed sequences are the "thd" arrays viewed as a
batch of one, (1, H, T, D), with ``cu_seqlens`` as operands; a contiguous KV cache is exactly
``attention(..., sync="none_end", k_lengths=...)``; a paged cache reaches backends declaring
"paged" raw, with the block table as an operand. The arrays' values are checked (SPEC §12) once
per torch tensor version (:mod:`attnhub.readings`).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any

import numpy as np

from attnhub.api import attention
from attnhub.dispatch import CACHE, DISPATCHER, override_state
from attnhub.errors import SpecError
from attnhub.extras import Extras, added_modifiers, check_int_array, int_arg
from attnhub.frameworks import Adapter, adapter_for, adapter_like
from attnhub.plan import Plan, mask_key, plan_for
from attnhub.readings import check_readable, reading
from attnhub.request import build_request_ex, check_backend_arg


def _int32_array(name: str, x: Any, ndim: int, ad: Adapter) -> tuple[int, ...]:
    """``x`` must be an int32 array of q's framework (``ad``; torch: any device) and rank
    ``ndim`` whose values can be read (SPEC §10, §12); returns its shape."""
    if isinstance(x, (list, tuple)) or not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise SpecError(name, f"an int32 {ad.name} array like q", type(x).__name__)
    adapter_like(x, name, ad)
    check_readable(name, x)
    dt = str(x.dtype).removeprefix("torch.").removeprefix("<dtype: '").removesuffix("'>")
    if dt != "int32":
        raise SpecError(f"{name}.dtype", "int32", dt)
    shape = tuple(int(d) for d in x.shape)
    if len(shape) != ndim:
        raise SpecError(f"{name}.shape", f"rank {ndim}", shape)
    return shape


def _check_cu_seqlens(name: str, cu: Any, total: int, ad: Adapter) -> int | None:
    """SPEC §12: from 0, non-decreasing, ending at ``total``; returns the longest sequence, or None
    where the values cannot be read (traced). Read once per torch tensor version."""
    (n,) = _int32_array(name, cu, 1, ad)
    if n < 1:
        raise SpecError(f"{name}.shape", "(N + 1,) with N >= 0", (n,))
    r = reading(cu)
    if r is None or r.values is None:
        return None
    facts = r.facts.get("cu_seqlens")
    if facts is None:
        vals = r.values
        steps = np.diff(vals)
        bad = vals.tolist() if np.any(steps < 0) else None
        facts = r.facts["cu_seqlens"] = (int(vals[0]), bad, int(vals[-1]), int(steps.max()) if n > 1 else 0)
    first, bad, last, longest = facts
    if first != 0:
        raise SpecError(name, "starting at 0", first)
    if bad is not None:
        raise SpecError(name, "non-decreasing", bad)
    if last != total:
        raise SpecError(name, f"ending at the total length {total}", last)
    return longest


def _graph_break_under_compile(fn: Any) -> Any:
    """``fn``, run eagerly while torch.compile traces it (:func:`attnhub.torch_ops.eager`): a
    traced call would reach the backends' launches (the Triton interpreter's NumPy code failed
    under Dynamo, 2026-11-29)."""

    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and torch.compiler.is_compiling():
            from attnhub import torch_ops

            return torch_ops.eager(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    return entry


@_graph_break_under_compile
def attention_varlen(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    mask: Any = None,
    sync: str = "none_front",
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    backend: str = "auto",
    return_lse: bool = False,
    **modifiers: Any,
) -> Any:
    """Attention over packed sequences (SPEC §10, layout "thd", as flash-attn's varlen functions).

    q (Tq, Hq, Dqk), k (Tk, Hkv, Dqk), v (Tk, Hkv, Dv); sequence n is rows
    ``cu_seqlens_q[n]:cu_seqlens_q[n+1]`` of q against rows ``cu_seqlens_k[n]:cu_seqlens_k[n+1]``
    of k and v, each an independent problem with ``mask`` (a rule) and ``sync``. Returns out
    (Tq, Hq, Dv), and lse (Hq, Tq) with ``return_lse``.
    """
    ad = adapter_for(q, "q")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or len(x.shape) != 3:
            raise SpecError(f"{name}.ndim", "3: (T, H, D) in layout thd", getattr(x, "shape", x))
    if mask is not None and not isinstance(mask, str) and hasattr(mask, "shape"):
        raise SpecError(
            "mask", "a rule (None, 'full', 'causal', Local(...)) with attention_varlen", "an array"
        )
    tq, tk = int(q.shape[0]), int(k.shape[0])
    longest_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, tq, ad)
    longest_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, tk, ad)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise SpecError(
            "cu_seqlens_k.shape", f"{tuple(cu_seqlens_q.shape)} like cu_seqlens_q", tuple(cu_seqlens_k.shape)
        )
    hint_q = None if max_seqlen_q is None else int_arg("max_seqlen_q", max_seqlen_q)
    hint_k = None if max_seqlen_k is None else int_arg("max_seqlen_k", max_seqlen_k)
    if longest_q is None or longest_k is None:
        # Traced cu_seqlens (jax.jit, tf.function): a max_seqlen hint cannot be checked against
        # them, so the totals bound the sequences instead (exact, if slower); never a SpecError.
        mq, mk = tq, tk
    else:
        mq = longest_q if hint_q is None else hint_q
        mk = longest_k if hint_k is None else hint_k
        if mq < longest_q or mk < longest_k:
            raise SpecError(
                "max_seqlen_q/max_seqlen_k", f">= the longest sequences ({longest_q}, {longest_k})", (mq, mk)
            )
    extras = Extras(
        softcap=softcap, sinks=sinks, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=mq, max_seqlen_k=mk, more=added_modifiers("attention_varlen", modifiers),
    )  # fmt: skip
    # (T, H, D) viewed as the canonical (1, H, T, D): the plan then moves no axes on the way in.
    q4, k4, v4 = (
        ad.reshape(ad.permute(x, (1, 0, 2)), (1, int(x.shape[1]), int(x.shape[0]), int(x.shape[2])))
        for x in (q, k, v)
    )
    plan = plan_for(q4, k4, v4, mask, sync, scale, "bhsd", return_lse, backend, extras)
    result = plan.execute(q4, k4, v4, mask, extras)
    out, lse = result if return_lse else (result, None)
    out = ad.permute(ad.reshape(out, (out.shape[1], out.shape[2], out.shape[3])), (1, 0, 2))
    if return_lse:
        return out, ad.reshape(lse, (lse.shape[1], lse.shape[2]))
    return out


@_graph_break_under_compile
def attention_kvcache(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    k_lengths: Any,
    *,
    block_table: Any = None,
    mask: Any = "causal",
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    backend: str = "auto",
    return_lse: bool = False,
    **modifiers: Any,
) -> Any:
    """Attention of new tokens q (B, Hq, Lq, Dqk) against a KV cache (SPEC §10).

    Without ``block_table``, k_cache/v_cache are (B, Hkv, Lmax, D) and batch b's keys are its
    first ``k_lengths[b]`` rows; with ``block_table`` (B, max_blocks) int32, they are (num_blocks,
    block_size, Hkv, D) and key j of batch b is row ``j % block_size`` of block
    ``block_table[b, j // block_size]``. Queries sit at the end of each sequence (sync none_end).
    """
    if k_lengths is None:
        raise SpecError("k_lengths", "the number of valid keys per batch entry, (B,) ints", None)
    if block_table is None:
        return attention(
            q, k_cache, v_cache, mask=mask, sync="none_end", scale=scale, softcap=softcap, sinks=sinks,
            k_lengths=k_lengths, backend=backend, return_lse=return_lse, **modifiers,
        )  # fmt: skip
    more = added_modifiers("attention_kvcache", modifiers)
    return _paged(
        q, k_cache, v_cache, k_lengths, block_table, mask, scale, softcap, sinks, backend, return_lse, more
    )


def _stand_in(x: Any, shape: tuple[int, ...]) -> Any:
    """An array with ``x``'s framework, dtype, device and grad flag but ``shape``, holding no data
    of its own where the framework allows: what the request is validated on for a paged cache."""
    mod = type(x).__module__.split(".", 1)[0]
    if mod == "torch":
        torch = sys.modules["torch"]
        t = torch.empty_strided(shape, (0,) * len(shape), dtype=x.dtype, device=x.device)
        return t.requires_grad_(x.requires_grad)
    if mod == "numpy":
        return np.lib.stride_tricks.as_strided(np.zeros(1, dtype=x.dtype), shape, (0,) * len(shape))
    ad = adapter_for(x, "k_cache")
    first = ad.reshape(x, (-1,))[:1] if hasattr(x, "__getitem__") else x
    if mod == "tensorflow":
        return sys.modules["tensorflow"].broadcast_to(ad.reshape(first, (1,) * len(shape)), shape)
    return sys.modules["jax.numpy"].broadcast_to(ad.reshape(first, (1,) * len(shape)), shape)


def _check_blocks(block_table: Any, k_lengths: Any, nb: int, bs: int, max_blocks: int) -> None:
    """SPEC §12: the blocks in use (those holding one of batch b's first ``k_lengths[b]`` keys)
    are in [0, nb); the rest may be unset, as vLLM leaves them. Where both can be read, checked
    once per pair of torch tensor versions."""
    table, lens = reading(block_table), reading(k_lengths)
    if table is None or lens is None or table.values is None or lens.values is None or not lens.values.size:
        return
    key = (nb, bs, lens.values.tobytes())
    last = table.facts.get("blocks")  # the last lengths checked with this table (one kept)
    if last is not None and last[0] == key:
        bad = last[1]
    else:
        vals = table.values
        used = np.arange(max_blocks)[None, :] < -(-np.clip(lens.values, 0, max_blocks * bs) // bs)[:, None]
        in_use = vals[used]
        bad = in_use.tolist() if in_use.size and (in_use.min() < 0 or in_use.max() >= nb) else []
        table.facts["blocks"] = (key, bad)
    if bad:
        raise SpecError("block_table", f"block indices in [0, {nb}) for the blocks in use", bad)


def _paged(
    q, k_cache, v_cache, k_lengths, block_table, mask, scale, softcap, sinks, backend, return_lse, more=()
):
    """Validated and dispatched once per call signature (the key holds every shape and dtype the
    checks look at); the values of the lengths and the block table are checked on every call (once
    per torch tensor version, attnhub.readings)."""
    ad = adapter_for(q, "q")
    try:
        extras = Extras(
            softcap=softcap,
            sinks=sinks,
            k_lengths=k_lengths,
            block_table=block_table,
            paged=int(k_cache.shape[1]),
            more=more,
        )
        key = (
            "paged", ad.call_key(q, k_cache, v_cache), mask_key(mask), scale, type(scale), return_lse,
            type(return_lse), backend, override_state(), extras.key(ad),
        )  # fmt: skip
        plan = CACHE.recent.get(key) or CACHE.get(key)
    except (TypeError, AttributeError, IndexError):  # not arrays, unhashable: validated below
        key, plan = None, None
    if plan is None:
        plan, extras = _paged_plan(ad, q, k_cache, v_cache, k_lengths, block_table, mask, scale, softcap,
                                   sinks, backend, return_lse, more)  # fmt: skip
        if key is not None:
            CACHE.put(key, plan)
    check_int_array("k_lengths", k_lengths, ad, (int(q.shape[0]),))  # a list's items (its key: its length)
    nb, bs, mb = int(k_cache.shape[0]), int(k_cache.shape[1]), int(block_table.shape[1])
    _check_blocks(block_table, k_lengths, nb, bs, mb)
    return plan.execute(q, k_cache, v_cache, mask, extras)


def _paged_plan(
    ad, q, k_cache, v_cache, k_lengths, block_table, mask, scale, softcap, sinks, backend, return_lse, more=()
):
    """SPEC §12's checks of a paged call's shapes and dtypes, and its plan (request, backend)."""
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not hasattr(x, "shape") or len(x.shape) != 4:
            raise SpecError(
                f"{name}.ndim", "4: (num_blocks, block_size, Hkv, D) with block_table", getattr(x, "shape", x)
            )
    nb, bs, hkv, d = (int(s) for s in k_cache.shape)
    if tuple(v_cache.shape[:3]) != (nb, bs, hkv):
        raise SpecError("v_cache.shape", f"({nb}, {bs}, {hkv}, Dv) like k_cache", tuple(v_cache.shape))
    if not hasattr(q, "shape") or len(q.shape) != 4:
        raise SpecError("q.ndim", "4: (B, Hq, Lq, Dqk)", getattr(q, "shape", q))
    b = int(q.shape[0])
    tb = _int32_array("block_table", block_table, 2, ad)
    if tb[0] != b:
        raise SpecError("block_table.shape", f"({b}, max_blocks)", tb)
    check_int_array("k_lengths", k_lengths, ad, (b,))
    lk = tb[1] * bs
    extras = Extras(
        softcap=softcap, sinks=sinks, k_lengths=k_lengths, block_table=block_table, paged=bs, more=more
    )
    dv = int(v_cache.shape[3])
    ks, vs = _stand_in(k_cache, (b, hkv, lk, d)), _stand_in(v_cache, (b, hkv, lk, dv))
    req, ad, _ = build_request_ex(q, ks, vs, mask, "none_end", scale, "bhsd", return_lse, extras)
    req = dataclasses.replace(
        req, needs_grad=req.needs_grad or any(ad.requires_grad(x) for x in (k_cache, v_cache))
    )
    check_backend_arg(backend)
    return Plan(req, ad, DISPATCHER.choose(req, backend)), extras


__all__ = ["attention_varlen", "attention_kvcache"]


# As attnhub.api's entry points: TensorFlow's AutoGraph would otherwise rewrite these and
# everything they call (dispatch included) inside tf.function; plain trace-time Python runs
# unconverted (tests/test_tf_autograph_entry.py).
for _entry in (attention_varlen, attention_kvcache):
    _entry.autograph_info__ = frozenset()  # type: ignore[attr-defined]
del _entry
