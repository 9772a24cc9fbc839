"""Kernel time of one padded prefill of benchmarks/hf_llama.py's model, per kernel name (issue 24):
how much of the forward is attention, for attn_implementation "attnhub" and "sdpa".

    python tools/dev/hf_prefill_profile.py
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import hf_llama  # noqa: E402

import attnhub.integrations.transformers as ah_hf  # noqa: E402


@torch.no_grad()
def main() -> None:
    ah_hf.register()
    model = hf_llama.build("full", "cuda")  # bfloat16, as benchmarks/hf_llama.py runs it
    ids, mask = hf_llama.prefill_batch(4, 4096, model.config.vocab_size, "cuda")
    for impl in ("attnhub", "sdpa"):
        model.set_attn_implementation(impl)
        for _ in range(2):
            model(ids, attention_mask=mask, logits_to_keep=1)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(ids, attention_mask=mask, logits_to_keep=1)
            torch.cuda.synchronize()
        per: dict = defaultdict(lambda: [0.0, 0])
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name[:80]][0] += ev.device_time / 1e3
                per[ev.name[:80]][1] += 1
        total = sum(t for t, _ in per.values())
        print(f"== {impl}: kernels {total:.2f} ms")
        for name, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:12]:
            print(f"   {t:8.2f} ms x{n:4d}  {name}")


if __name__ == "__main__":
    main()
