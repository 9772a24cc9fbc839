"""A Llama-shaped transformers model with attn_implementation "attnhub", "sdpa" and "flex_attention".

Run (GPU): python benchmarks/hf_llama.py [--impls sdpa,attnhub,flex_attention] [--out results.json]
On the CPU: python benchmarks/hf_llama.py --cpu [--impls sdpa,attnhub,eager]
Smoke test (CPU, tiny): python benchmarks/hf_llama.py --tiny

The model: random weights (seeded, no download), 16 layers, hidden 2048, 32 query / 8 key-value
heads (head dim 64), MLP 5632, vocab 32000, bf16 (float32 with --tiny). Each implementation runs
on the same weights:
- prefill: one forward of a left-padded batch 4 x 4096 (pads 0, 512, 1024, 1536 on the left;
  ``logits_to_keep=1``, with a KV cache, as generate's first step), median of ``--reps`` after one
  warm-up; tokens/s counts valid tokens only;
- decode: greedy ``generate()`` of 256 new tokens (``min_new_tokens`` = ``max_new_tokens``) after a
  512-token prompt, at batch 8 and batch 1, one timed run after a short warm-up; tokens/s = B·256 / s
  (the prompt's prefill included, as a user sees it).
``--cpu``: 4 layers, hidden 512, 8 query / 2 key-value heads (head dim 64), float32; prefill 4 x 512,
decode of 32 tokens after a 128-token prompt. ``--tiny``: 2 layers, hidden 64, prefill 2 x 32.
For attnhub it prints the call counter (every attention call went through attnhub) and each
implementation's last-position prefill logits against sdpa's (max |e| / max |ref|).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers

import attnhub
import attnhub.integrations.transformers as ah_hf


def build(size: str, device: str) -> transformers.LlamaForCausalLM:
    if size == "tiny":
        cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=128)  # fmt: skip
    elif size == "cpu":
        cfg = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=2, vocab_size=8000)  # fmt: skip
    else:
        cfg = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=32000)  # fmt: skip
    config = transformers.LlamaConfig(**cfg, max_position_embeddings=8192, initializer_range=0.02)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if size == "full" else torch.float32
    with torch.device(device):  # initialised where it runs (a CPU init of 1B weights takes a while)
        model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.eval()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def prefill_batch(batch: int, length: int, vocab: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for b in range(batch):
        mask[b, : (length // 8) * b] = 0  # pads 0, L/8, L/4, 3L/8 on the left
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


@torch.no_grad()
def time_prefill(model, ids, mask, reps: int, device: str) -> tuple[float, torch.Tensor]:
    logits = model(ids, attention_mask=mask, logits_to_keep=1).logits  # warm-up
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        logits = model(ids, attention_mask=mask, logits_to_keep=1).logits
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), logits.float()


@torch.no_grad()
def time_generate(model, batch: int, prompt: int, new: int, vocab: int, device: str) -> float:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, vocab, (batch, prompt), generator=g).to(device)
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
    model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)  # warm-up
    sync(device)
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
    sync(device)
    assert out.shape[1] == prompt + new
    return time.perf_counter() - t0


def chosen_backends(model, ids, mask, gen_batch: int, prompt: int) -> dict[str, str]:
    """The backend attnhub's dispatch picks for this model's prefill and decode calls (a request
    only the float64 reference can serve would take hours at these sizes: not timed then)."""
    cfg = model.config
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = cfg.hidden_size // hq
    dev, dt = ids.device, model.dtype
    b, n = ids.shape
    q = torch.empty(b, hq, n, d, device=dev, dtype=dt)
    k = torch.empty(b, hkv, n, d, device=dev, dtype=dt)
    lengths = mask.sum(-1).to(torch.int32)
    pre = attnhub.explain(
        q, k, k, mask=attnhub.Causal(), sync="none_end", k_lengths=lengths, padding_side="left"
    )
    q1 = torch.empty(gen_batch, hq, 1, d, device=dev, dtype=dt)
    k1 = torch.empty(gen_batch, hkv, prompt + 1, d, device=dev, dtype=dt)
    dec = attnhub.explain(q1, k1, k1, mask=attnhub.Causal(), sync="none_end")
    return {"prefill": str(pre.chosen), "decode": str(dec.chosen)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impls", default="sdpa,attnhub,flex_attention")
    p.add_argument("--tiny", action="store_true", help="a 2-layer float32 model on the CPU (smoke test)")
    p.add_argument("--cpu", action="store_true", help="a 4-layer float32 model on the CPU")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    size = "tiny" if args.tiny else "cpu" if args.cpu else "full"
    device = "cuda" if size == "full" else "cpu"
    ah_hf.register()
    model = build(size, device)
    vocab = model.config.vocab_size
    pb, pl = {"tiny": (2, 32), "cpu": (4, 512), "full": (4, 4096)}[size]
    prompt, new = {"tiny": (16, 8), "cpu": (128, 32), "full": (512, 256)}[size]
    gen_batches = {"tiny": (2, 1), "cpu": (4, 1), "full": (8, 1)}[size]
    ids, mask = prefill_batch(pb, pl, vocab, device)
    valid = int(mask.sum())
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))  # fmt: skip
    results, ref_logits = {}, None
    for impl in args.impls.split(","):
        row: dict = {}
        try:
            if impl == "attnhub":
                row["backends"] = chosen_backends(model, ids, mask, gen_batches[0], prompt)
                if size != "tiny" and "reference" in row["backends"].values():
                    raise RuntimeError(f"only the float64 reference serves these calls: {row['backends']}")
            model.set_attn_implementation(impl)
            ah_hf.reset_stats()
            secs, logits = time_prefill(model, ids, mask, args.reps, device)
            row["prefill_tok_s"] = valid / secs
            row["prefill_ms"] = secs * 1e3
            if impl == "sdpa":
                ref_logits = logits
            row["logits"] = logits
            for b in gen_batches:
                secs = time_generate(model, b, prompt, new, vocab, device)
                row[f"decode_b{b}_tok_s"] = b * new / secs
            if impl == "attnhub":
                st = ah_hf.stats()
                row["attnhub_calls"] = st.calls
                row["attnhub_kinds"] = dict(st.kinds)
                row["attnhub_features"] = dict(st.features)
        except Exception as exc:  # report and go on with the next implementation
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        logits = row.pop("logits", None)
        if logits is not None and ref_logits is not None:
            row["logits_vs_sdpa"] = float((logits - ref_logits).abs().max() / ref_logits.abs().max())
        results[impl] = row
        print(impl, json.dumps(row, default=str), flush=True)  # each row as soon as it is measured
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
