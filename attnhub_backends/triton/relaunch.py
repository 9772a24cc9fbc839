"""Relaunching a compiled Triton kernel without Triton's per-call argument binding.

``JITFunction.__getitem__(grid)(...)`` specialises every argument (type, 16-byte divisibility,
value 1) and looks the compiled kernel up on each call: for the forward's 50-odd arguments that
costs more CPU time than a short kernel runs (profiled on the H100's host). The launchers
here are created per call signature (``launch._FwdLaunch``), whose key already fixes everything
Triton specialises on (strides, lengths, alignments, dtypes); the first call goes through Triton and
keeps the ``CompiledKernel`` it returns, later calls launch that kernel directly.

"Directly" is the compiled kernel's own launcher (``CompiledKernel.run``, Triton's C launcher)
with the current CUDA stream, as ``CompiledKernel.__getitem__``'s runner calls it, without the
runner's per-call closure, device and stream queries through Triton's driver, and launch-hook
lookups (together about as long as the launch itself on the H100's host). Where the compiled
kernel lacks those attributes, or a launch hook (a profiler's) is set when the signature first
runs, later calls go through the runner instead; hooks set after that first call are not seen.
Triton 3.5 and later keep an empty hook chain where older ones kept None: both count as unset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Relauncher:
    """Launch ``fn[grid](*args, **kwargs)`` once through Triton, then its compiled kernel directly.

    ``args`` must be the kernel's leading parameters, in order, the first a torch tensor on the
    launch's device; ``kwargs`` the rest (constexprs and launch options). Under Triton's
    interpreter nothing is kept and every call goes through Triton.
    """

    def __init__(self) -> None:
        self._launch: Callable[[tuple[int, ...], tuple], None] | None = None
        #: True once later calls use the compiled kernel's C launcher (not Triton's runner).
        self.direct = False

    def __call__(self, fn: Any, grid: tuple[int, ...], args: tuple, kwargs: dict[str, Any]) -> None:
        launch = self._launch
        if launch is not None:
            launch(grid, args)
            return
        ret = fn[grid](*args, **kwargs)
        if hasattr(ret, "packed_metadata") and hasattr(fn, "params"):  # compiled, not interpreted
            params = fn.params[len(args) :]
            tail = tuple(kwargs.get(p.name, p.default) for p in params)
            direct = _direct(ret, tail)
            self.direct = direct is not None
            self._launch = direct or _runner(ret, tail)

    @property
    def compiled(self) -> bool:
        """True once later calls bypass Triton's binding."""
        return self._launch is not None


def _runner(compiled: Any, tail: tuple) -> Callable[[tuple[int, ...], tuple], None]:
    def launch(grid: tuple[int, ...], args: tuple) -> None:
        compiled[grid](*args, *tail)

    return launch


def _direct(compiled: Any, tail: tuple) -> Callable[[tuple[int, ...], tuple], None] | None:
    """The compiled kernel's C launcher called as its runner does, or None where this Triton's
    kernel does not look as expected or a launch hook is set."""
    try:
        import torch
        from triton import knobs

        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
        run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    except (ImportError, AttributeError):
        return None
    if not all(_unset(h) for h in hooks) or function is None or not callable(run):
        return None
    stream = torch._C._cuda_getCurrentRawStream

    def launch(grid: tuple[int, ...], args: tuple) -> None:
        run(
            grid[0],
            grid[1],
            grid[2],
            stream(args[0].get_device()),
            function,
            meta,
            None,
            None,
            None,
            *args,
            *tail,
        )

    return launch


def _unset(hook: Any) -> bool:
    """True for a launch hook that calls nothing: None (Triton before 3.5) or an empty
    ``HookChain`` (later Tritons keep a chain there, never None)."""
    return hook is None or getattr(hook, "calls", None) == []
