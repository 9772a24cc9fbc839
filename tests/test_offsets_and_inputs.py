"""SPEC §10-§12 validation: positions that would wrap, arrays without values, mixed frameworks.

Positions (SPEC §11-§12) must lie in [-2**30, 2**30) so that the difference of two fits int32: the
requests at the edges are checked against a brute-force float64 reading of SPEC §2-§4 and §11
written here with Python ints (which cannot wrap); one past the edges is a SpecError before any
backend runs. Meta tensors (no values) and ``cu_seqlens``/``block_table`` of another framework
than q's are SpecErrors naming the argument; lengths stay lenient (SPEC §10).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnhub
from attnhub import Causal, Local, SpecError

LIMIT = 2**30
F64_TOL = 1e-10  # SPEC §6, float64 forward


def attended(rule, p: int, r: int) -> bool:
    """SPEC §3 for one (query, key) pair of 1-d positions, in Python ints."""
    if isinstance(rule, Causal):
        return p >= r
    delta, s = abs(p - r), 2**rule.log2_stride
    keep = delta % s == 0 and delta // s < rule.window
    return keep and (not rule.causal or p >= r)


def brute(q, k, v, rule, q_offset: int, k_offset: int):
    """(out, lse) of SPEC §4 with positions P(i) = i + q_offset, R(j) = j + k_offset (SPEC §11)."""
    b, h, lq, d = q.shape
    lk = k.shape[2]
    keep = np.array([[attended(rule, i + q_offset, j + k_offset) for j in range(lk)] for i in range(lq)])
    out = np.zeros((b, h, lq, v.shape[-1]))
    lse = np.full((b, h, lq), -np.inf)
    for bi in range(b):
        for hi in range(h):
            s = q[bi, hi] @ k[bi, hi].T / math.sqrt(d)
            for i in range(lq):
                cols = np.flatnonzero(keep[i])
                if cols.size == 0:
                    continue
                top = s[i, cols].max()
                w = np.exp(s[i, cols] - top)
                out[bi, hi, i] = (w / w.sum()) @ v[bi, hi, cols]
                lse[bi, hi, i] = top + math.log(w.sum())
    return out, lse


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), "fully masked rows differ"
    denom = np.linalg.norm(want[finite]) or 1.0
    return float(np.linalg.norm(got[finite] - want[finite]) / denom)


def inputs(rng, lq=5, lk=7, d=8):
    q = rng.standard_normal((1, 2, lq, d))
    k = rng.standard_normal((1, 2, lk, d))
    v = rng.standard_normal((1, 2, lk, d))
    return q, k, v


LQ, LK = 5, 7
EDGE_CASES = [
    # both at the top edge, aligned: causal attends a staircase
    (Causal(), LIMIT - LQ, LIMIT - LK),
    # queries at the top edge, keys at the bottom edge: P - R = 2**31 - 1 - ... fits int32 exactly
    (Local(3), LIMIT - LQ, -LIMIT),
    (Local(2**31, causal=True), LIMIT - LQ, -LIMIT),  # every pair within the window and causal
    (Local(2**31 - 6, causal=True), LIMIT - LQ, -LIMIT),  # the window's bound cuts through the block
    (Causal(), -LIMIT, LIMIT - LK),  # every key after every query: fully masked rows
    (Local(2, log2_stride=1), -LIMIT, -LIMIT + 1),  # the bottom edge, a strided window
    (Local(3, causal=True), -LIMIT + 2, -LIMIT),
]


def _backend_call(backend: str, q, k, v, **kw):
    """attention on float64 arrays of the backend's framework, results back as NumPy."""
    if backend == "reference":
        return attnhub.attention(q, k, v, backend=backend, return_lse=True, **kw)
    if backend == "sdpa-cpu":
        out, lse = attnhub.attention(
            *(torch.from_numpy(x) for x in (q, k, v)), backend=backend, return_lse=True, **kw
        )
        return out.numpy(), lse.numpy()
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        out, lse = attnhub.attention(
            *(jax.numpy.asarray(x) for x in (q, k, v)), backend=backend, return_lse=True, **kw
        )
        return np.asarray(out), np.asarray(lse)


