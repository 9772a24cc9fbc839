"""attnhub.torch.patch_sdpa: torch's SDPA routed through attnhub's dispatch, with fallbacks."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import attnhub
import attnhub.torch as at

ORIGINAL = F.scaled_dot_product_attention


@pytest.fixture(autouse=True)
def _unpatched():
    at.unpatch_sdpa()
    at.reset_sdpa_stats()
    attnhub.REGISTRY.reload()
    yield
    at.unpatch_sdpa()
    attnhub.REGISTRY.reload()
    assert F.scaled_dot_product_attention is ORIGINAL


def _close_grads(got, want):
    """Parameter gradients agree to float32 round-off, relative to the largest gradient."""
    scale = max(float(b.abs().max()) for b in want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * scale)


def _layer(seed=0):
    torch.manual_seed(seed)
    # dropout=0 and training mode: the Python path of nn.MultiheadAttention, which calls SDPA
    # (the fused eval fast path bypasses it).
    return torch.nn.TransformerEncoderLayer(
        d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
    )


def _run_layer(layer, x, **kw):
    xx = x.clone().requires_grad_()
    out = layer(xx, **kw)
    layer.zero_grad()
    out.square().sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    return out.detach(), xx.grad, grads


@pytest.mark.parametrize("case", ["plain", "causal", "padding"])
def test_transformer_encoder_layer_matches_unpatched(case):
    layer = _layer()
    x = torch.randn(3, 10, 32)
    kw = {}
    if case == "causal":
        kw = dict(src_mask=torch.nn.Transformer.generate_square_subsequent_mask(10), is_causal=True)
    elif case == "padding":
        pad = torch.zeros(3, 10, dtype=torch.bool)
        pad[1, 6:] = True
        kw = dict(src_key_padding_mask=pad)
    want = _run_layer(layer, x, **kw)
    at.patch_sdpa()
    got = _run_layer(layer, x, **kw)
    stats = at.sdpa_stats()
    # The patched path ran attnhub (once forward; backward is attnhub's autograd, not a new call).
    assert stats.get("routed") == 1 and stats.get("fallback", 0) == 0, stats
    # torch CPU tensors: sdpa-cpu where the sdpa plugin is installed, else the reference.
    assert stats.get("backend:sdpa-cpu", 0) + stats.get("backend:reference", 0) == 1, stats
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    _close_grads(got[2], want[2])


def test_transformer_layer_on_the_emulated_ipu_backend(monkeypatch):
    monkeypatch.setenv("ATTNHUB_IPU_EMULATE", "1")
    attnhub.REGISTRY.reload()
    layer = _layer(1)
    x = torch.randn(2, 24, 32)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(24)
    want = _run_layer(layer, x, src_mask=mask, is_causal=True)
    at.patch_sdpa(backend="ipu")
    got = _run_layer(layer, x, src_mask=mask, is_causal=True)
    assert at.sdpa_stats().get("backend:ipu") == 1, at.sdpa_stats()
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    _close_grads(got[2], want[2])


def _qkv(*shape_q, lk=None, hkv=None, dv=None, dtype=torch.float32):
    *lead, hq, lq, e = shape_q
    lk = lk or lq
    hkv = hkv or hq
    q = torch.randn(*lead, hq, lq, e, dtype=dtype)
    k = torch.randn(*lead, hkv, lk, e, dtype=dtype)
    v = torch.randn(*lead, hkv, lk, dv or e, dtype=dtype)
    return q, k, v


CALLS = {
    "plain": (lambda: _qkv(2, 3, 9, 8), {}),
    "causal L<S (top-left)": (lambda: _qkv(2, 3, 5, 8, lk=12), dict(is_causal=True)),
    "causal L>S (top-left)": (lambda: _qkv(2, 3, 12, 8, lk=5), dict(is_causal=True)),
    "scale": (lambda: _qkv(2, 3, 9, 8), dict(scale=0.7)),
    "gqa": (lambda: _qkv(2, 6, 9, 8, hkv=2, dv=4), dict(enable_gqa=True, is_causal=True)),
    "3-d": (lambda: _qkv(3, 7, 8, lk=11), {}),
    "5-d leading dims": (lambda: _qkv(2, 2, 3, 6, 8), dict(is_causal=True)),
    "float64": (lambda: _qkv(1, 2, 6, 4, dtype=torch.float64), {}),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_argument_mapping_matches_torch(name):
    make, kw = CALLS[name]
    torch.manual_seed(3)
    q, k, v = make()
    want = ORIGINAL(q, k, v, **kw)
    at.patch_sdpa()
    got = F.scaled_dot_product_attention(q, k, v, **kw)
    assert at.sdpa_stats().get("routed") == 1, at.sdpa_stats()
    tol = 1e-12 if q.dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["bool", "additive", "bool broadcast (L, S)", "additive per head"])
def test_attn_mask_matches_torch(kind):
    torch.manual_seed(4)
    q, k, v = _qkv(2, 3, 7, 8, lk=10)
    if kind == "bool":
        mask = torch.rand(2, 3, 7, 10) > 0.3
        mask[..., 0] = True  # no fully masked row (torch gives NaN there, attnhub 0)
    elif kind == "bool broadcast (L, S)":
        mask = torch.rand(7, 10) > 0.5
        mask[:, 2] = True
    elif kind == "additive":
        mask = torch.randn(2, 1, 7, 10)
    else:
        mask = torch.randn(1, 3, 7, 10)
    want = ORIGINAL(q, k, v, attn_mask=mask)
    at.patch_sdpa()
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert at.sdpa_stats().get("routed") == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fully_masked_row_gives_zero():
    q, k, v = _qkv(1, 1, 4, 8)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    at.patch_sdpa()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (out[0, 0, 2] == 0).all() and not torch.isnan(out).any()


@pytest.mark.parametrize(
    "why, call",
    [
        ("dropout", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)),
        ("heads", lambda q, k, v: F.scaled_dot_product_attention(q, k[:, :1], v[:, :1])),
    ],
)
def test_unservable_calls_go_to_torch(why, call):
    torch.manual_seed(5)
    q, k, v = _qkv(2, 2, 6, 4)
    at.patch_sdpa()
    with contextlib.suppress(RuntimeError):  # torch's own verdict (heads mismatch without enable_gqa)
        call(q, k, v)
    stats = at.sdpa_stats()
    assert stats.get("routed", 0) == 0 and stats.get(f"fallback:{why}") == 1, stats


def test_mask_and_is_causal_together_go_to_torch():
    torch.manual_seed(6)
    q, k, v = _qkv(1, 2, 6, 8)
    mask = torch.rand(6, 6) > 0.3
    try:
        want = ORIGINAL(q, k, v, attn_mask=mask, is_causal=True)
    except RuntimeError:  # torch versions that reject the combination
        want = None
    at.patch_sdpa()
    if want is None:
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    else:
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert at.sdpa_stats().get("fallback:attn_mask with is_causal") == 1


def test_no_backend_falls_back_to_torch(monkeypatch):
    monkeypatch.setenv("ATTNHUB_DISABLE", ",".join(r.name for r in attnhub.backends()))
    q, k, v = _qkv(1, 2, 5, 8)
    want = ORIGINAL(q, k, v)
    at.patch_sdpa()
    got = F.scaled_dot_product_attention(q, k, v)
    assert at.sdpa_stats().get("fallback:NoBackendError") == 1
    torch.testing.assert_close(got, want, rtol=0, atol=0)


class _SdpaCallingBackend(attnhub.Backend):
    """A backend that itself calls torch's SDPA: the patch must not route that call back to attnhub."""

    name = "sdpa-caller-test"
    priority = 10_000
    vendor = True  # it runs torch's SDPA: first in the prior's order for plain requests too
    frameworks = ("torch",)
    calls = 0

    def forward(self, q, k, v, req, mask=None, operands=None):
        type(self).calls += 1
        out = F.scaled_dot_product_attention(q, k, v, scale=req.scale)
        return out, torch.zeros(q.shape[:-1])


