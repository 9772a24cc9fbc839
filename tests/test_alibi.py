"""ALiBi (SPEC §9, ``alibi_slopes``): the definition on SPEC's positions, its validation, the
flash-attn form it matches, and certify failing a backend that evaluates it on array indices."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import attnhub
from attnhub.errors import BackendUnsupported, SpecError
from attnhub.modifiers.alibi import alibi_slopes, nearest_key_gap
from attnhub.operands import Operands
from attnhub.rules import Causal, Full
from attnhub_backends.reference.backend import ReferenceBackend
from attnhub_conformance.modifier_cases import alibi_full_cases, alibi_quick_cases
from attnhub_conformance.runner import Certifier
from tests.plugged import plugged_in, run_all


def _qkv(rng, b=2, h=4, lq=7, lk=11, d=8):
    return (
        rng.standard_normal((b, h, lq, d)),
        rng.standard_normal((b, h, lk, d)),
        rng.standard_normal((b, h, lk, d)),
    )


def _term(slopes: np.ndarray, pq: np.ndarray, pk: np.ndarray) -> np.ndarray:
    """−slope·|P − R| written out: slopes (B | 1, H), positions (Nq,), (Nk,)."""
    return -slopes[:, :, None, None] * np.abs(pq[:, None] - pk[None, :]).astype(np.float64)


@pytest.mark.parametrize(
    "sync, q_offset, k_offset, rule",
    [("none_front", 0, 0, Full()), ("none_end", 0, 0, Causal()), ("none_front", 9, 3, Causal()),
     ("none_front", 0, 0, Causal())],
)  # fmt: skip
def test_alibi_is_the_bias_minus_slope_times_position_distance(sync, q_offset, k_offset, rule):
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng)
    lq, lk = 7, 11
    slopes = rng.uniform(0.1, 1.0, (2, 4))
    shift = lk - lq if sync == "none_end" else 0  # SPEC §2: none_end puts the queries last
    pq, pk = np.arange(lq) + shift + q_offset, np.arange(lk) + k_offset
    kw = dict(
        mask=rule, sync=sync, q_offset=q_offset, k_offset=k_offset, backend="reference", return_lse=True
    )
    got = attnhub.attention(q, k, v, alibi_slopes=slopes.astype(np.float32), **kw)
    want = attnhub.attention(q, k, v, bias=_term(slopes.astype(np.float32).astype(np.float64), pq, pk), **kw)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)


def test_left_padded_entries_take_alibi_on_their_own_positions():
    """With lengths each entry is its own problem (SPEC §10): entry b's queries and keys are
    numbered from its first valid token, whatever the padding."""
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, lq=6, lk=6)
    slopes = np.float32([[0.5, 0.25, 0.125, 0.0625]])
    lens = [6, 3]
    got = attnhub.attention(q, k, v, mask="causal", alibi_slopes=slopes[0], q_lengths=lens, k_lengths=lens,
                            padding_side="left", backend="reference")  # fmt: skip
    for b, n in enumerate(lens):
        pos = np.arange(n)
        want = attnhub.attention(
            q[b : b + 1, :, 6 - n :], k[b : b + 1, :, 6 - n :], v[b : b + 1, :, 6 - n :], mask="causal",
            bias=_term(slopes.astype(np.float64), pos, pos), backend="reference",
        )  # fmt: skip
        np.testing.assert_allclose(got[b : b + 1, :, 6 - n :], want, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(got[b, :, : 6 - n], 0.0)


def test_flash_attn_causal_form_gives_the_same_output():
    """flash-attn adds ``+slope·j`` under causal (bottom-right aligned): a per-row constant away
    from −slope·|P − R|, so the same output (its lse differs by that constant)."""
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, lq=5, lk=9)
    slopes = np.float32(alibi_slopes(4))
    got = attnhub.attention(q, k, v, mask="causal", sync="none_end", alibi_slopes=slopes, backend="reference")
    fa = slopes.astype(np.float64)[None, :, None, None] * np.arange(9)[None, None, None, :]
    want = attnhub.attention(q, k, v, mask="causal", sync="none_end", bias=np.broadcast_to(fa, (1, 4, 5, 9)),
                             backend="reference")  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_the_slopes_of_the_alibi_paper():
    assert alibi_slopes(8) == [2.0 ** -(i + 1) for i in range(8)]
    s12 = alibi_slopes(12)  # 8 from 2**(-8/8), then 4 odd terms of the 16-head sequence
    assert s12[:8] == alibi_slopes(8) and s12[8:] == [2.0 ** (-(2 * i + 1) / 2) for i in range(4)]


def test_bad_slopes_are_spec_errors():
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng)
    with pytest.raises(SpecError, match="alibi_slopes.shape"):
        attnhub.attention(q, k, v, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(SpecError, match="alibi_slopes.dtype"):
        attnhub.attention(q, k, v, alibi_slopes=np.ones(4, np.float64))
    q2 = rng.standard_normal((1, 4, 2, 3, 8))
    with pytest.raises(SpecError, match="alibi_slopes"):
        attnhub.attention(q2, q2, q2, alibi_slopes=np.ones(4, np.float32))
    torch = pytest.importorskip("torch")
    tq = torch.randn(1, 4, 5, 8)
    with pytest.raises(SpecError, match="detach"):
        attnhub.attention(tq, tq, tq, alibi_slopes=torch.ones(4, requires_grad=True))


class NoAlibi(ReferenceBackend):
    name = "t_no_alibi"
    priority = -1000
    features = ReferenceBackend.features - {"alibi"}


def test_backends_without_alibi_decline_with_its_reason():
    q, k, v = _qkv(np.random.default_rng(5))
    with plugged_in(NoAlibi()), pytest.raises(BackendUnsupported) as info:
        attnhub.attention(q, k, v, alibi_slopes=np.ones(4, np.float32), backend="t_no_alibi")
    assert "does not compute ALiBi (alibi_slopes=)" in str(info.value)


def test_a_backend_without_alibi_is_never_shown_passing_it():
    """The 2-d ALiBi case expects the core's SpecError before any backend is asked: it certifies
    the rejection (row "bad input rejected"), not ALiBi. It used to mark the row "alibi" passed, so
    the support matrix showed ALiBi for backends that compute none (cuda, jax, tf)."""
    from attnhub_conformance.report import aggregate

    with plugged_in(NoAlibi()):
        results = run_all(Certifier("t_no_alibi", seed=3, framework="numpy"), alibi_quick_cases("float32"))
    matrix = aggregate(results)
    assert matrix["alibi"]["float32"]["passed"] == 0 < matrix["alibi"]["float32"]["declined"]
    assert matrix["bad input rejected"]["float32"]["passed"] == 1
    assert not [r.id for r in results if r.status == "FAIL"]


class NoOffsets(ReferenceBackend):
    name = "t_no_offsets"
    priority = -1000
    features = ReferenceBackend.features - {"offsets"}


def test_the_2d_alibi_rejection_is_certified_for_backends_without_offsets():
    """The rejection of ALiBi with 2-d sequences does not depend on offsets: a backend without them
    passes that case (it was declined as 'does not take q_offset/k_offset')."""
    (case,) = [c for c in alibi_quick_cases("float32") if getattr(c, "expect_spec_error", "")]
    with plugged_in(NoOffsets()):
        (result,) = run_all(Certifier("t_no_offsets", seed=3, framework="numpy"), [case])
    assert result.status == "pass", (result.status, result.reasons, result.message)


def test_nearest_key_gap():
    def req(lq, lk, sync="none_front", rule=None, qo=0, ko=0):
        q = np.zeros((1, 1, lq, 4))
        k = np.zeros((1, 1, lk, 4))
        return attnhub.explain(q, k, k, mask=rule, sync=sync, q_offset=qo, k_offset=ko).request

    assert nearest_key_gap(req(8, 8)) == 0
    assert nearest_key_gap(req(45, 19)) == 26  # none_front: queries 19..44 past the last key
    assert nearest_key_gap(req(45, 19, "none_end", Causal())) == 0  # early queries attend nothing
    assert nearest_key_gap(req(45, 19, "none_end")) == 26
    assert nearest_key_gap(req(4, 4, qo=100)) == 100


class IndexAlibi(ReferenceBackend):
    """Declares "alibi" and evaluates it on array indices |i − j| (padded rows, no sync mode, no
    offsets) instead of SPEC's positions: right for plain none_front calls only."""

    name = "t_index_alibi"
    priority = -1000

    def _term(self, req, slopes):
        """−slope·|i − j| on the indices: (B | 1, H, Nq, Nk)."""
        return -slopes[:, :, None, None] * np.abs(np.arange(req.nq)[:, None] - np.arange(req.nk)[None, :])

    def _as_bias(self, req, operands):
        """(request, operands) with the ALiBi term (``_term``) moved into the bias."""
        slopes = operands.more["alibi_slopes"] if operands is not None and operands.more else None
        if slopes is None:
            return req, operands
        term = self._term(req, np.asarray(slopes, dtype=np.float64))
        bias = term if operands.bias is None else np.asarray(operands.bias, np.float64) + term
        req = dataclasses.replace(req, bias=bias.shape, more=())
        ops = Operands(**{**{f: getattr(operands, f) for f in operands.__dataclass_fields__}, "bias": bias,
                          "more": None})  # fmt: skip
        return req, ops

    def forward(self, q, k, v, req, mask=None, operands=None):
        return super().forward(q, k, v, *self._swap(req, mask, operands))

    def _swap(self, req, mask, operands):
        r, ops = self._as_bias(req, operands)
        return r, mask, ops

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        return super().backward(q, k, v, out, lse, dout, *self._swap(req, mask, operands), dlse)


