"""attnhub as a Hugging Face transformers attention implementation.

Run: python examples/hf_transformers.py            (a tiny random Llama, CPU or GPU, no download)

With a real checkpoint, the same two lines apply:

    import attnhub.integrations.transformers as ah_hf
    ah_hf.register()
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", attn_implementation="attnhub")
"""

from __future__ import annotations

import torch
import transformers

import attnhub.integrations.transformers as ah_hf


def main() -> None:
    ah_hf.register()  # "attnhub" is now an attn_implementation
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = (
        transformers.LlamaForCausalLM._from_config(config, attn_implementation="attnhub").to(device).eval()
    )

    # A left-padded batch, as generate() wants it: attnhub gets key lengths, not a dense mask.
    ids = torch.randint(3, 256, (2, 10), device=device)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    ah_hf.reset_stats()
    tokens = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    print("attnhub tokens:", tokens[:, 10:].tolist())
    print("attention calls through attnhub:", ah_hf.stats().calls, dict(ah_hf.stats().kinds))

    model.set_attn_implementation("sdpa")  # the same weights through torch's SDPA
    same = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    print("same tokens as sdpa:", torch.equal(tokens, same))


if __name__ == "__main__":
    main()
