"""The grid's SPEC §9-§11 cases: bias, bool masks, softcap, sinks, lengths, varlen, kvcache, offsets.

Chosen from what their bugs look like: a bias read with the wrong broadcast strides (shapes
(1, Hq, Nq, Nk), (B, 1, 1, Nk), (B, Hq, Nq, Nk), Lq != Lk), -inf entries (rows a bias empties),
dbias not summed over broadcast dimensions, softcap applied after the bias or without its
tanh' in the backward (large logits saturate it), a sink dropped from lse or from fully masked
rows, lengths whose sync alignment uses the padded length (none_end, left padding, lengths 0 and
full), a packed sequence crossing into its neighbour (an empty one between), a paged cache read
in logical instead of table order (a shuffled table, blocks no entry names hold NaN), and
offsets applied to one side only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from attnhub.rules import Causal, Full, Local
from attnhub_conformance.case import BIAS_SHAPES, DTYPES, SYNCS, Case

RULES = (Full(), Causal(), Local(3), Local(2, 1, causal=True))

#: SPEC §11: positions stay in [-LIMIT, LIMIT) (q_offset >= -LIMIT, q_offset + Lq <= LIMIT; same for k).
LIMIT = 2**30


@dataclass(frozen=True)
class RaggedCase(Case):
    """A §10-§11 case with the checks issue 36 added (its flags off: the same id as a plain Case)."""

    #: NaN stored where SPEC §10 says nothing is read: padded query rows (out must be 0 there),
    #: padded keys and values, cache rows past k_lengths (unused blocks hold NaN always).
    nan_padding: bool = False
    #: The call must raise SpecError naming this argument (offsets one past SPEC §11's range).
    expect_spec_error: str = ""

    def _modifier_tokens(self) -> list[tuple[bool, str]]:
        return [*super()._modifier_tokens(), (self.nan_padding, "nanpad"),
                (bool(self.expect_spec_error), f"specerror-{self.expect_spec_error}")]  # fmt: skip

    def _modifier_features(self) -> list[str]:
        return [*super()._modifier_features(), *(["NaN in padding"] if self.nan_padding else [])]

    @property
    def modified(self) -> bool:
        return Case.modified.fget(self) or self.nan_padding or bool(self.expect_spec_error)  # type: ignore[attr-defined]

    @cached_property
    def features(self) -> tuple[str, ...]:
        """A case that must raise SpecError certifies the rejection, not what the call would have
        computed: its one row is "bad input rejected" (its inputs are not checked afterwards). It
        showed ALiBi as passed for backends that compute no ALiBi: the core rejects ALiBi with 2-d
        sequences before any backend is asked."""
        if self.expect_spec_error:
            return ("bad input rejected",)
        return Case.features.func(self)  # type: ignore[attr-defined]


def _other(main: str) -> str:
    """A bias dtype unlike the inputs' (float32), or "" when the inputs are float32."""
    return "" if main == "float32" else "float32"


def quick_cases(main: str) -> list[Case]:
    """Tiny cases, every §9-§11 row once (--quick runs them on the Triton interpreter too)."""
    m, t = main, dict(dim_qk=16, dim_v=16)
    return [
        Case(m, (9,), (13,), Causal(), "scale_end", bias="1hqk", bias_dtype="float32" if m != "float32" else "",
             grad=True, bias_grad=True, **t),
        Case(m, (11,), (11,), "bool", mask_shape="padding", bias="b11k", bias_neginf=True, lse=True, **t),
        Case(m, (10,), (14,), Local(3), "none_end", heads_q=4, heads_kv=2, bias="full", softcap=30.0, sinks=True,
             grad=True, bias_grad=True, lse=True, **t),
        Case(m, (48,), (48,), "bool", mask_shape="block16", batch=1, softcap=5.0, large_logits=True, grad=True,
             **t),
        Case(m, (13,), (7,), Causal(), "none_end", sinks=True, grad=True, lse=True, **t),
        Case(m, (9,), (13,), Causal(), "none_end", q_lengths=(7, 0), k_lengths=(13, 4), grad=True, lse=True,
             **t),
        Case(m, (9,), (12,), Local(2), "scale_front", q_lengths=(3, 9), k_lengths=(0, 11), padding_side="left",
             bias="b11k", lse=True, **t),
        varlen(m, Causal(), "none_front", (3, 0, 5, 2), (4, 2, 6, 0), grad=True, lse=True, **t),
        kvcache(m, Causal(), 3, 16, (7, 16), lse=True, **t),
        kvcache(m, Causal(), 2, 48, (20, 33), paged=16, heads_q=4, heads_kv=2, lse=True, **t),
        Case(m, (6,), (14,), Local(3, causal=True), q_offset=8, k_offset=2, grad=True, lse=True, **t),
        *gap_cases(m),
        *alibi_quick_cases(m),
    ]  # fmt: skip


