"""The ring's fused lse merge (``attnhub.distributed.merge_kernel``) rewrites its rows in place:
no thread may store a merged lse before every thread has read the old one.

Issue 40: the 4-GPU ring gave O that differed between runs (lse equal). Triton lays the tile's
rows across all four warps and loads the old lse once per layout, so a warp that stored its
merged lse early could be read by a slower warp, which then weighted its part of O by the merged
lse. Compiling the kernel for sm_90 (no GPU needed) shows the order of loads, barrier and stores;
``tests/test_distributed_gpu.py`` repeats the merge under load on a GPU."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("torch")


def _ttgir(fresh: bool, pair: bool) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnhub.distributed.merge_kernel import _merge

    names = _merge.arg_names
    pointers = {"ao", "al", "ob", "lb", "out", "xo", "xl"}
    flags = {"FRESH": fresh, "OUT": True, "PAIR": pair, "BR": 64, "BD": 128}
    sig = {
        n: ("*bf16" if n == "ob" else "*fp32") if n in pointers else "constexpr" if n in flags else "i32"
        for n in names
    }
    src = ASTSource(_merge, sig, constexprs={(names.index(k),): v for k, v in flags.items()})
    try:
        return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ttgir"]
    except Exception as exc:  # a Triton without its CUDA compiler on this machine
        pytest.skip(f"cannot compile for sm_90 here: {type(exc).__name__}: {exc}")


def test_every_load_precedes_a_barrier_before_the_first_store() -> None:
    """The accumulating merge (not fresh, no pair): its rows are read and rewritten in place."""
    ir = _ttgir(fresh=False, pair=False)
    ops = [m.group(1) for m in re.finditer(r"\b(tt\.load|tt\.store|ttg\.barrier|gpu\.barrier)\b", ir)]
    assert "tt.store" in ops and "tt.load" in ops
    first_store = ops.index("tt.store")
    last_load = max(i for i, op in enumerate(ops) if op == "tt.load")
    assert last_load < first_store, ops
    assert any(op.endswith("barrier") for op in ops[last_load:first_store]), (
        f"no barrier between the last load and the first store: {ops}"
    )
