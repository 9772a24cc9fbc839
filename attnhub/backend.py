"""The backend contract: what a backend declares, how it says no, and the calls the core makes.

Backends receive canonical arrays of the caller's framework: q (B, Hq, Nq, Dqk), k (B, Hkv, Nk,
Dqk), v (B, Hkv, Nk, Dv), the sequence flattened row-major (``req.seq_q`` keeps its shape), and an
explicit mask, when there is one, as a rank-4 array broadcastable to (B, Hq, Nq, Nk). They return
out (B, Hq, Nq, Dv) in the input dtype and lse (B, Hq, Nq) in float32 (float64 for float64).

Every backend has the same three compute methods, called with the same arguments
(docs/writing-a-backend.md): ``forward(q, k, v, req, mask, operands)``, ``forward_for_grad`` (the
same) and ``backward(q, k, v, out, lse, dout, req, mask, operands, dlse)``. ``mask`` is a boolean
array or None (a float mask reaches backends as the bias, SPEC §9); ``operands`` the §9-§11 arrays
(:class:`attnhub.operands.Operands`) or None; ``dlse`` the upstream gradient of lse or None.
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar

from attnhub.frameworks import FLOAT_DTYPES
from attnhub.modifiers import ADDED, MODIFIERS
from attnhub.request import Request
from attnhub.rules import ExplicitMask

#: Feature names a backend may declare in ``features``.
FEATURES = (
    "1d",
    "2d",
    "full",
    "causal",
    "local",
    "explicit_mask",
    "gqa",
    "lse",
    "backward",
    # The backward folds the upstream gradient of lse (``dlse``): TensorFlow's glue then lets lse
    # carry a gradient, and context parallelism merges blocks through it.
    "dlse",
    # The backward reads the ``out`` and ``lse`` it is given (FlashAttention's convention:
    # rowsum(dO·O) from ``out``, the probabilities from ``lse``), so context parallelism can hand
    # it the merged ones.
    "given_lse",
    "deterministic",
    "tf32",
    # SPEC §9: an additive bias composed with every rule (arrives as ``operands.bias``); its
    # gradient ("dbias", without which the core declines a differentiated bias); softcap; sinks
    # (with "backward": their gradient too).
    "bias",
    "dbias",
    "softcap",
    "sinks",
    # SPEC §10-§11: per-entry lengths (both padding sides), packed sequences, paged KV caches,
    # position offsets.
    "lengths",
    "varlen",
    "paged",
    "offsets",
)

#: What a backend without the feature says about a request that uses these §10-§11 arguments
#: (the §9 score modifiers say it themselves: attnhub.modifiers).
_MISSING = {
    "lengths": "does not take q_lengths/k_lengths",
    "varlen": "does not take packed sequences (attention_varlen)",
    "paged": "does not read paged KV caches (block_table)",
    "offsets": "does not take q_offset/k_offset",
}


def missing_features(req: Request, feats: frozenset[str] | set[str]) -> list[str]:
    """Reasons for the §9-§11 arguments of ``req`` that ``feats`` does not cover."""
    reasons = [m.missing for m in MODIFIERS.values() if m.feature not in feats and m.used(req)]
    uses = {
        "lengths": req.q_lengths or req.k_lengths,
        "varlen": req.varlen,
        "paged": bool(req.paged),
        "offsets": bool(req.q_offset or req.k_offset),
    }
    reasons.extend(_MISSING[f] for f, used in uses.items() if used and f not in feats)
    if "backward" not in feats:
        if req.sinks_grad:
            reasons.append("has no backward, and the sinks require grad")
        for name, sig in req.more:
            if ADDED[name].requires_grad(sig):
                reasons.append(f"has no backward, and {name} requires grad")
    return reasons


class Backend:
    """Base class of every backend; override the class attributes and the two compute methods."""

    name: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    frameworks: ClassVar[tuple[str, ...]] = ()
    device_types: ClassVar[tuple[str, ...]] = ("cpu",)
    dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    features: ClassVar[frozenset[str]] = frozenset({"1d", "2d", "full", "causal", "local", "gqa", "lse"})
    max_head_dim: ClassVar[int | None] = None
    #: Name and version of what the backend runs on, for ``attnhub info``.
    requires: ClassVar[tuple[str, ...]] = ()
    #: A kernel its framework or hardware vendor ships (torch's SDPA kernels, cuDNN). Where no
    #: profile measured a request's class, ``auto`` tries vendor kernels first for plain dense
    #: requests (Full or Causal, no SPEC §9-§11 argument): tuned for every device their vendor
    #: supports, they are the safe pick on a device attnhub has never measured (docs/dispatch.md).
    vendor: ClassVar[bool] = False
    #: A vendor kernel with the least host and launch cost per call: the prior tries it first for
    #: plain calls too small to time (below :data:`attnhub.dispatch.SMALL_CALL_FLOPS`), where a
    #: loop of calls runs at the host's pace.
    light_calls: ClassVar[bool] = False
    #: A vendor kernel whose call costs more host time than the others' (cuDNN through its
    #: frontend): the prior puts it after the other vendor kernels for plain calls below this many
    #: FLOPs, where its host time would exceed the kernel's and a loop of calls waits on the host.
    heavy_calls_from: ClassVar[float] = 0.0

    #: Its first call of each new request shape builds a plan (cuDNN's graphs: milliseconds). A
    #: decode step (few query rows) comes with a new cache length every step, so ``auto`` puts such
    #: a backend after the others there, over a profile too (which times one shape repeatedly).
    builds_per_shape: ClassVar[bool] = False

    def availability(self) -> str | None:
        """None when the backend can run on this machine, else a reason a user can act on."""
        return None

    def version(self) -> str | None:
        """Version of the framework or toolchain the backend runs on (for ``attnhub info``)."""
        return None

    def check(self, req: Request) -> list[str]:
        """Reasons this backend cannot serve ``req``; an empty list means it can."""
        reasons: list[str] = []
        if req.framework not in self.frameworks:
            reasons.append(f"takes {', '.join(self.frameworks) or 'no'} arrays, got a {req.framework} array")
        if req.device_type not in self.device_types:
            reasons.append(self.device_reason(req))
        if req.dtype not in self.dtypes:
            reasons.append(f"supports dtypes {', '.join(self.dtypes)}, got {req.dtype}")
        feats = self.features
        if f"{req.ndim}d" not in feats:
            reasons.append(f"does not support {req.ndim}-d sequences")
        rule = req.rule
        if isinstance(rule, ExplicitMask):
            if "explicit_mask" not in feats:
                reasons.append(
                    "does not read explicit mask arrays; express the mask as a rule (Causal/Local)"
                )
        else:
            kind = type(rule).__name__.lower()
            if kind not in feats:
                reasons.append(f"does not support the {kind} rule")
        if req.heads_q != req.heads_kv and "gqa" not in feats:
            reasons.append(f"needs Hq == Hkv (no GQA/MQA), got Hq={req.heads_q} Hkv={req.heads_kv}")
        if req.return_lse and "lse" not in feats:
            reasons.append("cannot return lse")
        if req.needs_grad and "backward" not in feats:
            reasons.append("has no backward; call it under torch.no_grad() or on tensors without grad")
        reasons.extend(missing_features(req, feats))
        if self.max_head_dim is not None and max(req.dim_qk, req.dim_v) > self.max_head_dim:
            reasons.append(f"head dims up to {self.max_head_dim}, got Dqk={req.dim_qk} Dv={req.dim_v}")
        reasons.extend(self.extra_reasons(req))
        return reasons

    def late_reasons(self, req: Request) -> list[str]:
        """Reasons only a costly probe finds, asked after :meth:`check` found none (override as
        needed). cudnn builds the request's cuDNN graph here: a new sequence length is a new graph,
        milliseconds of host time, so ``auto`` asks this only of the candidate it is about to
        choose (a decode loop whose cache grows every step must not build graphs for a backend it
        never runs); a named backend, ``explain`` and ``certify`` ask it always."""
        return []

    def light_call(self, req: Request) -> bool:
        """Whether the call for ``req`` is as light as :attr:`light_calls` declares; override where
        some requests cost more (torch's efficient kernel serves GQA by repeating K and V per query
        head: a copy of the cache and two more launches a call, no light call)."""
        return self.light_calls

    def device_reason(self, req: Request) -> str:
        """Why a request on another device type is declined (from ``device_types`` alone)."""
        return f"runs on {', '.join(self.device_types)} devices, the inputs are on {req.device}"

    def extra_reasons(self, req: Request) -> list[str]:
        """Backend-specific reasons beyond the declared attributes (override as needed)."""
        return []

    def tuning(self) -> contextlib.AbstractContextManager:
        """Entered while ``attnhub tune`` times the backends: inside, a backend that picks among
        kernel configs may time them for a shape class met for the first time and record its pick
        (the triton backend does). Default: nothing."""
        return contextlib.nullcontext()

    #: ``warmup`` compiles kernels ahead (``attnhub warmup`` offers the backend).
    compiles_ahead: ClassVar[bool] = False

    def warmup(self, dtypes: list[str], head_dims: list[int], tune: bool, echo: Any) -> None:
        """Compile the backend's common kernels for this GPU ahead of the first calls (``attnhub
        warmup``), timing and recording config picks with ``tune``; ``echo(line)`` reports progress.
        Only called where :attr:`compiles_ahead`."""
        raise NotImplementedError(f"backend {self.name!r} compiles nothing ahead")

    def tuned_configs(self) -> dict[str, str]:
        """The kernel configs the backend's tuner picked in this process, for benchmark reports."""
        return {}

    def note(self, req: Request) -> str | None:
        """How the backend would run ``req`` (e.g. which kernel path), shown by ``explain``; optional."""
        return None

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        """Compute (out, lse) on canonical arrays (see the module docstring). ``operands`` holds the
        §9-§11 arrays of a request that uses them (None otherwise)."""
        raise NotImplementedError

    def forward_for_grad(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any, Any]:
        """(out, lse, saved): the forward when a backward will follow; ``saved`` is what
        :meth:`backward` receives as ``out``. The torch and TensorFlow glue both call it.

        Default: the output itself. A backend whose backward forms rowsum(dO·O) overrides this to
        keep a float32 output for half-precision inputs: on a row whose probability sits on one
        key, dP − rowsum(dO·O) cancels and O rounded to bfloat16 costs dq several times SPEC's
        tolerance (tests/test_peaked_row_gradients.py).
        """
        out, lse = self.forward(q, k, v, req, mask, operands)
        return out, lse, out

    def backward(
        self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, req: Request, mask: Any = None,
        operands: Any = None, dlse: Any = None,
    ) -> tuple[Any, ...]:  # fmt: skip
        """(dq, dk, dv), or (dq, dk, dv, dbias, dsinks) with None where not asked, for upstream
        gradient ``dout``; called by the framework glue.

        ``dlse`` is the upstream gradient of lse, (B, Hq, Nq), or None when lse receives none. Only
        a backend declaring the feature "dlse" is ever given one; it folds it in as
        ``dS = P * (dP - rowsum(dO·O) + dlse)``.
        """
        raise NotImplementedError(f"backend {self.name!r} has no backward")

    def __repr__(self) -> str:
        return f"<attnhub backend {self.name!r} priority={self.priority}>"
