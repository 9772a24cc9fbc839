"""attnhub: exact scaled-dot-product attention, dispatched to the best backend for each request.

Importing attnhub loads no framework (torch, tensorflow, jax, triton, poptorch): backends load
their frameworks lazily, when a request of theirs arrives.
"""

from __future__ import annotations

import importlib
from typing import Any

from attnhub import first_use
from attnhub.api import BackendRecord, attention, backends, explain
from attnhub.backend import FEATURES, Backend
from attnhub.dispatch import DISPATCHER, Explanation, use_backend
from attnhub.errors import AttnhubError, BackendError, BackendUnsupported, NoBackendError, SpecError
from attnhub.hookspecs import hookimpl
from attnhub.operands import Operands
from attnhub.ragged import attention_kvcache, attention_varlen
from attnhub.registry import REGISTRY
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local

__version__ = "0.1.0"

# auto's first-use measurement (ATTNHUB_AUTOTUNE) times candidates through the tuner, which runs
# attnhub's public API; the dispatcher, which times nothing itself, asks it about a request class
# the device's profile lacks. Wired here, above both, so that no import runs in a circle.
DISPATCHER.measure = first_use.measure

#: Submodules that import a framework, reachable as ``attnhub.<name>`` but imported on first access
#: (PEP 562), so that ``import attnhub; attnhub.torch.patch_sdpa()`` works and ``import attnhub``
#: alone still loads no framework.
LAZY_SUBMODULES = ("torch", "tf", "keras", "ipu", "integrations", "distributed")


def __getattr__(name: str) -> Any:
    """Load the framework submodules and ``tune`` on first access; anything else is missing."""
    if name in LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "tune":  # loaded on use: the tuner imports torch only when it runs
        from attnhub.tuner import tune

        return tune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names plus the lazily loaded ones, so completion and ``dir()`` show them."""
    return sorted(set(globals()) | set(LAZY_SUBMODULES) | {"tune"})


__all__ = [
    "FEATURES",
    "REGISTRY",
    "AttnhubError",
    "Backend",
    "BackendError",
    "BackendRecord",
    "BackendUnsupported",
    "Causal",
    "ExplicitMask",
    "Explanation",
    "Full",
    "Local",
    "NoBackendError",
    "Operands",
    "Request",
    "SpecError",
    "attention",
    "attention_kvcache",
    "attention_varlen",
    "backends",
    "explain",
    "hookimpl",
    "tune",
    "use_backend",
]
