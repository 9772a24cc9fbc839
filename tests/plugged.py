"""Backends registered for a test module as a third-party plugin would be, and certify run over a
list of cases: what the tests that prove certify fails a deliberately broken backend share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from attnhub import REGISTRY, hookimpl
from attnhub.backend import Backend


@contextlib.contextmanager
def plugged_in(*backends: Backend) -> Iterator[None]:
    """``backends`` registered through the ``attnhub`` hook while the block runs."""

    class _Plugin:
        @hookimpl
        def attnhub_backends(self):
            return list(backends)

    plugin = _Plugin()
    REGISTRY.register_plugin(plugin)
    try:
        yield
    finally:
        REGISTRY.unregister_plugin(plugin)


def run_all(cert, cases) -> list:
    """Every case through ``cert`` (a failure is recorded, not raised); the results."""
    from attnhub_conformance.runner import CaseFailure

    for c in cases:
        with contextlib.suppress(CaseFailure):
            cert.run(c)
    return list(cert.results.values())
