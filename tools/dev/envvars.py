"""Environment switches for the benchmark scripts (run as ``python tools/dev/<script>.py``)."""

from __future__ import annotations

import os
from typing import Any


class env_set:
    """Context manager: set environment variables (a value of None unsets one), then restore them.

    The backends read their tuning switches per call (``ATTNHUB_CUDA_*``, ``ATTNHUB_TRITON_*``) or at
    trace time (JAX), so a variant is timed inside the block that selects it."""

    def __init__(self, **env: str | None) -> None:
        self.env: dict[str, str | None] = env
        self.old: dict[str, str | None] = {}

    def __enter__(self) -> None:
        self.old = {k: os.environ.get(k) for k in self.env}
        _apply(self.env)

    def __exit__(self, *exc: Any) -> None:
        _apply(self.old)


def _apply(env: dict[str, str | None]) -> None:
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
