"""SPEC §9-§12 through the public API on the reference: values and gradients against a dense
float64 torch formula written here, and the bad input of §12."""

from __future__ import annotations

import numpy as np
import pytest

import attnhub
from attnhub import SpecError

torch = pytest.importorskip("torch")


def dense(q, k, v, *, causal=False, window=None, bias=None, softcap=None, sinks=None, qpos=None, kpos=None):
    """Attention of one problem (B, H, Lq, D) from positions, in float64 torch (autograd-able)."""
    lq, lk = q.shape[2], k.shape[2]
    qpos = torch.arange(lq) if qpos is None else qpos
    kpos = torch.arange(lk) if kpos is None else kpos
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    keep = torch.ones(lq, lk, dtype=torch.bool)
    d = qpos[:, None] - kpos[None, :]
    if causal:
        keep &= d >= 0
    if window is not None:
        keep &= d.abs() < window
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    if sinks is not None:
        p = p[..., :-1]
    return p @ v, lse


def rand(*shape, grad=True, seed=[0]):  # noqa: B006 - a counter across calls
    seed[0] += 1
    g = torch.Generator().manual_seed(seed[0])
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)


def close(a, b):
    return torch.allclose(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("rule", ["full", "causal", "local"])
@pytest.mark.parametrize("bias_shape", [None, (1, 4, 6, 9), (2, 1, 1, 9), (9,)])
def test_modifiers_match_the_dense_formula(softcap, rule, bias_shape):
    q, k, v = rand(2, 4, 6, 8), rand(2, 2, 9, 8), rand(2, 2, 9, 8)
    q.data *= 4  # large logits: softcap saturates
    bias = None if bias_shape is None else rand(*bias_shape)
    sinks = rand(4)
    mask = {"full": None, "causal": "causal", "local": attnhub.Local(3, causal=True)}[rule]
    out, lse = attnhub.attention(
        q, k, v, mask=mask, sync="none_end", bias=bias, softcap=softcap, sinks=sinks, return_lse=True
    )
    pos = torch.arange(6) + 3  # none_end: queries at the end
    want, wlse = dense(
        q, k, v, causal=rule != "full", window=3 if rule == "local" else None, bias=bias,
        softcap=softcap, sinks=sinks, qpos=pos,
    )  # fmt: skip
    assert close(out, want) and close(lse, wlse)
    inputs = [x for x in (q, k, v, bias, sinks) if x is not None]
    dout = torch.randn_like(out)
    got = torch.autograd.grad((out * dout).sum(), inputs)
    ref = torch.autograd.grad((want * dout).sum(), inputs)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and close(g, r)


def test_fully_masked_rows_with_sinks_give_zero_and_the_sink():
    q, k, v = rand(1, 2, 4, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)
    sinks = rand(2)
    bias = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    bias[..., 1, :] = float("-inf")  # row 1 attends nothing
    out, lse = attnhub.attention(q, k, v, bias=bias, sinks=sinks, return_lse=True)
    assert torch.all(out[:, :, 1] == 0) and close(lse[0, :, 1], sinks.detach())
    # lse is differentiable (the reference declares "dlse"): on that row lse = sinks[h], so d/dsinks = 1
    (ds,) = torch.autograd.grad(lse[0, :, 1].sum(), sinks)
    assert torch.equal(ds, torch.ones_like(ds))


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("sync", ["none_front", "none_end", "scale_end"])
def test_lengths_are_the_valid_segments(side, sync):
    q, k, v = rand(3, 2, 6, 8), rand(3, 2, 7, 8), rand(3, 2, 7, 8)
    ql, kl = [6, 2, 0], [7, 3, 1]
    out, lse = attnhub.attention(
        q, k, v, mask="causal", sync=sync, q_lengths=ql, k_lengths=torch.tensor(kl), padding_side=side,
        return_lse=True,
    )  # fmt: skip
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad((out * dout).sum(), (q, k, v))
    for b in range(3):
        qs, ks = (6 - ql[b], 7 - kl[b]) if side == "left" else (0, 0)
        rows, cols = slice(qs, qs + ql[b]), slice(ks, ks + kl[b])
        pad_q = torch.ones(6, dtype=torch.bool)
        pad_q[rows] = False
        assert torch.all(out[b][:, pad_q] == 0) and torch.all(torch.isneginf(lse[b][:, pad_q]))
        assert torch.all(dq[b][:, pad_q] == 0)
        pad_k = torch.ones(7, dtype=torch.bool)
        pad_k[cols] = False
        assert torch.all(dk[b][:, pad_k] == 0) and torch.all(dv[b][:, pad_k] == 0)
        if ql[b] == 0:
            continue
        sub = attnhub.attention(q[b : b + 1, :, rows], k[b : b + 1, :, cols], v[b : b + 1, :, cols],
                                mask="causal", sync=sync)  # fmt: skip
        assert close(out[b : b + 1, :, rows], sub)


def test_offsets_give_the_block_of_the_larger_problem():
    q, k, v = rand(1, 2, 16, 8), rand(1, 2, 16, 8), rand(1, 2, 16, 8)
    for mask in ("causal", attnhub.Local(4, causal=True), attnhub.Local(3)):
        whole, wl = attnhub.attention(q, k, v, mask=mask, return_lse=True)
        part, pl = attnhub.attention(q[:, :, 8:12], k[:, :, 4:], v[:, :, 4:], mask=mask, q_offset=8, k_offset=4,
                                     return_lse=True)  # fmt: skip
        # keys 0..3 are outside every window/causal reach of rows 8..11 only for the local rules
        if not isinstance(mask, str):
            assert close(part, whole[:, :, 8:12]) and close(pl, wl[:, :, 8:12])


def test_varlen_equals_per_sequence_calls_and_kvcache_equals_lengths():
    lens_q, lens_k = [3, 0, 5], [4, 2, 6]
    cq = torch.tensor(np.cumsum([0, *lens_q]), dtype=torch.int32)
    ck = torch.tensor(np.cumsum([0, *lens_k]), dtype=torch.int32)
    q, k, v = rand(8, 4, 8), rand(12, 2, 8), rand(12, 2, 8)
    out, lse = attnhub.attention_varlen(q, k, v, cq, ck, mask="causal", sync="none_end", return_lse=True)
    assert out.shape == (8, 4, 8) and lse.shape == (4, 8)
    for n in range(3):
        a, b, c, d = cq[n], cq[n + 1], ck[n], ck[n + 1]
        if a == b:
            continue
        want = attnhub.attention(*(x.transpose(0, 1)[None] for x in (q[a:b], k[c:d], v[c:d])), mask="causal",
                                 sync="none_end")  # fmt: skip
        assert close(out[a:b].transpose(0, 1), want[0])
    kl = torch.tensor([5, 9], dtype=torch.int32)
    qc, kc, vc = rand(2, 4, 2, 8), rand(2, 2, 12, 8), rand(2, 2, 12, 8)
    got = attnhub.attention_kvcache(qc, kc, vc, kl, softcap=3.0)
    want = attnhub.attention(qc, kc, vc, mask="causal", sync="none_end", k_lengths=kl, softcap=3.0)
    assert close(got, want)


def test_paged_cache_equals_the_contiguous_one():
    b, hkv, bs, blocks, d = 2, 2, 4, 3, 8
    kc, vc = rand(b, hkv, bs * blocks, d, grad=False), rand(b, hkv, bs * blocks, d, grad=False)
    q = rand(b, 4, 3, d, grad=False)
    kl = torch.tensor([6, 12], dtype=torch.int32)
    table = torch.randperm(b * blocks).view(b, blocks).to(torch.int32)
    kp, vp = (
        torch.zeros(b * blocks, bs, hkv, d, dtype=torch.float64),
        torch.zeros(b * blocks, bs, hkv, d, dtype=torch.float64),
    )
    for i in range(b):
        for j in range(blocks):
            kp[table[i, j]] = kc[i, :, j * bs : (j + 1) * bs].transpose(0, 1)
            vp[table[i, j]] = vc[i, :, j * bs : (j + 1) * bs].transpose(0, 1)
    got = attnhub.attention_kvcache(q, kp, vp, kl, block_table=table)
    assert close(got, attnhub.attention_kvcache(q, kc, vc, kl))


def test_numpy_tf_and_jax_inputs_reach_the_same_reference_values():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)) for _ in range(3))
    bias, sinks = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal(2)
    want = attnhub.attention(q, k, v, mask="causal", bias=bias, sinks=sinks, softcap=4.0, q_lengths=[4],
                             backend="reference")  # fmt: skip
    jnp = pytest.importorskip("jax.numpy")
    got = attnhub.attention(*(jnp.asarray(x) for x in (q, k, v)), mask="causal", bias=jnp.asarray(bias),
                            sinks=jnp.asarray(sinks), softcap=4.0, q_lengths=[4], backend="reference")  # fmt: skip
    assert np.allclose(np.asarray(got), want, atol=1e-6)


