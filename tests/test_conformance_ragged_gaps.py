"""Issue 36's SPEC §9-§11 gaps in ``attnhub certify``: each broken backend below fails the grid on
the row of its bug and still passes another row.

NaN stored in padding (padded query rows, padded keys, cache rows past ``k_lengths``, unused
blocks), gradients through a paged cache, packed GQA gradients, bitwise repeats, offsets at the
edges of SPEC §11's range, a softcap of 1e300, and a plain §1-§8 NumPy backend that must never
receive ``operands=``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
import pytest

from attnhub.backend import Backend
from attnhub.registry import REGISTRY
from attnhub.rules import Causal, ExplicitMask, Full, Local
from attnhub_backends.reference import kernel
from attnhub_backends.reference.backend import ReferenceBackend
from attnhub_conformance import report as rep
from attnhub_conformance.cases import SYNCS, Case
from attnhub_conformance.modifier_cases import full_cases, gap_cases, quick_cases, quick_dtype_cases
from attnhub_conformance.runner import Certifier
from tests.plugged import plugged_in, run_all

# -- deliberately broken backends --------------------------------------------------------------


class _ZeroTimesNaN(ReferenceBackend):
    """Multiplies the masked probabilities by v: adds 0 · (every stored value row) to out, so a NaN
    in a padded key row or an unused cache block reaches the output (0 × NaN)."""

    name: ClassVar[str] = "t_gap_zero_nan"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        out, lse = super().forward(q, k, v, req, mask, operands)
        # paged: every block, those no table entry names included; else every key row, padded included
        every_v = v.sum(axis=(0, 1))[None, :, None, :] if req.paged else v.sum(axis=2, keepdims=True)
        every_v = np.repeat(every_v, req.group, axis=1)
        return (out + 0.0 * every_v).astype(out.dtype), lse


class _PaddedRowsNotZeroed(ReferenceBackend):
    """Computes padded query rows as if they were valid (q_lengths ignored there) instead of
    writing zeros: a NaN stored in a padded query row comes out."""

    name: ClassVar[str] = "t_gap_rows_unzeroed"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        out, lse = super().forward(q, k, v, req, mask, operands)
        if operands is None or operands.q_lengths is None:
            return out, lse
        loose = dataclasses.replace(req, q_lengths=False)
        out_all, _ = super().forward(q, k, v, loose, mask, dataclasses.replace(operands, q_lengths=None))
        n = req.nq
        rows = np.arange(n)[None, :]
        lens = np.asarray(operands.q_lengths)[:, None]
        padded = rows >= lens if req.padding_side == "right" else rows < n - lens
        return np.where(padded[:, None, :, None], out_all, out).astype(out.dtype), lse


class _PagedGradContiguous(ReferenceBackend):
    """Right forward; its backward writes dk/dv of a paged cache as if the cache were contiguous
    (block j of entry b is block b·max_blocks + j, the table ignored)."""

    name: ClassVar[str] = "t_gap_paged_grad"
    priority: ClassVar[int] = -50

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        grads = list(super().backward(q, k, v, out, lse, dout, req, mask, operands, dlse))
        if req.paged:
            table = np.asarray(operands.block_table)
            order = np.arange(table.size).reshape(table.shape)
            for i in (1, 2):
                moved = np.zeros_like(grads[i])
                moved[order.ravel()] = grads[i][table.ravel()]
                grads[i] = moved
        return tuple(grads)


class _GroupFirstHead(ReferenceBackend):
    """Packed sequences: dk/dv from the first query head of each GQA group only."""

    name: ClassVar[str] = "t_gap_first_head"
    priority: ClassVar[int] = -50

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        grads = super().backward(q, k, v, out, lse, dout, req, mask, operands, dlse)
        if not req.varlen or req.group == 1:
            return grads
        first = (np.arange(req.heads_q) % req.group == 0)[None, :, None, None]
        only = super().backward(q, k, v, out, lse, np.where(first, dout, 0).astype(dout.dtype), req, mask,
                                dlse, operands)  # fmt: skip
        return (grads[0], only[1], only[2], *grads[3:])


class _Nondeterministic(ReferenceBackend):
    """Declares ``deterministic`` but moves one element by an ulp on every §9-§11 call."""

    name: ClassVar[str] = "t_gap_nondet"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        out, lse = super().forward(q, k, v, req, mask, operands)
        return (_nudged(out) if req.modified else out), lse

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        grads = super().backward(q, k, v, out, lse, dout, req, mask, operands, dlse)
        return (_nudged(grads[0]) if req.modified else grads[0], *grads[1:])


def _nudged(x: np.ndarray) -> np.ndarray:
    y = np.array(x)
    i = np.random.default_rng().choice(np.flatnonzero(y))  # zeros stay exact (SPEC §4's empty rows)
    y.flat[i] = np.nextafter(y.flat[i], np.inf)
    return y


def _wrap32(x: np.ndarray) -> np.ndarray:
    return (x + 2**31) % 2**32 - 2**31


class _Int32Positions(ReferenceBackend):
    """Evaluates the rule on ``P − R + 1`` in int32 arithmetic (``P >= R`` written as
    ``P − R + 1 > 0``): at SPEC §11's edges the sum wraps and pairs are dropped."""

    name: ClassVar[str] = "t_gap_int32"
    priority: ClassVar[int] = -50

    def _as_mask(self, req, mask):
        if not (req.q_offset or req.k_offset) or req.ragged or mask is not None:
            return req, mask
        p = np.arange(req.nq, dtype=np.int64) + req.q_offset
        r = np.arange(req.nk, dtype=np.int64) + req.k_offset
        delta = _wrap32(p[:, None] - r[None, :] + 1) - 1
        keep = np.ones(delta.shape, dtype=bool)
        rule = req.rule
        if isinstance(rule, Local):
            d = np.abs(delta)
            keep = (d % rule.stride == 0) & (d // rule.stride < rule.windows(1)[0])
        if isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal):
            keep &= delta >= 0
        shape = (1, 1, req.nq, req.nk)
        return dataclasses.replace(req, rule=ExplicitMask("bool", shape), q_offset=0, k_offset=0), keep[
            None, None
        ]

    def forward(self, q, k, v, req, mask=None, operands=None):
        req, mask = self._as_mask(req, mask)
        return super().forward(q, k, v, req, mask, operands)

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        req, mask = self._as_mask(req, mask)
        return super().backward(q, k, v, out, lse, dout, req, mask, operands, dlse)


