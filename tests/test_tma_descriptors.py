"""device.kv_descriptors without a GPU: a call's descriptors are copies of a checked template with
the call's tensor as base, equal field for field to freshly built ones, and the template cache
keeps no caller's tensor alive."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from attnhub_backends.triton import device  # noqa: E402


def _fields(d: TensorDescriptor) -> dict:
    return {k: v for k, v in vars(d).items() if k != "base"}


def test_descriptors_match_fresh_ones_and_take_the_call_tensor(monkeypatch) -> None:
    monkeypatch.setattr(device, "_DESCRIPTORS", {})
    k = torch.randn(2, 4, 40, 64, dtype=torch.bfloat16)
    v = torch.randn(2, 4, 40, 64, dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
    for bn in (64, 32):
        kd, vd = device.kv_descriptors(k, v, bn)
        for got, x in ((kd, k), (vd, v)):
            fresh = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, bn, x.shape[-1]])
            assert got.base is x
            assert _fields(got) == _fields(fresh)
    # a second call with other tensors of the same layout reuses the templates, with its own bases
    k2, v2 = torch.randn_like(k), v.clone()
    kd2, vd2 = device.kv_descriptors(k2, v2, 64)
    assert kd2.base is k2 and vd2.base is v2 and kd2 is not kd
    assert len(device._DESCRIPTORS) == 4  # (k layout, v layout) x two block sizes


def test_template_cache_keeps_no_tensor_alive(monkeypatch) -> None:
    monkeypatch.setattr(device, "_DESCRIPTORS", {})
    k = torch.randn(1, 2, 16, 64, dtype=torch.float16)
    ref = weakref.ref(k)
    device.kv_descriptors(k, k, 16)
    del k
    gc.collect()
    assert ref() is None
    assert all(t.base is None for t in device._DESCRIPTORS.values())


def test_a_small_decode_cache_loads_through_pointers() -> None:
    """Decode over a cache under SMALL_DECODE_CACHE_BYTES skips TMA (its launch costs the host
    ~10 us more; H200, B 1 at 8k), larger caches keep it (B 8 at 8k equal, B 64 at 4k faster)."""
    from attnhub_backends.triton.ragged_launch import small_decode_cache

    def cache(b: int, lk: int) -> torch.Tensor:  # (B, Hkv 8, Lk, D 128) bf16, no storage
        return torch.empty((b, 8, lk, 128), dtype=torch.bfloat16, device="meta")

    assert small_decode_cache(cache(1, 8192), cache(1, 8192))  # 33.5 MB
    assert not small_decode_cache(cache(8, 8192), cache(8, 8192))  # 268 MB
    assert not small_decode_cache(cache(64, 4096), cache(64, 4096))