BAD = [
    ({"softcap": 0.0}, "softcap"),
    ({"softcap": float("inf")}, "softcap"),
    ({"softcap": True}, "softcap"),
    ({"sinks": "x"}, "sinks"),
    ({"q_lengths": [1, 2]}, "q_lengths.shape"),
    ({"k_lengths": [9]}, "k_lengths"),
    ({"k_lengths": [-1]}, "k_lengths"),
    ({"q_lengths": [1.5]}, "q_lengths"),
    ({"q_lengths": np.array([1.0])}, "q_lengths.dtype"),
    ({"padding_side": "top"}, "padding_side"),
    ({"q_offset": 1, "sync": "none_end"}, "sync"),
    ({"q_offset": 1.0}, "q_offset"),
    ({"k_offset": True}, "k_offset"),
]


@pytest.mark.parametrize("kw,name", BAD)
def test_bad_input_is_a_spec_error_naming_the_argument(kw, name):
    q = np.zeros((1, 2, 4, 8)) + 0.5
    with pytest.raises(SpecError, match=name.replace(".", r"\.")):
        attnhub.attention(q, q, q, **kw)


def test_bad_bias_and_sinks_and_cu_seqlens():
    q = np.ones((1, 2, 4, 8))
    with pytest.raises(SpecError, match="bias.shape"):
        attnhub.attention(q, q, q, bias=np.zeros((3, 4)))
    with pytest.raises(SpecError, match="bias.dtype"):
        attnhub.attention(q.astype(np.float32), q.astype(np.float32), q.astype(np.float32), bias=np.zeros(4))
    with pytest.raises(SpecError, match="sinks.shape"):
        attnhub.attention(q, q, q, sinks=np.zeros(3))
    with pytest.raises(SpecError, match="mask"):
        attnhub.attention(q, q, q, mask=np.zeros((4, 4)), bias=np.zeros((4, 4)))
    with pytest.raises(SpecError, match="q_lengths"):
        attnhub.attention(np.ones((1, 2, 2, 2, 8)), np.ones((1, 2, 2, 2, 8)), np.ones((1, 2, 2, 2, 8)),
                          q_lengths=[1])  # fmt: skip
    t = np.ones((6, 2, 8))
    for cu, what in (
        (np.array([0, 3, 6], dtype=np.int64), "dtype"),
        ([0, 3, 6], "int32"),
        (np.array([1, 3, 6], dtype=np.int32), "starting at 0"),
        (np.array([0, 4, 3, 6], dtype=np.int32), "non-decreasing"),
        (np.array([0, 3, 5], dtype=np.int32), "ending"),
    ):
        with pytest.raises(SpecError, match=what):
            attnhub.attention_varlen(t, t, t, cu, np.array([0, 3, 6], dtype=np.int32))
    with pytest.raises(SpecError, match="block_table"):
        attnhub.attention_kvcache(np.ones((1, 2, 1, 8)), np.ones((4, 2, 2, 8)), np.ones((4, 2, 2, 8)), [3],
                                  block_table=np.array([[0, 7]], dtype=np.int32))  # fmt: skip


