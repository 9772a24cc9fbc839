"""The request: everything a backend needs to decide whether it can run a call, validated per SPEC §7.

A :class:`Request` is hashable; together with the dispatch overrides it is the key under which the
dispatcher caches its choice. Arrays never live in it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnhub.errors import SpecError
from attnhub.frameworks import FLOAT_DTYPES, Adapter, adapter_for, adapter_like
from attnhub.modifiers import MODIFIERS
from attnhub.modifiers.softcap import effective_softcap
from attnhub.positions import check_position_range
from attnhub.rules import SYNC_MODES, Causal, ExplicitMask, Full, Local, Rule

LAYOUTS = ("bhsd", "bshd", "bhds")


@dataclass(frozen=True)
class Request:
    """One attention call described by its signature (see SPEC §1-4)."""

    framework: str
    device: str
    dtype: str
    layout: str
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: tuple[int, ...]
    seq_k: tuple[int, ...]
    dim_qk: int
    dim_v: int
    rule: Rule
    sync: str
    scale: float
    needs_grad: bool = False
    return_lse: bool = False
    #: True when the inputs hold no data yet (traced under jax.jit, or a tf.function graph).
    symbolic: bool = False
    # SPEC §9: score modifiers. A float ``mask=`` array arrives here as ``bias`` with the rule Full.
    #: The bias's rank-4 broadcast shape over (B, Hq, Nq, Nk), or None without a bias.
    bias: tuple[int, int, int, int] | None = None
    #: The caller differentiates the bias: only backends declaring "dbias" may run the request.
    bias_grad: bool = False
    softcap: float | None = None
    #: A (Hq,) sinks array is given; ``sinks_grad`` when the caller differentiates it.
    sinks: bool = False
    sinks_grad: bool = False
    # SPEC §10: ragged sequences. The arrays travel in :class:`attnhub.operands.Operands`.
    q_lengths: bool = False
    k_lengths: bool = False
    padding_side: str = "right"
    #: ``attention_varlen``: batch is 1, seq_q = (Tq,), seq_k = (Tk,), sequences by cu_seqlens.
    varlen: bool = False
    #: ``attention_kvcache`` with a block table: the block size (0: no paging). k and v then
    #: reach the backend as (num_blocks, block_size, Hkv, D) and seq_k = (max_blocks * block_size,).
    paged: int = 0
    # SPEC §11: position offsets (sync none_front only).
    q_offset: int = 0
    k_offset: int = 0
    #: ``(name, signature)`` of each score modifier added since SPEC's first edition that the call
    #: uses (:mod:`attnhub.modifiers`: the signature is its ``ScoreModifier.signature``).
    more: tuple = ()

    @property
    def ndim(self) -> int:
        """Number of sequence dimensions (1 or 2)."""
        return len(self.seq_q)

    @property
    def nq(self) -> int:
        return math.prod(self.seq_q)

    @property
    def nk(self) -> int:
        return math.prod(self.seq_k)

    @property
    def group(self) -> int:
        """Query heads per kv head (1 without GQA)."""
        return self.heads_q // self.heads_kv if self.heads_kv else 1

    @property
    def ragged(self) -> bool:
        """True when §10 arguments make the valid segment differ per batch entry or sequence."""
        return self.q_lengths or self.k_lengths or self.varlen or bool(self.paged)

    @property
    def modified(self) -> bool:
        """True when any §9-§11 argument is present (the backend then receives ``operands``)."""
        return (
            self.bias is not None or self.softcap is not None or self.sinks or self.ragged
            or bool(self.q_offset) or bool(self.k_offset) or bool(self.more)
        )  # fmt: skip

    @property
    def device_type(self) -> str:
        return self.device.split(":", 1)[0]

    @property
    def flops(self) -> float:
        """FlashAttention's count: 4·B·Hq·Nq·Nk·D (D the mean of Dqk and Dv), halved under a
        causal rule, 3.5× with gradients (forward plus a backward of 2.5×)."""
        f = 2.0 * self.batch * self.heads_q * self.nq * self.nk * (self.dim_qk + self.dim_v)
        if isinstance(self.rule, Causal):
            f /= 2
        return f * (3.5 if self.needs_grad else 1.0)

    @property
    def is_empty(self) -> bool:
        """True when the output has no elements or no key is present (SPEC §7: not an error)."""
        return 0 in (self.batch, self.heads_q, self.nq, self.dim_v) or self.nk == 0

    def describe(self) -> str:
        sq = "x".join(map(str, self.seq_q))
        sk = "x".join(map(str, self.seq_k))
        return (
            f"{self.framework}/{self.device} {self.dtype} B={self.batch} Hq={self.heads_q} "
            f"Hkv={self.heads_kv} Sq={sq} Sk={sk} Dqk={self.dim_qk} Dv={self.dim_v} "
            f"{self.rule.describe()} sync={self.sync}"
            + (" grad" if self.needs_grad else "")
            + "".join(f" {m.describe(self)}" for m in MODIFIERS.values() if m.used(self))
            + (f" q_lengths({self.padding_side})" if self.q_lengths else "")
            + (f" k_lengths({self.padding_side})" if self.k_lengths else "")
            + (" varlen" if self.varlen else "")
            + (f" paged{self.paged}" if self.paged else "")
            + (f" q_offset={self.q_offset}" if self.q_offset else "")
            + (f" k_offset={self.k_offset}" if self.k_offset else "")
            + (" lse" if self.return_lse else "")
        )


def parse_rule(mask: Any) -> Rule | None:
    """A rule object for ``mask`` or None when ``mask`` is an explicit array."""
    if mask is None:
        return Full()
    if isinstance(mask, str):
        named = {"full": Full(), "causal": Causal()}
        if mask in named:
            return named[mask]
        raise SpecError("mask", "None, 'full', 'causal', Full(), Causal(), Local(...) or an array", mask)
    if isinstance(mask, (Full, Causal, Local)):
        return mask
    if hasattr(mask, "shape") and hasattr(mask, "dtype"):
        return None
    raise SpecError("mask", "None, 'full', 'causal', Full(), Causal(), Local(...) or an array", mask)


def _split(shape: tuple[int, ...], layout: str) -> tuple[int, int, tuple[int, ...], int]:
    """(batch, heads, sequence shape, head dim) of an array in ``layout``."""
    if layout == "bhsd":
        return shape[0], shape[1], shape[2:-1], shape[-1]
    if layout == "bshd":
        return shape[0], shape[-2], shape[1:-2], shape[-1]
    return shape[0], shape[1], shape[3:], shape[2]


def build_request(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    sync: str,
    scale: float | None,
    layout: str,
    return_lse: bool,
) -> tuple[Request, Adapter]:
    """Validate a call against SPEC §7 and §12 and describe it; raises :class:`SpecError` naming
    the argument on bad input (types included: a bool is not a number here, a list not an array).

    A float ``mask`` is described as a bias with the rule Full (SPEC §9)."""
    req, ad, _ = build_request_ex(q, k, v, mask, sync, scale, layout, return_lse)
    return req, ad


def build_request_ex(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    sync: str,
    scale: float | None,
    layout: str,
    return_lse: bool,
    extras: Any = None,
) -> tuple[Request, Adapter, Any]:
    """:func:`build_request` with the §9-§11 arguments (:class:`attnhub.extras.Extras`); returns
    the extras too, with a float mask moved into ``bias``."""
    from attnhub import extras as ext

    extras = ext.NONE if extras is None else extras
    ad = adapter_for(q, "q")
    for name, x in (("k", k), ("v", v)):
        adapter_like(x, name, ad)
    for name, x in (("q", q), ("k", k), ("v", v)):
        why = ad.dense_problem(x)
        if why is not None:
            raise SpecError(name, f"a dense {ad.name} array", why)
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise SpecError("layout", "one of " + ", ".join(LAYOUTS), layout)
    if not isinstance(sync, str) or sync not in SYNC_MODES:
        raise SpecError("sync", "one of " + ", ".join(SYNC_MODES), sync)
    if not isinstance(return_lse, bool):
        raise SpecError("return_lse", "a bool (True or False)", return_lse)

    shapes = {n: ad.shape(x) for n, x in (("q", q), ("k", k), ("v", v))}
    for n, s in shapes.items():
        if len(s) not in (4, 5):
            raise SpecError(f"{n}.ndim", f"4 (1-d sequence) or 5 (2-d sequence) in layout {layout!r}", len(s))
    if not len(shapes["q"]) == len(shapes["k"]) == len(shapes["v"]):
        raise SpecError("k.ndim/v.ndim", f"{len(shapes['q'])} like q", (len(shapes["k"]), len(shapes["v"])))
    bq, hq, sq, dqk = _split(shapes["q"], layout)
    bk, hk, sk, dk = _split(shapes["k"], layout)
    bv, hv, sv, dv = _split(shapes["v"], layout)
    if bk != bq or bv != bq:
        raise SpecError("batch of k/v", f"{bq} (the batch of q)", (bk, bv))
    if hv != hk:
        raise SpecError("heads of v", f"{hk} (the heads of k)", hv)
    if (hk == 0 and hq != 0) or (hk and hq % hk):
        raise SpecError("heads of q", f"a multiple of the kv heads ({hk})", hq)
    if dk != dqk:
        raise SpecError("head dim of k", f"{dqk} (the head dim of q)", dk)
    if dqk < 1:
        raise SpecError("head dim of q", ">= 1", dqk)
    if sv != sk:
        raise SpecError("sequence shape of v", f"{sk} (the sequence shape of k)", sv)

    dtypes = [ad.dtype_name(x) for x in (q, k, v)]
    if dtypes[0] not in FLOAT_DTYPES:
        raise SpecError("q.dtype", "one of " + ", ".join(FLOAT_DTYPES), dtypes[0])
    if dtypes[1] != dtypes[0] or dtypes[2] != dtypes[0]:
        raise SpecError("k.dtype/v.dtype", f"{dtypes[0]} (the dtype of q)", (dtypes[1], dtypes[2]))
    devices = [ad.device(x) for x in (q, k, v)]
    if devices[1] != devices[0] or devices[2] != devices[0]:
        raise SpecError("k.device/v.device", f"{devices[0]} (the device of q)", (devices[1], devices[2]))

    scale_value = 1.0 / math.sqrt(dqk) if scale is None else scale_float(scale)

    rule = parse_rule(mask)
    nq, nk = math.prod(sq), math.prod(sk)
    from_mask = False
    if rule is None:
        rule = _explicit_signature(mask, ad, bq, hq, nq, nk, devices[0])
        if rule.kind == "additive":  # SPEC §9: a float mask is a bias with the rule Full
            if extras.bias is not None:
                raise SpecError("mask", "a rule or a bool mask when bias= is given", "a float mask")
            extras = dataclasses.replace(extras, bias=mask)
            rule, from_mask = Full(), True
    elif isinstance(rule, Local):
        rule.windows(len(sq))  # raises SpecError for a window tuple of the wrong length
    fields = ext.parse(
        extras, ad, q, bq, hq, nq, nk, len(sq), sync, devices[0], dtypes[0], from_mask
    ).as_dict()
    check_position_range(tuple(sq), tuple(sk), fields["q_offset"], fields["k_offset"])
    fields["softcap"] = effective_softcap(fields["softcap"], dtypes[0], scale_value, dqk)

    req = Request(
        framework=ad.name,
        device=devices[0],
        dtype=dtypes[0],
        layout=layout,
        batch=bq,
        heads_q=hq,
        heads_kv=hk,
        seq_q=tuple(sq),
        seq_k=tuple(sk),
        dim_qk=dqk,
        dim_v=dv,
        rule=rule,
        sync=sync,
        scale=scale_value,
        needs_grad=any(ad.requires_grad(x) for x in (q, k, v)),
        return_lse=return_lse,
        symbolic=not ad.is_concrete(q),
        **fields,
    )
    return req, ad, extras


_SCALE = "a finite real number (not a bool) or None"


def scale_float(scale: Any) -> float:
    """``scale`` as a finite float; :class:`SpecError` for a bool, a non-number, a multi-element,
    traced or differentiated array, an overflow or a non-finite value (SPEC §7, §12)."""
    if isinstance(scale, (bool, np.bool_)):
        raise SpecError("scale", _SCALE, scale)
    if isinstance(scale, numbers.Real):
        try:
            value = float(scale)
        except (OverflowError, ValueError, TypeError):
            raise SpecError("scale", _SCALE, scale) from None
    elif hasattr(scale, "shape") and hasattr(scale, "dtype"):
        shape = tuple(scale.shape)
        if None in shape or math.prod(shape) != 1:
            raise SpecError("scale", _SCALE + " (a one-element array at most)", f"an array of shape {shape}")
        kind = getattr(scale.dtype, "kind", None) or str(scale.dtype)
        if kind in ("b", "c") or "bool" in str(scale.dtype) or "complex" in str(scale.dtype):
            raise SpecError("scale", _SCALE, f"an array of dtype {scale.dtype}")
        if getattr(scale, "requires_grad", False):
            raise SpecError(
                "scale", _SCALE + " (its gradient would be dropped)", "a tensor that requires grad"
            )
        try:
            value = float(scale.reshape(()) if hasattr(scale, "reshape") else scale)
        except Exception:  # a traced value (jax.jit, tf.function) has no number yet
            raise SpecError(
                "scale", _SCALE + " known when attention is called", type(scale).__name__
            ) from None
    else:
        raise SpecError("scale", _SCALE, scale)
    if not math.isfinite(value):
        raise SpecError("scale", _SCALE, scale)
    return value


def check_backend_arg(backend: Any) -> None:
    """``backend`` must be a name: "auto" or a backend's name."""
    if not isinstance(backend, str) or not backend:
        raise SpecError("backend", '"auto" or the name of a registered backend', backend)


