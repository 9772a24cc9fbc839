"""Exceptions raised by attnhub; every one derives from :class:`AttnhubError`."""

from __future__ import annotations


class AttnhubError(Exception):
    """Base class of every error attnhub raises on purpose."""


class SpecError(AttnhubError, ValueError):
    """The request breaks SPEC.md (bad shape, dtype, rule, ...); raised before any kernel runs."""

    def __init__(self, argument: str, expected: str, actual: object) -> None:
        self.argument = argument
        self.expected = expected
        self.actual = actual
        super().__init__(f"{argument}: expected {expected}, got {actual!r}")


class BackendUnsupported(AttnhubError):
    """A backend named explicitly cannot serve the request; ``reasons`` says why."""

    def __init__(self, backend: str, reasons: list[str]) -> None:
        self.backend = backend
        self.reasons = list(reasons)
        lines = "\n".join(f"  - {r}" for r in self.reasons)
        super().__init__(f"backend {backend!r} cannot run this request:\n{lines}")


class NoBackendError(AttnhubError):
    """``backend="auto"`` found no backend able to serve the request."""

    def __init__(self, reasons: dict[str, list[str]]) -> None:
        self.reasons = {name: list(r) for name, r in reasons.items()}
        parts = []
        for name, rs in self.reasons.items():
            parts.append(f"  {name}: " + "; ".join(rs))
        body = "\n".join(parts) if parts else "  (no backend is registered)"
        super().__init__(f"no backend can run this request:\n{body}")