def test_inputs_are_unchanged():
    q, k, v = (rand(2, 2, 5, 8, grad=False) for _ in range(3))
    bias, sinks = rand(1, 2, 5, 5, grad=False), rand(2, grad=False)
    kl = torch.tensor([3, 5], dtype=torch.int32)
    before = [x.clone() for x in (q, k, v, bias, sinks, kl)]
    attnhub.attention(q, k, v, bias=bias, sinks=sinks, k_lengths=kl, softcap=2.0)
    for a, b in zip((q, k, v, bias, sinks, kl), before):
        assert torch.equal(a, b)


def test_lengths_with_a_bias_and_its_gradient():
    q, k, v = rand(2, 2, 5, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8)
    bias = rand(1, 2, 5, 6)
    kl = [6, 4]
    out = attnhub.attention(q, k, v, bias=bias, k_lengths=kl, softcap=3.0)
    keymask = torch.arange(6)[None, :] < torch.tensor(kl)[:, None]  # (B, Lk)
    masked = bias + torch.where(keymask, 0.0, float("-inf"))[:, None, None, :]
    want, _ = dense(q, k, v, bias=masked, softcap=3.0)
    assert close(out, want)
    dout = torch.randn_like(out)
    got = torch.autograd.grad((out * dout).sum(), (q, k, v, bias))
    ref = torch.autograd.grad((want * dout).sum(), (q, k, v, bias))
    for g, r in zip(got, ref):
        assert close(g, r)


