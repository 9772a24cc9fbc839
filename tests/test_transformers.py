"""attnhub as a Hugging Face transformers attention implementation, on the CPU (issue 24).

Tiny random-weight models built from configs (no downloads, seeded), in float64: each runs once with
``attn_implementation="eager"`` and once with ``"attnhub"`` from the same weights. Logits (valid
positions only, for padded batches), greedy ``generate()`` tokens and one training step's gradients
must agree, and every attention module call must have gone through attnhub (the integration's call
counter equals the number of attention-module forwards, counted by hooks).

Tolerance: the models run in float64, but transformers' eager attention computes its softmax in
float32 for most models (``softmax(..., dtype=torch.float32)``), so eager itself is only
float32-accurate: we allow ``max|e| / max|ref| <= 2e-6`` for logits and ``2e-5`` for gradients,
ten times below SPEC §6's float32 limits for one call (2e-5 / 1e-4) and far below what a wrong
mask, window, bias, sink or head mapping does (1e-2 or more at these sizes).
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attnhub  # noqa: E402
import attnhub.integrations.transformers as ah_hf  # noqa: E402

FWD_TOL = 2e-6
GRAD_TOL = 2e-5
VOCAB = 128
SMALL = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    assert ah_hf.register() == "attnhub"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


class CallCounter:
    """Counts forwards of the attention modules (by class name) with hooks."""

    def __init__(self, model: torch.nn.Module, cls_name: str):
        self.n = 0
        self.handles = [
            m.register_forward_hook(self._hook) for m in model.modules() if type(m).__name__ == cls_name
        ]
        assert self.handles, f"no {cls_name} in the model"

    def _hook(self, *_):
        self.n += 1

    def __enter__(self):
        ah_hf.reset_stats()
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        if exc[0] is None:
            assert ah_hf.stats().calls == self.n, (ah_hf.stats(), self.n)
            assert self.n > 0


def _pair(model_cls, config, seed: int = 0, **kw):
    """(eager model, attnhub model) with identical float64 weights."""
    torch.manual_seed(seed)
    eager = model_cls._from_config(config, attn_implementation="eager", **kw).to(torch.float64).eval()
    ours = copy.deepcopy(eager)
    ours.set_attn_implementation("attnhub")
    assert ours.config._attn_implementation == "attnhub"
    return eager, ours


def _ids(b: int, n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (b, n), generator=g)


def _left_mask(b: int, n: int) -> torch.Tensor:
    mask = torch.ones(b, n, dtype=torch.long)
    for i in range(b):
        mask[i, : 3 * i] = 0  # row i has 3·i pad tokens on the left
    return mask


DECODERS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", "LlamaAttention", dict(num_key_value_heads=2)),
    "mistral": (
        "MistralForCausalLM",
        "MistralConfig",
        "MistralAttention",
        dict(num_key_value_heads=2, sliding_window=4),
    ),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", "Qwen2Attention", dict(num_key_value_heads=1)),
    "gemma2": (
        "Gemma2ForCausalLM",
        "Gemma2Config",
        "Gemma2Attention",
        dict(
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=4,
            attn_logit_softcapping=2.0,
            query_pre_attn_scalar=16,
        ),
    ),
    "gpt_oss": (
        "GptOssForCausalLM",
        "GptOssConfig",
        "GptOssAttention",
        dict(
            num_key_value_heads=2, head_dim=16, sliding_window=4, num_local_experts=4, num_experts_per_tok=2
        ),
    ),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", "GPT2Attention", None),
}


def _decoder(name: str):
    model_name, config_name, attn_name, extra = DECODERS[name]
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    if extra is None:  # GPT-2's own config names
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, attn_pdrop=0.0, resid_pdrop=0.0,
            embd_pdrop=0.0, initializer_range=0.2,
        )  # fmt: skip
    else:
        config = getattr(transformers, config_name)(
            **SMALL, **extra, max_position_embeddings=64, initializer_range=0.2
        )
    kw = {"experts_implementation": "eager"} if name == "gpt_oss" else {}  # grouped_mm has no float64
    eager, ours = _pair(getattr(transformers, model_name), config, **kw)
    return eager, ours, attn_name


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch, as generate() makes them."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check_grads(got: dict, want: dict, tol: float = GRAD_TOL) -> None:
    """Per parameter, max|e| over max(max|ref|, 1e-3 · the largest gradient of the model): some
    gradients are exactly 0 in exact arithmetic (the key projection's bias) and eager leaves float32
    softmax noise there."""
    assert got.keys() == want.keys()
    floor = max(float(g.abs().max()) for g in want.values()) * 1e-3
    for n in want:
        err = float((got[n] - want[n]).abs().max()) / max(float(want[n].abs().max()), floor)
        assert err <= tol, (n, err)


@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_logits_generate_and_grads(name):
    """Unpadded batch against eager; a left-padded batch against eager on each sequence alone
    (eager cannot serve a float64 padded batch: its float32 softmax turns the fully masked pad rows
    into NaN, which reach the valid rows through zero weights); greedy generation; gradients."""
    eager, ours, attn_name = _decoder(name)
    ids = _ids(3, 12)
    # 1. unpadded logits
    with CallCounter(ours, attn_name):
        got = ours(ids).logits
    assert _rel(got, eager(ids).logits) <= FWD_TOL
    # 2. left-padded batch, valid positions against each sequence alone; then its gradients
    mask = _left_mask(3, 12)
    ours.zero_grad()
    with CallCounter(ours, attn_name):
        got = ours(ids, attention_mask=mask, position_ids=_positions(mask)).logits
    assert ah_hf.stats().kinds["dense"] == 0 and ah_hf.stats().features["lengths"] > 0
    (got[mask.bool()] ** 2).sum().backward()
    eager.zero_grad()
    for row in range(3):
        want = eager(ids[row : row + 1, 3 * row :]).logits[0]
        assert _rel(got[row, 3 * row :], want) <= FWD_TOL, row
        (want**2).sum().backward()
    _check_grads(_grads(ours), _grads(eager))
    # 3. greedy generation from the left-padded batch (KV cache: bottom-right alignment, lengths)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with CallCounter(ours, attn_name):
        got_tokens = ours.generate(ids, attention_mask=mask, **kw)
    assert ah_hf.stats().features["none_end"] > 0
    for row in range(3):
        want_tokens = eager.generate(ids[row : row + 1, 3 * row :], **kw)
        assert torch.equal(got_tokens[row, 3 * row :], want_tokens[0]), row


def test_sliding_window_masks_are_local():
    """Mistral's window w means 0 <= q - k < w: attnhub.Local(w, causal=True), no dense mask."""
    eager, ours, attn_name = _decoder("mistral")
    ids = _ids(2, 12)
    with CallCounter(ours, attn_name):
        ours(ids)
    assert ah_hf.stats().kinds == {"sliding": 2}
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    from attnhub.integrations.hf_masks import attnhub_mask

    m = attnhub_mask(1, 12, 12, mask_function=sliding_window_causal_mask_function(4))
    assert m.rule == attnhub.Local(4, causal=True) and m.kind == "sliding"
    dense = sdpa_mask(
        1, 12, 12, mask_function=sliding_window_causal_mask_function(4), allow_is_causal_skip=False
    )
    assert int(dense[0, 0, 11].sum()) == 4  # the last query sees 4 keys: 8..11


def test_vit_full_attention():
    config = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=16,
        patch_size=4, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2,
    )  # fmt: skip
    eager, ours = _pair(transformers.ViTForImageClassification, config)
    pixels = torch.randn(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with CallCounter(ours, "ViTAttention"):
        got = ours(pixels).logits
    assert _rel(got, eager(pixels).logits) <= FWD_TOL
    assert set(ah_hf.stats().kinds) == {"full"}
    for model in (eager, ours):
        model.zero_grad()
        model(pixels).logits.square().sum().backward()
    _check_grads(_grads(ours), _grads(eager))


def t5_config():
    """A tiny T5 (2 layers, 4 heads of 16, 8 relative-position buckets)."""
    return transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, dropout_rate=0.0,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        initializer_factor=4.0,
    )  # fmt: skip


