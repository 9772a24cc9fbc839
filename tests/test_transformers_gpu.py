"""attn_implementation="attnhub" on an NVIDIA GPU, against eager and sdpa (issue 24).

Run on the device machine: ``python -m pytest -q -m gpu tests/test_transformers_gpu.py``.

Tiny random-weight models as in tests/test_transformers.py, on CUDA:
- float32 models against eager float32 (eager's float32 softmax is exact enough here), left-padded
  batches compared at valid positions, greedy generation and one training step's gradients;
  tolerance ``max|e| / max|ref| <= 2e-3`` (logits) and ``1e-2`` (gradients): SPEC §6's float32
  limits with tf32 (5e-4 / 2e-3), times 4-5 for a 2-layer model;
- a bf16 Llama-shaped model (4 layers, 512 wide) against sdpa at 1-2k tokens, padded, logits within
  ``5e-2`` (bf16's 1.6e-2 per call, times 3 for depth).
Every test asserts that each attention-module forward went through attnhub.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attnhub  # noqa: E402
import attnhub.integrations.transformers as ah_hf  # noqa: E402
from tests.test_transformers import (  # noqa: E402
    DECODERS,
    SMALL,
    CallCounter,
    _check_grads,
    _grads,
    _ids,
    _left_mask,
    _positions,
    _rel,
    t5_config,
)

pytestmark = pytest.mark.gpu
F32_TOL, F32_GRAD_TOL, BF16_TOL = 2e-3, 1e-2, 5e-2


@pytest.fixture(scope="module", autouse=True)
def _registered():
    ah_hf.register()


def _cuda_pair(name: str, dtype=torch.float32):
    model_name, config_name, attn_name, extra = DECODERS[name]
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    if extra is None:
        config = transformers.GPT2Config(
            vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, attn_pdrop=0.0, resid_pdrop=0.0,
            embd_pdrop=0.0, initializer_range=0.2,
        )  # fmt: skip
    else:
        config = getattr(transformers, config_name)(
            **SMALL, **extra, max_position_embeddings=64, initializer_range=0.2
        )
    kw = {"experts_implementation": "eager"} if name == "gpt_oss" else {}
    torch.manual_seed(0)
    cls = getattr(transformers, model_name)
    eager = cls._from_config(config, attn_implementation="eager", **kw).to("cuda", dtype).eval()
    ours = cls._from_config(config, attn_implementation="eager", **kw).to("cuda", dtype).eval()
    ours.load_state_dict(eager.state_dict())
    ours.set_attn_implementation("attnhub")
    return eager, ours, attn_name


@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_float32_cuda(name):
    eager, ours, attn_name = _cuda_pair(name)
    ids = _ids(3, 12).cuda()
    mask = _left_mask(3, 12).cuda()
    pos = _positions(mask)
    ours.zero_grad()
    with CallCounter(ours, attn_name):
        got = ours(ids, attention_mask=mask, position_ids=pos).logits
    eager.zero_grad()
    for row in range(3):  # each sequence alone: eager's reference for a padded batch
        want = eager(ids[row : row + 1, 3 * row :]).logits[0]
        assert _rel(got[row, 3 * row :], want) <= F32_TOL, row
        (want**2).sum().backward()
    (got[mask.bool()] ** 2).sum().backward()
    g_ours, g_eager = _grads(ours), _grads(eager)
    floor = max(float(g.abs().max()) for g in g_eager.values()) * 1e-3
    for n in g_eager:
        err = float((g_ours[n] - g_eager[n]).abs().max()) / max(float(g_eager[n].abs().max()), floor)
        assert err <= F32_GRAD_TOL, (n, err)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with CallCounter(ours, attn_name):
        got_tokens = ours.generate(ids, attention_mask=mask, **kw)
    for row in range(3):
        want_tokens = eager.generate(ids[row : row + 1, 3 * row :], **kw)
        assert torch.equal(got_tokens[row, 3 * row :], want_tokens[0]), row


def test_llama_bf16_cuda_against_sdpa():
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(0)
    sdpa = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    sdpa = sdpa.to("cuda", torch.bfloat16).eval()
    b, n = 3, 2048
    ids = torch.randint(3, 1000, (b, n), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones(b, n, dtype=torch.long, device="cuda")
    mask[1, :700] = 0
    mask[2, :1500] = 0
    with torch.no_grad():
        want = sdpa(ids, attention_mask=mask).logits.float()
        sdpa.set_attn_implementation("attnhub")
        with CallCounter(sdpa, "LlamaAttention"):
            got = sdpa(ids, attention_mask=mask).logits.float()
    valid = mask.bool()
    assert _rel(got[valid], want[valid]) <= BF16_TOL
    assert ah_hf.stats().features["lengths"] == 4
    # and a GPU kernel served them, not the float64 reference
    q = torch.empty(b, 8, n, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(b, 2, n, 64, device="cuda", dtype=torch.bfloat16)
    lengths = mask.sum(-1).to(torch.int32)
    ex = attnhub.explain(
        q, k, k, mask=attnhub.Causal(), sync="none_end", k_lengths=lengths, padding_side="left"
    )
    assert ex.chosen not in (None, "reference"), str(ex)


def test_t5_left_padded_cuda():
    """Issue 39: a left-padded T5 batch on the GPU (its relative position bias with the padding as
    lengths): prefill, greedy generation identical to eager, and a training step whose gradients
    (the bias's buckets included) match eager's; every attention call served by attnhub."""
    config = t5_config()
    import copy

    torch.manual_seed(0)
    eager = transformers.T5ForConditionalGeneration._from_config(
        copy.deepcopy(config), attn_implementation="eager"
    )
    eager = eager.to("cuda", torch.float32).eval()
    # built with attnhub from the start (T5's stacks keep copies of the config)
    ours = transformers.T5ForConditionalGeneration._from_config(
        copy.deepcopy(config), attn_implementation="attnhub"
    )
    ours.load_state_dict(eager.state_dict())
    ours = ours.to("cuda", torch.float32).eval()
    assert ours.config._attn_implementation == "attnhub"
    ids, mask = _ids(3, 12).cuda(), _left_mask(3, 12).cuda()
    dec = _ids(3, 6, seed=3).cuda()
    with CallCounter(ours, "T5Attention"):
        got = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    want = eager(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert _rel(got, want) <= F32_TOL
    assert ah_hf.stats().features["lengths"] > 0 and ah_hf.stats().features["bias"] > 0
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False)
    with CallCounter(ours, "T5Attention"):
        got_tokens = ours.generate(ids, **kw)
    assert torch.equal(got_tokens, eager.generate(ids, **kw))
    grads = []
    for model in (eager, ours):
        model.zero_grad()
        model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits.square().mean().backward()
        grads.append(_grads(model))
    bias_grads = [n for n in grads[1] if "relative_attention_bias" in n]
    assert bias_grads and all(grads[1][n].abs().max() > 0 for n in bias_grads)
    _check_grads(grads[1], grads[0], F32_GRAD_TOL)
