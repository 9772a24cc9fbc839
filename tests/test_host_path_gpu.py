"""Host reads of lengths on a GPU (attnhub/readings.py): one device-to-host read per tensor
version across a decoding step's calls, nothing kept used inside a CUDA graph capture (replays
follow lengths changed in place), and the int32 copy of an int64 lengths tensor made per stream.
Against a float64 formula written here (decode: every valid key of a batch entry is attended)."""

from __future__ import annotations

import math

import pytest

import attnhub
from attnhub import readings

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.gpu

B, HQ, HKV, D, LK = 4, 32, 8, 128, 1024


def inputs(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, HQ, 1, D, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(B, HKV, LK, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    return q, k, v


def dense_decode(q, k, v, lengths):
    """out (B, Hq, 1, D) in float64: query b attends keys [0, lengths[b])."""
    q, k, v = (x.double().cpu() for x in (q, k, v))
    k, v = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    keep = torch.arange(LK)[None, :] < torch.as_tensor(lengths)[:, None]
    s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v


def close(got, want, tol=1e-2):
    got = got.double().cpu()
    assert torch.isfinite(got).all()
    return float((got - want).norm() / want.norm()) < tol


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_one_read_per_step(reads, dtype) -> None:
    """32 layers given one lengths tensor: one device-to-host read; an in-place update (the next
    step) one more."""
    q, k, v = inputs()
    lens = torch.tensor([LK, 1, 700, 129], dtype=dtype, device="cuda")
    for _ in range(32):
        out = attnhub.attention_kvcache(q, k, v, lens, backend="triton")
    torch.cuda.synchronize()
    assert len(reads) == 1
    assert close(out, dense_decode(q, k, v, lens.tolist()))
    lens.sub_(1)  # [LK - 1, 0, 699, 128]
    for _ in range(32):
        out = attnhub.attention_kvcache(q, k, v, lens, backend="triton")
    assert len(reads) == 2
    assert close(out, dense_decode(q, k, v, lens.tolist()))


def test_graph_replays_follow_lengths_changed_in_place() -> None:
    """An int64 lengths tensor (attnhub makes its int32 copy): the copy kept from eager calls is not
    used while capturing, so replays read the lengths the caller wrote in place."""
    q, k, v = inputs(1)
    lens = torch.tensor([LK, 5, 300, 1000], dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: compile outside the capture (keeps a copy on `side`)
        for _ in range(3):
            attnhub.attention_kvcache(q, k, v, lens, backend="triton")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attnhub.attention_kvcache(q, k, v, lens, backend="triton")
    for new in ([1, LK, 64, 513], [700, 2, LK, 9]):
        lens.copy_(torch.tensor(new, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert close(out, dense_decode(q, k, v, new))


def test_int32_copy_per_stream() -> None:
    """Calls on two streams with one int64 lengths tensor each use a copy made on their own stream."""
    q, k, v = inputs(2)
    lens = torch.tensor([LK, 3, 10, 900], dtype=torch.int64, device="cuda")
    want = dense_decode(q, k, v, lens.tolist())
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            outs.append(attnhub.attention_kvcache(q, k, v, lens, backend="triton"))
    torch.cuda.synchronize()
    for out in outs:
        assert close(out, want)
    copies = [key for key in readings.kept(lens).facts if isinstance(key, tuple) and key[0] == "int32"]
    assert len(copies) == 2