def test_certify_fails_alibi_on_indices_instead_of_positions():
    cases = [c for c in alibi_quick_cases("float32") + alibi_full_cases("float32")[:12] if not c.ndim > 1]
    with plugged_in(IndexAlibi()):
        results = run_all(Certifier("t_index_alibi", seed=5, framework="numpy"), cases)
    by_id = {r.id: r for r in results}
    failed = [c for c in cases if by_id[c.id].status == "FAIL"]
    # each way positions differ from indices is caught: sync none_end with Lq != Lk, offsets,
    # left padding, packed sequences, a paged cache (queries at its end)
    for what, moved in (
        ("none_end", lambda c: c.sync == "none_end" and c.entry == "attention" and c.nq != c.nk),
        ("offsets", lambda c: c.q_offset != c.k_offset),
        ("left padding", lambda c: c.padding_side == "left"),
        ("varlen", lambda c: c.entry == "varlen"),
        ("kvcache", lambda c: c.entry == "kvcache"),
    ):
        assert any(moved(c) for c in failed), (what, [(c.id, by_id[c.id].status) for c in cases if moved(c)])
    plain = [c for c in cases if c.sync == "none_front" and not c.q_offset and not c.k_offset and c.entry == "attention"
             and c.q_lengths is None and c.k_lengths is None and not c.bias]  # fmt: skip
    assert plain and all(by_id[c.id].status == "pass" for c in plain), [
        (c.id, by_id[c.id].message) for c in plain
    ]
    good = run_all(Certifier("reference", seed=5, framework="numpy"), cases)
    assert all(r.status == "pass" for r in good), [(r.id, r.status, r.message) for r in good]