def _explicit_signature(
    mask: Any, ad: Adapter, b: int, hq: int, nq: int, nk: int, device: str
) -> ExplicitMask:
    """Check an explicit mask array (SPEC §3) and describe it as rank 4."""
    mad = adapter_like(mask, "mask", ad)
    why = mad.dense_problem(mask)
    if why is not None:
        raise SpecError("mask", f"a dense {mad.name} array", why)
    if mad.device(mask) != device:
        raise SpecError("mask.device", device, mad.device(mask))
    dt = mad.dtype_name(mask)
    if dt == "bool":
        kind = "bool"
    elif dt in FLOAT_DTYPES:
        kind = "additive"
    else:
        raise SpecError("mask.dtype", "bool (True = attend) or a float dtype (additive bias)", dt)
    shape = mad.shape(mask)
    target = (b, hq, nq, nk)
    if len(shape) > 4:
        raise SpecError("mask.shape", f"broadcastable to (B, Hq, Nq, Nk) = {target}", shape)
    full = (1,) * (4 - len(shape)) + tuple(shape)
    for have, want in zip(full, target, strict=True):
        if have not in (1, want):
            raise SpecError("mask.shape", f"broadcastable to (B, Hq, Nq, Nk) = {target}", shape)
    return ExplicitMask(kind=kind, shape=full)  # type: ignore[arg-type]


def to_canonical(ad: Adapter, x: Any, layout: str) -> Any:
    """View ``x`` as (B, H, N, D) with the sequence flattened (a view where the framework allows)."""
    rank = len(x.shape)
    if layout == "bshd":
        x = ad.permute(x, (0, rank - 2, *range(1, rank - 2), rank - 1))
    elif layout == "bhds":
        x = ad.permute(x, (0, 1, *range(3, rank), 2))
    s = x.shape
    n = math.prod(int(d) for d in s[2:-1])
    return ad.reshape(x, (int(s[0]), int(s[1]), n, int(s[-1])))


def from_canonical(ad: Adapter, out: Any, req: Request) -> Any:
    """Bring a (B, Hq, Nq, Dv) result back to the request's layout and sequence shape."""
    x = ad.reshape(out, (req.batch, req.heads_q, *req.seq_q, req.dim_v))
    rank = 3 + req.ndim
    if req.layout == "bshd":
        x = ad.permute(x, (0, *range(2, rank - 1), 1, rank - 1))
    elif req.layout == "bhds":
        x = ad.permute(x, (0, 1, rank - 1, *range(2, rank - 1)))
    return x
