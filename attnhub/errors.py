"""Exceptions raised by attnhub; every one derives from :class:`AttnhubError`.

Each error keeps ``Exception.__init__`` and sets its attributes in ``__new__``, so that it can be
rebuilt from its ``args`` (``type(e)(*e.args)``, pickling) and from a message alone: TensorFlow's
AutoGraph re-raises an error from inside a ``tf.function`` as ``type(e)(message)`` only for
exception classes whose ``__init__`` is ``Exception.__init__``, and otherwise replaces it with a
``StagingError`` that ``except SpecError`` does not catch.
"""

from __future__ import annotations

import re
from typing import Any

_UNSET: Any = object()


class AttnhubError(Exception):
    """Base class of every error attnhub raises on purpose."""

    __init__ = Exception.__init__


class SpecError(AttnhubError, ValueError):
    """The request breaks SPEC.md (bad shape, dtype, rule, ...); raised before any kernel runs.

    ``argument`` names the argument, ``expected`` and ``actual`` say what it should be and was.
    """

    __init__ = Exception.__init__

    argument: str
    expected: str
    actual: object

    def __new__(cls, argument: str, expected: str = _UNSET, actual: object = _UNSET, *rest: Any):
        if expected is _UNSET:  # rebuilt from a message (AutoGraph): recover the argument name
            self = super().__new__(cls, argument)
            found = re.search(r"(?:^|\n)\s*(?:\w+: )?([^\n:]+): expected (.*), got (.*)", str(argument))
            self.argument = found.group(1) if found else str(argument)
            self.expected = found.group(2) if found else ""
            self.actual = found.group(3) if found else None
            self._message = str(argument)
            return self
        self = super().__new__(cls, argument, expected, actual, *rest)
        self.argument, self.expected, self.actual = argument, expected, actual
        self._message = f"{argument}: expected {expected}, got {actual!r}"
        return self

    def __str__(self) -> str:
        return self._message


class BackendUnsupported(AttnhubError):
    """A backend named explicitly cannot serve the request; ``reasons`` says why."""

    __init__ = Exception.__init__

    def __new__(cls, backend: str, reasons: Any = _UNSET, *rest: Any):
        if reasons is _UNSET:  # rebuilt from a message
            self = super().__new__(cls, backend)
            self.backend, self.reasons, self._message = "", [], str(backend)
            return self
        self = super().__new__(cls, backend, reasons, *rest)
        self.backend, self.reasons = backend, list(reasons)
        lines = "\n".join(f"  - {r}" for r in self.reasons)
        self._message = f"backend {backend!r} cannot run this request:\n{lines}"
        return self

    def __str__(self) -> str:
        return self._message


class NoBackendError(AttnhubError):
    """``backend="auto"`` found no backend able to serve the request; ``reasons`` by backend, and
    optionally a line on what to do (``next_step``)."""

    __init__ = Exception.__init__

    def __new__(cls, reasons: Any = _UNSET, *rest: Any):
        if isinstance(reasons, str) or reasons is _UNSET:  # rebuilt from a message
            self = super().__new__(cls) if reasons is _UNSET else super().__new__(cls, reasons)
            self.reasons, self._message = {}, "" if reasons is _UNSET else reasons
            return self
        self = super().__new__(cls, reasons, *rest)
        self.reasons = {name: list(r) for name, r in reasons.items()}
        parts = [f"  {name}: " + "; ".join(rs) for name, rs in self.reasons.items()]
        body = "\n".join(parts) if parts else "  (no backend is registered)"
        self._message = f"no backend can run this request:\n{body}"
        if rest and isinstance(rest[0], str) and rest[0]:
            self._message += f"\nnext step: {rest[0]}"
        return self

    def __str__(self) -> str:
        return self._message


class BackendError(AttnhubError, RuntimeError):
    """A backend failed on a request it had accepted: an exception in its forward or backward, or
    a result of the wrong shape, dtype, framework or device. ``backend`` names it, ``request``
    describes the call (``Request.describe()``); the backend's own exception is the ``__cause__``.
    """

    __init__ = Exception.__init__

    def __new__(cls, backend: str, request: str = _UNSET, problem: str = "", *rest: Any):
        if request is _UNSET:  # rebuilt from a message
            self = super().__new__(cls, backend)
            found = re.search(r"backend '([^']*)' failed", str(backend))
            self.backend = found.group(1) if found else ""
            self.request, self.problem, self._message = "", "", str(backend)
            return self
        self = super().__new__(cls, backend, request, problem, *rest)
        self.backend, self.request, self.problem = backend, request, problem
        self._message = f"backend {backend!r} failed on {request}: {problem}"
        return self

    def __str__(self) -> str:
        return self._message


def passes_through(exc: BaseException) -> bool:
    """Exceptions from a backend that reach the caller unchanged: attnhub's own (a SpecError a
    backend raises is still about the request) and running out of memory, which callers catch
    by type (``MemoryError``, ``torch.OutOfMemoryError``) to retry smaller."""
    return isinstance(exc, (AttnhubError, MemoryError)) or type(exc).__name__.endswith("OutOfMemoryError")


def backend_error(name: str, req: Any, problem: str) -> BackendError:
    """The :class:`BackendError` of backend ``name`` on request ``req`` (a Request, or None)."""
    return BackendError(name, req.describe() if req is not None else "a request", problem)
