"""The triton backend on the CPU: tile plans in-process, kernels under Triton's interpreter.

The kernel checks live in ``triton_interp_cases.py`` and run in a child pytest with
``TRITON_INTERPRET=1`` set before triton is imported (see that file's docstring).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnhub.rules import Causal, Full, Local
from attnhub_backends.triton import plan

pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:  # not imported here: see tests/triton_check.py
    pytest.skip("triton is not installed", allow_module_level=True)


@pytest.mark.slow
def test_kernels_under_interpreter() -> None:
    """Forward, lse and dq/dk/dv against the float64 reference (SPEC §6) for rules, syncs, 2-d, GQA."""
    here = Path(__file__).parent
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(here.parent))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here / "triton_interp_cases.py")],
        cwd=here.parent, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize(
    "rule,sync,sq,sk",
    [
        (Causal(), "none_front", (70,), (70,)),
        (Causal(), "none_end", (33,), (90,)),
        (Local(7, causal=True), "none_end", (64,), (64,)),
        (Local(4, log2_stride=2), "scale_end", (30,), (60,)),
        (Local((2, 3)), "none_front", (9, 11), (9, 11)),
        (Causal(), "scale_front", (6, 8), (12, 16)),
        (Full(), "none_front", (50,), (45,)),
    ],
)
def test_plan_is_exact_where_it_claims(rule, sync, sq, sk) -> None:
    """EMPTY tiles hold no attended pair, FULL tiles only attended pairs (else work is wrong)."""
    from attnhub.positions import dense_rule_mask

    dense = dense_rule_mask(rule, sq, sk, sync)
    bm, bn = 16, 8
    cls = plan.classify(rule, sq, sk, sync, bm, bn)
    for i in range(cls.shape[0]):
        for j in range(cls.shape[1]):
            tile = dense[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn]
            if cls[i, j] == plan.EMPTY:
                assert not tile.any()
            elif cls[i, j] == plan.FULL:
                assert tile.all() and tile.shape[1] == bn
    rows = plan.lists(cls)
    for i in range(cls.shape[0]):
        lo, hi, n = rows[i, :3]
        visited = set(range(lo, hi)) | set(rows[i, 3 : 3 + n].tolist())
        assert visited == set(np.flatnonzero(cls[i] != plan.EMPTY).tolist())
        assert all(cls[i, j] == plan.FULL for j in range(lo, hi))


def test_work_skipping_counts() -> None:
    """Causal visits about half the tile pairs of Full; a local window O(L·w)."""
    n, b = 4096, 128
    full = (plan.classify(Full(), (n,), (n,), "none_front", b, b) != plan.EMPTY).sum()
    causal = (plan.classify(Causal(), (n,), (n,), "none_front", b, b) != plan.EMPTY).sum()
    local = (plan.classify(Local(256, causal=True), (n,), (n,), "none_end", b, b) != plan.EMPTY).sum()
    assert causal <= 0.52 * full
    assert local <= (n // b) * (256 // b + 2)


def test_tuner_is_not_fooled_by_a_cold_gpu(monkeypatch) -> None:
    """A GPU that runs at half speed for its first 8 ms must not make the first candidate lose."""
    from attnhub_backends.triton import configs

    fast, slow = configs.Cfg(128, 128, 8, 3), configs.Cfg(64, 64, 4, 3)
    cost = {fast: 1.0, slow: 1.15}  # ms per run once warm
    state = {"elapsed": 0.0, "last": None}

    def run(cfg):
        state["last"] = cfg

    def elapsed_ms(fn, n):
        total = 0.0
        for _ in range(n):
            fn()
            t = cost[state["last"]] * (2.0 if state["elapsed"] < 8.0 else 1.0)
            state["elapsed"] += t
            total += t
        return total / n

    monkeypatch.setattr(configs, "_elapsed_ms", elapsed_ms)
    monkeypatch.setenv("ATTNHUB_TRITON_TUNE", "1")
    key = ("test-cold-gpu",)
    configs._CHOSEN.pop(key, None)
    try:
        with configs.tuning():
            assert configs.choose(key, [fast, slow], run, 1 << 30) == fast
            state["elapsed"] = 0.0
            configs._CHOSEN.pop(key, None)
            assert configs.choose(key, [slow, fast], run, 1 << 30) == fast
    finally:
        configs._CHOSEN.pop(key, None)


def test_declines_instead_of_crashing_after_tensorflow(monkeypatch) -> None:
    """Triton imported after TensorFlow aborts the process: the backend says so and is skipped."""
    import sys
    import types

    import torch

    import attnhub
    from attnhub_backends.triton.backend import TritonBackend

    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    why = TritonBackend().availability()
    assert why and "import triton before tensorflow" in why
    q = torch.randn(1, 1, 4, 8)
    verdict = next(v for v in attnhub.explain(q, q, q).verdicts if v.name == "triton")
    assert any("import triton before tensorflow" in r for r in verdict.reasons)
