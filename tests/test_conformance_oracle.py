"""The suite's SPEC §9-§11 oracle against a second reading: per segment, in torch float64 autograd.

The oracle (attnhub_conformance.oracle) builds one dense keep mask and differentiates by hand; here
each batch entry's (or packed sequence's) valid segment is sliced out, its rule evaluated pair by
pair (tests/brute.py) with the offsets added, the sink joined as an extra logit column, and torch
autograd gives dq, dk, dv, dbias and dsinks.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnhub.rules import Causal, Full, Local
from attnhub_conformance import oracle
from attnhub_conformance.cases import Case
from attnhub_conformance.modifier_cases import alibi_full_cases, full_cases, kvcache, quick_cases, varlen
from attnhub_conformance.modifier_data import make_mod_data, to_blocks
from tests.brute import position

torch = pytest.importorskip("torch")


def _attended(rule, sync, lq, lk, i, j, qo, ko) -> bool:
    p = position(i, lq, lk, sync, True) + qo
    r = position(j, lq, lk, sync, False) + ko
    if isinstance(rule, Full):
        return True
    if isinstance(rule, Causal):
        return p >= r
    s = 2**rule.log2_stride
    delta = abs(p - r)
    ok = delta % s == 0 and delta // s < rule.window
    return ok and (not rule.causal or p >= r)


def second_reading(case: Case, d, scale: float):
    """(out, lse, grads by name) from per-segment torch float64 autograd."""
    t = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)  # noqa: E731
    q, k, v = t(d.q), t(d.k), t(d.v)
    bias = None if d.bias is None else t(d.bias)
    sinks = None if d.sinks is None else t(d.sinks)
    batch, hq, nq = d.q.shape[:3]
    g = hq // d.k.shape[1]
    out = torch.zeros(batch, hq, nq, d.v.shape[-1], dtype=torch.float64)
    lse = torch.full((batch, hq, nq), float("-inf"), dtype=torch.float64)
    rule = Full() if isinstance(case.rule, str) else case.rule
    full_bias = None if bias is None else bias.expand(batch, hq, nq, d.k.shape[2])
    outs, lses = {}, {}
    for b, segs in enumerate(oracle.segments(case)):
        for rows, cols in segs:
            lq, lk = len(rows), len(cols)
            for h in range(hq):
                if lq == 0:
                    continue
                qs = q[b, h, rows]
                ks, vs = k[b, h // g, cols], v[b, h // g, cols]
                s = scale * qs @ ks.T
                if case.softcap is not None:
                    s = case.softcap * torch.tanh(s / case.softcap)
                if full_bias is not None:
                    s = s + full_bias[b, h][rows][:, cols]
                shift = 0.0
                if d.alibi is not None:  # SPEC §9: − slope·|P − R| on the segment's positions, less
                    # the row's value at its nearest key (exact integers), which lse adds back: at
                    # SPEC §11's edge offsets the term is ~1e9, where float64 loses the differences
                    slopes = d.alibi.reshape(-1, hq)
                    slope = float(slopes[min(b, slopes.shape[0] - 1), h])
                    dist = torch.tensor(
                        [[abs(position(i, lq, lk, case.sync, True) + case.q_offset
                              - position(j, lq, lk, case.sync, False) - case.k_offset) for j in range(lk)]
                         for i in range(lq)], dtype=torch.int64,
                    ).reshape(lq, lk)  # fmt: skip
                    near = (
                        dist.min(dim=1, keepdim=True).values if lk else torch.zeros(lq, 1, dtype=torch.int64)
                    )
                    s = s - slope * (dist - near).to(torch.float64)
                    shift = -slope * near[:, 0].to(torch.float64)
                keep = torch.tensor(
                    [[_attended(rule, case.sync, lq, lk, i, j, case.q_offset, case.k_offset) for j in range(lk)]
                     for i in range(lq)], dtype=torch.bool,
                ).reshape(lq, lk)  # fmt: skip
                if d.mask is not None:
                    mb = d.mask[min(b, d.mask.shape[0] - 1), min(h, d.mask.shape[1] - 1)]
                    keep = keep & torch.tensor(mb[np.ix_(rows, cols)])
                s = torch.where(keep, s, torch.tensor(float("-inf"), dtype=torch.float64))
                if sinks is not None:  # (its logit against the logits less ALiBi's row constant)
                    s = torch.cat([s, (sinks[h] - shift).expand(lq).reshape(lq, 1)], dim=1)
                    vs = torch.cat([vs, torch.zeros(1, vs.shape[1], dtype=torch.float64)])
                m = torch.logsumexp(s, dim=1)
                p = torch.where(torch.isfinite(m)[:, None], torch.exp(s - m[:, None]), torch.zeros_like(s))
                outs[(b, h, tuple(rows))] = p @ vs
                lses[(b, h, tuple(rows))] = m + shift
    for (b, h, rows), o in outs.items():
        out = out.index_put((torch.tensor(b), torch.tensor(h), torch.tensor(rows, dtype=torch.long)), o)
        lse = lse.index_put(
            (torch.tensor(b), torch.tensor(h), torch.tensor(rows, dtype=torch.long)), lses[(b, h, rows)]
        )
    wrt = {"dq": q, "dk": k, "dv": v}
    if bias is not None:
        wrt["dbias"] = bias
    if sinks is not None:
        wrt["dsinks"] = sinks
    grads = torch.autograd.grad(out, list(wrt.values()), torch.tensor(d.dout), allow_unused=True)
    named = {n: (np.zeros(x.shape) if gr is None else gr.numpy()) for (n, x), gr in zip(wrt.items(), grads)}
    return out.detach().numpy(), lse.detach().numpy(), named


CASES = [
    *(c for c in quick_cases("float64") if not (c.alibi and c.ndim > 1)),  # (2-d ALiBi: a SpecError)
    *alibi_full_cases("float64")[1::6],  # every sync mode and rule, ragged entries, offsets
    Case("float64", (7,), (9,), Causal(), "scale_end", bias="b11k", softcap=5.0, sinks=True, grad=True,
         bias_grad=True, q_lengths=(7, 3), k_lengths=(2, 9), padding_side="left", large_logits=True),
    Case("float64", (5,), (8,), Local(2, 1, causal=True), q_offset=4, k_offset=1, bias="1hqk", sinks=True,
         grad=True, bias_grad=True),
    varlen("float64", Local(2), "none_end", (2, 4, 0), (5, 0, 3), sinks=True, softcap=30.0, grad=True),
    kvcache("float64", Local(3, causal=True), 2, 32, (9, 32), paged=16, sinks=True),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_oracle_matches_a_per_segment_autograd_reading(case):
    d = make_mod_data(case, np.random.default_rng(3))
    scale = case.scale or 1 / np.sqrt(case.dim_qk)
    p = d.problem(case, scale)
    out, lse = oracle.forward(p)
    out2, lse2, grads = second_reading(case, d, scale)
    np.testing.assert_allclose(out, out2, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse2))
    fin = np.isfinite(lse2)
    np.testing.assert_allclose(lse[fin], lse2[fin], rtol=1e-10, atol=1e-12)
    g, mag = oracle.backward(p, d.dout)
    for name, want in grads.items():
        got = getattr(g, name)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11, err_msg=name)
        assert np.all(getattr(mag, name) >= np.abs(got) - 1e-12), name


def test_padded_rows_have_no_sink_and_masked_rows_do():
    case = Case("float64", (4,), (4,), Causal(), "none_end", q_lengths=(2, 4), k_lengths=(0, 4), sinks=True)
    d = make_mod_data(case, np.random.default_rng(0))
    p = d.problem(case, 0.5)
    out, lse = oracle.forward(p)
    assert np.all(np.isneginf(lse[0, :, 2:]))  # padded rows (right padding: rows 0, 1 valid)
    np.testing.assert_array_equal(lse[0, :, :2], np.broadcast_to(d.sinks[:, None], (2, 2)))  # no keys: sink
    assert not out[0].any()


def test_paged_blocks_hold_the_logical_cache_in_table_order():
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 4))
    table = np.array([[5, 1], [0, 3]], dtype=np.int32)
    blocks = to_blocks(x, 16, table, 6)
    for b in range(2):
        for j in range(32):
            np.testing.assert_array_equal(blocks[table[b, j // 16], j % 16], x[b, :, j])
    assert np.isnan(blocks[[2, 4]]).all()


def test_paged_cache_gradients_are_the_oracles_placed_by_the_table():
    """dk, dv of the cache blocks by torch autograd through the table's gather equal the oracle's
    logical gradients placed in the blocks (zero in blocks no entry names), whatever the NaN there."""
    from attnhub_conformance.modifier_runner import in_cache_form

    case = kvcache("float64", Local(3, causal=True), 3, 48, (20, 33), paged=16, heads_q=4, heads_kv=2, grad=True,
                   nan_padding=True)  # fmt: skip
    d = make_mod_data(case, np.random.default_rng(4))
    scale = 1 / np.sqrt(case.dim_qk)
    p = d.problem(case, scale)
    kb, vb = (torch.tensor(x, requires_grad=True) for x in (d.k_blocks, d.v_blocks))
    j = np.arange(case.nk)
    blocks, rows = d.block_table[:, j // case.paged], j % case.paged  # (B, L) each
    k, v = (x[blocks, rows].permute(0, 2, 1, 3).repeat_interleave(2, dim=1) for x in (kb, vb))
    s = scale * torch.tensor(d.q) @ k.transpose(-1, -2)
    s = torch.where(torch.tensor(np.broadcast_to(p.keep, s.shape)), s, torch.tensor(float("-inf")))
    prob = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    out = prob @ torch.where(torch.isnan(v), torch.zeros_like(v), v)
    dkb, dvb = torch.autograd.grad(out, [kb, vb], torch.tensor(d.dout))
    want = in_cache_form(oracle.backward(p, d.dout)[0], case, d)
    np.testing.assert_allclose(want.dk, dkb.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(want.dv, dvb.numpy(), rtol=1e-9, atol=1e-11)
    spare = np.setdiff1d(np.arange(d.k_blocks.shape[0]), d.block_table)
    assert spare.size and not want.dk[spare].any() and not want.dv[spare].any()


def _check_constraints(c: Case) -> None:
    ragged = c.q_lengths is not None or c.k_lengths is not None or c.entry != "attention"
    if ragged or c.q_offset or c.k_offset:
        assert c.ndim == 1, c.id
    if c.q_offset or c.k_offset:
        assert c.sync == "none_front", c.id
    if c.entry == "kvcache":
        assert c.sync == "none_end" and len(c.k_lengths) == c.batch, c.id
        assert not c.paged or c.nk % c.paged == 0, c.id
    if c.entry == "varlen":
        assert not c.bias and c.batch == 1 and c.nq == sum(c.seqlens_q), c.id
    for n, lens in ((c.nq, c.q_lengths), (c.nk, c.k_lengths)):
        assert lens is None or (len(lens) == c.batch and all(0 <= x <= n for x in lens)), c.id


def test_randomised_modifier_cases_respect_the_spec_constraints():
    import hypothesis
    import hypothesis.strategies as st
    from hypothesis import HealthCheck, Phase, settings

    from attnhub_conformance.suite import modifier_fields, random_case, random_fields

    seen = set()

    @hypothesis.seed(0)
    @settings(max_examples=150, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @hypothesis.given(fields=random_fields(("float32", "float16"), True), data=st.data())
    def check(fields, data):
        c = random_case(data.draw(modifier_fields(fields)))
        _check_constraints(c)
        seen.update(c.features)

    check()
    assert {
        "bias",
        "softcap",
        "sinks",
        "q_lengths",
        "padding left",
        "offsets",
        "varlen",
        "kvcache paged",
    } <= seen


def test_full_modifier_cases_respect_the_spec_constraints():
    for c in full_cases("float32"):
        _check_constraints(c)