def traced_modifier_cases(m: str, full: bool = False) -> list[Case]:
    """§9-§11 arguments through the framework's tracer (jax.jit, tf.function, torch.compile), every
    array traced: a bias with its gradient, softcap and sinks; lengths on the left; packed
    sequences; a paged cache (a jitted decode step); full mode adds a contiguous cache and offsets
    with sinks (in the grids of frameworks with a tracer)."""
    t = dict(dim_qk=16, dim_v=16, traced=True)
    c = [
        Case(m, (40,), (40,), Causal(), "none_end", heads_q=4, heads_kv=2, bias="1hqk", bias_grad=True,
             softcap=30.0, sinks=True, cotangent="ones", grad=True, **t),
        Case(m, (33,), (33,), Causal(), "none_end", q_lengths=(29, 5), k_lengths=(33, 9), padding_side="left",
             grad=True, **t),
        varlen(m, Causal(), "none_front", (13, 0, 21), (13, 4, 21), grad=True, **t),
        kvcache(m, Causal(), 3, 48, (20, 33), paged=16, heads_q=4, heads_kv=2, lse=True, **t),
    ]  # fmt: skip
    if full:
        c += [
            kvcache(m, Causal(), 2, 40, (7, 40), lse=True, **t),
            Case(m, (9,), (14,), Causal(), q_offset=8, k_offset=2, sinks=True, grad=True, **t),
        ]
    return c


def alibi_quick_cases(m: str) -> list[Case]:
    """ALiBi (SPEC §9, ``alibi_slopes``): positions of each sync mode (flash-attn's causal is
    none_end), per-head and per-batch slopes, with a bias and softcap, lengths on the left, packed
    sequences, a paged cache, offsets, and a 2-d request (a SpecError)."""
    t = dict(dim_qk=16, dim_v=16)
    return [
        Case(m, (9,), (13,), Causal(), "none_end", alibi="h", grad=True, lse=True, heads_q=4, heads_kv=2, **t),
        Case(m, (13,), (9,), Full(), "none_front", alibi="bh", bias="1hqk", softcap=30.0, grad=True,
             bias_grad=True, lse=True, **t),
        Case(m, (9,), (12,), Local(3), "scale_end", alibi="h", large_logits=True, grad=True, lse=True, **t),
        Case(m, (9,), (13,), Causal(), "none_end", q_lengths=(7, 0), k_lengths=(13, 4), padding_side="left",
             alibi="bh", grad=True, lse=True, **t),
        varlen(m, Causal(), "none_front", (3, 0, 5, 2), (4, 2, 6, 0), alibi="h", grad=True, lse=True, **t),
        kvcache(m, Causal(), 3, 48, (20, 33), paged=16, alibi="bh", heads_q=4, heads_kv=2, lse=True, **t),
        Case(m, (6,), (14,), Causal(), q_offset=8, k_offset=2, alibi="h", sinks=True, grad=True, lse=True, **t),
        RaggedCase(m, (3, 4), (3, 4), Causal(), alibi="h", expect_spec_error="alibi_slopes", **t),
    ]  # fmt: skip


