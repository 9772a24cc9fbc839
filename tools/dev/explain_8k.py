"""What auto picks, and the measured times it follows, at B=2 H=16 L=8k D=128 full (bf16, f16).

python tools/dev/explain_8k.py
"""

import torch

import attnhub

for dt in (torch.bfloat16, torch.float16):
    q, k, v = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=dt) for _ in range(3))
    e = attnhub.explain(q, k, v)
    print(dt, e.chosen)
    print(str(e)[:1500])