@pytest.mark.parametrize("backend", ["reference", "sdpa-cpu", "jax"])
@pytest.mark.parametrize(("rule", "q_offset", "k_offset"), EDGE_CASES)
def test_offsets_at_the_edges_against_brute_force(rng, backend, rule, q_offset, k_offset):
    q, k, v = inputs(rng, LQ, LK)
    want_out, want_lse = brute(q, k, v, rule, q_offset, k_offset)
    out, lse = _backend_call(backend, q, k, v, mask=rule, q_offset=q_offset, k_offset=k_offset)
    assert rel_err(out, want_out) < F64_TOL
    assert rel_err(lse, want_lse) < F64_TOL


def test_edge_cases_are_not_trivial():
    """The edge cases cover attended, partly attended and fully masked blocks (the tests above
    could not tell a wrapped mask from a right one otherwise)."""
    kinds = set()
    for rule, qo, ko in EDGE_CASES:
        keep = [[attended(rule, i + qo, j + ko) for j in range(LK)] for i in range(LQ)]
        flat = [x for row in keep for x in row]
        kinds.add("all" if all(flat) else "none" if not any(flat) else "some")
    assert kinds == {"all", "none", "some"}


def expect(argument: str, call, *, contains: str = "") -> SpecError:
    with pytest.raises(SpecError) as info:
        call()
    assert info.value.argument == argument, str(info.value)
    assert contains in str(info.value), str(info.value)
    return info.value


PAST_EDGE = [
    ("q_offset", {"q_offset": LIMIT - LQ + 1}),
    ("q_offset", {"q_offset": -LIMIT - 1}),
    ("k_offset", {"k_offset": LIMIT - LK + 1}),
    ("k_offset", {"k_offset": -LIMIT - 1}),
    ("q_offset", {"q_offset": 2**31 - 2}),  # jax wrapped this in int32 (relative error 0.84)
    ("q_offset", {"q_offset": 2**62, "k_offset": -(2**62)}),  # |P - R| wrapped in int64
    ("k_offset", {"k_offset": -(2**62)}),
    ("q_offset", {"q_offset": 2**70}),  # OverflowError from NumPy, as a BackendError
    ("k_offset", {"k_offset": -(2**70)}),
    ("q_offset", {"q_offset": np.int64(LIMIT)}),
    ("k_offset", {"k_offset": np.int32(-(2**31))}),
]


@pytest.mark.parametrize(("argument", "kw"), PAST_EDGE)
@pytest.mark.parametrize("mask", ["causal", Local(3)])
def test_offsets_past_the_edges_are_spec_errors(rng, argument, kw, mask):
    q, k, v = inputs(rng, LQ, LK)
    copies = [x.copy() for x in (q, k, v)]
    err = expect(argument, lambda: attnhub.attention(q, k, v, mask=mask, **kw), contains="2**30")
    assert str(kw[argument]) in str(err)
    assert all(np.array_equal(a, b) for a, b in zip(copies, (q, k, v), strict=True))


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_offsets_past_the_edges_in_every_framework(rng, framework):
    """The check is the core's: no backend of any framework sees such a request."""
    q, k, v = inputs(rng, LQ, LK)
    if framework == "torch":
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    else:
        jnp = pytest.importorskip("jax.numpy")
        q, k, v = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
    expect("q_offset", lambda: attnhub.attention(q, k, v, mask="causal", q_offset=2**31 - 2))
    expect("k_offset", lambda: attnhub.attention(q, k, v, mask=Local(3), k_offset=-(2**62)))


def test_numpy_int_offsets_at_the_edge_are_ints(rng):
    q, k, v = inputs(rng, LQ, LK)
    want = attnhub.attention(q, k, v, mask=Local(3), q_offset=LIMIT - LQ, k_offset=-LIMIT)
    got = attnhub.attention(q, k, v, mask=Local(3), q_offset=np.int64(LIMIT - LQ), k_offset=np.int32(-LIMIT))
    assert np.array_equal(got, want)