def alibi_full_cases(m: str) -> list[Case]:
    """ALiBi with every rule and sync mode (both slope shapes), composed with bias, softcap and
    sinks, lengths on both sides, packing, caches, offsets (one pair far apart: float32 kernels
    decline it, SPEC §9) and large logits."""
    c: list[Case] = []
    n = 0
    seqs = (((19,), (45,)), ((45,), (19,)), ((37,), (37,)))
    for rule in RULES:
        for sync in SYNCS:
            for shape in ("h", "bh"):
                sq, sk = seqs[n % 3]
                c.append(Case(m, sq, sk, rule, sync, alibi=shape, grad=n % 2 == 0, lse=n % 2 == 1,
                              large_logits=n % 5 == 0, **_shape(n)))  # fmt: skip
                n += 1
    for combo in ({"bias": "full", "bias_grad": True}, {"softcap": 30.0}, {"sinks": True},
                  {"bias": "b11k", "softcap": 50.0, "sinks": True, "bias_grad": True}):  # fmt: skip
        for rule in (Causal(), Local(2, 1, causal=True)):
            sq, sk = seqs[n % 3]
            c.append(Case(m, sq, sk, rule, SYNCS[n % 4], alibi=("h", "bh")[n % 2], grad=True, lse=True, **combo,
                          **_shape(n)))  # fmt: skip
            n += 1
    lens = (((19, 7), (27, 0)), ((5, 19), (13, 27)), (None, (20, 3)), ((11, 19), None))
    for side in ("right", "left"):
        for sync in SYNCS:
            ql, kl = lens[n % len(lens)]
            c.append(RaggedCase(m, (19,), (27,), (Causal(), Full())[n % 2], sync, q_lengths=ql, k_lengths=kl,
                                padding_side=side, alibi=("h", "bh")[n % 2], grad=n % 2 == 0, lse=True, heads_q=4,
                                heads_kv=2, nan_padding=n % 3 == 0))  # fmt: skip
            n += 1
    for rule in (Causal(), Full(), Local(3)):
        c.append(varlen(m, rule, "none_end", (5, 0, 9, 3), (7, 4, 9, 0), alibi="h", grad=True, lse=True,
                        heads_q=4, heads_kv=2, dim_qk=32, dim_v=16))  # fmt: skip
    for paged, cap, kls in ((0, 40, (1, 40, 17)), (16, 64, (64, 1, 30))):
        for lq in (1, 5):
            c.append(kvcache(m, Causal(), lq, cap, kls, paged=paged, alibi=("h", "bh")[lq % 2], heads_q=4,
                             heads_kv=2, lse=True))  # fmt: skip
    for shape, side, mods in (("bcast", "right", {}), ("full", "left", {"softcap": 30.0, "sinks": True}),
                              ("full", "right", {"bias": "b11k", "bias_grad": True, "bias_neginf": True})):  # fmt: skip
        c.append(RaggedCase(m, (19,), (27,), "bool", mask_shape=shape, mask_empty_rows=side == "left",
                            q_lengths=(19, 7), k_lengths=(0, 27), padding_side=side, grad=True, lse=True, heads_q=4,
                            heads_kv=2, nan_padding=not mods, **mods))  # fmt: skip
    for qo, ko in ((0, 5), (7, 0), (12, 3), (LIMIT - 13, -LIMIT)):
        c.append(Case(m, (13,), (21,), Causal(), q_offset=qo, k_offset=ko, alibi="bh", grad=True, lse=True,
                      **_shape(n)))  # fmt: skip
        n += 1
    return c


