"""One conformance case: the frozen :class:`Case` (everything needed to build an attention call, but
not its data), the features it exercises and the constants the grids share. The grids themselves
are cases.py (SPEC §1-§8) and modifier_cases.py (§9-§11)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from attnhub.positions import dense_rule_mask
from attnhub.rules import Causal, Full, Local

DTYPES = ("float32", "float64", "float16", "bfloat16")
SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
SYNCS = ("none_front", "scale_front", "scale_end", "none_end")
LAYOUTS = ("bhsd", "bshd", "bhds")

#: Rows of the support matrix, in display order.
FEATURE_ROWS = (
    "1-d",
    "2-d",
    "rule full",
    "rule causal",
    "rule local",
    "rule local causal",
    "rule local strided",
    "explicit bool mask",
    "explicit additive mask",
    "sync none_front",
    "sync scale_front",
    "sync scale_end",
    "sync none_end",
    "Lq != Lk",
    "L = 1",
    "batch/heads > 1",
    "GQA/MQA",
    "Dv < Dqk",
    "Dv > Dqk",
    "head dim >= 128",
    "custom scale",
    "lse",
    "backward",
    "deterministic",
    "layout bhsd",
    "layout bshd",
    "layout bhds",
    "large logits",
    "peaked rows",
    "fully masked rows",
    "non-contiguous",
    "NaN/Inf propagate",
    "traced",
    "grad of sum",
    # SPEC §9-§11 (see modifier_cases.py)
    "bias",
    "bias broadcast",
    "bias float32",
    "bias -inf",
    "dbias",
    "bool mask padding",
    "bool mask block-sparse",
    "softcap",
    "sinks",
    "dsinks",
    "alibi",
    "alibi per batch",
    "q_lengths",
    "k_lengths",
    "padding left",
    "zero lengths",
    "NaN in padding",
    "varlen",
    "kvcache contiguous",
    "kvcache paged",
    "offsets",
    "modifiers combined",
    "bad input rejected",
    "randomised",
    "inputs unchanged",
    "framework numpy",
    "framework torch",
    "framework tensorflow",
    "framework jax",
)

#: Features that belong to one check only: a failure elsewhere in a case does not mark them.
#: "inputs unchanged" is on every case; its check runs last (see runner), so when it alone fails the
#: case's other rows passed.
CHECK_FEATURES = {
    "lse": "lse",
    "backward": "backward",
    "deterministic": "deterministic",
    "inputs unchanged": "inputs",
    "dbias": "dbias",
    "dsinks": "dsinks",
    "grad of sum": "backward",
}

#: Bias shapes over (B, Hq, Nq, Nk): per head (ALiBi-like), per key (padding-like), full.
BIAS_SHAPES = ("1hqk", "b11k", "full")

#: Head-dim classes (kernels pick tiles by them: <= 32, 64, 128, 256): large logits are tested at each.
HEAD_DIM_CLASSES = (32, 64, 128, 256)


@dataclass(frozen=True)
class Case:
    """One call of ``attnhub.attention`` to certify (the data comes from the seed and :attr:`id`)."""

    dtype: str
    seq_q: tuple[int, ...]
    seq_k: tuple[int, ...]
    rule: Full | Causal | Local | str = field(default_factory=Full)  # or "bool" / "additive"
    sync: str = "none_front"
    batch: int = 2
    heads_q: int = 2
    heads_kv: int = 2
    dim_qk: int = 32
    dim_v: int = 32
    layout: str = "bhsd"
    scale: float | None = None
    lse: bool = False
    grad: bool = False
    large_logits: bool = False
    #: Every query row puts ~98 % of its probability on key 0 (see ``runner.make_data``): the
    #: backward's dP − rowsum(dO·O) cancels, so an O rounded before the backward shows in dq.
    peaked: bool = False
    #: "" (contiguous), "transposed" (a permuted view) or "sliced" (a slice of a wider buffer).
    noncontig: str = ""
    #: Run twice and require bitwise equal results (for backends declaring ``deterministic``).
    repeat: bool = False
    #: Explicit masks: "bcast" (1, 1, Nq, Nk) or "full" (B, Hq, Nq, Nk); with fully masked rows or not.
    #: Bool masks also "padding" (B, 1, Nq, Nk: each entry's valid queries x valid keys, fully padded
    #: query rows included) and "block<T>" (1, 1, Nq, Nk: whole T x T tiles on or off).
    mask_shape: str = "full"
    mask_empty_rows: bool = False
    #: Set for hypothesis-drawn cases: their id is ``random-<n>``.
    random_index: int | None = None
    #: The inputs' framework; "" is the run's main one (``--framework``, or the backend's first).
    #: Cases of the other declared frameworks carry it, and their id ends with it.
    framework: str = ""
    # -- SPEC §9: score modifiers -----------------------------------------------------------------
    #: "" (none) or one of :data:`BIAS_SHAPES`; its dtype is the input dtype or "float32".
    bias: str = ""
    bias_dtype: str = ""
    #: With ``grad``: the caller differentiates the bias too (dbias is checked).
    bias_grad: bool = False
    #: About 20 % of the bias is -inf (those pairs are excluded).
    bias_neginf: bool = False
    softcap: float | None = None
    #: A (Hq,) sinks array; with ``grad`` it is differentiated (dsinks is checked).
    sinks: bool = False
    #: ALiBi slopes (SPEC §9, ``alibi_slopes``): "" (none), "h" (Hq,) or "bh" (B, Hq); 1-d only.
    alibi: str = ""
    # -- SPEC §10-§11: ragged sequences and offsets (1-d only) ------------------------------------
    q_lengths: tuple[int, ...] | None = None
    k_lengths: tuple[int, ...] | None = None
    padding_side: str = "right"
    q_offset: int = 0
    k_offset: int = 0
    #: Which entry point: "attention", "varlen" (``attention_varlen``; ``seq_q``/``seq_k`` are the
    #: totals and ``seqlens_q``/``seqlens_k`` the packed sequences) or "kvcache"
    #: (``attention_kvcache``: ``seq_k`` is the cache capacity, ``k_lengths`` the valid keys).
    entry: str = "attention"
    seqlens_q: tuple[int, ...] = ()
    seqlens_k: tuple[int, ...] = ()
    #: kvcache: the block size of a paged cache (its block table shuffled), 0 for a contiguous one.
    paged: int = 0
    # -- SPEC §4: non-finite inputs and traced calls ----------------------------------------------
    #: "" or "nan" / "inf": that value in one element of q (batch entry 0), of k (entry 1) and of v
    #: (entry 2); see ``runner.place_nonfinite``. Needs ``batch >= 3``; never with ``grad``.
    nonfinite: str = ""
    #: Forward and gradients through the framework's tracer: ``jax.jit``, ``tf.function`` or
    #: ``torch.compile`` (NumPy inputs have none: such a case is declined).
    traced: bool = False
    #: The upstream gradient: "" (random N(0, 1)) or "ones" (the gradient of ``out.sum()``).
    cotangent: str = ""

    def __post_init__(self) -> None:
        if self.nonfinite and (self.nonfinite not in ("nan", "inf") or self.batch < 3 or self.grad):
            raise ValueError(f"nonfinite={self.nonfinite!r} needs 'nan' or 'inf', batch >= 3 and no grad")
        if self.cotangent not in ("", "ones"):
            raise ValueError(f"cotangent must be '' or 'ones', got {self.cotangent!r}")

    @cached_property
    def id(self) -> str:
        if self.random_index is not None:
            return f"random-{self.random_index}"
        return self.content_id

    @cached_property
    def content_id(self) -> str:
        """The grid-style id of the case's content (a random case's id is only ``random-<n>``)."""
        dims = lambda s: "x".join(map(str, s))  # noqa: E731
        parts = [SHORT[self.dtype], f"{len(self.seq_q)}d", f"q{dims(self.seq_q)}", f"k{dims(self.seq_k)}"]
        if self.entry == "varlen":
            seqs = lambda s: ".".join(map(str, s))  # noqa: E731
            parts.append(f"varlen{seqs(self.seqlens_q)}_{seqs(self.seqlens_k)}")
        elif self.entry == "kvcache":
            parts.append(f"kvcache{f'-paged{self.paged}' if self.paged else ''}")
        parts.append(rule_token(self.rule))
        if isinstance(self.rule, str):
            parts.append(self.mask_shape + ("-emptyrows" if self.mask_empty_rows else ""))
        else:
            parts.append(self.sync)
        parts.append(f"b{self.batch}h{self.heads_q}:{self.heads_kv}")
        parts.append(f"d{self.dim_qk}:{self.dim_v}")
        parts.append(self.layout)
        for flag, token in (
            (self.scale is not None, f"scale{self.scale}"),
            (self.lse, "lse"),
            (self.grad, "grad"),
            (self.large_logits, "big"),
            (self.peaked, "peaked"),
            (bool(self.noncontig), self.noncontig),
            (self.repeat, "repeat"),
            *self._modifier_tokens(),
            (bool(self.nonfinite), self.nonfinite),
            (self.traced, "traced"),
            (bool(self.cotangent), f"dout{self.cotangent}"),
            (bool(self.framework), self.framework),
        ):
            if flag:
                parts.append(token)
        return "-".join(parts)

    def _modifier_tokens(self) -> list[tuple[bool, str]]:
        """Id tokens of the §9-§11 fields (none for a case without them: old ids stay as they were)."""
        lens = lambda s: ".".join(map(str, s))  # noqa: E731
        return [
            (bool(self.bias), f"bias{self.bias}" + ("f32" if self.bias_dtype else "")
             + ("ninf" if self.bias_neginf else "") + ("g" if self.bias_grad else "")),
            (self.softcap is not None, f"softcap{self.softcap:g}" if self.softcap else ""),
            (self.sinks, "sinks"),
            (bool(self.alibi), f"alibi{self.alibi}"),
            (self.q_lengths is not None and self.entry == "attention", f"ql{lens(self.q_lengths or ())}"),
            (self.k_lengths is not None, f"kl{lens(self.k_lengths or ())}"),
            (self.padding_side != "right", f"pad{self.padding_side}"),
            (bool(self.q_offset or self.k_offset), f"off{self.q_offset}.{self.k_offset}"),
        ]  # fmt: skip

    def describe(self) -> str:
        """Every field in words (what a failed randomised case prints; its id says none of it)."""
        seq = lambda s: "x".join(map(str, s))  # noqa: E731
        rule = self.rule if isinstance(self.rule, str) else rule_token(self.rule)
        parts = [
            self.dtype,
            f"q {seq(self.seq_q)} k {seq(self.seq_k)}",
            f"B={self.batch} Hq={self.heads_q} Hkv={self.heads_kv} Dqk={self.dim_qk} Dv={self.dim_v}",
            f"layout {self.layout}",
            f"rule {rule}" + (f" ({self.mask_shape}{', empty rows' if self.mask_empty_rows else ''})"
                              if isinstance(self.rule, str) else ""),
            f"sync {self.sync}",
            f"scale {'default' if self.scale is None else self.scale}",
            f"large logits {'yes' if self.large_logits else 'no'}",
        ]  # fmt: skip
        for flag, token in ((self.lse, "lse"), (self.grad, "grad"), (self.peaked, "peaked rows"),
                            (bool(self.noncontig), f"{self.noncontig} view"), (self.repeat, "repeat"),
                            (bool(self.nonfinite), f"{self.nonfinite} in q, k and v"),
                            (self.traced, "traced"), (bool(self.cotangent), f"dout {self.cotangent}"),
                            (bool(self.framework), f"framework {self.framework}")):  # fmt: skip
            if flag:
                parts.append(token)
        if self.modified:
            parts.append("modifiers " + " ".join(t for f, t in self._modifier_tokens() if f))
            if self.entry != "attention":
                parts.append(f"entry {self.entry} {self.seqlens_q or ''} {self.seqlens_k or ''}"
                             + (f" block size {self.paged}" if self.paged else ""))  # fmt: skip
        return ", ".join(parts)

    @property
    def modified(self) -> bool:
        """True when the case uses SPEC §9-§11 (it then runs through :mod:`modifier_runner`)."""
        return bool(
            self.bias or self.softcap is not None or self.sinks or self.alibi or self.q_lengths is not None
            or self.k_lengths is not None or self.q_offset or self.k_offset or self.entry != "attention"
            or self.mask_shape == "padding" or self.mask_shape.startswith("block")
        )  # fmt: skip

    @property
    def ndim(self) -> int:
        return len(self.seq_q)

    @property
    def nq(self) -> int:
        return math.prod(self.seq_q)

    @property
    def nk(self) -> int:
        return math.prod(self.seq_k)

    @property
    def mask(self):
        """What to pass as ``mask=`` for rule cases (explicit masks are built from the data)."""
        return None if isinstance(self.rule, Full) else self.rule

    def rule_has_empty_rows(self) -> bool:
        if self.modified:
            from attnhub_conformance.oracle import case_has_empty_rows

            return case_has_empty_rows(self)
        if isinstance(self.rule, str):
            return self.mask_empty_rows
        keep = dense_rule_mask(self.rule, self.seq_q, self.seq_k, self.sync)
        return bool((~keep.any(axis=1)).any())

    @cached_property
    def features(self) -> tuple[str, ...]:
        f = [f"{self.ndim}-d"]
        r = self.rule
        if r == "bool":
            f.append("explicit bool mask")
        elif r == "additive":
            f.append("explicit additive mask")
        elif isinstance(r, Full):
            f.append("rule full")
        elif isinstance(r, Causal):
            f.append("rule causal")
        elif isinstance(r, Local):
            f.append("rule local causal" if r.causal else "rule local")
            if r.log2_stride:
                f.append("rule local strided")
        if not isinstance(r, str):
            f.append(f"sync {self.sync}")
        if self.seq_q != self.seq_k:
            f.append("Lq != Lk")
        if 1 in self.seq_q or 1 in self.seq_k:
            f.append("L = 1")
        if self.batch > 1 and self.heads_q > 1:
            f.append("batch/heads > 1")
        if self.heads_q != self.heads_kv:
            f.append("GQA/MQA")
        if self.dim_v < self.dim_qk:
            f.append("Dv < Dqk")
        elif self.dim_v > self.dim_qk:
            f.append("Dv > Dqk")
        if max(self.dim_qk, self.dim_v) >= 128:
            f.append("head dim >= 128")
        if self.scale is not None:
            f.append("custom scale")
        if self.lse:
            f.append("lse")
        if self.grad:
            f.append("backward")
        if self.repeat:
            f.append("deterministic")
        f.append(f"layout {self.layout}")
        if self.large_logits:
            f.append("large logits")
        if self.peaked:
            f.append("peaked rows")
        if self.rule_has_empty_rows():
            f.append("fully masked rows")
        if self.noncontig:
            f.append("non-contiguous")
        if self.nonfinite:
            f.append("NaN/Inf propagate")
        if self.traced:
            f.append("traced")
        if self.cotangent == "ones" and self.grad:
            f.append("grad of sum")
        f += self._modifier_features()
        if self.random_index is not None:
            f.append("randomised")
        f.append("inputs unchanged")
        if self.framework:
            f.append(f"framework {self.framework}")
        return tuple(f)

    def _modifier_features(self) -> list[str]:
        f = []
        if self.bias:
            f.append("bias")
            if self.bias != "full":
                f.append("bias broadcast")
            if self.bias_dtype:
                f.append("bias float32")
            if self.bias_neginf:
                f.append("bias -inf")
            if self.bias_grad and self.grad:
                f.append("dbias")
        if self.mask_shape == "padding":
            f.append("bool mask padding")
        elif self.mask_shape.startswith("block"):
            f.append("bool mask block-sparse")
        if self.softcap is not None:
            f.append("softcap")
        if self.sinks:
            f.append("sinks")
            if self.grad:
                f.append("dsinks")
        if self.alibi:
            f.append("alibi")
            if self.alibi == "bh":
                f.append("alibi per batch")
        if self.q_lengths is not None and self.entry == "attention":
            f.append("q_lengths")
        if self.k_lengths is not None:
            f.append("k_lengths")
        if self.padding_side == "left":
            f.append("padding left")
        if 0 in (*(self.q_lengths or ()), *(self.k_lengths or ()), *self.seqlens_q, *self.seqlens_k):
            f.append("zero lengths")
        if self.entry == "varlen":
            f.append("varlen")
        elif self.entry == "kvcache":
            f.append("kvcache paged" if self.paged else "kvcache contiguous")
        if self.q_offset or self.k_offset:
            f.append("offsets")
        used = [bool(self.bias), self.softcap is not None, self.sinks, bool(self.alibi),
                self.entry == "attention" and (self.q_lengths is not None or self.k_lengths is not None),
                bool(self.q_offset or self.k_offset), self.entry != "attention",
                isinstance(self.rule, str)]  # fmt: skip
        if sum(used) >= 2:
            f.append("modifiers combined")
        return f


def rule_token(rule: Full | Causal | Local | str) -> str:
    if isinstance(rule, str):
        return f"{rule}mask"
    if isinstance(rule, Full):
        return "full"
    if isinstance(rule, Causal):
        return "causal"
    w = rule.window if isinstance(rule.window, int) else "x".join(map(str, rule.window))
    return f"local{w}" + (f"s{rule.log2_stride}" if rule.log2_stride else "") + ("c" if rule.causal else "")