def test_torch_zero_dim_offsets_stay_rejected(rng):
    """A 0-d tensor was never an int offset (SPEC §12: ints); it is still a SpecError."""
    q, k, v = inputs(rng, LQ, LK)
    expect("q_offset", lambda: attnhub.attention(q, k, v, q_offset=torch.tensor(3)))


def _free(shape):
    """A float64 NumPy array of ``shape`` holding one element (zero strides): only validated."""
    return np.lib.stride_tricks.as_strided(np.ones(1), shape, (0,) * len(shape))


def test_sequences_longer_than_the_position_range_are_spec_errors():
    small = _free((1, 1, 4, 1))
    long = _free((1, 1, LIMIT + 1, 1))
    expect("sequence length of q", lambda: attnhub.attention(long, small, small), contains="2**30")
    expect("sequence length of k", lambda: attnhub.attention(small, long, long, sync="none_end"))
    edge = _free((1, 1, LIMIT, 1))
    expect("q_offset", lambda: attnhub.attention(edge, small, small, q_offset=1))


def test_a_2d_grid_beyond_the_position_range_is_a_spec_error():
    """2-d: the flat index of SPEC §2 (what Causal compares) must stay in range too."""
    side = 2**15
    x = _free((1, 1, side + 1, side, 1))
    expect("sequence shapes of q/k", lambda: attnhub.attention(x, x, x, mask="causal"), contains="2**30")


def test_a_paged_cache_beyond_the_position_range_is_a_spec_error():
    """The full padded length (max_blocks * block_size) counts, as the kernels index it."""
    bs, blocks = 2**20, 2**10 + 1
    cache = _free((2, bs, 1, 1))
    table = np.zeros((1, blocks), np.int32)
    q = np.ones((1, 1, 1, 1))
    call = lambda: attnhub.attention_kvcache(q, cache, cache, [3], block_table=table)  # noqa: E731
    expect("sequence length of k", call)


# --- arrays whose values cannot be read (torch meta tensors) -------------------------------------


def _meta(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, device="meta")


def test_meta_lengths_are_spec_errors(rng):
    q, k, v = (torch.from_numpy(x) for x in inputs(rng, 4, 6))
    lens = torch.tensor([3])
    for name in ("q_lengths", "k_lengths"):
        expect(name, lambda name=name: attnhub.attention(q, k, v, **{name: _meta(lens)}), contains="meta")
    qm, km, vm = (_meta(x) for x in (q, k, v))
    expect("k_lengths", lambda: attnhub.attention(qm, km, vm, k_lengths=_meta(lens)), contains="meta")


def test_meta_cu_seqlens_are_spec_errors():
    t = torch.randn(6, 2, 8, dtype=torch.float64)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    expect("cu_seqlens_q", lambda: attnhub.attention_varlen(t, t, t, _meta(cu), cu), contains="meta")
    expect("cu_seqlens_k", lambda: attnhub.attention_varlen(t, t, t, cu, _meta(cu)), contains="meta")


def test_meta_block_table_and_kvcache_lengths_are_spec_errors():
    q = torch.randn(2, 2, 1, 8, dtype=torch.float64)
    cache = torch.randn(4, 4, 2, 8, dtype=torch.float64)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([3, 8], dtype=torch.int32)
    paged = attnhub.attention_kvcache
    expect("block_table", lambda: paged(q, cache, cache, lens, block_table=_meta(table)), contains="meta")
    expect("k_lengths", lambda: paged(q, cache, cache, _meta(lens), block_table=table), contains="meta")
    dense = torch.randn(2, 2, 8, 8, dtype=torch.float64)
    expect("k_lengths", lambda: paged(q, dense, dense, _meta(lens)), contains="meta")