def gap_cases(m: str) -> list[Case]:
    """Issue 36's tiny cases: NaN in padding, paged and packed GQA gradients, bitwise repeats,
    offsets at SPEC §11's edges (and one past them), a softcap too large for the inputs' dtype."""
    t = dict(dim_qk=16, dim_v=16)
    g = dict(heads_q=4, heads_kv=2)
    return [
        RaggedCase(m, (9,), (13,), Causal(), "none_end", q_lengths=(7, 3), k_lengths=(13, 5), grad=True, lse=True,
                   nan_padding=True, **g, **t),
        RaggedCase(m, (9,), (12,), Local(3), "scale_front", q_lengths=(2, 9), k_lengths=(6, 0),
                   padding_side="left", nan_padding=True, **t),
        kvcache(m, Causal(), 3, 48, (20, 33), paged=16, grad=True, nan_padding=True, **g, **t),
        kvcache(m, Local(4, causal=True), 2, 12, (5, 12), nan_padding=True, **g, **t),
        varlen(m, Causal(), "none_end", (3, 0, 5, 2), (4, 2, 6, 0), grad=True, lse=True, **g, **t),
        Case(m, (9,), (13,), Causal(), "none_end", q_lengths=(7, 3), k_lengths=(13, 5), bias="b11k", softcap=30.0,
             sinks=True, grad=True, bias_grad=True, lse=True, repeat=True, **g, **t),
        varlen(m, Causal(), "none_end", (3, 0, 5, 2), (4, 2, 6, 0), grad=True, lse=True, repeat=True, **g, **t),
        kvcache(m, Causal(), 3, 48, (20, 33), paged=16, grad=True, lse=True, repeat=True, **g, **t),
        *offset_edge_cases(m, 6, 9, t),
        # a bool mask array with lengths (issue 39: the GPU kernels run it as an additive bias)
        RaggedCase(m, (9,), (13,), "bool", mask_shape="full", q_lengths=(7, 3), k_lengths=(13, 5),
                   padding_side="left", bias="1hqk", grad=True, bias_grad=True, lse=True, **g, **t),
        # 1e39: beyond float32's max, yet float32 logits can reach it (the core keeps it, SPEC §9)
        Case(m, (9,), (13,), Causal(), "scale_end", softcap=1e39, grad=True, lse=True, **g, **t),
        Case(m, (9,), (13,), Causal(), "scale_end", softcap=1e3, grad=True, lse=True, **g, **t),
    ]  # fmt: skip


def edge_offsets(lq: int, lk: int) -> list[tuple[int, int]]:
    """(q_offset, k_offset) at the edges: queries at the top and keys at the bottom (P − R up to
    2**31 − 1), both at the top (keys 2 behind), both at the bottom (keys 3 ahead), queries near
    the bottom and keys at the top."""
    top_q, top_k, bottom = LIMIT - lq, LIMIT - lk, -LIMIT
    return [(top_q, bottom), (top_q, top_k - 2), (bottom, bottom + 3), (bottom + 4, top_k)]


def offset_edge_cases(m: str, lq: int, lk: int, t: dict) -> list[Case]:
    """Offsets at the edges of [-2**30, 2**30): the largest P − R (2**31 − 1: int32 holds it, one
    more term does not), both sides at the top and at the bottom; one past each edge raises."""
    (top_bottom, top_top, bottom_bottom, bottom_top) = edge_offsets(lq, lk)
    top_q, bottom = top_bottom
    return [
        Case(m, (lq,), (lk,), Causal(), q_offset=top_q, k_offset=bottom, grad=True, lse=True, **t),
        Case(m, (lq,), (lk,), Local(3, causal=True), q_offset=top_q, k_offset=top_top[1], lse=True, **t),
        Case(m, (lq,), (lk,), Local(2, 1), q_offset=bottom, k_offset=bottom_bottom[1], lse=True, **t),
        Case(m, (lq,), (lk,), Causal(), q_offset=bottom_top[0], k_offset=bottom_top[1], lse=True, **t),
        RaggedCase(m, (lq,), (lk,), Causal(), q_offset=top_q + 1, expect_spec_error="q_offset", **t),
        RaggedCase(m, (lq,), (lk,), Causal(), k_offset=bottom - 1, expect_spec_error="k_offset", **t),
    ]  # fmt: skip


