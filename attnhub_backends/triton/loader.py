"""Load the kernels module in the mode of the moment: compiled, or interpreted on the CPU.

``triton.jit`` decides at decoration time whether a function runs compiled or under the
interpreter (``TRITON_INTERPRET=1``). The kernel source is therefore executed once per mode into
its own module, so that a process can hold both (tests switch the variable per test).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from attnhub import settings

_LOCK = threading.RLock()  # re-entrant: a kernel source loads tiles.py while it executes
_LOADED: dict[tuple[str, bool], ModuleType] = {}


_interpret_raw = settings.key_reader("TRITON_INTERPRET")


def interpret_mode() -> bool:
    """True when ``TRITON_INTERPRET`` asks for Triton's CPU interpreter (read on every launch:
    a C-level read and a cached parse)."""
    return _truthy(_interpret_raw())


@lru_cache(maxsize=16)
def _truthy(raw: str | bytes | None) -> bool:
    text = os.fsdecode(raw) if raw is not None else "0"
    return text.strip().lower() in ("1", "true", "yes", "on")


def kernels(interpret: bool | None = None) -> ModuleType:
    """The kernels module for ``interpret`` (default: the current ``TRITON_INTERPRET``)."""
    return load("kernels.py", interpret)


def load(filename: str, interpret: bool | None = None) -> ModuleType:
    """The kernel source ``filename`` (beside this file) executed in mode ``interpret`` (default:
    the current ``TRITON_INTERPRET``), once per mode and file."""
    mode = interpret_mode() if interpret is None else interpret
    key = (filename, mode)
    found = _LOADED.get(key)
    if found is not None:
        return found
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        stem = Path(filename).stem
        name = f"attnhub_backends.triton._{stem}_{'interpreted' if mode else 'compiled'}"
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if mode else "0"
        try:
            sys.modules[name] = module
            spec.loader.exec_module(module)
        finally:
            if saved is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = saved
        _LOADED[key] = module
        return module