def _seq2seq(kind: str):
    if kind == "t5":
        return _pair(transformers.T5ForConditionalGeneration, t5_config()), "T5Attention"
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, init_std=0.2, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip
    return _pair(transformers.BartForConditionalGeneration, config), "BartAttention"


@pytest.mark.parametrize("kind", ["t5", "bart"])
def test_encoder_decoder(kind):
    """Right-padded encoder input: padded self-attention, causal decoder, cross attention (Full),
    T5's relative position bias with its gradient."""
    (eager, ours), attn_name = _seq2seq(kind)
    ids = _ids(2, 10)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding, as seq2seq tokenizers pad
    dec = _ids(2, 6, seed=3)
    with CallCounter(ours, attn_name):
        got = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    want = eager(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert _rel(got, want) <= FWD_TOL
    assert ah_hf.stats().features["lengths"] > 0
    if kind == "t5":
        assert ah_hf.stats().features["bias"] == ah_hf.stats().calls
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False)
    with CallCounter(ours, attn_name):
        got_tokens = ours.generate(ids, **kw)
    assert torch.equal(got_tokens, eager.generate(ids, **kw))
    grads = []
    for model in (eager, ours):
        model.zero_grad()
        model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits.square().mean().backward()
        grads.append(_grads(model))
    if kind == "t5":  # the position bias's gradient reached the bucket embeddings
        bias_grads = [n for n in grads[1] if "relative_attention_bias" in n]
        assert bias_grads and all(grads[1][n].abs().max() > 0 for n in bias_grads)
    _check_grads(grads[1], grads[0])