def test_meta_lengths_are_rejected_when_lengths_are_trusted(rng, monkeypatch):
    """ATTNHUB_TRUST_LENGTHS skips reading values, but a meta tensor has none to pass on either."""
    monkeypatch.setenv("ATTNHUB_TRUST_LENGTHS", "1")
    q, k, v = (torch.from_numpy(x) for x in inputs(rng, 4, 6))
    expect("k_lengths", lambda: attnhub.attention(q, k, v, k_lengths=_meta(torch.tensor([3]))))


# --- cu_seqlens and block tables of q's framework (SPEC §10, §12) ----------------------------------


def _packed(rng):
    q, k, v = rng.standard_normal((6, 2, 8)), rng.standard_normal((9, 2, 8)), rng.standard_normal((9, 2, 8))
    return q, k, v, np.array([0, 2, 6], np.int32), np.array([0, 4, 9], np.int32)


def test_cu_seqlens_of_another_framework_are_spec_errors(rng):
    q, k, v, cq, ck = _packed(rng)
    tcq, tck = torch.from_numpy(cq), torch.from_numpy(ck)
    expect("cu_seqlens_q", lambda: attnhub.attention_varlen(q, k, v, tcq, ck), contains="torch")
    expect("cu_seqlens_k", lambda: attnhub.attention_varlen(q, k, v, cq, tck), contains="torch")
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    expect("cu_seqlens_q", lambda: attnhub.attention_varlen(tq, tk, tv, cq, tck), contains="numpy")
    expect("cu_seqlens_k", lambda: attnhub.attention_varlen(tq, tk, tv, tcq, ck), contains="numpy")
    # the same arrays in q's framework are served
    want = attnhub.attention_varlen(q, k, v, cq, ck)
    assert np.allclose(attnhub.attention_varlen(tq, tk, tv, tcq, tck).numpy(), want, rtol=0, atol=1e-12)


def test_cu_seqlens_of_another_framework_with_jax(rng):
    jnp = pytest.importorskip("jax.numpy")
    q, k, v, cq, ck = _packed(rng)
    jq, jk, jv = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
    expect(
        "cu_seqlens_q", lambda: attnhub.attention_varlen(jq, jk, jv, cq, jnp.asarray(ck)), contains="numpy"
    )
    expect("cu_seqlens_q", lambda: attnhub.attention_varlen(q, k, v, jnp.asarray(cq), ck), contains="jax")


def test_block_table_of_another_framework_is_a_spec_error(rng):
    q = rng.standard_normal((1, 2, 1, 8))
    cache = rng.standard_normal((4, 4, 2, 8))
    table = np.array([[2, 0]], np.int32)
    call = attnhub.attention_kvcache
    expect(
        "block_table",
        lambda: call(q, cache, cache, [5], block_table=torch.from_numpy(table)),
        contains="torch",
    )
    tq, tc = torch.from_numpy(q), torch.from_numpy(cache)
    expect("block_table", lambda: call(tq, tc, tc, [5], block_table=table), contains="numpy")


def test_lengths_of_any_framework_stay_accepted(rng):
    """SPEC §10: q_lengths/k_lengths are host-side lengths, of any framework or a sequence."""
    q, k, v = inputs(rng, 4, 6)
    want = attnhub.attention(q, k, v, k_lengths=np.array([3]))
    for lens in ([3], torch.tensor([3]), torch.tensor([3], dtype=torch.int32)):
        assert np.array_equal(attnhub.attention(q, k, v, k_lengths=lens), want)
    table = np.array([[2, 0]], np.int32)
    cache = rng.standard_normal((4, 4, 2, 8))
    qd = rng.standard_normal((1, 2, 1, 8))
    want = attnhub.attention_kvcache(qd, cache, cache, [5], block_table=table)
    got = attnhub.attention_kvcache(qd, cache, cache, torch.tensor([5]), block_table=table)
    assert np.array_equal(got, want)


