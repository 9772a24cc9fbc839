"""The reference processes queries in blocks: memory O(block x Lk), not O(Lq x Lk)."""

import tracemalloc

import numpy as np

import attnhub
from attnhub_backends.reference import kernel


def test_peak_memory_is_blockwise(monkeypatch):
    monkeypatch.setattr(kernel, "BLOCK_BYTES", 1 << 18)  # 256 KiB of logits per block
    n, h, d = 1024, 2, 16
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(3))
    attnhub.attention(q[:, :, :8], k, v, mask="causal", backend="reference")  # load plugins, fill caches
    tracemalloc.start()
    out = attnhub.attention(q, k, v, mask="causal", backend="reference")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    dense_logits = h * n * n * 8  # 16 MiB
    assert peak < dense_logits / 4, peak
    # and blocking changes nothing in the result
    monkeypatch.setattr(kernel, "BLOCK_BYTES", 1 << 30)
    np.testing.assert_allclose(out, attnhub.attention(q, k, v, mask="causal", backend="reference"), rtol=1e-6)
