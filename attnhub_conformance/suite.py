"""The conformance tests that ``attnhub certify`` collects: the fixed grid and randomised cases.

Run through ``attnhub certify NAME`` (or ``pytest <this file> --attnhub-backend NAME``); without the
option every test here skips.
"""

from __future__ import annotations

import itertools
import zlib

import hypothesis
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, Phase, settings

from attnhub.rules import Causal, Full, Local
from attnhub_conformance.cases import BIAS_SHAPES, DTYPES, LAYOUTS, SYNCS, Case


def test_case(attnhub_suite, attnhub_case: Case) -> None:
    """One grid case: accepted -> conforms to the reference; declined -> declined honestly."""
    attnhub_suite.certifier.run(attnhub_case)


@st.composite
def random_fields(draw: st.DrawFn, dtypes: tuple[str, ...], strided: bool) -> dict:
    """Keyword arguments of a random :class:`Case` (small shapes; every rule, sync and layout)."""
    ndim = draw(st.sampled_from([1, 2]))
    if ndim == 1:
        seq_q, seq_k = (draw(st.integers(1, 48)),), (draw(st.integers(1, 48)),)
    else:
        seq_q = (draw(st.integers(1, 7)), draw(st.integers(1, 7)))
        seq_k = (draw(st.integers(1, 7)), draw(st.integers(1, 7)))
    kind = draw(st.sampled_from(["full", "causal", "local", "bool", "additive"]))
    if kind == "full":
        rule: object = Full()
    elif kind == "causal":
        rule = Causal()
    elif kind == "local":
        if ndim == 2 and draw(st.booleans()):
            window: int | tuple[int, ...] = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
        else:
            window = draw(st.integers(1, 8))
        rule = Local(window, draw(st.integers(0, 3)), draw(st.booleans()))
    else:
        rule = kind
    heads_kv = draw(st.integers(1, 3))
    return dict(
        dtype=draw(st.sampled_from(dtypes)),
        seq_q=seq_q,
        seq_k=seq_k,
        rule=rule,
        sync=draw(st.sampled_from(SYNCS)),
        batch=draw(st.integers(1, 2)),
        heads_q=heads_kv * draw(st.sampled_from([1, 2, 3])),
        heads_kv=heads_kv,
        dim_qk=draw(st.sampled_from([8, 16, 32, 64])),
        dim_v=draw(st.sampled_from([8, 16, 32, 64])),
        layout=draw(st.sampled_from(LAYOUTS)),
        scale=draw(st.one_of(st.none(), st.sampled_from([0.25, 1.0, 1.7]))),
        lse=draw(st.booleans()),
        grad=draw(st.booleans()),
        large_logits=draw(st.booleans()),
        noncontig=draw(st.sampled_from(["", "transposed", "sliced"])) if strided else "",
        mask_shape=draw(st.sampled_from(["bcast", "full"])),
        mask_empty_rows=draw(st.booleans()),
    )


@st.composite
def modifier_fields(draw: st.DrawFn, fields: dict) -> dict:
    """§9-§11 arguments mixed into a drawn case: bias, softcap, sinks, and for 1-d sequences
    lengths (either padding side), offsets (none_front), or the varlen / kvcache entry points."""
    f = dict(fields)
    if f["rule"] == "additive":  # a float mask is a bias already: draw a bias instead
        f["rule"] = Full()
    f["softcap"] = draw(st.one_of(st.none(), st.sampled_from([5.0, 30.0, 50.0])))
    f["sinks"] = draw(st.booleans())
    entry = "attention"
    if len(f["seq_q"]) == 1:
        entry = draw(st.sampled_from(["attention", "attention", "varlen", "kvcache"]))
    if entry == "attention":
        f["bias"] = draw(st.sampled_from(["", *BIAS_SHAPES]))
        if f["bias"]:
            f["bias_dtype"] = draw(st.sampled_from(["", "float32"])) if f["dtype"] != "float32" else ""
            f["bias_grad"] = draw(st.booleans())
            f["bias_neginf"] = draw(st.booleans())
        if len(f["seq_q"]) == 1:
            lq, lk, b = f["seq_q"][0], f["seq_k"][0], f["batch"]
            lens = lambda n: st.one_of(st.none(), st.tuples(*[st.integers(0, n)] * b))  # noqa: E731
            f["q_lengths"], f["k_lengths"] = draw(lens(lq)), draw(lens(lk))
            f["padding_side"] = draw(st.sampled_from(["right", "left"]))
            if draw(st.integers(0, 2)) == 0:  # offsets (a third of these draws): sync none_front
                f["sync"] = "none_front"
                f["q_offset"], f["k_offset"] = draw(st.integers(0, 20)), draw(st.integers(0, 20))
        return f
    f.update(layout="bhsd", noncontig="")
    if isinstance(f["rule"], str):
        f["rule"] = Causal()
    if entry == "varlen":
        n = draw(st.integers(1, 4))
        lens_q = draw(st.tuples(*[st.integers(0, 12)] * n).filter(lambda t: sum(t) > 0))
        lens_k = draw(st.tuples(*[st.integers(0, 12)] * n).filter(lambda t: sum(t) > 0))
        f.update(entry="varlen", seqlens_q=lens_q, seqlens_k=lens_k, seq_q=(sum(lens_q),), seq_k=(sum(lens_k),),
                 batch=1)  # fmt: skip
        return f
    paged = draw(st.sampled_from([0, 16]))
    cap = 16 * draw(st.integers(1, 3)) if paged else draw(st.integers(1, 48))
    f.update(entry="kvcache", paged=paged, seq_q=(draw(st.integers(1, 8)),), seq_k=(cap,), sync="none_end",
             grad=False, k_lengths=draw(st.tuples(*[st.integers(0, cap)] * f["batch"])))  # fmt: skip
    return f


def random_case(fields: dict) -> Case:
    """A random case named by its content, so a replay of the same draw has the same id and data."""
    probe = Case(**fields)
    return Case(random_index=zlib.crc32(repr(probe).encode()) % 10**8, **fields)


def test_random_cases(attnhub_suite) -> None:
    """Randomised cases drawn by hypothesis from the run's seed (full mode, or ``--case random-N``).

    Shrinking is off: the reported example is the first failing draw, reproducible with the printed
    command (same seed and number of examples).
    """
    state = attnhub_suite
    cert = state.certifier
    dtypes = tuple(d for d in DTYPES if d in cert.backend.dtypes) or DTYPES
    strided = cert.framework in ("numpy", "torch")
    draws = itertools.count()  # the draw's number: which --jobs shard runs it

    @hypothesis.seed(cert.seed)
    @settings(
        max_examples=state.random_examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @hypothesis.given(fields=random_fields(dtypes, strided), data=st.data())
    def check(fields: dict, data: st.DataObject) -> None:
        if data.draw(st.booleans()):  # half the draws mix in §9-§11 arguments
            fields = data.draw(modifier_fields(fields))
        case = random_case(fields)
        if state.owns(next(draws)) and state.wants(case.id):
            cert.run(case)

    check()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__]))