@pytest.mark.gpu
def test_cpu_cu_seqlens_and_block_table_with_cuda_q_are_served():
    """torch: any device (today's behaviour: copied to q's device once per tensor version)."""
    rng = np.random.default_rng(3)
    q, k, v, cq, ck = _packed(rng)
    want = attnhub.attention_varlen(q, k, v, cq, ck)
    cuda = [torch.from_numpy(x).float().cuda() for x in (q, k, v)]
    got = attnhub.attention_varlen(*cuda, torch.from_numpy(cq), torch.from_numpy(ck))
    assert rel_err(got.double().cpu().numpy(), want) < 2e-5 * 10  # float32, tf32 off


# --- messages --------------------------------------------------------------------------------------


def test_bias_dtype_message_names_float32_once(rng):
    q, k, v = (x.astype(np.float32) for x in inputs(rng, 4, 6))
    bias = np.ones((1, 1, 4, 6), np.float16)
    err = expect("bias.dtype", lambda: attnhub.attention(q, k, v, bias=bias))
    assert err.expected == "float32 (the dtype of q)", str(err)
    q64, k64, v64 = inputs(rng, 4, 6)
    err = expect("bias.dtype", lambda: attnhub.attention(q64, k64, v64, bias=bias))
    assert err.expected == "float32 or float64 (the dtype of q)", str(err)
    err = expect("sinks.dtype", lambda: attnhub.attention(q, k, v, sinks=np.ones(2, np.float16)))
    assert err.expected == "float32 (the dtype of q)", str(err)


# --- the reference's own arithmetic ----------------------------------------------------------------


def test_reference_refuses_positions_out_of_range_given_directly(rng):
    """A request that skipped the core's validation (a backend called directly, as the
    conformance suite does) never makes the oracle wrap: |P - R| of 2**63 wrapped in int64 and
    attended keys Local(3) masks."""
    import dataclasses

    from attnhub.registry import REGISTRY
    from attnhub.request import build_request

    q, k, v = inputs(rng, LQ, LK)
    req, _ = build_request(q, k, v, Local(3), "none_front", None, "bhsd", True)
    far = dataclasses.replace(req, q_offset=2**62, k_offset=-(2**62))
    reference = REGISTRY.backends()["reference"]
    with pytest.raises(SpecError) as info:
        reference.forward(q, k, v, far)
    assert info.value.argument == "q_offset"
    edge = dataclasses.replace(req, q_offset=LIMIT - LQ, k_offset=-LIMIT)
    out, lse = reference.forward(q, k, v, edge)
    assert rel_err(out, brute(q, k, v, Local(3), LIMIT - LQ, -LIMIT)[0]) < F64_TOL


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_reference_keeps_a_non_finite_value_at_an_excluded_key_out(rng, value):
    """SPEC §4 for the oracle: a NaN/Inf in v reaches exactly the rows attending its key; rows that
    exclude the key (causal rule, or a −inf bias) stay finite and equal attention without it."""
    q, k, v = inputs(rng, 6, 6)
    poisoned = v.copy()
    poisoned[0, 1, 3, 2] = value
    out = attnhub.attention(q, k, poisoned, mask="causal", backend="reference")
    want, _ = brute(q, k, v, Causal(), 0, 0)
    finite = np.ones((6, 8), bool)
    finite[3:, 2] = False  # the rows attending key 3, in the poisoned value column
    assert np.array_equal(np.isfinite(out[0, 1]), finite)
    assert np.isfinite(out[1:]).all() and np.isfinite(out[:, 0]).all()
    assert rel_err(out[0, 1, :3], want[0, 1, :3]) < F64_TOL
    bias = np.zeros((1, 1, 6, 6))
    bias[..., 3] = -np.inf  # no row attends key 3
    out = attnhub.attention(q, k, poisoned, bias=bias, backend="reference")
    assert np.isfinite(out).all()
    want_full, _ = brute(q, np.delete(k, 3, axis=2), np.delete(v, 3, axis=2), Local(2**31), 0, 0)
    assert rel_err(out, want_full) < F64_TOL
