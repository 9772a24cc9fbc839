"""The score-modifier contract (SPEC §9): what the core knows about one modifier, in one object."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from attnhub.frameworks import Adapter, adapter_for


@dataclass(frozen=True)
class Call:
    """What a modifier's argument is validated against: the call's sizes, device and dtype."""

    ad: Adapter
    q: Any
    batch: int
    heads_q: int
    nq: int
    nk: int
    ndim: int
    sync: str
    device: str
    dtype: str


class ScoreModifier:
    """One SPEC §9 score modifier. The core asks it everything it needs to know (validation, the
    dispatch cache key, the feature a backend declares to compute it, the reason a backend without
    it declines, the array a backend receives, how ``explain`` names it); nothing else in the core
    names a modifier. docs/writing-a-backend.md, "Adding a score modifier", lists the steps.

    The modifiers of SPEC's first edition (bias, softcap, sinks) keep dedicated fields of
    :class:`attnhub.request.Request` and :class:`attnhub.operands.Operands`, which thirty files of
    kernels read; a modifier added since lives in ``Request.more`` (its signature) and
    ``Operands.more`` (its array), under its name.
    """

    #: The keyword of ``attention``, ``attention_varlen`` and ``attention_kvcache``.
    name: str = ""
    #: The feature a backend declares (``Backend.features``) to compute it.
    feature: str = ""
    #: Why a backend without :attr:`feature` declines a request that uses it (words a user can act on).
    missing: str = ""

    def absent(self, value: Any) -> bool:
        """True when the caller's ``value`` means "not used" (the keyword's default)."""
        return value is None

    def signature(self, value: Any, call: Call) -> Hashable:
        """Validate ``value`` against the call (raise :class:`attnhub.errors.SpecError`) and return
        what the request records of it: hashable, never the array's values."""
        raise NotImplementedError

    def key(self, value: Any) -> Hashable:
        """The dispatch cache's key of ``value``, built without validating it (on every call):
        everything :meth:`signature` depends on. Raise TypeError where none can be built (the
        call is then validated, and rejected, without the cache). Default: an array's metadata."""
        return array_key(value, self.name)

    def operand(self, value: Any, ad: Adapter, q: Any, sig: Hashable) -> Any:
        """What a backend receives in ``Operands.more[name]`` (default: ``value`` as given)."""
        return value

    def requires_grad(self, sig: Hashable) -> bool:
        """True when the caller differentiates the argument (only backends declaring "backward"
        then serve it; the backward returns its gradient after (dq, dk, dv, dbias, dsinks))."""
        return False

    def used(self, req: Any) -> bool:
        """True when ``req`` uses this modifier."""
        return any(n == self.name for n, _ in req.more)

    def describe(self, req: Any) -> str:
        """How ``Request.describe`` (and ``attnhub explain``) names its use in ``req``."""
        return self.name

    def __repr__(self) -> str:
        return f"<score modifier {self.name!r}>"


def array_key(value: Any, name: str) -> Hashable:
    """An array's cache key (framework metadata and whether it requires grad); TypeError for
    anything that is not an array."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        ad = adapter_for(value, name)
        return (ad.mask_key(value), ad.mask_needs_grad(value))
    raise TypeError
