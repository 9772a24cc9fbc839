"""Compile latency: calls that differ only in their lengths compile no new Triton kernel.

Triton compiles a kernel once per *specialisation*: its constexprs and launch options, and per
runtime argument its type and, for integers, whether it equals 1 or is divisible by 16 (pointers:
16-byte alignment). The CPU tests here run the launch code with the device decisions of an H100
(configs, TMA, split-KV) and Triton's own argument binder for sm90, without running a kernel, and
compare the specialisations launched for different lengths. The GPU tests count the kernels that
Triton's per-device caches hold.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import pytest
import torch

from attnhub.request import Request
from attnhub.rules import Causal, Full, Local
from attnhub_backends.triton import configs, launch, loader

KERNELS = ("fwd_kernel", "combine_kernel", "bwd_prep_kernel", "dkdv_kernel", "dq_kernel")


class _Recorder:
    """Stands in for the kernels module: records the compile key of every launch, runs nothing."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        self.module = loader.kernels(interpret=False)
        backend = make_backend(GPUTarget("cuda", 90, 128))
        self.binders = {
            name: create_function_from_signature(fn.signature, fn.params, backend)
            for name in KERNELS
            for fn in [getattr(self.module, name)]
        }
        self.keys: set[tuple] = set()

    def __getattr__(self, name: str) -> Any:
        if name not in KERNELS:
            return getattr(self.module, name)
        rec = self

        class _Indexed:
            def __getitem__(self, grid: Any) -> Any:
                def call(*args: Any, **kwargs: Any) -> None:
                    _, spec, options = rec.binders[name](*args, **kwargs)
                    rec.keys.add((name, tuple(map(str, spec)), tuple(sorted(options.items()))))

                return call

        return _Indexed()


@pytest.fixture
def h100(monkeypatch) -> _Recorder:
    """launch.py deciding as on one H100 (132 SMs, sm90), kernels recorded instead of run."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("ATTNHUB_TRITON_TUNE", "0")  # no tuning records read from this machine
    for name in ("ATTNHUB_TRITON_TMA", "ATTNHUB_TRITON_SPLITS", *configs.CFG_SETTING.values()):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(launch, "_on_gpu", lambda device: True)
    monkeypatch.setattr(launch, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(launch, "_sm_count", lambda device: 132)
    monkeypatch.setattr(launch, "_FWD_LAUNCHES", OrderedDict())
    monkeypatch.setattr(configs, "_CHOSEN", {})
    rec = _Recorder()
    monkeypatch.setattr(launch, "kernels", lambda: rec)
    return rec


def _call(
    rec: _Recorder, nq: int, nk: int, *, d: int = 128, hq: int = 2, hkv: int = 2, b: int = 1,
    rule: Any = None, dtype: torch.dtype = torch.bfloat16, backward: bool = False,
) -> set[tuple]:  # fmt: skip
    """The compile keys one call launches (forward, and backward where asked)."""
    rule = Causal() if rule is None else rule
    q = torch.zeros(b, hq, nq, d, dtype=dtype)
    k = torch.zeros(b, hkv, nk, d, dtype=dtype)
    v = torch.zeros(b, hkv, nk, d, dtype=dtype)
    req = Request(
        "torch", "cuda:0", str(dtype).removeprefix("torch."), "bhsd", b, hq, hkv, (nq,), (nk,), d, d, rule,
        "none_front", 1 / math.sqrt(d),
    )  # fmt: skip
    rec.keys = set()
    out, lse = launch.forward(q, k, v, req)
    if backward:
        launch.backward(q, k, v, out, lse, torch.zeros_like(out), req)
    return rec.keys


def _names(keys: set[tuple]) -> list[str]:
    return sorted(k[0] for k in keys)


# Moves that keep split-KV on (few query tiles x heads, enough key tiles: the heads here are few)
# or off (Lq = 300 under a causal rule visits at most 3 key tiles): Lk alone, Lq alone, both, with
# lengths that are multiples of 16 and of the tiles (Triton's and the kernels' special cases).
SPLIT_ON = [(1777, 1001), (1777, 1777), (1024, 1777), (4096, 1777), (4096, 4096), (1024, 2048), (2000, 3000)]
CAUSAL_SPLIT_OFF = [(300, 1001), (300, 1777), (300, 4096), (257, 4096), (320, 1024)]


@pytest.mark.parametrize(
    ("case", "lengths"),
    [
        ("bf16 D=128 causal", SPLIT_ON),
        ("bf16 D=128 causal", CAUSAL_SPLIT_OFF),
        ("bf16 D=128 full", SPLIT_ON),
        ("bf16 D=64 causal", SPLIT_ON),
        ("bf16 D=64 causal", CAUSAL_SPLIT_OFF),
        ("fp32 D=64 full", SPLIT_ON),
        ("bf16 D=128 local", SPLIT_ON),
        ("fp16 D=80 causal", [(1777, 1001), (1776, 1776), (4000, 4000), (1000, 3000)]),
    ],
)
def test_lengths_share_one_forward_and_backward(h100, case, lengths) -> None:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.split()[0]]
    d = int(case.split()[1].removeprefix("D="))
    rule = {"causal": Causal(), "full": Full(), "local": Local(256, causal=True)}[case.split()[2]]
    first = _call(h100, *lengths[0], d=d, dtype=dtype, rule=rule, backward=True)
    assert {"fwd_kernel", "bwd_prep_kernel", "dkdv_kernel", "dq_kernel"} <= set(_names(first))
    for nq, nk in lengths[1:]:
        assert _call(h100, nq, nk, d=d, dtype=dtype, rule=rule, backward=True) == first, (nq, nk)


def test_split_kv_is_the_only_length_dependent_forward_switch(h100) -> None:
    """Across prefill lengths a shape class compiles at most two forwards, with and without
    split-KV (the SPLIT constexpr), and one backward."""
    keys: set[tuple] = set()
    for nq, nk in SPLIT_ON + CAUSAL_SPLIT_OFF:
        keys |= _call(h100, nq, nk, backward=True)
    fwd = [k for k in keys if k[0] == "fwd_kernel"]
    assert _names(keys) == [
        "bwd_prep_kernel", "combine_kernel", "dkdv_kernel", "dq_kernel", "fwd_kernel", "fwd_kernel"
    ]  # fmt: skip
    differ = [i for i, (a, b) in enumerate(zip(fwd[0][1], fwd[1][1], strict=True)) if a != b]
    params = loader.kernels(interpret=False).fwd_kernel.params
    assert [params[i].name for i in differ] == ["O", "SPLIT"]  # O: float32 partials when split


def test_pointer_band_walk_has_an_even_key_variant(h100) -> None:
    """Where the band walk loads K/V through pointers (head dims without TMA, older GPUs), key
    counts that are a multiple of the key tile compile a second forward without bounds masks
    (EVEN_K); with TMA (16-bit, D = 128 on sm90) there is one forward for every key count."""
    odd = _call(h100, 1777, 1001, d=80, dtype=torch.float16)
    even = _call(h100, 4096, 4096, d=80, dtype=torch.float16)
    (a,), (b,) = [[k for k in keys if k[0] == "fwd_kernel"] for keys in (odd, even)]
    params = loader.kernels(interpret=False).fwd_kernel.params
    assert [params[i].name for i, (x, y) in enumerate(zip(a[1], b[1], strict=True)) if x != y] == ["EVEN_K"]
    assert _call(h100, 1777, 1001) == _call(h100, 4096, 4096)  # D = 128, TMA: no variant


def test_decode_lengths_share_one_forward_and_combine(h100) -> None:
    """Decoding (Lq = 1, GQA 32/8): the split-KV factor follows Lk (2 at Lk = 1001, 9 at 8k, 32 at
    32k with B = 1) and is a runtime value, so is the combine kernel's split tile."""
    first = _call(h100, 1, 1001, hq=32, hkv=8, b=1, rule=Full())
    assert _names(first) == ["combine_kernel", "fwd_kernel"]
    for b, nk in [(1, 1777), (1, 8192), (8, 8192), (1, 32768), (8, 32768), (1, 1024)]:
        assert _call(h100, 1, nk, hq=32, hkv=8, b=b, rule=Full()) == first, (b, nk)