def test_a_key_broadcast_bias_with_offsets_and_a_window():
    """A bias of one key column (Nk broadcast) on blocks whose first attended key is not 0."""
    q, k, v = rand(2, 2, 9, 8), rand(2, 2, 10, 8), rand(2, 2, 10, 8)
    bias = rand(1, 1, 9, 1)
    rule = attnhub.Local(4, causal=True)
    got = attnhub.attention(q, k, v, bias=bias, mask=rule, q_offset=7, k_offset=2)
    want = attnhub.attention(q, k, v, bias=bias.expand(1, 1, 9, 10), mask=rule, q_offset=7, k_offset=2)
    assert close(got, want)
    g1 = torch.autograd.grad(got.sum(), bias)[0]
    g2 = torch.autograd.grad(want.sum(), bias)[0]
    assert close(g1, g2)


def test_trusted_lengths_are_not_read_and_are_clamped(monkeypatch):
    """ATTNHUB_TRUST_LENGTHS=1: length arrays are not read on the host (no SpecError; a Python list,
    free to read, is still checked) and out-of-range lengths act as clamped to [0, L], never
    reading outside the arrays."""
    q, k, v = rand(2, 2, 5, 8, grad=False), rand(2, 2, 6, 8, grad=False), rand(2, 2, 6, 8, grad=False)
    bad = torch.tensor([9, -2], dtype=torch.int32)
    with pytest.raises(SpecError, match="k_lengths"):
        attnhub.attention(q, k, v, k_lengths=bad)
    monkeypatch.setenv("ATTNHUB_TRUST_LENGTHS", "1")
    with pytest.raises(SpecError, match="k_lengths"):
        attnhub.attention(q, k, v, k_lengths=[9, -2])
    for side in ("right", "left"):
        got = attnhub.attention(q, k, v, mask="causal", sync="none_end", k_lengths=bad, padding_side=side)
        want = attnhub.attention(q, k, v, mask="causal", sync="none_end", k_lengths=[6, 0], padding_side=side)
        assert torch.equal(got, want)