def test_packed_sequences_position_ids_and_cu_seqlens():
    """Packed sequences in one row (position_ids restart): attnhub.attention_varlen, as eager's
    block-diagonal mask; also with flash-attention's cu_seq_lens kwargs."""
    eager, ours, attn_name = _decoder("llama")
    ids = _ids(1, 12)
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
    with CallCounter(ours, attn_name):
        got = ours(ids, position_ids=pos, use_cache=False).logits
    want = eager(ids, position_ids=pos, use_cache=False).logits
    assert _rel(got, want) <= FWD_TOL
    assert ah_hf.stats().kinds == {"packed": 2}
    assert _rel(ours(ids, use_cache=False).logits, want) > 1e-3  # packing changed the result
    # two rows packed differently: sequences over the flattened B·L tokens
    ids2, pos2 = _ids(2, 12, seed=4), torch.cat([pos, torch.tensor([[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4]])])
    with CallCounter(ours, attn_name):
        got2 = ours(ids2, position_ids=pos2, use_cache=False).logits
    assert ah_hf.stats().kinds == {"packed": 2}
    assert _rel(got2, eager(ids2, position_ids=pos2, use_cache=False).logits) <= FWD_TOL
    cu = torch.tensor([0, 5, 8, 12], dtype=torch.int32)
    fa = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5, max_length_k=5)
    with CallCounter(ours, attn_name):
        got = ours(ids, position_ids=pos, use_cache=False, **fa).logits
    assert _rel(got, want) <= FWD_TOL


def test_from_config_and_unservable_calls_raise():
    model_name, config_name, attn_name, extra = DECODERS["llama"]
    config = transformers.LlamaConfig(**SMALL, **extra, attention_dropout=0.5)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="attnhub")
    assert model.config._attn_implementation == "attnhub"
    ids = _ids(1, 6)
    with pytest.raises(ah_hf.AttnhubHFError, match="output_attentions"):
        model.eval()(ids, output_attentions=True)
    with pytest.raises(ah_hf.AttnhubHFError, match="dropout"):
        model.train()(ids)


