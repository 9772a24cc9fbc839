"""relaunch.py without a GPU: when a compiled kernel is relaunched through its C launcher, and when
Triton's runner is kept instead (a launch hook set, a kernel object of another shape)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
knobs = pytest.importorskip("triton").knobs

from attnhub_backends.triton import relaunch  # noqa: E402

_LOADED = object()  # a loaded kernel function handle


class _Compiled:
    """The attributes of Triton's CompiledKernel that relaunch reads."""

    def __init__(self, function=_LOADED):
        self.run = lambda *a: None
        self.function = function
        self.packed_metadata = ()


def _hooks():
    return knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook


def test_unset_hooks_are_none_or_empty_chains():
    assert relaunch._unset(None)
    chain = knobs.HookChain() if hasattr(knobs, "HookChain") else None
    if chain is not None:
        assert relaunch._unset(chain)
        chain.add(lambda *a: None)
        assert not relaunch._unset(chain)
    assert not relaunch._unset(lambda *a: None)


def test_direct_launch_unless_a_hook_is_set(monkeypatch):
    """This Triton's default hooks (None or empty chains) give the direct launcher; a hook set
    (a profiler's) or a kernel without a loaded function keeps Triton's runner."""
    import torch

    assert all(relaunch._unset(h) for h in _hooks()), "the test process has a launch hook set"
    # A CPU build of torch lacks the CUDA stream query the launcher reads (only named here).
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    assert relaunch._direct(_Compiled(), ()) is not None
    assert relaunch._direct(_Compiled(function=None), ()) is None
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert relaunch._direct(_Compiled(), ()) is None
