"""flash-attention-ipu's API on attnhub: flash_attention_qkv_packed, chunk selection, auto-patching."""

from __future__ import annotations

import importlib
import math
import sys

import pytest
import torch

import attnhub
from attnhub.ipu import choose_num_chunks, flash_attention_qkv_packed
from attnhub_backends.ipu.plan import choose_chunks
from tests.test_ipu_helpers import TOL, assert_close, emulate, fresh_dispatch

_fresh = pytest.fixture(autouse=True)(fresh_dispatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("chunks", [(1, 1), (4, 4), (8, 2), (2, 8), None], ids=str)
def test_qkv_packed_matches_attention_causal_scale_one(rng, dtype, chunks):
    n, seq_len, d = 3, 128, 16
    # q already scaled, as flash-attention-ipu expects: D**-0.5 folded in, plus large-logit rows.
    qkv = torch.tensor(rng.standard_normal((3, n, seq_len, d)), dtype=torch.float32)
    qkv[0] *= d**-0.5
    qkv[0, 0] *= 8
    qkv = qkv.to(dtype).requires_grad_()
    out = flash_attention_qkv_packed(qkv, *chunks) if chunks else flash_attention_qkv_packed(qkv)
    assert out.shape == (n, seq_len, d) and out.dtype == dtype
    # The same function through attnhub's public API, on the float64 reference.
    leaf = qkv.detach().double().requires_grad_()
    ref = attnhub.attention(*(x.unsqueeze(0) for x in leaf), mask="causal", scale=1.0, backend="reference")[0]
    tol_f, tol_g = TOL[dtype]
    assert_close(out, ref, tol_f, "out")
    dout = torch.randn(n, seq_len, d, dtype=torch.float64)
    (g,) = torch.autograd.grad(out, qkv, dout.to(dtype))
    (rg,) = torch.autograd.grad(ref, leaf, dout)
    assert_close(g, rg, tol_g, "dqkv")


def test_qkv_packed_equals_attnhub_attention_on_the_ipu_backend(rng, monkeypatch):
    """Bitwise: the packed entry point and attention(mask='causal', scale=1.0) run the same graph."""
    emulate(monkeypatch)
    qkv = torch.tensor(rng.standard_normal((3, 2, 96, 32)), dtype=torch.float32)
    cq, ck = choose_chunks(96, 96, 32)
    out = flash_attention_qkv_packed(qkv, cq, ck)
    via_api = attnhub.attention(*(x.unsqueeze(0) for x in qkv), mask="causal", scale=1.0, backend="ipu")[0]
    assert torch.equal(out, via_api)


def test_qkv_packed_validation():
    qkv = torch.randn(3, 2, 12, 4)
    with pytest.raises(ValueError, match="4 dimensions"):
        flash_attention_qkv_packed(qkv[0], 1, 1)
    with pytest.raises(ValueError, match="size 3 at dimension 0"):
        flash_attention_qkv_packed(qkv[:2], 1, 1)
    with pytest.raises(ValueError, match="divisible by num_chunks_q"):
        flash_attention_qkv_packed(qkv, 5, 1)
    with pytest.raises(ValueError, match="divisible by num_chunks_kv"):
        flash_attention_qkv_packed(qkv, 1, 7)
    with pytest.raises(ValueError, match="float16 and float32"):
        flash_attention_qkv_packed(qkv.double(), 1, 1)


@pytest.mark.parametrize(
    "seq_len, head_dim", [(256, 128), (1024, 128), (4096, 128), (16384, 128), (2048, 64)]
)
def test_chunk_choice_follows_flash_attention_ipu_for_powers_of_two(seq_len, head_dim):
    r = max(seq_len, head_dim) // head_dim
    expected = (2 ** math.ceil(math.log2(r) / 2), 2 ** math.floor(math.log2(r) / 2))
    assert choose_num_chunks(seq_len, head_dim) == expected


@pytest.mark.parametrize(
    "lq, lk, d",
    [(100, 100, 16), (1000, 37, 64), (37, 1000, 64), (5000, 5000, 8), (3, 3, 128), (777, 333, 20)],
)
def test_chunk_choice_keeps_tiles_within_the_memory_model(lq, lk, d):
    cq, ck = choose_chunks(lq, lk, d)
    assert 1 <= cq <= min(lq, 64) and 1 <= ck <= min(lk, 64)
    tile = math.ceil(lq / cq) * math.ceil(lk / ck)
    if cq < min(lq, 64) and ck < min(lk, 64):  # not capped: the budget holds (up to rounding up)
        assert tile <= max(lq, lk) * d + lq + lk


def test_import_auto_patches_sdpa():
    import attnhub.torch as at

    at.unpatch_sdpa()
    original = torch.nn.functional.scaled_dot_product_attention
    sys.modules.pop("attnhub.ipu.auto", None)
    try:
        importlib.import_module("attnhub.ipu.auto")
        assert at.is_patched()
        assert torch.nn.functional.scaled_dot_product_attention is not original
    finally:
        at.unpatch_sdpa()
    assert torch.nn.functional.scaled_dot_product_attention is original