def quick_dtype_cases(dt: str) -> list[Case]:
    """Each other declared dtype: a float32 bias with its gradient, softcap and sinks; left padding."""
    t = dict(dim_qk=16, dim_v=16)
    return [
        Case(dt, (9,), (13,), Causal(), "none_end", heads_q=4, heads_kv=2, bias="b11k", bias_dtype=_other(dt),
             softcap=30.0, sinks=True, grad=True, bias_grad=True, lse=True, **t),
        Case(dt, (9,), (13,), Local(3, causal=True), "none_end", q_lengths=(9, 4), k_lengths=(13, 6),
             padding_side="left", grad=True, lse=True, **t),
        Case(dt, (9,), (13,), Causal(), "scale_end", softcap=1e300, lse=True, **t),
        RaggedCase(dt, (9,), (13,), Causal(), "none_end", q_lengths=(7, 3), k_lengths=(13, 5), nan_padding=True,
                   **t),
    ]  # fmt: skip


def secondary_cases(main: str) -> list[Case]:
    """Another framework's autodiff of dbias/dsinks, lengths, varlen; its int arrays for paged caches."""
    q = quick_cases(main)
    return [q[2], q[5], q[7], q[9]]


def varlen(dtype: str, rule, sync: str, lens_q: tuple[int, ...], lens_k: tuple[int, ...], **kw) -> Case:
    """An ``attention_varlen`` case with these packed sequence lengths."""
    return RaggedCase(dtype, (sum(lens_q),), (sum(lens_k),), rule, sync, batch=1, entry="varlen",
                      seqlens_q=lens_q, seqlens_k=lens_k, **kw)  # fmt: skip


def kvcache(
    dtype: str, rule, lq: int, capacity: int, k_lengths: tuple[int, ...], paged: int = 0, **kw
) -> Case:
    """An ``attention_kvcache`` case: Lq new queries against a cache of ``capacity`` rows."""
    return RaggedCase(dtype, (lq,), (capacity,), rule, "none_end", batch=len(k_lengths), entry="kvcache",
                      k_lengths=k_lengths, paged=paged, **kw)  # fmt: skip


HEADS = ((2, 2, 2), (2, 4, 2), (2, 3, 1), (1, 1, 1))
DIMS = ((32, 32), (16, 16), (64, 16), (24, 40))


