"""The triton backend on an NVIDIA GPU against the float64 reference (SPEC §6 tolerances).

Run on the device machine: ``python -m pytest -q -m gpu tests/test_triton_gpu.py``.
"""

from __future__ import annotations

import importlib.util

import pytest

from attnhub.rules import Causal, Full, Local
from tests.triton_check import check

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:  # not imported here: see tests/triton_check.py
    pytest.skip("triton is not installed", allow_module_level=True)
pytestmark = pytest.mark.gpu

DTYPES = ("float16", "bfloat16", "float32")
RULES = [
    (Full(), "none_front", (300,), (300,)),
    (Causal(), "none_front", (257,), (257,)),
    (Causal(), "none_end", (190,), (333,)),
    (Causal(), "none_end", (333,), (190,)),  # fully masked rows
    (Local(40, causal=True), "none_end", (500,), (500,)),
    (Local(17), "scale_front", (150,), (300,)),
    (Local(9, log2_stride=2), "scale_end", (200,), (100,)),
    (Local((3, 5)), "none_front", (16, 20), (16, 20)),
    (Causal(), "scale_end", (12, 10), (24, 20)),
    (Local(4, causal=True), "none_end", (9, 30), (18, 30)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rule,sync,sq,sk", RULES, ids=lambda x: str(x) if not hasattr(x, "describe") else x.describe()
)
def test_rules(dtype, rule, sync, sq, sk) -> None:
    check(
        torch,
        device="cuda",
        dtype=dtype,
        seq_q=sq,
        seq_k=sk,
        rule=rule,
        sync=sync,
        b=2,
        hq=4,
        hkv=2,
        dqk=64,
        dv=64,
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dqk,dv", [(16, 16), (40, 72), (96, 96), (128, 128), (256, 256), (256, 64)])
def test_head_dims(dtype, dqk, dv) -> None:
    check(torch, device="cuda", dtype=dtype, seq_q=(211,), seq_k=(177,), rule=Causal(), sync="none_end",
          b=1, hq=2, hkv=1, dqk=dqk, dv=dv)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_layout_gqa_mqa_large_logits(dtype) -> None:
    check(torch, device="cuda", dtype=dtype, seq_q=(129,), seq_k=(129,), rule=Causal(), layout="bshd",
          b=2, hq=8, hkv=1, dqk=64, dv=64)  # fmt: skip
    check(torch, device="cuda", dtype=dtype, seq_q=(200,), seq_k=(200,), rule=Full(), b=1, hq=6, hkv=2,
          dqk=64, dv=64, logit_boost=8.0)  # fmt: skip
    check(torch, device="cuda", dtype=dtype, seq_q=(1,), seq_k=(1000,), rule=Full(), sync="none_end",
          b=2, hq=8, hkv=2, dqk=128, dv=128)  # fmt: skip


def test_larger_causal_bf16() -> None:
    check(torch, device="cuda", dtype="bfloat16", seq_q=(2048,), seq_k=(2048,), rule=Causal(), b=1, hq=2,
          hkv=2, dqk=128, dv=128)  # fmt: skip


def test_deterministic() -> None:
    import attnhub

    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 4, 777, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    outs = []
    for _ in range(2):
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        o = attnhub.attention(qq, kk, vv, mask=Causal(), backend="triton")
        o.backward(torch.ones_like(o))
        outs.append([o.detach(), qq.grad, kk.grad, vv.grad])
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["0", "3"])
def test_forward_load_paths(monkeypatch, mode) -> None:
    """The forward's K/V loads through pointers (0) and host-made tensor descriptors (3, TMA)."""
    monkeypatch.setenv("ATTNHUB_TRITON_TMA", mode)
    check(torch, device="cuda", dtype="bfloat16", seq_q=(300,), seq_k=(300,), rule=Causal(), b=2, hq=4,
          hkv=2, dqk=128, dv=128, grad=False)  # fmt: skip
    check(torch, device="cuda", dtype="float16", seq_q=(190,), seq_k=(333,), rule=Local(100, causal=True),
          sync="none_end", b=2, hq=8, hkv=2, dqk=64, dv=64, layout="bshd", grad=False)  # fmt: skip
    check(torch, device="cuda", dtype="bfloat16", seq_q=(1,), seq_k=(1000,), rule=Full(), sync="none_end",
          b=2, hq=8, hkv=2, dqk=128, dv=128, grad=False)  # fmt: skip
    check(torch, device="cuda", dtype="bfloat16", seq_q=(77,), seq_k=(1000,), rule=Local(9, log2_stride=1),
          sync="scale_front", b=1, hq=2, hkv=1, dqk=64, dv=64, grad=False)  # fmt: skip


def _fwd_candidates() -> list[str]:
    from attnhub_backends.triton import configs

    found = {c for d in (64, 128) for c in configs.local_candidates(d, (9, 0))}
    found |= {c for d in (64, 128) for c in configs.candidates("fwd", d, 2, (9, 0))}
    return sorted(f"{c.bm},{c.bn},{c.warps},{c.stages},{c.maxnreg},{int(c.band)}" for c in found)


@pytest.mark.parametrize("cfg", _fwd_candidates())
def test_every_forward_candidate(monkeypatch, cfg) -> None:
    """Each 16-bit forward config the tuner may pick (band walk, register caps), pinned, on windows
    long enough for several tiles per edge, causal calls with fully masked rows, and full calls."""
    monkeypatch.setenv("ATTNHUB_TRITON_FWD_CFG", cfg)
    check(torch, device="cuda", dtype="bfloat16", seq_q=(1100,), seq_k=(1100,), rule=Local(300, causal=True),
          sync="none_end", b=2, hq=4, hkv=2, dqk=128, dv=128, grad=False)  # fmt: skip
    check(torch, device="cuda", dtype="float16", seq_q=(700,), seq_k=(500,), rule=Local(130, causal=True),
          sync="none_front", b=1, hq=4, hkv=4, dqk=64, dv=64, layout="bshd", logit_boost=8.0,
          grad=False)  # fmt: skip
    check(torch, device="cuda", dtype="bfloat16", seq_q=(333,), seq_k=(190,), rule=Causal(), sync="none_end",
          b=1, hq=2, hkv=1, dqk=64, dv=64, grad=False)  # fmt: skip
    check(torch, device="cuda", dtype="float16", seq_q=(300,), seq_k=(290,), rule=Full(), b=1, hq=2, hkv=2,
          dqk=128, dv=128, grad=False)  # fmt: skip


def test_repeated_calls_launch_the_compiled_kernel() -> None:
    """From a signature's second call on, the forward (and split-KV combine) kernels are launched
    without Triton's argument binding (relaunch.py); fresh data each call, still right: windows with
    the band walk, host TMA descriptors at D = 128, decode with split-KV."""
    from attnhub_backends.triton import launch

    cases = [
        dict(dtype="bfloat16", seq_q=(900,), seq_k=(900,), rule=Local(200, causal=True), sync="none_end",
             b=1, hq=4, hkv=2, dqk=128, dv=128),
        dict(dtype="float16", seq_q=(333,), seq_k=(190,), rule=Causal(), sync="none_end", b=2, hq=2, hkv=1,
             dqk=64, dv=64, layout="bshd"),
        dict(dtype="bfloat16", seq_q=(1,), seq_k=(3000,), rule=Full(), sync="none_end", b=2, hq=8, hkv=2,
             dqk=128, dv=128),
    ]  # fmt: skip
    launch._FWD_LAUNCHES.clear()
    for case in cases:
        for _ in range(3):
            check(torch, device="cuda", grad=False, **case)
    launches = list(launch._FWD_LAUNCHES.values())
    assert launches and all(fl.fwd_launcher.compiled and fl.fwd_launcher.direct for fl in launches)
    assert any(fl.splits > 1 and fl.combine_launcher.compiled for fl in launches)


def test_tma_eligibility(monkeypatch) -> None:
    """Descriptors only where TMA's rules hold; everything else keeps the pointer path."""
    from attnhub_backends.triton import device

    monkeypatch.delenv("ATTNHUB_TRITON_TMA", raising=False)
    x = torch.randn(2, 4, 64, 128, device="cuda", dtype=torch.bfloat16)
    assert device.tma_mode(x, x, x) == device.DESCRIPTORS
    assert device.tma_mode(x.float(), x.float(), x.float()) == 0  # float32: pointers
    assert device.tma_mode(x[..., :64], x[..., :64], x[..., :64]) == 0  # head dim 64: pointers
    odd = torch.randn(2 * 4 * 64 * 128 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(2, 4, 64, 128)
    assert device.tma_mode(odd, odd, odd) == 0  # base not 16-byte aligned
    y = torch.randn(2, 4, 64, 97, device="cuda", dtype=torch.bfloat16)[..., :96]
    assert device.tma_mode(y, y, y) == 0  # head dim 96 (not a power of two), odd row stride
    assert device.tma_mode(x, x, x, packed=True) == device.POINTERS  # decode-shaped: pointers
    monkeypatch.setenv("ATTNHUB_TRITON_TMA", "3")
    assert device.tma_mode(x, x, x, packed=True) == device.DESCRIPTORS  # forced
    monkeypatch.setenv("ATTNHUB_TRITON_TMA", "0")
    assert device.tma_mode(x, x, x) == device.POINTERS