def test_decode_and_prefill_are_different_kernels_by_design(h100) -> None:
    """Lq = 1 packs a GQA group's rows into one 16-row tile with split-KV (a decode kernel, with its
    one row folded in: NQ1); Lq = 300 tiles the queries (the prefill kernel). The move compiles the
    prefill kernel once, then no prefill length compiles again."""
    full = Full()
    decode = _call(h100, 1, 1777, hq=32, hkv=8, rule=full)
    prefill = _call(h100, 300, 1777, hq=32, hkv=8, rule=full)
    assert decode != prefill
    assert _call(h100, 1000, 1777, hq=32, hkv=8, rule=full) == prefill
    assert _call(h100, 2, 1777, hq=32, hkv=8, rule=full) != decode  # NQ1: one query row
    assert _call(h100, 3, 1777, hq=32, hkv=8, rule=full) == _call(h100, 2, 1777, hq=32, hkv=8, rule=full)


def test_tuning_keys_have_no_lengths(h100) -> None:
    """A config is chosen per shape class: lengths never pick another config (another compile)."""
    x = torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    reqs = [
        Request("torch", "cuda:0", "bfloat16", "bhsd", 1, 2, 2, (nq,), (nk,), 128, 128, Causal(), "none_front", 0.1)
        for nq, nk in [(300, 1777), (1777, 1001), (4096, 16384)]
    ]  # fmt: skip
    for kernel in ("fwd", "dkdv", "dq"):
        assert len({launch._key(kernel, r, x) for r in reqs}) == 1


def test_calls_do_not_tune_outside_tuning(monkeypatch) -> None:
    """Without configs.tuning() a call runs the first candidate only, however large its work."""
    ran = []
    monkeypatch.setattr(configs, "_CHOSEN", {})
    a, b = configs.Cfg(128, 128, 8, 3), configs.Cfg(64, 64, 4, 3)
    assert configs.choose(("no-tuning",), [a, b], ran.append, 1 << 40) == a
    assert ran == [a]


