"""Relaunching a compiled Triton kernel without Triton's per-call argument binding.

``JITFunction.__getitem__(grid)(...)`` specialises every argument (type, 16-byte divisibility,
value 1) and looks the compiled kernel up on each call: for the forward's 50-odd arguments that
costs more CPU time than a short kernel runs (profiled on the H100's host). The launchers
here are created per call signature (``launch._FwdLaunch``), whose key already fixes everything
Triton specialises on (strides, lengths, alignments, dtypes); the first call goes through Triton and
keeps the ``CompiledKernel`` it returns, later calls launch that kernel directly.
"""

from __future__ import annotations

from typing import Any


class Relauncher:
    """Launch ``fn[grid](*args, **kwargs)`` once through Triton, then its compiled kernel directly.

    ``args`` must be the kernel's leading parameters, in order; ``kwargs`` the rest (constexprs and
    launch options). Under Triton's interpreter nothing is kept and every call goes through Triton.
    """

    def __init__(self) -> None:
        self._compiled: Any = None
        self._tail: tuple = ()

    def __call__(self, fn: Any, grid: tuple[int, ...], args: tuple, kwargs: dict[str, Any]) -> None:
        compiled = self._compiled
        if compiled is not None:
            compiled[grid](*args, *self._tail)
            return
        ret = fn[grid](*args, **kwargs)
        if hasattr(ret, "packed_metadata") and hasattr(fn, "params"):  # compiled, not interpreted
            params = fn.params[len(args) :]
            self._tail = tuple(kwargs.get(p.name, p.default) for p in params)
            self._compiled = ret

    @property
    def compiled(self) -> bool:
        """True once later calls bypass Triton's binding."""
        return self._compiled is not None
