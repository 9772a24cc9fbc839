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


def test_repeated_call_signature() -> None:
    """Later calls of one signature launch the compiled kernels directly (relaunch.py): same results."""
    from attnhub.operands import Operands
    from attnhub_backends.triton import ragged_launch
    from tests.ragged_dense import case_request

    for lq, paged in ((1, 0), (3, 16), (300, 0)):
        q = torch.randn(2, 8, lq, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 2, 2048, 64, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        lens = torch.tensor([2048, 700], dtype=torch.int32, device="cuda")
        ops = Operands(k_lengths=lens)
        req = case_request("bfloat16", 2, 8, 2, lq, 2048, 64, 64, Causal(), "none_end", device="cuda:0",
                           k_lengths=True)  # fmt: skip
        if paged:
            k = k.permute(0, 2, 1, 3).reshape(2 * 2048 // paged, paged, 2, 64)
            v = v.permute(0, 2, 1, 3).reshape(2 * 2048 // paged, paged, 2, 64)
            table = torch.arange(2 * 2048 // paged, dtype=torch.int32, device="cuda").reshape(2, -1)
            ops = Operands(k_lengths=lens, block_table=table)
            req = case_request("bfloat16", 2, 8, 2, lq, 2048, 64, 64, Causal(), "none_end", device="cuda:0",
                               k_lengths=True, paged=paged)  # fmt: skip
        first = ragged_launch.forward(q, k, v, req, ops)
        for _ in range(3):
            again = ragged_launch.forward(q, k, v, req, ops)
            assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
