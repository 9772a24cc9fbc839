"""sdpa-cpu with SPEC §9-§11 arguments that an attention mask expresses: bias (and its gradient),
q/k lengths on both padding sides, offsets, composed with rules, sync modes and boolean masks;
out, lse and every gradient against the float64 reference on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnhub  # noqa: E402
from attnhub import Local  # noqa: E402

pytestmark = pytest.mark.usefixtures("sdpa_registered")

#: (forward, gradient) relative error bounds per dtype (SPEC §6's rule, as test_sdpa_backends).
TOL = {"float64": (1e-10, 1e-9), "float32": (2e-5, 1e-4), "bfloat16": (1.6e-2, 4e-2)}
B, H, L, D = 3, 4, 24, 16


def _rel(got, want):
    got, want = got.detach().double(), want.detach().double()
    both_inf = torch.isinf(got) & torch.isinf(want) & (torch.sign(got) == torch.sign(want))
    diff = torch.where(both_inf, 0.0, got - want)
    assert not torch.isnan(diff).any(), "NaN where the reference has a value"
    return diff.abs().max().item() / (want[torch.isfinite(want)].abs().max().item() or 1.0)


def _case(dtype, seed, bias_shape=None, bias_grad=False, logit_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for _ in range(3))
    q = q * logit_scale  # large logits: peaked rows
    q, k, v = (x.to(dt).requires_grad_(True) for x in (q, k, v))
    bias = None
    if bias_shape is not None:
        bias = (3 * torch.randn(*bias_shape, generator=g, dtype=torch.float64)).to(dt)
        bias.requires_grad_(bias_grad)
    return q, k, v, bias


def _run(backend, q, k, v, bias, kw):
    """out, lse and the gradients of (q, k, v[, bias]) for one upstream gradient."""
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    b = None
    if bias is not None:
        b = bias.detach().clone().requires_grad_(bias.requires_grad)
        if backend == "reference":
            b = b.double().detach().requires_grad_(bias.requires_grad)
    if backend == "reference":
        leaves = [x.double().detach().requires_grad_(True) for x in leaves]
    out, lse = attnhub.attention(*leaves, bias=b, backend=backend, return_lse=True, **kw)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    out.backward(dout.to(out.dtype))
    grads = [x.grad for x in leaves] + ([b.grad] if b is not None and b.requires_grad else [])
    return out, lse, grads


LENGTHS = {"q_lengths": torch.tensor([10, 24, 0]), "k_lengths": torch.tensor([7, 24, 5])}

_CASES = [
    (dict(mask="causal", **LENGTHS), None, "lengths-causal"),
    (dict(mask="causal", padding_side="left", **LENGTHS), None, "left-causal"),
    (dict(mask="causal", sync="none_end", padding_side="left", **LENGTHS), None, "left-none_end"),
    (dict(mask=Local(3, causal=True), sync="scale_end", **LENGTHS), None, "lengths-local-scale_end"),
    (dict(mask=None, k_lengths=torch.tensor([1, 24, 13])), None, "k_lengths-only"),
    (dict(mask="causal", q_offset=5, k_offset=2), None, "offsets-causal"),
    (dict(mask=Local(4), q_offset=7), None, "offsets-local"),
    (dict(mask="causal"), (1, H, L, L), "bias-causal"),
    (dict(mask=None), (B, 1, L, L), "bias-full"),
    (dict(mask="causal", sync="none_end", padding_side="left", **LENGTHS), (1, H, 1, L), "bias-lengths"),
    (dict(mask=Local(5), q_offset=3), (1, 1, L, L), "bias-offsets-local"),
]


#: Each case without its bias's gradient, and the ones with a bias with it too (dbias).
CASES = [
    pytest.param(kw, shape, grad, id=name + ("-dbias" if grad else ""))
    for kw, shape, name in _CASES
    for grad in ((False, True) if shape is not None else (False,))
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("kw, bias_shape, bias_grad", CASES)
def test_against_reference(kw, bias_shape, bias_grad, dtype):
    fwd, bwd = TOL[dtype]
    q, k, v, bias = _case(dtype, seed=len(str(kw)) + len(dtype), bias_shape=bias_shape, bias_grad=bias_grad)
    kept = [x.detach().clone() for x in (q, k, v)] + ([bias.detach().clone()] if bias is not None else [])
    assert attnhub.explain(q, k, v, bias=bias, **kw).chosen == "sdpa-cpu"
    out, lse, grads = _run("sdpa-cpu", q, k, v, bias, kw)
    want, want_lse, want_grads = _run("reference", q, k, v, bias, kw)
    assert out.dtype == q.dtype and out.shape == want.shape
    assert _rel(out, want) < fwd
    assert _rel(lse, want_lse) < max(fwd, 1e-6)
    assert len(grads) == len(want_grads) == 3 + bias_grad
    for got, ref in zip(grads, want_grads):
        assert got.shape == ref.shape and got.dtype == (bias if got is grads[-1] and bias_grad else q).dtype
        assert _rel(got, ref) < bwd
    # the caller's arrays are untouched
    for before, now in zip(kept, [q, k, v] + ([bias] if bias is not None else [])):
        assert torch.equal(before, now.detach())


def test_padded_rows_and_entries_are_zero_with_zero_gradients():
    q, k, v, _ = _case("float32", seed=3)
    kw = dict(mask="causal", padding_side="left", **LENGTHS)
    out, lse, grads = _run("sdpa-cpu", q, k, v, None, kw)
    ql, kl = LENGTHS["q_lengths"], LENGTHS["k_lengths"]
    for b in range(B):
        pad_q, pad_k = L - int(ql[b]), L - int(kl[b])
        assert torch.all(out[b, :, :pad_q] == 0) and torch.all(lse[b, :, :pad_q] == float("-inf"))
        assert torch.all(grads[0][b, :, :pad_q] == 0)  # dq of padded queries
        assert torch.all(grads[1][b, :, :pad_k] == 0) and torch.all(grads[2][b, :, :pad_k] == 0)
    assert torch.all(out[2] == 0)  # an entry with no queries at all
    for side in ("left", "right"):  # without autograd the rows are zeroed in place: same values
        kw["padding_side"] = side
        with torch.no_grad():
            plain = attnhub.attention(q, k, v, backend="sdpa-cpu", **kw)
        assert torch.equal(plain, attnhub.attention(q, k, v, backend="sdpa-cpu", **kw).detach())
        want = attnhub.attention(*(x.detach().double() for x in (q, k, v)), backend="reference", **kw)
        assert _rel(plain, want) < 2e-5


def test_large_logits_with_bias_gradient():
    """Peaked rows (logits of several hundred) with a bias that requires grad (the math kernel)."""
    q, k, v, bias = _case("float32", seed=11, bias_shape=(1, H, L, L), bias_grad=True, logit_scale=30.0)
    kw = dict(mask="causal", **LENGTHS)
    out, lse, grads = _run("sdpa-cpu", q, k, v, bias, kw)
    want, want_lse, want_grads = _run("reference", q, k, v, bias, kw)
    assert _rel(out, want) < 2e-5 and _rel(lse, want_lse) < 1e-6
    for got, ref in zip(grads, want_grads):
        assert _rel(got, ref) < 1e-4


def test_bool_mask_with_lengths_and_bias():
    q, k, v, bias = _case("float64", seed=5, bias_shape=(B, H, L, L), bias_grad=True)
    keep = torch.rand(B, 1, L, L, generator=torch.Generator().manual_seed(2)) > 0.3
    kw = dict(mask=keep, **LENGTHS)
    out, lse, grads = _run("sdpa-cpu", q, k, v, bias, kw)
    ref = [x.double().detach().requires_grad_(True) for x in (q, k, v)]
    rb = bias.detach().clone().requires_grad_(True)
    want, want_lse = attnhub.attention(
        *ref, bias=rb, mask=keep, backend="reference", return_lse=True, **LENGTHS
    )
    assert _rel(out, want) < 1e-10 and _rel(lse, want_lse) < 1e-10
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    want.backward(dout)
    for got, r in zip(grads, ref + [rb]):
        assert _rel(got, r.grad) < 1e-9


def test_math_kernel_limit_is_a_decline_with_its_reason():
    from attnhub_backends.sdpa import masks

    n = 4200
    assert n * n > masks.MAX_MASK_ELEMENTS
    q, k, v = (torch.empty(1, 1, n, 8).normal_() for _ in range(3))
    bias = torch.zeros(1, 1, 1, n, requires_grad=True)
    verdict = next(
        x for x in attnhub.explain(q, k, v, mask="causal", bias=bias).verdicts if x.name == "sdpa-cpu"
    )
    assert any("math kernel" in r for r in verdict.reasons), verdict.reasons


def test_padding_form_covers_what_hugging_face_sends():
    """The cases that need no (B, 1, Nq, Nk) mask: right padding, left padding aligned at the end
    (prefill), a decode step's single query; others keep the general mask."""
    from attnhub.extras import Extras
    from attnhub.frameworks import adapter_for
    from attnhub.operands import Operands
    from attnhub.request import build_request_ex
    from attnhub_backends.sdpa.ragged import padding

    def form(nq, nk, ql, kl, sync="none_front", padding_side="right"):
        q, k = torch.zeros(len(kl), 2, nq, 8), torch.zeros(len(kl), 2, nk, 8)
        extras = Extras(q_lengths=ql, k_lengths=kl, padding_side=padding_side)
        req, _, _ = build_request_ex(q, k, k, "causal", sync, None, "bhsd", False, extras)
        ops = Operands(q_lengths=None if ql is None else torch.tensor(ql), k_lengths=torch.tensor(kl))
        assert adapter_for(q).name == "torch"
        return padding(req, ops, q)

    assert form(8, 8, [3, 8], [3, 8]).causal  # right padding
    left = form(8, 8, [3, 8], [3, 8], padding_side="left", sync="none_end")
    assert left.causal and left.q_valid[0, 0, :, 0].tolist() == [False] * 5 + [True] * 3
    decode = form(1, 8, None, [3, 8], padding_side="left", sync="none_end")
    assert not decode.causal and decode.q_valid is None
    assert decode.key_keep[0, 0, 0].tolist() == [False] * 5 + [True] * 3
    assert form(8, 8, [3, 8], [5, 8], padding_side="left") is None  # shifts differ per entry


