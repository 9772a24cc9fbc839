"""Conformance cases: one frozen :class:`Case` per attention call, the fixed grids and their features.

A case says everything needed to build the call (shapes, dtype, rule, sync, layout, mask, scale,
lse, gradients, repeat) but not the data: the data is drawn from the run's seed and the case id, so
``attnhub certify NAME --case ID --seed N`` rebuilds exactly the same inputs.
"""

from __future__ import annotations

import dataclasses
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
            self.bias or self.softcap is not None or self.sinks or self.q_lengths is not None
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
        used = [bool(self.bias), self.softcap is not None, self.sinks,
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


def _main_dtype(dtypes: tuple[str, ...]) -> str:
    return "float32" if "float32" in dtypes else (dtypes[0] if dtypes else "float32")


def _dedupe(cases: list[Case]) -> list[Case]:
    seen: dict[str, Case] = {}
    for c in cases:
        seen.setdefault(c.id, c)
    return list(seen.values())


def big_logit_cases(dtype: str) -> list[Case]:
    """Large logits (q x 8, SPEC §6) at every head-dim class: precision bugs of one tile path (e.g.
    a half-precision accumulator) show only where logits are large *and* that path runs."""
    return [
        Case(dtype, (33,), (33,), Causal(), large_logits=True, lse=True),  # head dim 32
        Case(dtype, (17,), (29,), Full(), heads_q=4, heads_kv=2, dim_qk=64, dim_v=64, large_logits=True,
             lse=True),
        Case(dtype, (21,), (21,), Causal(), sync="none_end", batch=1, dim_qk=128, dim_v=128, large_logits=True),
        Case(dtype, (13,), (19,), Full(), batch=1, heads_q=1, heads_kv=1, dim_qk=256, dim_v=256,
             large_logits=True, lse=True),
    ]  # fmt: skip


def layout_cases(dtype: str, grad: bool) -> list[Case]:
    """Layouts where every wrong transposition still has valid shapes: the sequence length equals
    the head count (``bshd`` read as ``bhsd``) or the head dim (``bhds`` read as ``bhsd``), so a
    backend permuting the wrong axes computes on scrambled data instead of failing on a shape."""
    return [
        Case(dtype, (4,), (4,), Full(), heads_q=4, heads_kv=4, dim_qk=16, dim_v=16, layout="bshd", lse=True),
        Case(dtype, (4,), (2,), Causal(), sync="none_end", heads_q=4, heads_kv=2, dim_qk=16, dim_v=16,
             layout="bshd", grad=grad),
        Case(dtype, (16,), (16,), Causal(), batch=1, heads_q=16, heads_kv=16, dim_qk=16, dim_v=16,
             layout="bhds", lse=True),
    ]  # fmt: skip


def nonfinite_cases(dtype: str, full: bool = False) -> list[Case]:
    """SPEC §4: a NaN (one case) and a +Inf (another) in q, k and v, each in its own batch entry.

    Causal with sync none_end and Lq > Lk leaves fully masked rows (they stay exactly 0) and rows
    that attend some keys but not the poisoned one (they stay finite); GQA checks that only the
    query heads reading the poisoned kv head are hit. Full mode adds other rules, 2-d, layouts and
    explicit masks."""
    base = dict(batch=3, heads_q=4, heads_kv=2, dim_qk=16, dim_v=16)
    shapes = [dict(seq_q=(13,), seq_k=(9,), rule=Causal(), sync="none_end", lse=True)]
    if full:
        shapes += [
            # what vendor kernels take (SDPA's is_causal, no lse), so that they are checked too
            dict(seq_q=(24,), seq_k=(24,), rule=Causal()),
            dict(seq_q=(21,), seq_k=(21,), rule=Full(), lse=True),
            dict(seq_q=(37,), seq_k=(37,), rule=Local(4), layout="bshd"),
            dict(seq_q=(6, 7), seq_k=(6, 7), rule=Local(2, 1, causal=True), lse=True),
            dict(seq_q=(21,), seq_k=(21,), rule="bool", mask_empty_rows=True, lse=True),
            dict(seq_q=(19,), seq_k=(45,), rule=Causal(), sync="scale_end", layout="bhds", heads_kv=1),
        ]
    return [Case(dtype, **{**base, **f}, nonfinite=kind) for f in shapes for kind in ("nan", "inf")]


def traced_cases(dtype: str, full: bool = False) -> list[Case]:
    """Forward and gradients under the framework's tracer, with the gradient of ``out.sum()`` (a
    constant ones cotangent) and a random one, at lengths no tile size divides (48, 80, 100) and
    B·Hq >= 8 (a jitted gradient of one such shape once gave dq ~1e27 while eager was right)."""
    c = [
        Case(dtype, (48,), (48,), Causal(), batch=1, heads_q=8, heads_kv=8, dim_qk=16, dim_v=16, grad=True,
             traced=True, cotangent="ones"),
        Case(dtype, (80,), (80,), Causal(), heads_q=4, heads_kv=2, grad=True, lse=True, traced=True),
    ]  # fmt: skip
    if full:
        for length in (48, 80, 100):
            for rule in (Full(), Causal(), Local(8, causal=True)):
                for cot in ("ones", ""):
                    c.append(Case(dtype, (length,), (length,), rule, batch=2, heads_q=4, heads_kv=2,
                                  dim_qk=16, dim_v=16, grad=True, traced=True, cotangent=cot))  # fmt: skip
        c.append(Case(dtype, (100,), (48,), Causal(), sync="none_end", heads_q=4, heads_kv=1, grad=True,
                      traced=True, cotangent="ones"))  # fmt: skip
    return c


def grad_of_sum_cases(dtype: str) -> list[Case]:
    """The gradient of ``out.sum()`` eagerly (a constant ones cotangent), at a length no tile divides."""
    return [
        Case(dtype, (48,), (48,), Causal(), batch=1, heads_q=8, heads_kv=8, dim_qk=16, dim_v=16, grad=True,
             cotangent="ones"),
    ]  # fmt: skip


def quick_grid(dtypes: tuple[str, ...], framework: str) -> list[Case]:
    """A small representative grid: every feature row once or twice, small shapes (``--quick``)."""
    main = _main_dtype(dtypes)
    strided = framework in ("numpy", "torch")
    c: list[Case] = []
    add = c.append
    m = main
    add(Case(m, (37,), (37,), Full(), heads_q=4, heads_kv=2, lse=True))
    add(Case(m, (37,), (37,), Causal(), lse=True))
    for sync in SYNCS:
        add(Case(m, (19,), (45,), Causal(), sync=sync, lse=sync in ("scale_end", "none_end")))
    add(Case(m, (45,), (19,), Causal(), sync="none_end", lse=True))  # leaves fully masked rows
    add(Case(m, (45,), (19,), Causal(), sync="scale_end"))
    add(Case(m, (1,), (23,), Causal(), sync="none_end", heads_q=3, heads_kv=1))
    add(Case(m, (37,), (37,), Local(4), lse=True))
    add(Case(m, (37,), (29,), Local(2, 1), sync="scale_front"))
    add(Case(m, (6, 7), (6, 7), Local(2, 2, causal=True), lse=True))
    add(Case(m, (4, 6), (8, 12), Causal(), sync="scale_end", lse=True))
    add(Case(m, (8, 12), (4, 6), Local((2, 3)), sync="scale_front"))
    # layouts: the first sequence dimension equals the head count (see layout_cases)
    add(Case(m, (4, 5), (4, 5), Full(), layout="bshd", heads_q=4, heads_kv=1))
    add(Case(m, (29,), (29,), Causal(), layout="bhds", lse=True))
    add(Case(m, (4, 5), (4, 5), Causal(), layout="bhds", sync="none_end", heads_q=4, heads_kv=4))
    c += layout_cases(m, grad=True)
    add(Case(m, (21,), (21,), "bool", mask_shape="bcast", mask_empty_rows=True, lse=True))
    add(Case(m, (13,), (27,), "additive", mask_shape="full", lse=True))
    c += big_logit_cases(m)
    add(Case(m, (25,), (17,), Full(), heads_q=4, heads_kv=1, dim_qk=64, dim_v=16))
    add(Case(m, (17,), (25,), Causal(), heads_q=4, heads_kv=2, dim_qk=16, dim_v=64, lse=True))
    add(Case(m, (17,), (17,), Full(), batch=1, heads_q=1, heads_kv=1, dim_qk=128, dim_v=128))
    add(Case(m, (23,), (23,), Causal(), scale=0.3, lse=True))
    # scale 0 is a valid scale (uniform weights), not "the default": cuDNN's graph gave NaN for it
    add(Case(m, (23,), (29,), Causal(), sync="none_end", scale=0.0, lse=True))
    if strided:
        add(Case(m, (23,), (23,), Causal(), noncontig="transposed"))
        add(Case(m, (19,), (31,), Full(), noncontig="sliced", heads_q=4, heads_kv=2))
    # gradients
    add(Case(m, (23,), (31,), Full(), heads_q=4, heads_kv=2, grad=True))
    add(Case(m, (31,), (17,), Causal(), sync="none_end", grad=True, dim_qk=32, dim_v=16))
    add(Case(m, (19,), (23,), Full(), grad=True, dim_qk=16, dim_v=40))
    add(Case(m, (2, 6), (2, 6), Local(2, 1, causal=True), grad=True, layout="bshd"))
    add(Case(m, (19,), (19,), "additive", mask_empty_rows=True, grad=True))
    add(Case(m, (21,), (21,), Causal(), grad=True, large_logits=True, scale=0.5))
    c += grad_of_sum_cases(m)
    if framework != "numpy":  # NumPy has no tracer
        c += traced_cases(m)
    for dt in dtypes:  # SPEC §4 in every declared dtype
        c += nonfinite_cases(dt)
    # determinism
    add(Case(m, (27,), (27,), Causal(), heads_q=4, heads_kv=2, grad=True, lse=True, repeat=True))
    for dt in DTYPES:
        if dt == main:
            continue
        if dt not in dtypes:  # the backend should decline these: one case shows it in the matrix
            add(Case(dt, (19,), (45,), Causal(), sync="scale_end", lse=True))
            continue
        add(Case(dt, (19,), (45,), Causal(), sync="scale_end", lse=True))
        add(Case(dt, (6, 7), (6, 7), Local(2, 1, causal=True), heads_q=4, heads_kv=2))
        add(Case(dt, (45,), (19,), Causal(), sync="none_end", grad=True, large_logits=True))
        c += big_logit_cases(dt)[1:]  # head dim 32 is the gradient case above
        add(Case(dt, (4,), (4,), Full(), heads_q=4, heads_kv=4, dim_qk=16, dim_v=16, layout="bshd", lse=True))
        if dt in ("float16", "bfloat16"):
            add(Case(dt, (9,), (44,), Full(), grad=True, dim_qk=16, dim_v=16, peaked=True))
    from attnhub_conformance.modifier_cases import quick_grid_part

    c += quick_grid_part(dtypes, main)
    return _dedupe(c)


def secondary_grid(dtypes: tuple[str, ...], framework: str) -> list[Case]:
    """The quick cases run again with the inputs of another declared framework (``framework`` set):
    conversions, layouts, masks and that framework's autodiff, in every declared dtype."""
    main = _main_dtype(dtypes)
    c = [
        Case(main, (37,), (37,), Full(), heads_q=4, heads_kv=2, lse=True),
        Case(main, (19,), (45,), Causal(), sync="none_end", lse=True),
        Case(main, (6, 7), (6, 7), Local(2, 2, causal=True), lse=True),
        Case(main, (21,), (21,), "bool", mask_shape="bcast", mask_empty_rows=True, lse=True),
        Case(main, (17,), (25,), Causal(), heads_q=4, heads_kv=2, dim_qk=16, dim_v=64, lse=True),
        Case(main, (23,), (31,), Full(), heads_q=4, heads_kv=2, grad=True),
        Case(main, (19,), (19,), "additive", mask_empty_rows=True, grad=True),
        *layout_cases(main, grad=True),
        *nonfinite_cases(main)[:1],
        *traced_cases(main)[:1],
    ]
    if framework in ("numpy", "torch"):
        c.append(Case(main, (19,), (31,), Full(), noncontig="sliced", heads_q=4, heads_kv=2, grad=True))
    for dt in dtypes:
        if dt != main:
            c.append(Case(dt, (45,), (19,), Causal(), sync="none_end", grad=True, large_logits=True))
    from attnhub_conformance.modifier_cases import secondary_cases

    c += secondary_cases(main)
    return _dedupe([dataclasses.replace(x, framework=framework) for x in c])


def full_grid(dtypes: tuple[str, ...], framework: str) -> list[Case]:
    """Every rule x every sync mode on many shapes, plus layouts, masks, head dims, grads, dtypes."""
    main = _main_dtype(dtypes)
    strided = framework in ("numpy", "torch")
    shapes1 = [((1,), (1,)), ((1,), (23,)), ((23,), (1,)), ((37,), (37,)), ((19,), (45,)),
               ((45,), (19,)), ((64,), (64,)), ((100,), (33,))]  # fmt: skip
    shapes2 = [((5, 7), (5, 7)), ((4, 6), (8, 12)), ((8, 12), (4, 6)), ((3, 5), (6, 4)), ((1, 1), (4, 4))]
    rules1 = [Full(), Causal(), Local(1), Local(3), Local(64), Local(2, 1), Local(2, 2), Local(1, 3),
              Local(3, causal=True), Local(2, 1, causal=True)]  # fmt: skip
    rules2 = [*rules1[:-2], Local((1, 3)), Local(2, 1, causal=True), Local((3, 2), causal=True)]
    heads = [(2, 2, 2), (1, 4, 2), (2, 3, 1), (1, 1, 1)]
    dims = [(32, 32), (16, 16), (64, 16), (24, 40)]
    c: list[Case] = []
    n = 0
    for shapes, rules in ((shapes1, rules1), (shapes2, rules2)):
        for sq, sk in shapes:
            for rule in rules:
                for sync in SYNCS:
                    b, hq, hkv = heads[n % len(heads)]
                    dq, dv = dims[(n // 4) % len(dims)]
                    c.append(Case(main, sq, sk, rule, sync, b, hq, hkv, dq, dv, lse=n % 2 == 0))
                    n += 1
    # gradients: every rule x sync on a few shapes
    for sq, sk in (((19,), (45,)), ((45,), (19,)), ((37,), (37,)), ((4, 6), (8, 12)), ((5, 7), (5, 7))):
        for rule in rules1 if len(sq) == 1 else rules2:
            for sync in SYNCS:
                b, hq, hkv = heads[n % len(heads)]
                dq, dv = dims[(n // 4) % len(dims)]
                c.append(Case(main, sq, sk, rule, sync, b, hq, hkv, dq, dv, grad=True))
                n += 1
    # layouts x non-contiguous x grad
    for layout in LAYOUTS:
        for sq, sk in (((23,), (31,)), ((4, 6), (4, 6))):
            for grad in (False, True):
                kinds = ("", "transposed", "sliced") if strided else ("",)
                for nc in kinds:
                    c.append(Case(main, sq, sk, Causal(), heads_q=4, heads_kv=2, layout=layout,
                                  grad=grad, noncontig=nc, lse=not grad))  # fmt: skip
    c += layout_cases(main, grad=True)
    if strided:
        c.append(Case(main, (4,), (4,), Causal(), heads_q=4, heads_kv=4, layout="bshd", noncontig="transposed",
                      grad=True))  # fmt: skip
    # head dims
    for dq, dv in ((16, 16), (32, 32), (64, 64), (128, 128), (256, 256), (256, 64), (64, 256), (8, 8)):
        for grad in (False, True):
            c.append(Case(main, (33,), (33,), Causal(), batch=1, heads_q=2, heads_kv=1, dim_qk=dq,
                          dim_v=dv, grad=grad))  # fmt: skip
    # explicit masks
    for kind in ("bool", "additive"):
        for shape in ("bcast", "full"):
            for empty in (False, True):
                for sq, sk in (((21,), (21,)), ((3, 5), (4, 4))):
                    for grad in (False, True):
                        c.append(Case(main, sq, sk, kind, heads_q=4, heads_kv=2, mask_shape=shape,
                                      mask_empty_rows=empty, grad=grad, lse=not grad))  # fmt: skip
    # large logits, custom scales, determinism
    for rule in (Full(), Causal(), Local(3)):
        for grad in (False, True):
            c.append(Case(main, (41,), (41,), rule, large_logits=True, grad=grad, lse=True))
    c += big_logit_cases(main)
    for dq, dv in ((64, 64), (128, 128), (64, 128)):
        c.append(
            Case(main, (29,), (23,), Causal(), batch=1, dim_qk=dq, dim_v=dv, large_logits=True, grad=True)
        )
    for scale in (0.3, 2.0, -1.0, 0.0):
        for grad in (False, True):
            c.append(Case(main, (23,), (29,), Causal(), sync="none_end", scale=scale, grad=grad, lse=True))
    for rule in (Full(), Causal(), Local(2, 1)):
        c.append(Case(main, (37,), (29,), rule, heads_q=4, heads_kv=2, grad=True, lse=True, repeat=True))
    c += grad_of_sum_cases(main)
    if framework != "numpy":  # NumPy has no tracer
        c += traced_cases(main, full=True)
    # the other dtypes: a reduced product (declined cases are cheap)
    for dt in DTYPES:
        if dt == main:
            continue
        for sq, sk in (((19,), (45,)), ((45,), (19,)), ((4, 6), (8, 12))):
            for rule in (Full(), Causal(), Local(3), Local(2, 1, causal=True)):
                for sync in SYNCS:
                    c.append(Case(dt, sq, sk, rule, sync, heads_q=4, heads_kv=2, lse=sync == "none_end"))
        for sq, sk in (((31,), (17,)), ((5, 6), (5, 6))):
            for rule in (Full(), Causal(), Local(2, causal=True)):
                c.append(Case(dt, sq, sk, rule, "none_end", grad=True, heads_q=2, heads_kv=1))
        for layout in LAYOUTS:
            c.append(Case(dt, (23,), (23,), Causal(), layout=layout, lse=True))
        c.append(Case(dt, (33,), (33,), Causal(), large_logits=True, lse=True, grad=True))
        c += big_logit_cases(dt)
        c += layout_cases(dt, grad=True)
        if dt in ("float16", "bfloat16"):
            c.append(Case(dt, (9,), (44,), Full(), grad=True, dim_qk=16, dim_v=16, peaked=True))
            c.append(Case(dt, (44,), (44,), Causal(), grad=True, heads_q=4, heads_kv=2, dim_qk=16, dim_v=32,
                          peaked=True))  # fmt: skip
        c.append(Case(dt, (21,), (21,), "bool", mask_empty_rows=True, lse=True))
        c.append(Case(dt, (21,), (21,), "additive", mask_empty_rows=True, grad=True))
        c.append(Case(dt, (33,), (33,), Causal(), dim_qk=128, dim_v=128, batch=1))
        c.append(Case(dt, (23,), (29,), Causal(), "none_end", scale=0.3, dim_qk=64, dim_v=16, grad=True))
        if strided:
            c.append(Case(dt, (23,), (31,), Full(), heads_q=4, heads_kv=2, noncontig="sliced", grad=True))
        if dt in dtypes:
            c.append(Case(dt, (27,), (27,), Causal(), grad=True, lse=True, repeat=True))
            if framework != "numpy":
                c += traced_cases(dt)[:1]
    for dt in dtypes:  # SPEC §4 in every declared dtype
        c += nonfinite_cases(dt, full=True)
    from attnhub_conformance.modifier_cases import full_grid_part

    c += full_grid_part(dtypes, main)
    return _dedupe(c)
