"""Conformance cases: one frozen :class:`Case` per attention call, the fixed grids and their features.

A case says everything needed to build the call (shapes, dtype, rule, sync, layout, mask, scale,
lse, gradients, repeat) but not the data: the data is drawn from the run's seed and the case id, so
``attnhub certify NAME --case ID --seed N`` rebuilds exactly the same inputs.
"""

from __future__ import annotations

import dataclasses

from attnhub.rules import Causal, Full, Local
from attnhub_conformance.case import (  # noqa: F401  (re-exported: the grids' callers import them here)
    BIAS_SHAPES,
    CHECK_FEATURES,
    DTYPES,
    FEATURE_ROWS,
    HEAD_DIM_CLASSES,
    LAYOUTS,
    SHORT,
    SYNCS,
    Case,
    rule_token,
)
from attnhub_conformance.modifier_cases import (
    full_grid_part,
    quick_grid_part,
    secondary_cases,
    traced_modifier_cases,
)


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
        c += traced_cases(m) + traced_modifier_cases(m)
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
        c += traced_cases(main, full=True) + traced_modifier_cases(main, full=True)
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

    c += full_grid_part(dtypes, main)
    return _dedupe(c)