class _SoftcapInInputDtype(ReferenceBackend):
    """Rounds softcap to float32 first (as tf and jax did): 1e300 becomes inf, tanh(t/inf)·inf NaN."""

    name: ClassVar[str] = "t_gap_softcap32"
    priority: ClassVar[int] = -50

    def forward(self, q, k, v, req, mask=None, operands=None):
        if req.softcap is not None:
            with np.errstate(over="ignore"):
                req = dataclasses.replace(req, softcap=float(np.float32(req.softcap)))
        return super().forward(q, k, v, req, mask, operands)


class _PlainNumpy(Backend):
    """A §1-§8 NumPy backend (backward, boolean masks, no §9-§11 feature): its ``operands`` is
    always None."""

    name: ClassVar[str] = "t_gap_plain"
    priority: ClassVar[int] = -50
    frameworks: ClassVar[tuple[str, ...]] = ("numpy",)
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float64")
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "2d", "full", "causal", "local", "explicit_mask", "gqa", "lse", "backward"}
    )

    def forward(
        self, q: Any, k: Any, v: Any, req: Any, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        out, lse = kernel.forward(q, k, v, req, mask)
        return out.astype(q.dtype), lse.astype(np.float64 if q.dtype == np.float64 else np.float32)

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        return tuple(g.astype(q.dtype) for g in kernel.backward(q, k, v, dout, req, mask))


BROKEN = [_ZeroTimesNaN, _PaddedRowsNotZeroed, _PagedGradContiguous, _GroupFirstHead, _Nondeterministic,
          _Int32Positions, _SoftcapInInputDtype, _PlainNumpy]  # fmt: skip


@pytest.fixture(scope="module")
def broken():
    with plugged_in(*(cls() for cls in BROKEN)):
        yield


def _quick(pred) -> list[Case]:
    return [c for c in quick_cases("float32") if pred(c)]


def _nan_padded(c: Case) -> bool:
    return getattr(c, "nan_padding", False)


def _statuses(cert: Certifier, cases: list[Case], *rows: str) -> dict[str, str]:
    m = rep.aggregate(run_all(cert, cases))
    return {r: m[r][cases[0].dtype]["status"] for r in rows}


# -- the new cases exist and the reference passes them ---------------------------------------


def test_the_quick_grid_has_every_gap_case():
    q = quick_cases("float32")
    nan = [c for c in q if _nan_padded(c)]
    assert {c.padding_side for c in nan if c.q_lengths is not None} == {"right", "left"}
    assert any(c.entry == "kvcache" and c.paged and c.grad for c in nan)
    assert any(c.entry == "varlen" and c.grad and c.heads_q > c.heads_kv for c in q)
    assert {c.entry for c in q if c.repeat} >= {"attention", "varlen", "kvcache"}
    assert any(c.q_offset == 2**30 - c.nq for c in q) and any(c.k_offset == -(2**30) for c in q)
    assert any(getattr(c, "expect_spec_error", "") for c in q)
    assert any(c.softcap == 1e39 for c in q) and any(c.softcap == 1e3 for c in q)
    assert any(c.softcap == 1e300 for c in quick_dtype_cases("float16"))


def test_full_grid_keeps_the_gap_cases():
    full = full_cases("float32")
    assert {c.id for c in gap_cases("float32")} <= {c.id for c in full}
    assert len({c.id for c in full}) == len(full)
    nan = [c for c in full if _nan_padded(c)]
    assert {(c.padding_side, c.sync) for c in nan if c.entry == "attention"} == {
        (side, sync) for side in ("right", "left") for sync in SYNCS
    }
    assert {c.paged for c in full if c.entry == "kvcache" and c.grad} == {0, 16, 64}
    assert {(c.heads_q, c.heads_kv) for c in full if c.entry == "varlen" and c.grad} >= {
        (4, 2),
        (3, 1),
        (6, 2),
    }


# -- each broken backend fails its row and passes another ------------------------------------


def test_nan_in_padded_keys_and_cache_blocks_is_caught(broken):
    cases = _quick(lambda c: _nan_padded(c) or c.bias == "1hqk")
    st = _statuses(Certifier("t_gap_zero_nan", seed=21), cases, "k_lengths", "kvcache paged", "bias")
    assert st == {"k_lengths": "FAIL", "kvcache paged": "FAIL", "bias": "pass"}, st


def test_nan_in_padded_query_rows_is_caught_on_both_sides(broken):
    for side in ("right", "left"):
        cases = _quick(lambda c, side=side: (_nan_padded(c) and c.padding_side == side and c.q_lengths is not None)
                       or (c.bias == "1hqk" and c.q_lengths is None))  # fmt: skip
        cert = Certifier("t_gap_rows_unzeroed", seed=22)
        st = _statuses(cert, cases, "q_lengths", "bias")
        assert st == {"q_lengths": "FAIL", "bias": "pass"}, (side, st)
        nan_ids = {c.id for c in cases if _nan_padded(c)}
        assert all(cert.results[i].status == "FAIL" for i in nan_ids)


def test_a_paged_backward_that_ignores_the_block_table_is_caught(broken):
    cases = _quick(lambda c: (c.entry == "kvcache" and c.grad) or c.bias == "1hqk")
    assert any(c.paged for c in cases if c.entry == "kvcache")
    cert = Certifier("t_gap_paged_grad", seed=23)
    st = _statuses(cert, cases, "kvcache paged", "bias")
    assert st == {"kvcache paged": "FAIL", "bias": "pass"}, st
    assert {r.check for r in cert.results.values() if r.status == "FAIL"} <= {"dk", "dv"}


def test_packed_gqa_gradients_from_one_head_are_caught(broken):
    cases = _quick(lambda c: (c.entry == "varlen" and c.grad) or c.bias == "1hqk")
    assert any(c.heads_q == c.heads_kv for c in cases if c.entry == "varlen")  # MHA: passes
    cert = Certifier("t_gap_first_head", seed=24)
    results = run_all(cert, cases)
    for c in cases:
        if c.entry == "varlen":
            assert (cert.results[c.id].status == "FAIL") == (c.heads_q > c.heads_kv), c.id
    m = rep.aggregate(results)
    assert m["varlen"]["float32"]["status"] == "FAIL" and m["bias"]["float32"]["status"] == "pass"


def test_a_repeat_that_is_not_bitwise_equal_is_caught(broken):
    cases = _quick(lambda c: c.repeat or c.q_offset == 8)
    cert = Certifier("t_gap_nondet", seed=25)
    results = run_all(cert, cases)
    repeat_ids = {c.id for c in cases if c.repeat}
    assert {r.id for r in results if r.status == "FAIL"} == repeat_ids
    assert all(r.check.startswith("deterministic") for r in results if r.status == "FAIL")
    m = rep.aggregate(results)
    assert m["deterministic"]["float32"]["status"] == "FAIL" and m["offsets"]["float32"]["status"] == "pass"


def test_a_backend_without_deterministic_declines_the_repeats():
    cert = Certifier("sdpa-cpu", seed=26) if "sdpa-cpu" in REGISTRY.backends() else None
    if cert is None or "deterministic" in cert.backend.features:
        pytest.skip("needs a backend that does not declare deterministic")
    results = run_all(cert, _quick(lambda c: c.repeat))
    assert results and all(r.status == "declined" for r in results)


def test_offsets_at_the_int32_edges_are_caught(broken):
    edge = _quick(
        lambda c: abs(c.q_offset) + abs(c.k_offset) > 2**29 and not getattr(c, "expect_spec_error", "")
    )
    small = Case("float32", (6,), (14,), Local(3, causal=True), q_offset=8, k_offset=2, lse=True, dim_qk=16,
                 dim_v=16)  # fmt: skip
    assert Certifier("t_gap_int32", seed=27).run(small).status == "pass"  # right for small offsets
    results = run_all(Certifier("t_gap_int32", seed=27), [*edge, _quick(lambda c: c.bias == "1hqk")[0]])
    assert any(r.status == "FAIL" and r.check == "out" for r in results), [(r.id, r.status) for r in results]
    m = rep.aggregate(results)
    assert m["offsets"]["float32"]["status"] == "FAIL" and m["bias"]["float32"]["status"] == "pass"


def test_offsets_at_the_edges_pass_the_reference():
    edge = _quick(
        lambda c: abs(c.q_offset) + abs(c.k_offset) > 2**29 and not getattr(c, "expect_spec_error", "")
    )
    assert len(edge) >= 3
    results = run_all(Certifier("reference", seed=28), edge)
    assert all(r.status == "pass" for r in results), [(r.id, r.message) for r in results]


def test_one_past_the_offset_limits_and_2d_alibi_must_be_spec_errors():
    cases = _quick(lambda c: getattr(c, "expect_spec_error", ""))
    assert {c.expect_spec_error for c in cases} == {"q_offset", "k_offset", "alibi_slopes"}
    results = run_all(Certifier("reference", seed=29), cases)
    assert all(r.status == "pass" for r in results), [(r.id, r.message) for r in results]


def test_a_huge_softcap_rounded_to_inf_is_caught(broken):
    cases = _quick(lambda c: c.softcap in (1e39, 30.0))
    cert = Certifier("t_gap_softcap32", seed=30)
    results = run_all(cert, cases)
    assert {r.status for r in results if "softcap1e+39" in r.id} == {"FAIL"}
    assert {r.status for r in results if "softcap30" in r.id} == {"pass"}


# -- the harness: a plain §1-§8 NumPy backend never receives operands= ------------------------


def test_a_plain_numpy_backend_certifies_the_modifier_grid(broken):
    """Full mode's §9-§11 grid on a backend declaring none of §9-§11: everything it accepts (bool
    padding and block-sparse masks) passes, with gradients; a bias it declines (no "bias")."""
    cases = [c for c in full_cases("float32") if c.rule == "bool" or (c.bias and isinstance(c.rule, Full)
             and c.softcap is None and not c.sinks and c.entry == "attention" and c.q_lengths is None
             and c.k_lengths is None and not c.q_offset and not c.k_offset)]  # fmt: skip
    results = run_all(Certifier("t_gap_plain", seed=31), cases)
    bad = [(r.id, r.message) for r in results if r.status == "FAIL"]
    assert not bad, bad
    accepted = [r for r in results if r.status == "pass"]
    assert any("bool mask padding" in r.features and "backward" in r.features for r in accepted)
    biased = [r for r in results if r.id in {c.id for c in cases if c.bias}]
    assert biased and all(r.status == "declined" for r in biased), [(r.id, r.status) for r in biased]
    assert all(any("additive bias" in why for why in r.reasons) for r in biased)
