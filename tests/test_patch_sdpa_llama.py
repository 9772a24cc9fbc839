"""A Hugging Face Llama run with ``attn_implementation="sdpa"`` under ``attnhub.torch.patch_sdpa()``:
a left-padded batch of 3 sends SDPA a 4-D mask at every layer; attnhub serves every call (no
fallback to torch) and the logits and one training step's gradients match eager (issue 22).

On the CPU (CI) in float64; on the GPU (``-m gpu``) in float32, where the masks reach the triton
backend's tile-summarised mask path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attnhub.torch import patch_sdpa, reset_sdpa_stats, sdpa_stats, unpatch_sdpa  # noqa: E402


def _llama(device: str, dtype: torch.dtype):
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager").to(device, dtype)
    ours = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa").to(device, dtype)
    ours.load_state_dict(eager.state_dict())
    return eager.eval(), ours.eval()


def _batch(device: str):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    for i in range(3):
        mask[i, : 3 * i] = 0  # row i: 3·i pad tokens on the left
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device), pos.to(device)


def _check(device: str, dtype: torch.dtype, fwd_tol: float, grad_tol: float) -> dict:
    eager, ours = _llama(device, dtype)
    ids, mask, pos = _batch(device)
    patch_sdpa()
    reset_sdpa_stats()
    try:
        got = ours(ids, attention_mask=mask, position_ids=pos).logits
        (got[mask.bool()] ** 2).sum().backward()
        stats = sdpa_stats()
    finally:
        unpatch_sdpa()
    for row in range(3):  # each sequence alone is eager's reference for a padded batch
        want = eager(ids[row : row + 1, 3 * row :]).logits[0]
        err = float((got[row, 3 * row :] - want).detach().abs().max() / want.detach().abs().max())
        assert err <= fwd_tol, (row, err)
        (want**2).sum().backward()
    floor = max(float(p.grad.abs().max()) for p in eager.parameters() if p.grad is not None) * 1e-3
    for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
        if q.grad is None:
            continue
        err = float((p.grad - q.grad).abs().max()) / max(float(q.grad.abs().max()), floor)
        assert err <= grad_tol, (name, err)
    assert stats.get("routed") == 2 and not any(k.startswith("fallback") for k in stats), stats
    return stats


def test_llama_left_padded_under_patch_sdpa_cpu():
    _check("cpu", torch.float64, 1e-10, 1e-8)


@pytest.mark.gpu
def test_llama_left_padded_under_patch_sdpa_gpu():
    torch.backends.cuda.matmul.allow_tf32 = False
    stats = _check("cuda", torch.float32, 2e-3, 1e-2)
    assert stats.get("backend:triton") == 2, stats
