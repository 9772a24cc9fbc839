"""Kernel checks under Triton's CPU interpreter; run by tests/test_triton_interpret.py in a child
process started with TRITON_INTERPRET=1 (the variable must be set before triton is imported, and it
must not leak into other tests, where it would make the triton backend take CPU tensors)."""

from __future__ import annotations

import inspect
import os

import pytest

from attnhub.rules import Causal, Full, Local
from tests.triton_check import check

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/test_triton_interpret.py"


@pytest.fixture
def interp():
    return None


CASES = [
    # (dtype, seq_q, seq_k, rule, sync, hq, hkv, dqk, dv, layout)
    ("float32", (37,), (29,), Causal(), "none_front", 4, 2, 24, 40, "bhsd"),
    ("float32", (40,), (20,), Causal(), "none_end", 2, 1, 16, 16, "bhsd"),  # fully masked rows
    ("float16", (33,), (70,), Local(5, causal=True), "none_end", 2, 1, 32, 16, "bshd"),
    ("bfloat16", (48,), (48,), Full(), "none_front", 2, 2, 64, 64, "bhsd"),
    ("float32", (6, 5), (12, 10), Local((2, 3), 1), "scale_end", 2, 2, 16, 16, "bshd"),
    ("float32", (6, 5), (12, 10), Causal(), "scale_front", 3, 1, 16, 8, "bhsd"),
    ("float32", (23,), (46,), Local(3, log2_stride=1), "scale_front", 1, 1, 8, 8, "bhsd"),
    ("float16", (5, 7), (5, 7), Local(2, causal=True), "none_front", 2, 2, 16, 16, "bhsd"),
    # causal windows reaching past the last key (rows fully masked), and scaled positions
    ("float32", (60,), (30,), Local(8, causal=True), "none_front", 2, 1, 16, 16, "bhsd"),
    ("float32", (20,), (41,), Local(6, causal=True), "scale_front", 1, 1, 16, 8, "bshd"),
    ("float32", (40,), (20,), Local(5, causal=True), "scale_end", 2, 2, 8, 16, "bhsd"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[3].describe()}-{c[4]}-{c[1]}x{c[2]}")
def test_matches_reference(interp, case) -> None:
    dtype, sq, sk, rule, sync, hq, hkv, dqk, dv, layout = case
    check(
        torch, device="cpu", dtype=dtype, seq_q=sq, seq_k=sk, rule=rule, sync=sync,
        b=2, hq=hq, hkv=hkv, dqk=dqk, dv=dv, layout=layout,
    )  # fmt: skip


def test_large_logits_and_negative_scale(interp) -> None:
    check(torch, device="cpu", dtype="float32", seq_q=(35,), seq_k=(35,), rule=Causal(), logit_boost=8.0)
    check(torch, device="cpu", dtype="float32", seq_q=(20,), seq_k=(33,), rule=Full(), scale=-0.3)


def test_cpu_declined_without_interpreter(monkeypatch) -> None:
    import attnhub

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 1, 8, 16)
    with pytest.raises(attnhub.BackendUnsupported, match="(?i)cuda"):
        attnhub.attention(q, q, q, backend="triton")


def test_float64_declined(interp) -> None:
    """(Boolean masks are served since SPEC §9: tests/test_triton_modifiers.py.)"""
    import attnhub

    q = torch.randn(1, 1, 8, 16)
    with pytest.raises(attnhub.BackendUnsupported, match="float64"):
        attnhub.attention(q.double(), q.double(), q.double(), backend="triton")


def test_split_kv_and_gqa_packing(monkeypatch) -> None:
    """Decoding shapes: GQA rows packed into one tile, keys split over programs and merged."""
    monkeypatch.setenv("ATTNHUB_TRITON_SPLITS", "3")
    check(torch, device="cpu", dtype="float32", seq_q=(1,), seq_k=(100,), rule=Full(), sync="none_end",
          b=2, hq=8, hkv=2, dqk=32, dv=24)  # fmt: skip
    check(torch, device="cpu", dtype="float32", seq_q=(40,), seq_k=(20,), rule=Causal(), sync="none_end",
          b=1, hq=2, hkv=1, dqk=16, dv=16)  # fmt: skip
    check(torch, device="cpu", dtype="bfloat16", seq_q=(5,), seq_k=(70,), rule=Local(5, causal=True),
          sync="none_end", b=1, hq=4, hkv=1, dqk=16, dv=16)  # fmt: skip


@pytest.mark.parametrize(
    "rule,sync,sq,sk,splits",
    [
        (Local(20, causal=True), "none_end", (70,), (70,), "1"),  # lead edge, full run, diagonal
        (Local(9, causal=True), "none_end", (45,), (100,), "2"),  # band walk split over programs
        (Causal(), "none_front", (40,), (20,), "1"),  # fully masked rows: 0 and -inf
        (Local(6), "scale_end", (30,), (60,), "1"),  # two-sided window, queries scaled onto keys
        (Full(), "none_front", (37,), (29,), "1"),  # last key tile partial
        (Local(24, causal=True), "none_end", (40,), (64,), "1"),  # key count a multiple of the tile
    ],
)
def test_band_walk(monkeypatch, rule, sync, sq, sk, splits) -> None:
    """The forward's band walk (one loop over a contiguous run of key tiles, rule evaluated only
    outside the unmasked run) against the reference; 16-row key tiles so the runs have several."""
    monkeypatch.setenv("ATTNHUB_TRITON_FWD_CFG", "32,16,1,1,0,1")
    monkeypatch.setenv("ATTNHUB_TRITON_SPLITS", splits)
    check(torch, device="cpu", dtype="float32", seq_q=sq, seq_k=sk, rule=rule, sync=sync, b=2, hq=2,
          hkv=1, dqk=16, dv=24, grad=False)  # fmt: skip
    check(torch, device="cpu", dtype="float16", seq_q=sq, seq_k=sk, rule=rule, sync=sync, b=1, hq=2,
          hkv=2, dqk=32, dv=32, layout="bshd", logit_boost=8.0, grad=False)  # fmt: skip
    from attnhub_backends.triton import launch

    kwargs = list(launch._FWD_LAUNCHES.values())[-1].kwargs
    assert kwargs["BAND"]  # not the index-list walk
    assert kwargs["EVEN_K"] == (sk[0] % 16 == 0)  # loads without bounds masks only then


