"""The triton backend's ragged kernels (SPEC §10-§11) on a GPU at realistic shapes, against the
float64 dense formula of tests/ragged_dense.py (SPEC §6 tolerances, unwritten elements NaN)."""

from __future__ import annotations

import pytest

from attnhub.rules import Causal, Full, Local
from tests.ragged_dense import check_case

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_lengths_training(dtype, side) -> None:
    """Padded batch, causal none_end, GQA, forward and backward."""
    check_case(torch, dtype=dtype, b=4, hq=8, hkv=2, lq=700, lk=1000, dqk=128, dv=128,
               q_lengths=[700, 0, 333, 129], k_lengths=[1000, 17, 640, 129], side=side, rule=Causal(),
               sync="none_end", grad=True, device="cuda", logit_boost=2.0)  # fmt: skip


@pytest.mark.parametrize("sync", ["none_front", "scale_front", "scale_end"])
def test_lengths_rules(sync) -> None:
    for rule in (Full(), Local(64, causal=True), Local(16, log2_stride=2)):
        check_case(torch, dtype="bfloat16", b=3, hq=4, hkv=4, lq=513, lk=777, dqk=64, dv=64,
                   q_lengths=[513, 300, 1], k_lengths=[777, 0, 400], side="left", rule=rule, sync=sync,
                   grad=True, device="cuda")  # fmt: skip


@pytest.mark.parametrize("rule", [Causal(), Local(128, causal=True), Full()], ids=lambda r: r.describe())
def test_varlen_training(rule) -> None:
    lens = [300, 1000, 17, 2048, 0, 129]
    check_case(torch, dtype="bfloat16", b=1, hq=8, hkv=4, lq=0, lk=0, dqk=128, dv=128,
               varlen=(lens, lens), side="right", rule=rule, sync="none_front", grad=True,
               device="cuda")  # fmt: skip


@pytest.mark.parametrize("lq", [1, 4])
def test_decode_split_kv(lq) -> None:
    """Ragged KV-cache decode: GQA packing and split-KV chosen automatically, sinks and softcap."""
    check_case(torch, dtype="bfloat16", b=4, hq=32, hkv=8, lq=lq, lk=8192, dqk=128, dv=128,
               q_lengths=None, k_lengths=[8192, 1, 3000, 0], side="right", rule=Causal(),
               sync="none_end", grad=False, device="cuda")  # fmt: skip
    check_case(torch, dtype="float16", b=2, hq=16, hkv=2, lq=lq, lk=5000, dqk=64, dv=64,
               q_lengths=None, k_lengths=[5000, 77], side="right", rule=Causal(),
               sync="none_end", grad=False, device="cuda", sinks=True, softcap=20.0)  # fmt: skip


@pytest.mark.parametrize("block", [16, 64])
def test_paged(block) -> None:
    check_case(torch, dtype="bfloat16", b=4, hq=32, hkv=8, lq=1, lk=4096, dqk=128, dv=128,
               q_lengths=None, k_lengths=[4096, 1, 2500, 1000], side="right", rule=Causal(),
               sync="none_end", grad=False, device="cuda", paged=block)  # fmt: skip
