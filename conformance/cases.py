"""Conformance cases: one frozen :class:`Case` per attention call, the fixed grids and their features.

A case says everything needed to build the call (shapes, dtype, rule, sync, layout, mask, scale,
lse, gradients, repeat) but not the data: the data is drawn from the run's seed and the case id, so
``attnhub certify NAME --case ID --seed N`` rebuilds exactly the same inputs.
"""

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
    "Dqk != Dv",
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
    "randomised",
)

#: Features that belong to one check only: a failure elsewhere in a case does not mark them.
CHECK_FEATURES = {"lse": "lse", "backward": "backward", "deterministic": "deterministic"}


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
    mask_shape: str = "full"
    mask_empty_rows: bool = False
    #: Set for hypothesis-drawn cases: their id is ``random-<n>``.
    random_index: int | None = None

    @cached_property
    def id(self) -> str:
        if self.random_index is not None:
            return f"random-{self.random_index}"
        dims = lambda s: "x".join(map(str, s))  # noqa: E731
        parts = [SHORT[self.dtype], f"{len(self.seq_q)}d", f"q{dims(self.seq_q)}", f"k{dims(self.seq_k)}"]
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
        ):
            if flag:
                parts.append(token)
        return "-".join(parts)

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
        if self.dim_qk != self.dim_v:
            f.append("Dqk != Dv")
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
        if self.random_index is not None:
            f.append("randomised")
        return tuple(f)


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
    add(Case(m, (5, 5), (5, 5), Full(), layout="bshd", heads_q=4, heads_kv=1))
    add(Case(m, (29,), (29,), Causal(), layout="bhds", lse=True))
    add(Case(m, (4, 5), (4, 5), Causal(), layout="bhds", sync="none_end"))
    add(Case(m, (21,), (21,), "bool", mask_shape="bcast", mask_empty_rows=True, lse=True))
    add(Case(m, (13,), (27,), "additive", mask_shape="full", lse=True))
    add(Case(m, (33,), (33,), Causal(), large_logits=True, lse=True))
    add(Case(m, (25,), (17,), Full(), heads_q=4, heads_kv=1, dim_qk=64, dim_v=16))
    add(Case(m, (17,), (17,), Full(), batch=1, heads_q=1, heads_kv=1, dim_qk=128, dim_v=128))
    add(Case(m, (23,), (23,), Causal(), scale=0.3, lse=True))
    if strided:
        add(Case(m, (23,), (23,), Causal(), noncontig="transposed"))
        add(Case(m, (19,), (31,), Full(), noncontig="sliced", heads_q=4, heads_kv=2))
    # gradients
    add(Case(m, (23,), (31,), Full(), heads_q=4, heads_kv=2, grad=True))
    add(Case(m, (31,), (17,), Causal(), sync="none_end", grad=True, dim_qk=32, dim_v=16))
    add(Case(m, (5, 6), (5, 6), Local(2, 1, causal=True), grad=True, layout="bshd"))
    add(Case(m, (19,), (19,), "additive", mask_empty_rows=True, grad=True))
    add(Case(m, (21,), (21,), Causal(), grad=True, large_logits=True, scale=0.5))
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
        if dt in ("float16", "bfloat16"):
            add(Case(dt, (9,), (44,), Full(), grad=True, dim_qk=16, dim_v=16, peaked=True))
    return _dedupe(c)


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
    for scale in (0.3, 2.0, -1.0):
        for grad in (False, True):
            c.append(Case(main, (23,), (29,), Causal(), sync="none_end", scale=scale, grad=grad, lse=True))
    for rule in (Full(), Causal(), Local(2, 1)):
        c.append(Case(main, (37,), (29,), rule, heads_q=4, heads_kv=2, grad=True, lse=True, repeat=True))
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
    return _dedupe(c)
