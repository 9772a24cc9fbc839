"""SPEC §9 ``alibi_slopes``: ALiBi, ``s = t − slope[b, h] · |P(i) − R(j)|`` on the positions of §2, §10, §11.

The first modifier added after SPEC's first edition (docs/writing-a-backend.md, "Adding a score
modifier"): it travels in ``Request.more`` and ``Operands.more`` under its name, and a backend
computes it from the positions it already evaluates the rule on, so no Lq × Lk array exists.
"""

from __future__ import annotations

from typing import Any

from attnhub.errors import SpecError
from attnhub.frameworks import Adapter, adapter_for
from attnhub.modifiers.arrays import check_float_array
from attnhub.modifiers.base import Call, ScoreModifier
from attnhub.positions import axis_affine
from attnhub.rules import Causal, Local


class Alibi(ScoreModifier):
    """The request records the slopes' shape as (1, Hq) or (B, Hq); backends receive the array in
    that shape (``Operands.more["alibi_slopes"]``, float32, on q's device). The slopes are
    constants (as flash-attn's ``alibi_slopes``): a caller differentiating them gets a SpecError,
    never a dropped gradient."""

    name = "alibi_slopes"
    feature = "alibi"
    missing = (
        "does not compute ALiBi (alibi_slopes=); pass the ALiBi term −slope·|i − j| as bias= "
        "instead, or pick a backend that declares 'alibi' (attnhub info)"
    )

    def signature(self, value: Any, call: Call) -> tuple[int, int]:
        if call.ndim != 1:
            raise SpecError("alibi_slopes", "only with 1-d sequences (SPEC §9)", "a 2-d sequence")
        shape = check_float_array(
            "alibi_slopes", value, call.ad, call.device, call.dtype, None, any_float=True
        )
        dt = adapter_for(value, "alibi_slopes").dtype_name(value)
        if dt != "float32":
            raise SpecError("alibi_slopes.dtype", "float32 (as flash-attn's alibi_slopes)", dt)
        if shape not in ((call.heads_q,), (1, call.heads_q), (call.batch, call.heads_q)):
            raise SpecError(
                "alibi_slopes.shape",
                f"({call.heads_q},) or ({call.batch}, {call.heads_q}) (per query head)",
                shape,
            )
        if adapter_for(value, "alibi_slopes").mask_needs_grad(value):
            raise SpecError(
                "alibi_slopes", "constants (no backend differentiates ALiBi slopes): detach them",
                "an array that requires grad",
            )  # fmt: skip
        return (1, call.heads_q) if len(shape) == 1 else shape  # type: ignore[return-value]

    def operand(self, value: Any, ad: Adapter, q: Any, sig: Any) -> Any:
        return ad.reshape(value, sig)

    def describe(self, req: Any) -> str:
        sig = dict(req.more)[self.name]
        return "alibi" + ("-per-batch" if sig[0] > 1 else "")


MODIFIER = Alibi()

#: The largest distance from a query to its nearest key for which an ALiBi term computed in float32
#: (``slope·|P − R|``, rounded relative 2**-24) keeps SPEC §6's forward tolerance with slopes up to 4
#: (ALiBi's are at most 0.5): float32 4·64·2**-24 = 1.5e-5 against 2e-5; float16 4·4096·2**-24 =
#: 1e-3 against 2e-3; bfloat16 4·32768·2**-24 = 8e-3 against 1.6e-2.
FLOAT32_TERM_GAP = {"float32": 64, "float16": 4096, "bfloat16": 32768}
#: The same for a term computed in float64 with float64 inputs (SPEC §6: 1e-10): 4·2**17·2**-53 =
#: 5.8e-11. Beyond it only a split of the term into a row constant and the rest is exact (the
#: reference's): at SPEC §11's edge offsets the term reaches 1e9.
FLOAT64_TERM_GAP = 2**17


def nearest_key_gap(req: Any) -> int:
    """The largest distance from a query position to the nearest key position of a 1-d request
    (SPEC §2, §11), over the queries that may attend a key: 0 when the ranges overlap. With §10's
    lengths (unknown here) a bound: 0 for a causal rule with sync none_end (each entry's queries
    end at its last key: caches, decoding), else the padded lengths' and offsets' span."""
    (nq,), (nk,) = req.seq_q, req.seq_k
    causal = isinstance(req.rule, Causal) or (isinstance(req.rule, Local) and req.rule.causal)
    if req.ragged:
        if causal and req.sync == "none_end":
            return 0
        return max(nq, nk) + abs(req.q_offset - req.k_offset)
    if nq == 0 or nk == 0:
        return 0
    aq, bq, ak, bk = axis_affine(nq, nk, req.sync)
    bq, bk = bq + req.q_offset, bk + req.k_offset
    p_lo, p_hi, r_lo, r_hi = bq, aq * (nq - 1) + bq, bk, ak * (nk - 1) + bk
    before = 0 if causal else r_lo - p_lo  # causal: queries before every key attend none
    return max(0, before, p_hi - r_hi)


def float64_alibi_problem(req: Any) -> str | None:
    """Why a backend that adds the ALiBi term in float64 cannot serve a float64 ``req`` within SPEC
    §6 (None when it can)."""
    gap = nearest_key_gap(req)
    if gap <= FLOAT64_TERM_GAP:
        return None
    return (
        f"adds the ALiBi term in float64, where a query {gap} positions from its nearest key (SPEC §11's "
        "offsets) loses the logits' differences below float64's tolerance; use backend='reference', "
        "which splits the term exactly"
    )


def float32_alibi_problem(req: Any) -> str | None:
    """Why a backend that computes the ALiBi term in float32 cannot serve ``req`` within SPEC §6
    (None when it can): queries far from every key, whose logits' differences float32 loses."""
    most = FLOAT32_TERM_GAP.get(req.dtype)
    if most is None:
        return "computes ALiBi in float32, below float64's tolerance; use backend='reference'"
    gap = nearest_key_gap(req)
    if gap <= most:
        return None
    if req.ragged:
        where = (
            f"where an entry's queries may sit up to {gap} positions from its nearest key (its lengths "
            "are not known when a backend is chosen; a causal rule with sync none_end keeps them at 0)"
        )
    else:
        where = f"where a query {gap} positions from its nearest key"
    return (
        f"computes ALiBi in float32, {where} loses the logits' differences (about slope·distance·2**-24 "
        f"each; at most {most} with {req.dtype} inputs); pass the ALiBi term as bias= (padded batches), "
        "cast to bfloat16, or use backend='reference'"
    )


def alibi_slopes(heads: int) -> list[float]:
    """The ALiBi paper's slopes for ``heads`` heads (Press et al. 2022; BLOOM's and flash-attn's):
    a geometric sequence from 2**(-8/n) for the largest power of two n <= heads, then the odd
    terms of the sequence for 2n."""
    import math

    n = 2 ** math.floor(math.log2(heads))
    base = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    extra = [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(heads - n)]
    return base + extra