def _shape(n: int, ht: tuple = HEADS) -> dict:
    b, hq, hkv = ht[n % len(ht)]
    dq, dv = DIMS[(n // 3) % len(DIMS)]
    return dict(batch=b, heads_q=hq, heads_kv=hkv, dim_qk=dq, dim_v=dv)


def full_cases(main: str) -> list[Case]:
    """Every §9-§11 argument with every rule and sync mode, their combinations, and edge values."""
    m = main
    c: list[Case] = []
    n = 0
    seqs = (((19,), (45,)), ((45,), (19,)), ((37,), (37,)))
    # bias: shapes x dtypes x rules x syncs, a differentiated one every other case
    for shape in BIAS_SHAPES:
        for bdt in dict.fromkeys(("", _other(m))):
            for rule in RULES:
                for sync in SYNCS:
                    sq, sk = seqs[n % 3]
                    c.append(Case(m, sq, sk, rule, sync, bias=shape, bias_dtype=bdt, grad=n % 2 == 0,
                                  bias_grad=n % 4 == 0, bias_neginf=n % 5 == 0, lse=n % 2 == 1, **_shape(n)))  # fmt: skip
                    n += 1
    for shape in BIAS_SHAPES:
        c.append(Case(m, (21,), (33,), Causal(), "none_end", bias=shape, bias_neginf=True, grad=True, bias_grad=True,
                      lse=True, heads_q=4, heads_kv=2))  # fmt: skip
        c.append(Case(m, (4, 6), (8, 12), Local((1, 3)), "scale_end", bias=shape, grad=True, bias_grad=True))
        c.append(
            Case(
                m, (29,), (29,), Causal(), bias=shape, large_logits=True, grad=True, bias_grad=True, lse=True
            )
        )
    # bool masks: padding-shaped, block-sparse (64 x 64 tiles), random with modifiers
    for sq, sk in (((21,), (21,)), ((19,), (33,)), ((3, 5), (4, 4))):
        for grad in (False, True):
            c.append(
                Case(m, sq, sk, "bool", mask_shape="padding", grad=grad, lse=not grad, heads_q=4, heads_kv=2)
            )
    c.append(Case(m, (21,), (33,), "bool", mask_shape="padding", bias="full", grad=True, bias_grad=True))
    for sq, sk in (((192,), (192,)), ((128,), (192,)), ((200,), (130,))):
        for grad in (False, True):
            c.append(Case(m, sq, sk, "bool", mask_shape="block64", batch=1, grad=grad, lse=not grad))
    c.append(Case(m, (192,), (192,), "bool", mask_shape="block64", batch=1, bias="b11k", softcap=30.0, sinks=True,
                  grad=True, bias_grad=True))  # fmt: skip
    c.append(
        Case(m, (32,), (48,), "bool", mask_shape="block16", softcap=50.0, grad=True, heads_q=4, heads_kv=1)
    )
    c.append(Case(m, (23,), (23,), "bool", mask_shape="full", mask_empty_rows=True, bias="1hqk", sinks=True,
                  grad=True, bias_grad=True, lse=True))  # fmt: skip
    # softcap: values x rules x syncs (large logits saturate tanh)
    for cap in (5.0, 30.0, 50.0):
        for rule in RULES:
            for sync in SYNCS:
                sq, sk = seqs[n % 3]
                c.append(Case(m, sq, sk, rule, sync, softcap=cap, grad=n % 2 == 0, large_logits=n % 3 == 0,
                              lse=n % 2 == 1, **_shape(n)))  # fmt: skip
                n += 1
    c.append(Case(m, (4, 6), (8, 12), Causal(), "scale_front", softcap=5.0, grad=True))
    # sinks: rules x syncs, with gradients; with softcap and bias (every combination)
    for rule in RULES:
        for sync in SYNCS:
            sq, sk = seqs[n % 3]
            c.append(Case(m, sq, sk, rule, sync, sinks=True, grad=n % 2 == 0, lse=True, **_shape(n)))
            n += 1
    c.append(Case(m, (23,), (23,), Causal(), sinks=True, large_logits=True, grad=True, lse=True))
    for rule in RULES:
        for grad in (False, True):
            for combo in ({"bias": "full", "softcap": 30.0}, {"bias": "b11k", "sinks": True},
                          {"softcap": 5.0, "sinks": True}, {"bias": "1hqk", "softcap": 50.0, "sinks": True}):  # fmt: skip
                sq, sk = seqs[n % 3]
                c.append(Case(m, sq, sk, rule, SYNCS[n % 4], grad=grad, bias_grad=grad and "bias" in combo,
                              lse=not grad, **combo, **_shape(n)))  # fmt: skip
                n += 1
    # lengths: padding side x sync x rule, with §9 modifiers in turn; lengths 0 and full
    lens = (((19, 7), (27, 0)), ((0, 12), (27, 27)), ((5, 19), (13, 27)), (None, (20, 3)), ((11, 19), None),
            ((1, 19), (1, 27)))  # fmt: skip
    mods = ({}, {"bias": "b11k"}, {"softcap": 30.0}, {"sinks": True}, {"bias": "full", "sinks": True})
    for side in ("right", "left"):
        for sync in SYNCS:
            for rule in RULES:
                ql, kl = lens[n % len(lens)]
                mod = mods[n % len(mods)]
                c.append(Case(m, (19,), (27,), rule, sync, q_lengths=ql, k_lengths=kl, padding_side=side,
                              grad=n % 2 == 0, bias_grad=n % 2 == 0 and "bias" in mod, lse=True, heads_q=4,
                              heads_kv=2, **mod))  # fmt: skip
                n += 1
    c.append(Case(m, (27,), (19,), Causal(), "none_end", batch=3, q_lengths=(27, 0, 13), k_lengths=(19, 19, 0),
                  padding_side="left", grad=True, lse=True))  # fmt: skip
    # varlen: rules x syncs on two packings (one with empty sequences), gradients every other case
    packs = (((5, 0, 9, 3), (7, 4, 9, 0)), ((1, 16, 8), (12, 16, 1)))
    for rule in RULES:
        for sync in SYNCS:
            lq, lk = packs[n % 2]
            mod = ({}, {"softcap": 30.0}, {"sinks": True})[n % 3]
            c.append(varlen(m, rule, sync, lq, lk, grad=n % 2 == 0, lse=True, heads_q=(2, 4)[n % 2], heads_kv=2,
                            dim_qk=32, dim_v=(32, 16)[n % 2], **mod))  # fmt: skip
            n += 1
    # kvcache: contiguous and paged (block sizes 16 and 64, shuffled tables)
    for paged, cap, kls in ((0, 40, (1, 40, 17)), (16, 64, (64, 1, 30)), (64, 192, (100, 192, 64))):
        for rule in (Causal(), Full(), Local(8, causal=True)):
            for lq in (1, 5):
                mod = ({}, {"softcap": 30.0}, {"sinks": True})[n % 3]
                c.append(kvcache(m, rule, lq, cap, kls, paged=paged, heads_q=4, heads_kv=(1, 2)[n % 2], lse=True,
                                 **mod))  # fmt: skip
                n += 1
    # offsets: rules x (q_offset, k_offset), with a bias and lengths too
    for rule in RULES:
        for qo, ko in ((0, 5), (7, 0), (12, 3), (3, 12)):
            c.append(Case(m, (13,), (21,), rule, q_offset=qo, k_offset=ko, grad=(qo + ko) % 2 == 1, lse=True,
                          **_shape(n)))  # fmt: skip
            n += 1
    c.append(
        Case(m, (13,), (21,), Causal(), q_offset=8, bias="b11k", softcap=30.0, grad=True, bias_grad=True)
    )
    return c + gap_cases(m) + full_gap_cases(m) + alibi_full_cases(m)


def full_gap_cases(m: str) -> list[Case]:
    """Issue 36's rows in full: NaN in padding on both sides with every rule and sync, paged and
    contiguous cache gradients, packed GQA gradients, repeats of each entry point, offsets at
    every edge with every rule, and a softcap of 1e300 with every rule."""
    c: list[Case] = []
    lens = (((19, 7), (27, 0)), ((0, 12), (27, 27)), ((5, 19), (13, 27)), (None, (20, 3)), ((11, 19), None))
    mods = ({}, {"bias": "b11k"}, {"softcap": 30.0}, {"sinks": True})
    n = 0
    for side in ("right", "left"):
        for sync in SYNCS:
            for rule in RULES:
                ql, kl = lens[n % len(lens)]
                mod = mods[n % len(mods)]
                c.append(RaggedCase(m, (19,), (27,), rule, sync, q_lengths=ql, k_lengths=kl, padding_side=side,
                                    grad=n % 2 == 0, bias_grad=n % 2 == 0 and "bias" in mod, lse=True, heads_q=4,
                                    heads_kv=2, nan_padding=True, **mod))  # fmt: skip
                n += 1
    for paged, cap, kls in ((0, 40, (1, 40, 17)), (16, 64, (64, 1, 30)), (64, 192, (100, 192, 64))):
        for rule in (Causal(), Full(), Local(8, causal=True)):
            mod = ({}, {"softcap": 30.0}, {"sinks": True})[n % 3]
            for nan in (False, True):
                c.append(kvcache(m, rule, 5, cap, kls, paged=paged, heads_q=4, heads_kv=(1, 2)[n % 2], grad=True,
                                 lse=not nan, nan_padding=nan, **mod))  # fmt: skip
            n += 1
    packs = (((5, 0, 9, 3), (7, 4, 9, 0)), ((1, 16, 8), (12, 16, 1)))
    for rule in RULES:
        for sync in SYNCS:
            lq, lk = packs[n % 2]
            hq, hkv = ((4, 2), (3, 1), (6, 2))[n % 3]
            mod = ({}, {"softcap": 30.0}, {"sinks": True})[n % 3]
            c.append(varlen(m, rule, sync, lq, lk, grad=True, lse=n % 2 == 0, heads_q=hq, heads_kv=hkv, dim_qk=32,
                            dim_v=(32, 16)[n % 2], **mod))  # fmt: skip
            n += 1
    c += [
        varlen(m, Local(2), "none_front", (4, 6), (5, 3), sinks=True, grad=True, heads_q=6, heads_kv=2, dim_qk=16,
               dim_v=16),
        Case(m, (19,), (27,), Local(3), "scale_front", q_lengths=(11, 19), k_lengths=(27, 5), padding_side="left",
             bias="full", sinks=True, grad=True, bias_grad=True, lse=True, repeat=True, heads_q=4, heads_kv=2),
        varlen(m, Local(2, 1, causal=True), "none_end", (5, 0, 9, 3), (7, 4, 9, 0), softcap=30.0, grad=True,
               lse=True, repeat=True, heads_q=4, heads_kv=2),
        kvcache(m, Causal(), 4, 128, (128, 70), paged=64, sinks=True, grad=True, lse=True, repeat=True, heads_q=4,
                heads_kv=1),
        kvcache(m, Local(8, causal=True), 3, 40, (1, 40, 17), grad=True, lse=True, repeat=True),
        Case(m, (13,), (21,), Local(2, 1, causal=True), q_offset=LIMIT - 13, k_offset=-LIMIT, grad=True, lse=True,
             repeat=True),
    ]  # fmt: skip
    for rule in RULES:
        for qo, ko in edge_offsets(13, 21):
            c.append(
                Case(m, (13,), (21,), rule, q_offset=qo, k_offset=ko, grad=n % 2 == 0, lse=True, **_shape(n))
            )
            n += 1
        c.append(Case(m, (13,), (21,), rule, q_offset=LIMIT - 13, k_offset=LIMIT - 21, bias="b11k", softcap=30.0,
                      grad=True, bias_grad=True, lse=True))  # fmt: skip
        c.append(Case(m, (13,), (21,), rule, q_offset=-LIMIT, k_offset=LIMIT - 21, q_lengths=(13, 4),
                      k_lengths=(9, 21), grad=True, lse=True))  # fmt: skip
        for sync, cap in (
            ("none_front", 1e300),
            ("scale_end", 1e300),
            ("none_front", 1e3),
            ("scale_end", 1e30),
        ):
            c.append(
                Case(m, (19,), (45,), rule, sync, softcap=cap, grad=True, lse=True, heads_q=4, heads_kv=2)
            )
    return c


def full_dtype_cases(dt: str) -> list[Case]:
    """A reduced §9-§11 product for each other dtype (declined cases are cheap)."""
    q = quick_cases(dt)
    return [
        *q,
        *quick_dtype_cases(dt),
        Case(dt, (19,), (45,), Causal(), "scale_end", heads_q=4, heads_kv=2, bias="full", bias_dtype=_other(dt),
             grad=True, bias_grad=True, large_logits=True, lse=True),
        Case(dt, (33,), (33,), Causal(), softcap=5.0, sinks=True, large_logits=True, grad=True, lse=True),
        kvcache(dt, Causal(), 4, 128, (128, 70), paged=64, lse=True),
    ]  # fmt: skip


def quick_grid_part(dtypes: tuple[str, ...], main: str) -> list[Case]:
    cases = quick_cases(main)
    for dt in DTYPES:
        if dt != main and dt in dtypes:
            cases += quick_dtype_cases(dt)
    return cases


def full_grid_part(dtypes: tuple[str, ...], main: str) -> list[Case]:
    cases = full_cases(main)
    for dt in DTYPES:
        if dt != main:
            cases += full_dtype_cases(dt)
    return cases