def test_import_attnhub_loads_no_transformers():
    code = "import sys, attnhub, attnhub.integrations; print('transformers' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def _mask_cases():
    """(q_length, kv_length, q_offset, kv_offset, 2-D mask, pattern, dense expected) of the
    situations transformers creates: prefill, decode and chunks with a cache, sliding-window caches
    (kv_offset), static caches (unfilled slots at the end), right/left/both-sided padding."""
    from transformers import masking_utils as mu

    left = torch.tensor([[1] * 9, [0, 0, 0] + [1] * 6, [0] * 9]).bool()
    right = torch.tensor([[1] * 9, [1] * 5 + [0] * 4, [1] * 9]).bool()
    both = torch.tensor([[1] * 9, [0, 0] + [1] * 5 + [0, 0], [1] * 9]).bool()
    for pattern in (mu.causal_mask_function, mu.sliding_window_causal_mask_function(3)):
        yield 9, 9, 0, 0, None, pattern, False  # prefill
        yield 9, 9, 0, 0, left, pattern, False
        yield 9, 9, 0, 0, right, pattern, False
        yield 9, 9, 0, 0, both, pattern, True  # lengths cannot say it
        yield 1, 9, 8, 0, left, pattern, False  # decode
        yield 3, 9, 6, 0, left, pattern, False  # chunk
        yield 3, 5, 6, 4, left, pattern, False  # sliding cache: keys 4..8
        yield 3, 12, 6, 0, left, pattern, True  # static cache: slots 9..11 unfilled
        yield 4, 9, 2, 0, None, pattern, False  # offsets, none_front
        yield 4, 9, 2, 0, right, pattern, False
    if not hasattr(mu, "sliding_window_bidirectional_mask_function"):  # transformers 4.x
        return
    for pattern in (mu.bidirectional_mask_function, mu.sliding_window_bidirectional_mask_function(2)):
        yield 9, 9, 0, 0, right, pattern, False
        yield 9, 9, 0, 0, both, pattern, True