class DenseFloat64Alibi(IndexAlibi):
    """ALiBi on SPEC's positions (dense requests), as one float64 bias −slope·|P − R|: right until
    the term is ~1e9 (SPEC §11's edge offsets), where float64 loses the logits' differences."""

    name = "t_dense_alibi"

    def _term(self, req, slopes):
        from attnhub.positions import axis_affine

        (nq,), (nk,) = req.seq_q, req.seq_k
        aq, bq, ak, bk = axis_affine(nq, nk, req.sync)
        pq = aq * np.arange(nq) + bq + req.q_offset
        pk = ak * np.arange(nk) + bk + req.k_offset
        return -slopes[:, :, None, None] * np.abs(pq[:, None] - pk[None, :])


def test_certify_fails_a_float64_alibi_term_at_the_edge_offsets():
    """The oracle (and the reference) split the term into a row constant and the rest, exactly;
    a float64 term of 1e9 is off by ~1e-7, which certify's float64 tolerance (1e-10) catches."""
    cases = [c for c in alibi_full_cases("float64") if c.q_offset or c.k_offset]
    edge = [c for c in cases if abs(c.q_offset - c.k_offset) > 2**29]
    assert edge and len(cases) > len(edge)
    with plugged_in(DenseFloat64Alibi()):
        results = {r.id: r for r in run_all(Certifier("t_dense_alibi", seed=7, framework="numpy"), cases)}
    assert all(results[c.id].status == "FAIL" for c in edge), [(c.id, results[c.id].status) for c in edge]
    assert all(results[c.id].status == "pass" for c in cases if c not in edge)
    good = run_all(Certifier("reference", seed=7, framework="numpy"), cases)
    assert all(r.status == "pass" for r in good), [(r.id, r.message) for r in good]
