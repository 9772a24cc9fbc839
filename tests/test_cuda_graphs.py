"""attnhub.attention captured in a CUDA graph: replays with new inputs give the eager result."""

from __future__ import annotations

import math

import pytest
import torch

import attnhub

pytestmark = pytest.mark.gpu


def _ref(q, k, v):
    q, k, v = (x.double() for x in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("backend", ["triton", "auto", "sdpa-flash", "sdpa-efficient"])
def test_capture_and_replay_with_new_inputs(backend):
    torch.manual_seed(0)
    shape = (2, 4, 128, 64)
    static = [torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile and autotune outside the capture
        for _ in range(3):
            attnhub.attention(*static, mask="causal", backend=backend)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attnhub.attention(*static, mask="causal", backend=backend)
    for _ in range(3):
        fresh = [torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3)]
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        want = attnhub.attention(*fresh, mask="causal", backend=backend)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        torch.testing.assert_close(out.double(), _ref(*fresh), rtol=2e-2, atol=2e-2)
