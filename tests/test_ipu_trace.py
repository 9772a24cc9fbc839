"""The chunked graph is trace-friendly: static shapes, no data-dependent control flow, skipped tiles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.fx

from attnhub import Causal, Full, Local
from attnhub.positions import dense_rule_mask
from attnhub_backends.ipu.graph import ChunkedAttention
from attnhub_backends.ipu.plan import bounds, make_plan


def _module(rule, n=64, m=64, cq=4, ck=4, sync="none_front", hq=2, hkv=1, d=8):
    plan = make_plan(rule, (n,), (m,), sync, cq, ck)
    return ChunkedAttention(plan, 2, hq, hkv, d, 0.35), plan


def _matmuls(gm: torch.fx.GraphModule) -> int:
    return sum(1 for node in gm.graph.nodes if node.op == "call_function" and node.target is torch.matmul)


def _unmasked_pairs(rule, n, m, cq, ck, sync) -> int:
    """Chunk pairs with at least one attended (query, key) pair, from the dense rule mask."""
    keep = dense_rule_mask(rule, (n,), (m,), sync)
    return sum(
        bool(keep[q0:q1, k0:k1].any()) for q0, q1 in bounds(n, cq) for k0, k1 in bounds(m, ck)
    )  # fmt: skip


@pytest.mark.parametrize(
    "rule, sync, shape, expected",
    [
        (Causal(), "none_front", (64, 64, 4, 4), 10),
        (Full(), "none_front", (64, 64, 4, 4), 16),
        (Causal(), "none_front", (64, 64, 8, 2), 12),
        (Local(8), "none_front", (64, 64, 4, 4), 10),
        (Local(4, causal=True), "none_front", (64, 64, 8, 8), 15),
        (Causal(), "none_end", (32, 64, 2, 4), 7),
        (Local(2, log2_stride=2), "scale_end", (24, 48, 3, 6), None),
    ],
)
def test_fx_trace_emits_one_matmul_pair_per_unmasked_chunk_pair(rule, sync, shape, expected):
    n, m, cq, ck = shape
    mod, plan = _module(rule, n, m, cq, ck, sync)
    gm = torch.fx.symbolic_trace(mod)
    pairs = _unmasked_pairs(rule, n, m, cq, ck, sync)
    if expected is not None:
        assert pairs == expected
    assert plan.num_pairs == pairs
    # Each computed tile is q_i @ k_j^T followed by p @ v_j: two matmuls, none for skipped tiles.
    assert _matmuls(gm) == 2 * pairs
    # The traced graph has no control flow left and computes the same as the eager module.
    q, k, v = torch.randn(2, 2, n, 8), torch.randn(2, 1, m, 8), torch.randn(2, 1, m, 8)
    for a, b in zip(gm(q, k, v), mod(q, k, v)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_causal_four_by_four_is_ten_chunk_pairs():
    mod, plan = _module(Causal())
    gm = torch.fx.symbolic_trace(mod)
    qk_products = [
        node for node in gm.graph.nodes if node.target is torch.matmul and "transpose" in str(node.args[1])
    ]
    assert len(qk_products) == 10 == plan.num_pairs
    assert plan.num_masked_pairs == 4  # only the diagonal tiles carry a mask constant
    # The 4 diagonal tiles are cut identically: one shared mask constant.
    assert [name for name, _ in mod.named_buffers()] == ["mask_0"]


@pytest.mark.filterwarnings("ignore:`torch.jit.trace")
def test_jit_trace_fixed_shapes_and_grad():
    mod, plan = _module(Local(5, causal=True), n=48, m=48, cq=3, ck=3)
    q, k, v = torch.randn(2, 2, 48, 8), torch.randn(2, 1, 48, 8), torch.randn(2, 1, 48, 8)
    traced = torch.jit.trace(mod, (q, k, v), check_trace=True)
    ops = [node.kind() for node in traced.graph.nodes()]
    assert ops.count("aten::matmul") == 2 * plan.num_pairs
    assert "prim::If" not in ops and "prim::Loop" not in ops
    qq = q.clone().requires_grad_()
    out, lse = traced(qq, k, v)
    eager_out, eager_lse = mod(q, k, v)
    torch.testing.assert_close(out, eager_out)
    torch.testing.assert_close(lse, eager_lse)
    out.sum().backward()
    assert qq.grad is not None and torch.isfinite(qq.grad).all()


def test_plan_tiles_follow_the_rule_exactly():
    """Every tile's mask (or its absence) equals the dense rule mask on that tile."""
    rule, sync = Local(3, log2_stride=1, causal=True), "scale_front"
    plan = make_plan(rule, (5, 6), (10, 12), sync, 4, 5)
    keep = dense_rule_mask(rule, (5, 6), (10, 12), sync)
    seen = np.zeros_like(keep)
    for row in plan.tiles:
        for t in row:
            (q0, q1), (k0, k1) = plan.q_bounds[t.i], plan.k_bounds[t.j]
            want = keep[q0:q1, k0:k1]
            assert want.any()
            assert (t.mask is None and want.all()) or np.array_equal(t.mask, want)
            seen[q0:q1, k0:k1] = True
    assert not (keep & ~seen).any()  # skipped tiles hold no attended pair


def test_mask_constants_are_shared_between_identical_tiles():
    mod, plan = _module(Local(8), n=256, m=256, cq=8, ck=8)
    assert plan.num_masked_pairs == plan.num_pairs == 22
    # Tiles at the same chunk offset (j - i = -1, 0, 1) are cut the same way.
    assert len(list(mod.buffers())) == 3


def test_uneven_bounds():
    assert bounds(10, 3) == ((0, 4), (4, 7), (7, 10))
    assert bounds(3, 8) == ((0, 1), (1, 2), (2, 3))
    with pytest.raises(ValueError):
        bounds(4, 0)