@pytest.mark.parametrize("sync", ["none_end", "scale_end"])
def test_a_decode_step_needs_no_mask(sync):
    """One query placed after every key (a decode step): Causal excludes nothing, so no rule mask is
    built (the bound fast path serves it), and the result is still the reference's."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 8, 1, 32, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 37, 32, generator=g, dtype=torch.float64) for _ in range(2))
    backend = attnhub.REGISTRY.backends()["sdpa-cpu"]
    assert "rule mask" not in (backend.note(attnhub.explain(q, k, v, mask="causal", sync=sync).request) or "")
    got = attnhub.attention(q, k, v, mask="causal", sync=sync)
    want = attnhub.attention(*(x.numpy() for x in (q, k, v)), mask="causal", sync=sync, backend="reference")
    assert np.abs(got.numpy() - want).max() < 1e-12
    q2 = torch.randn(2, 8, 2, 32, generator=g, dtype=torch.float64)  # two queries: the mask stays
    assert "rule mask" in backend.note(attnhub.explain(q2, k, v, mask="causal", sync=sync).request)


def test_gqa_with_bias_gradient_and_lengths():
    """Hq = 4·Hkv: the fused kernel and the math kernel (enable_gqa) read kv head h // 4."""
    g = torch.Generator().manual_seed(8)
    q = torch.randn(2, 8, 20, 16, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 20, 16, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    bias = torch.randn(1, 8, 20, 20, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = dict(q_lengths=torch.tensor([5, 20]), k_lengths=torch.tensor([9, 20]), padding_side="left")
    for kw in (
        dict(bias=bias, mask="causal"),
        dict(bias=bias, mask="causal", **lengths),
        dict(mask="causal", **lengths),
    ):
        assert attnhub.explain(q, k, v, **kw).chosen == "sdpa-cpu"
        leaves = [q, k, v] + ([bias] if "bias" in kw else [])
        out, lse = attnhub.attention(q, k, v, return_lse=True, **kw)
        want, want_lse = attnhub.attention(q, k, v, return_lse=True, backend="reference", **kw)
        dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
        for a, b in zip(torch.autograd.grad(out, leaves, dout), torch.autograd.grad(want, leaves, dout)):
            assert _rel(a, b) < 1e-9
        assert _rel(out, want) < 1e-10 and _rel(lse, want_lse) < 1e-10


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize(
    "mask, sync",
    [("causal", "none_front"), ("causal", "none_end"), (None, "none_front"), (Local(3), "scale_end")],
)
def test_packed_sequences_per_sequence(mask, sync, dtype):
    """attention_varlen: each sequence a dense problem of its own (a sequence with no queries and
    one with no keys among them), GQA, against the reference with gradients."""
    fwd, bwd = TOL[dtype]
    g = torch.Generator().manual_seed(6)
    cu_q = torch.tensor([0, 5, 5, 17, 40], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 9, 9, 30], dtype=torch.int32)
    dt = getattr(torch, dtype)
    q = torch.randn(40, 8, 16, generator=g, dtype=torch.float64).to(dt).requires_grad_(True)
    k, v = (
        torch.randn(30, 2, 16, generator=g, dtype=torch.float64).to(dt).requires_grad_(True) for _ in range(2)
    )
    kw = dict(mask=mask, sync=sync, return_lse=True)
    out, lse = attnhub.attention_varlen(q, k, v, cu_q, cu_k, **kw)
    ref = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
    want, want_lse = attnhub.attention_varlen(*ref, cu_q, cu_k, backend="reference", **kw)
    assert out.dtype == dt and _rel(out, want) < fwd and _rel(lse, want_lse) < max(fwd, 1e-6)
    assert torch.all(out[5:17] == 0) and torch.all(lse[:, 5:17] == float("-inf"))  # no keys
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, [q, k, v], dout.to(dt))
    for a, b in zip(got, torch.autograd.grad(want, ref, dout)):
        assert _rel(a, b) < bwd


def test_packed_sequences_go_to_sdpa_cpu():
    q, k = torch.zeros(12, 4, 8), torch.zeros(12, 4, 8)
    cu = torch.tensor([0, 4, 12], dtype=torch.int32)
    calls = []
    backend = attnhub.REGISTRY.backends()["sdpa-cpu"]
    real = backend._packed
    try:
        backend._packed = lambda *a: calls.append(1) or real(*a)
        attnhub.attention_varlen(q, k, k, cu, cu, mask="causal")
    finally:
        del backend._packed
    assert calls == [1]