class _Plugin:
    @attnhub.hookimpl
    def attnhub_backends(self):
        return [_SdpaCallingBackend()]


def test_backend_calling_sdpa_is_not_rerouted():
    plugin = _Plugin()
    attnhub.REGISTRY.register_plugin(plugin)
    try:
        attnhub.REGISTRY.reload()
        q, k, v = _qkv(1, 2, 5, 8)
        at.patch_sdpa()
        out = F.scaled_dot_product_attention(q, k, v)
        assert _SdpaCallingBackend.calls == 1
        stats = at.sdpa_stats()
        assert stats.get("backend:sdpa-caller-test") == 1 and stats.get("fallback:reentrant") == 1, stats
        torch.testing.assert_close(out, ORIGINAL(q, k, v))
    finally:
        attnhub.REGISTRY.unregister_plugin(plugin)
        attnhub.REGISTRY.reload()


def test_patch_is_idempotent_and_unpatch_restores():
    at.patch_sdpa()
    patched = F.scaled_dot_product_attention
    at.patch_sdpa()
    assert F.scaled_dot_product_attention is patched and at.is_patched()
    at.unpatch_sdpa()
    assert F.scaled_dot_product_attention is ORIGINAL and not at.is_patched()
    at.unpatch_sdpa()
    assert F.scaled_dot_product_attention is ORIGINAL