@pytest.mark.parametrize("case", list(range(24)))
def test_mask_descriptor_matches_transformers_dense_mask(case):
    if case >= len(list(_mask_cases())):
        pytest.skip("no bidirectional sliding windows in this transformers version")
    """attnhub with the descriptor's arguments = attnhub with transformers' own dense boolean mask
    (sdpa_mask), on every query row that attends at least one key."""
    from attnhub.integrations.hf_masks import attnhub_mask, dense_mask

    lq, lk, qo, ko, pad, fn, dense_expected = list(_mask_cases())[case]
    b = 3
    desc = attnhub_mask(b, lq, lk, qo, ko, mask_function=fn, attention_mask=pad)
    dense = dense_mask(b, lq, lk, qo, ko, fn, pad)
    assert (desc.kind == "dense") == dense_expected, desc
    g = torch.Generator().manual_seed(case)
    q, k, v = (torch.randn(b, 4, n, 8, dtype=torch.float64, generator=g) for n in (lq, lk, lk))
    kw = dict(mask=desc.rule, sync=desc.sync)
    if desc.q_offset or desc.k_offset:
        kw.update(q_offset=desc.q_offset, k_offset=desc.k_offset)
    if desc.k_lengths is not None:
        kw.update(k_lengths=desc.k_lengths, padding_side=desc.padding_side)
    got = attnhub.attention(q, k, v, **kw)
    want = attnhub.attention(q, k, v, mask=dense)
    rows = dense.any(-1, keepdim=True).expand_as(want)
    assert rows.any()
    assert torch.allclose(got[rows], want[rows], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_static_cache_generate(name):
    """A static cache: queries at a tensor offset, unfilled slots beyond the keys (right padding of
    the keys: lengths and offsets); generate() prepares these masks itself and passes them back.
    With left padding too, a full-attention layer's mask is dense (padding on both sides); a sliding
    layer's is not."""
    eager, ours, attn_name = _decoder(name)
    ids = _ids(2, 8)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, cache_implementation="static")
    with CallCounter(ours, attn_name):
        got = ours.generate(ids, **kw)
    assert ah_hf.stats().kinds["dense"] == 0
    if name == "llama":  # full-attention static layers keep every slot: keys beyond the queries
        assert ah_hf.stats().features["offsets"] > 0
    assert torch.equal(got, eager.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0))
    mask = _left_mask(2, 8)
    with CallCounter(ours, attn_name):
        got = ours.generate(ids, attention_mask=mask, **kw)
    if name == "llama":
        assert ah_hf.stats().kinds["dense"] > 0
    else:  # a sliding static layer holds the last keys only: end-aligned, left padding as lengths
        assert ah_hf.stats().kinds["dense"] == 0 and ah_hf.stats().features["lengths"] > 0
    want = eager.generate(ids[1:, 3:], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(got[1, 3:], want[0])


def test_user_4d_float_mask_is_a_bias():
    """A prepared 4-D float mask (transformers returns it untouched) is added like eager adds it."""
    eager, ours, attn_name = _decoder("llama")
    ids = _ids(2, 10)
    g = torch.Generator().manual_seed(5)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    mask4 = torch.where(causal, torch.randn(2, 1, 10, 10, dtype=torch.float64, generator=g), -1e30)
    with CallCounter(ours, attn_name):
        got = ours(ids, attention_mask=mask4).logits
    assert ah_hf.stats().kinds == {"tensor": 2} and ah_hf.stats().features["bias"] == 2
    assert _rel(got, eager(ids, attention_mask=mask4).logits) <= FWD_TOL


def test_stats_object_stays_live_across_resets():
    """``stats()`` is documented as live: an object taken before ``reset_stats()`` keeps counting."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    held = ah_hf.stats()
    ah_hf.attention_forward(None, q, k, v, None, is_causal=True)
    ah_hf.reset_stats()
    assert held.calls == 0 and not held.kinds and not held.features
    ah_hf.attention_forward(None, q, k, v, None, is_causal=True, softcap=5.0)
    assert held is ah_hf.stats()
    assert held.calls == 1 and held.kinds == {"none": 1} and held.features == {"softcap": 1}


def test_left_pad_query_rows_give_zero_as_sdpa_does():
    """docs/transformers.md: a left-pad query row (no visible key) gets attention output 0 (SPEC §4),
    so the logits there equal the ``sdpa`` implementation's and differ from eager's (a uniform
    average in float32). They matter: the last pad position's logits predict the first real token."""
    model_name, config_name, _, extra = DECODERS["llama"]
    config = getattr(transformers, config_name)(
        **SMALL, **extra, max_position_embeddings=64, initializer_range=0.2
    )
    torch.manual_seed(0)
    eager = getattr(transformers, model_name)._from_config(config, attn_implementation="eager").eval()
    ours, sdpa = copy.deepcopy(eager), copy.deepcopy(eager)
    ours.set_attn_implementation("attnhub")
    sdpa.set_attn_implementation("sdpa")
    ids, mask = _ids(2, 8), torch.ones(2, 8, dtype=torch.long)
    pads = 3
    mask[1, :pads] = 0
    attn_out = []
    hook = ours.model.layers[0].self_attn.o_proj.register_forward_pre_hook(lambda m, a: attn_out.append(a[0]))
    with torch.no_grad():
        logits = {name: m(input_ids=ids, attention_mask=mask).logits for name, m in
                  (("eager", eager), ("attnhub", ours), ("sdpa", sdpa))}  # fmt: skip
    hook.remove()
    assert torch.all(attn_out[0][1, :pads] == 0) and torch.all(attn_out[0][1, pads:] != 0)
    assert _rel(logits["attnhub"], logits["sdpa"]) <= FWD_TOL
    assert _rel(logits["attnhub"][1, pads:], logits["eager"][1, pads:]) <= FWD_TOL
    assert _rel(logits["attnhub"][1, pads - 1], logits["eager"][1, pads - 1]) > 1e-2