def test_tma_setting_is_checked(monkeypatch) -> None:
    """ATTNHUB_TRITON_TMA: empty means the default, anything but 0 or 3 is a clear error (was int('')
    deep in a launch); the interpreter always loads through pointers."""
    from attnhub.errors import AttnhubError
    from attnhub_backends.triton import device

    k = torch.zeros(2, 3, 40, 32, dtype=torch.float16)
    monkeypatch.setenv("ATTNHUB_TRITON_TMA", "")
    assert device.tma_mode(k, k, k) == 0  # the default: pointers on the CPU interpreter
    monkeypatch.setenv("ATTNHUB_TRITON_TMA", "3")
    assert device.tma_mode(k, k, k, packed=True) == device.POINTERS  # no descriptors in the interpreter
    for bad in ("x", "1", "2", "4", "-1"):
        monkeypatch.setenv("ATTNHUB_TRITON_TMA", bad)
        with pytest.raises(AttnhubError, match="ATTNHUB_TRITON_TMA"):
            device.tma_mode(k, k, k)


def test_launch_reused_only_for_its_signature(monkeypatch) -> None:
    """The forward's launch is cached per call signature: the same request in another layout, at
    another base offset, or under another split setting gets its own launch (each checked against
    the reference), and a repeated call reuses the first one."""
    import attnhub
    from attnhub_backends.triton import launch

    g = torch.Generator().manual_seed(7)
    base = torch.randn(2, 3, 41, 16, generator=g)
    q = base[:, :, :40]  # strided view (row stride 16 of a 41-row tensor)
    k, v = torch.randn(2, 3, 40, 16, generator=g), torch.randn(2, 3, 40, 16, generator=g)
    ref = attnhub.attention(q.double(), k.double(), v.double(), mask=Causal(), backend="reference")

    def run(qq, kk, vv):
        out = attnhub.attention(qq, kk, vv, mask=Causal(), backend="triton")
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 2e-5, err

    launch._FWD_LAUNCHES.clear()
    run(q.contiguous(), k, v)
    assert len(launch._FWD_LAUNCHES) == 1
    run(q.contiguous(), k, v)  # same signature: reused
    assert len(launch._FWD_LAUNCHES) == 1
    run(q, k, v)  # other strides
    run(q.transpose(1, 2).contiguous().transpose(1, 2), k, v)  # bshd strides
    shifted = torch.empty(q.numel() + 1)[1:].view(q.shape)  # 4-byte, not 16-byte, aligned base
    shifted.copy_(q)
    run(shifted, k, v)
    monkeypatch.setenv("ATTNHUB_TRITON_SPLITS", "2")
    run(q.contiguous(), k, v)
    assert len(launch._FWD_LAUNCHES) == 5


def test_rule_args_name_kernel_parameters() -> None:
    """args.rule_args' scalars are passed by name: each kernel takes all thirteen, in one run, and
    its constexprs (as the named tuple ``R``, args.RuleC); a pinned config takes 4 to 6 integers (no
    warp-specialisation field)."""
    from attnhub.errors import AttnhubError
    from attnhub.request import build_request
    from attnhub_backends.triton import args, configs
    from attnhub_backends.triton.loader import kernels

    x = torch.zeros(1, 2, 6, 5, 16)
    req, _ = build_request(x, x, x, Local((2, 3), 1), "scale_end", None, "bhsd", True)
    scalars, consts = args.rule_args(req)
    assert len(scalars) == 13 and consts == {"NDIM": 2, "RULE": "local", "CAUSAL": False, "LOG2_STRIDE": 1}
    for name in ("fwd_kernel", "dkdv_kernel", "dq_kernel"):
        params = list(inspect.signature(getattr(kernels(), name).fn).parameters)
        at = params.index("q_cols")
        assert params[at : at + 13] == list(scalars), name
        groups = args.DENSE_FWD if name == "fwd_kernel" else args.DENSE_BWD  # the constexprs' tuples
        assert params[-len(groups) :] == [g for g, _ in groups], name
    assert tuple(consts) == args.RuleC._fields
    assert args.pack(dict(consts), (("R", args.RuleC),)) == {"R": args.RuleC(2, "local", False, 1)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNHUB_TRITON_FWD_CFG", "64,64,4,3,128,1")
        assert configs.forced("fwd") == configs.Cfg(64, 64, 4, 3, 128, band=True)
        mp.setenv("ATTNHUB_TRITON_FWD_CFG", "64,64,4,3,0,0,1")
        with pytest.raises(AttnhubError, match="ATTNHUB_TRITON_FWD_CFG"):
            configs.forced("fwd")
