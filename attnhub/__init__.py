"""attnhub: exact scaled-dot-product attention, dispatched to the best backend for each request.

Importing attnhub loads no framework (torch, tensorflow, jax, triton, poptorch): backends load
their frameworks lazily, when a request of theirs arrives.
"""

from __future__ import annotations

from attnhub.api import BackendRecord, attention, backends, explain
from attnhub.backend import FEATURES, Backend
from attnhub.dispatch import Explanation, use_backend
from attnhub.errors import AttnhubError, BackendError, BackendUnsupported, NoBackendError, SpecError
from attnhub.hookspecs import hookimpl
from attnhub.operands import Operands
from attnhub.ragged import attention_kvcache, attention_varlen
from attnhub.registry import REGISTRY
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "tune":  # loaded on use: the tuner imports torch only when it runs
        from attnhub.tuner import tune

        return tune
    raise AttributeError(f"module 'attnhub' has no attribute {name!r}")


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
