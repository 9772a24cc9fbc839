"""torch.compile traces attnhub.attention and a patched SDPA into one graph (custom ops), forward
and backward, with the results of eager calls and of a float64 reference.

On the CPU the graphs run on ``aot_eager`` (inductor compiles C++ there, too slow for CI); the
GPU tests at the end use inductor.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnhub
import attnhub.torch as at
from attnhub.errors import SpecError

ORIGINAL = F.scaled_dot_product_attention


@pytest.fixture(autouse=True)
def _fresh():
    at.unpatch_sdpa()
    at.reset_sdpa_stats()
    torch._dynamo.reset()
    yield
    at.unpatch_sdpa()
    torch._dynamo.reset()


def _dense(q, k, v, keep, scale=None):
    """float64 attention with a boolean keep mask (B|1, H|1, Lq, Lk); rows with no key give 0."""
    q, k, v = (x.detach().double() for x in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * (scale or 1 / math.sqrt(q.shape[-1]))
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return p @ v, lse


def _one_graph(fn, *args):
    exp = torch._dynamo.explain(fn)(*args)
    assert exp.graph_count == 1 and exp.graph_break_count == 0, exp.break_reasons


def _qkv(shape, dtype=torch.float32, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=dtype).requires_grad_(grad) for _ in range(3)]


def _grads(fn, q, k, v):
    for x in (q, k, v):
        x.grad = None
    res = fn(q, k, v)
    out = res[0] if isinstance(res, tuple) else res
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).reshape(out.shape)
    (out * w).sum().backward()
    return res, [x.grad.clone() for x in (q, k, v)]


class Causal(torch.nn.Module):
    def forward(self, q, k, v):
        out, lse = attnhub.attention(q, k, v, mask="causal", return_lse=True)
        return out * 2.0, lse


def test_compiled_causal_with_lse_matches_eager_and_reference():
    q, k, v = _qkv((2, 3, 7, 8), seed=1)
    m = Causal()
    _one_graph(m, q, k, v)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    (out, lse), grads = _grads(compiled, q, k, v)
    (out_e, lse_e), grads_e = _grads(m, q, k, v)
    # eager may run sdpa-cpu, the compiled backward op another backend (sdpa-cpu's backward is autograd)
    torch.testing.assert_close(out, out_e, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(lse, lse_e, rtol=2e-5, atol=2e-6)
    for a, b in zip(grads, grads_e):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6)
    keep = torch.ones(7, 7, dtype=torch.bool).tril()
    ref_out, ref_lse = _dense(q, k, v, keep)
    torch.testing.assert_close(out.double() / 2, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    # The gradient of the float64 reference, through torch autograd.
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    s = (qd @ kd.transpose(-1, -2) / math.sqrt(8)).masked_fill(~keep, float("-inf"))
    ref = torch.softmax(s, -1) @ vd * 2.0
    w = torch.linspace(-1, 1, ref.numel(), dtype=ref.dtype).reshape(ref.shape)
    (ref * w).sum().backward()
    for a, b in zip(grads, (qd.grad, kd.grad, vd.grad)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)


def test_compiled_layout_local_rule_and_bool_mask_without_grad():
    q, k, v = _qkv((2, 9, 3, 8), dtype=torch.float64, grad=False, seed=2)  # bshd
    keep = torch.rand(9, 9, generator=torch.Generator().manual_seed(3)) > 0.3

    def f(q, k, v, keep):
        a = attnhub.attention(q, k, v, mask=attnhub.Local(3, causal=True), layout="bshd")
        b = attnhub.attention(q, k, v, mask=keep, layout="bshd", scale=0.5)
        return a, b

    _one_graph(f, q, k, v, keep)
    a, b = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, keep)
    ea, eb = f(q, k, v, keep)
    torch.testing.assert_close(a, ea, rtol=0, atol=0)
    torch.testing.assert_close(b, eb, rtol=0, atol=0)
    i = torch.arange(9)
    local = (i[:, None] - i[None, :] < 3) & (i[:, None] >= i[None, :])
    tr = lambda x: x.transpose(1, 2)  # noqa: E731
    torch.testing.assert_close(tr(a), _dense(tr(q), tr(k), tr(v), local)[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tr(b), _dense(tr(q), tr(k), tr(v), keep, 0.5)[0], rtol=1e-12, atol=1e-12)


def test_compiled_additive_mask_gradient_reaches_the_mask_or_is_declined():
    q, k, v = _qkv((1, 2, 5, 4), dtype=torch.float64, grad=True, seed=4)
    bias = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    f = lambda q, k, v: attnhub.attention(q, k, v, mask=bias)  # noqa: E731
    (out, grads), (out_e, grads_e) = (
        _grads(torch.compile(f, backend="aot_eager"), q, k, v),
        _grads(f, q, k, v),
    )
    torch.testing.assert_close(out, out_e, rtol=1e-10, atol=1e-12)
    for a, b in zip(grads, grads_e):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_invalid_call_raises_the_spec_error_under_compile():
    q, k, v = _qkv((1, 2, 4, 8), grad=False)
    f = lambda q, k, v: attnhub.attention(q, k, v, sync="bogus")  # noqa: E731
    with pytest.raises(SpecError):
        torch.compile(f, backend="eager")(q, k, v)


def test_op_registrations_pass_opcheck():
    q, k, v = _qkv((1, 2, 6, 4), dtype=torch.float64, seed=5)
    args = (q, k, v, None, "causal", "none_front", 0.5, [6], [6], True, "reference", True, False)
    torch.library.opcheck(torch.ops.attnhub.attention.default, args)


class SdpaModule(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sin()


def test_patched_sdpa_is_traced_into_attnhub_op():
    q, k, v = _qkv((2, 2, 6, 8), seed=6)
    want, grads_want = _grads(lambda *a: ORIGINAL(*a, is_causal=True).sin(), q, k, v)
    at.patch_sdpa()
    m = SdpaModule()
    _one_graph(m, q, k, v)
    torch._dynamo.reset()
    at.reset_sdpa_stats()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    got, grads = _grads(compiled, q, k, v)
    stats = at.sdpa_stats()
    assert stats.get("routed") == 1 and stats.get("backend:reference") == 1, stats
    assert stats.get("fallback", 0) == 0, stats
    graph = []
    torch.compile(m, fullgraph=True, backend=lambda gm, _: graph.append(gm) or gm)(q, k, v)
    assert "attnhub.attention" in str(graph[-1].code), graph[-1].code
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, grads_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_patched_sdpa_under_compile_routes_a_bias_with_grad():
    q, k, v = _qkv((1, 2, 5, 8), grad=False, seed=7)
    at.patch_sdpa()
    f = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=0.3)  # noqa: E731
    g = lambda q, k, v: F.scaled_dot_product_attention(q, k[:, :1], v[:, :1], enable_gqa=True)  # noqa: E731
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v),
                               ORIGINAL(q, k, v, scale=0.3), rtol=1e-5, atol=1e-5)  # fmt: skip
    torch.testing.assert_close(torch.compile(g, fullgraph=True, backend="aot_eager")(q, k, v),
                               ORIGINAL(q, k[:, :1], v[:, :1], enable_gqa=True), rtol=1e-5, atol=1e-5)  # fmt: skip
    assert at.sdpa_stats().get("routed") == 2, at.sdpa_stats()
    bias = torch.randn(5, 5, requires_grad=True)
    h = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # noqa: E731
    out = torch.compile(h, fullgraph=True, backend="aot_eager")(q, k, v)
    out.sum().backward()
    torch.testing.assert_close(out, ORIGINAL(q, k, v, attn_mask=bias), rtol=1e-5, atol=1e-5)
    # The float mask's gradient is computed by a backend declaring "dbias" (SPEC §9): no fallback.
    stats = at.sdpa_stats()
    assert stats.get("routed") == 3 and not any(k.startswith("fallback") for k in stats), stats
    want = bias.detach().clone().requires_grad_()
    ORIGINAL(q, k, v, attn_mask=want).sum().backward()
    torch.testing.assert_close(bias.grad, want.grad, rtol=1e-5, atol=1e-5)


# --- GPU: inductor ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_inductor_matches_eager(dtype):
    torch.manual_seed(8)
    q, k, v = (torch.randn(2, 4, 128, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    m = Causal()
    _one_graph(m, q, k, v)
    compiled = torch.compile(m, fullgraph=True)
    (out, lse), grads = _grads(compiled, q, k, v)
    (out_e, lse_e), grads_e = _grads(m, q, k, v)
    torch.testing.assert_close(out, out_e, rtol=0, atol=0)
    torch.testing.assert_close(lse, lse_e, rtol=0, atol=0)
    for a, b in zip(grads, grads_e):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
    keep = torch.ones(128, 128, dtype=torch.bool, device="cuda").tril()
    ref_out, _ = _dense(q, k, v, keep)
    torch.testing.assert_close(out.double() / 2, ref_out, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_patched_sdpa_under_inductor():
    torch.manual_seed(9)
    q, k, v = (torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    want = ORIGINAL(q, k, v, is_causal=True).sin()
    at.patch_sdpa()
    got = torch.compile(SdpaModule(), fullgraph=True)(q, k, v)
    stats = at.sdpa_stats()
    assert stats.get("routed") == 1 and stats.get("fallback", 0) == 0, stats
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