def test_tuning_records_its_pick(monkeypatch, tmp_path) -> None:
    """Inside configs.tuning() the pick is timed and recorded; a later process (records reloaded,
    choices forgotten) uses it, and ATTNHUB_TRITON_TUNE=0 ignores it."""
    monkeypatch.setenv("ATTNHUB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(configs, "_scope", lambda: "test GPU | triton x")
    monkeypatch.setattr(configs, "_RECORDS", None)
    monkeypatch.setattr(configs, "_CHOSEN", {})
    slow, fast = configs.Cfg(128, 128, 8, 3), configs.Cfg(64, 64, 4, 3, 128, True)
    state = {"last": None}
    monkeypatch.setattr(
        configs, "_elapsed_ms", lambda fn, n: (fn(), 2.0 if state["last"] == slow else 1.0)[1]
    )
    key = ("fwd", "cuda:0", (9, 0), "bfloat16")
    with configs.tuning():
        assert (
            configs.choose(key, [slow, fast], lambda c: state.update(last=c), 1 << 30, persist=True) == fast
        )
    assert configs.records_path() == tmp_path / "triton" / "tuned.json"
    assert configs.records_path().exists()
    for tune, want in (("1", fast), ("0", slow)):
        monkeypatch.setenv("ATTNHUB_TRITON_TUNE", tune)
        monkeypatch.setattr(configs, "_RECORDS", None)
        monkeypatch.setattr(configs, "_CHOSEN", {})
        ran = []
        assert configs.choose(key, [slow, fast], ran.append, 1 << 30, persist=True) == want
        assert ran == [want]


# --- GPU: compiled kernels counted in Triton's caches ----------------------------------------------


def _compiled() -> int:
    mod = loader.kernels(interpret=False)
    return sum(len(cache[0]) for name in KERNELS for cache in getattr(mod, name).device_caches.values())


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("hq", "hkv", "causal", "moves"),
    [
        (8, 8, True, [(1777, 1001), (1777, 1777), (1024, 1777), (4096, 4096), (1024, 2048)]),  # split-KV
        (8, 8, True, [(300, 1001), (300, 1777), (300, 4096), (320, 2048)]),  # Lq = 300: no split
        (32, 8, False, [(1, 1001), (1, 1777), (1, 8192), (1, 4096)]),  # decode: the split factor follows Lk
    ],
)
def test_changing_lengths_compiles_nothing_new(monkeypatch, hq, hkv, causal, moves) -> None:
    import attnhub

    monkeypatch.setenv("ATTNHUB_TRITON_TUNE", "0")
    for name in ("ATTNHUB_TRITON_TMA", "ATTNHUB_TRITON_SPLITS", *configs.CFG_SETTING.values()):
        monkeypatch.delenv(name, raising=False)
    grad = moves[0][0] > 16

    def call(nq: int, nk: int) -> None:
        q = torch.randn(1, hq, nq, 128, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        k = torch.randn(1, hkv, nk, 128, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        v = torch.randn(1, hkv, nk, 128, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        out = attnhub.attention(q, k, v, mask=attnhub.Causal() if causal else None, backend="triton")
        if grad:
            out.float().sum().backward()
        torch.cuda.synchronize()

    call(*moves[0])
    before = _compiled()
    assert before > 0
    for nq, nk in moves[1:]:
        call(nq, nk)
        assert _compiled() == before, f"Lq={nq} Lk={nk} compiled {_compiled() - before} new kernel(s)"


# --- attnhub warmup -------------------------------------------------------------------------------


def test_warmup_without_a_gpu_says_so(monkeypatch) -> None:
    from click.testing import CliRunner

    from attnhub.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(main, ["warmup", "--head-dims", "64"])
    assert result.exit_code == 1
    assert "none is visible" in result.output
    result = CliRunner().invoke(main, ["warmup", "--backends", "cuda"])
    assert result.exit_code == 2 and "only triton" in result.output


@pytest.mark.gpu
def test_warmup_covers_later_lengths(monkeypatch, tmp_path) -> None:
    """After ``attnhub warmup`` (one dtype, one head dim) calls at other lengths compile nothing."""
    from click.testing import CliRunner

    import attnhub
    from attnhub.cli import main

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNHUB_TRITON_TUNE", "0")
    result = CliRunner().invoke(main, ["warmup", "--dtype", "bfloat16", "--head-dims", "64"])
    assert result.exit_code == 0, result.output
    assert any(tmp_path.iterdir())  # Triton's disk cache was written
    before = _compiled()
    for b, h, nq, nk, mask in [
        (4, 32, 1777, 1001, attnhub.Causal()),
        (1, 2, 300, 1777, None),
        (8, 32, 1, 1777, None),
    ]:
        q = torch.randn(b, h, nq, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, h // 4 if nq == 1 else h, nk, 64, device="cuda", dtype=torch.bfloat16)
        attnhub.attention(q, k, k, mask=mask, backend="triton")
    torch.cuda.synchronize()
    assert _compiled() == before
