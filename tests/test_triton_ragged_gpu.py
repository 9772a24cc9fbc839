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


@pytest.mark.parametrize("side", ["right", "left"])
def test_tma_loads_ignore_padded_keys(side) -> None:
    """16-bit at head dims 128 and 64, query-tiled: K/V come through tensor descriptors (TMA), which read
    whole tiles; NaN in the padded keys and values reaches no result, and the programs write the
    padded query rows themselves (out 0, lse -inf)."""
    from attnhub_backends.triton import ragged_launch

    ragged_launch._PLANS.clear()
    check_case(torch, dtype="bfloat16", b=3, hq=8, hkv=2, lq=600, lk=900, dqk=128, dv=128,
               q_lengths=[600, 0, 257], k_lengths=[900, 33, 0], side=side, rule=Causal(),
               sync="none_end", grad=False, device="cuda", nan_padding=True)  # fmt: skip
    check_case(torch, dtype="float16", b=2, hq=4, hkv=4, lq=300, lk=1000, dqk=128, dv=128,
               q_lengths=[300, 190], k_lengths=[1000, 555], side=side, rule=Full(), sync="none_front",
               grad=False, device="cuda", nan_padding=True, softcap=30.0)  # fmt: skip
    check_case(torch, dtype="bfloat16", b=3, hq=8, hkv=8, lq=500, lk=500, dqk=64, dv=64,
               q_lengths=[500, 77, 1], k_lengths=[500, 77, 1], side=side, rule=Causal(),
               sync="none_front", grad=False, device="cuda", nan_padding=True)  # fmt: skip
    plans = list(ragged_launch._PLANS.values())
    assert plans and all(p.tma and not p.zero_fill for p in plans)


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
        launcher = next(reversed(ragged_launch._PLANS.values())).fwd_launcher
        assert launcher.compiled and launcher.direct  # the C launcher, not Triton's runner


def _decode_reference(q, k, v, lens):
    """float64 decode attention of q (B, Hq, 1, D) on each entry's first lens[b] keys (GQA)."""
    group = q.shape[1] // k.shape[1]
    outs = []
    for b, n in enumerate(lens.tolist()):
        kb = k[b, :, :n].double().repeat_interleave(group, 0)
        vb = v[b, :, :n].double().repeat_interleave(group, 0)
        s = q[b].double() @ kb.transpose(-1, -2) / q.shape[-1] ** 0.5
        outs.append(torch.softmax(s, -1) @ vb if n else torch.zeros_like(q[b], dtype=torch.float64))
    return torch.stack(outs)


def test_split_kv_workspace_across_calls_streams_and_graphs() -> None:
    """The split-KV forward keeps one workspace per stream and its done-counters reset themselves:
    lengths changed in place between calls, a second stream, and a CUDA graph replayed with new
    lengths all give the reference (SPEC §6 bfloat16 tolerance, every element written)."""
    import attnhub

    torch.manual_seed(7)
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 8, 8192, 128, device="cuda", dtype=torch.bfloat16) * 2
    v = torch.randn_like(k)
    lens = torch.tensor([8192, 1, 3000, 0], dtype=torch.int32, device="cuda")

    def call():
        return attnhub.attention_kvcache(q, k, v, lens, mask=None, backend="triton")

    def check(out):
        ref = _decode_reference(q, k, v, lens)
        assert not out.isnan().any()
        torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)

    for new in ([8192, 1, 3000, 0], [5000, 8000, 17, 4096], [1, 1, 1, 1]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        check(call())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # launched on another stream: its own workspace
        out = call()
    torch.cuda.current_stream().wait_stream(side)
    check(out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    for new in ([7000, 2, 64, 8192], [100, 200, 300, 400]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        check(captured)
        check(call())  # eager calls between replays use their own workspace
