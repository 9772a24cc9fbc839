"""The one pluggy hook a plugin implements to offer backends (entry-point group ``attnhub``)."""

from __future__ import annotations

import pluggy

PROJECT = "attnhub"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def attnhub_backends() -> list:
    """Return the backends (instances of :class:`attnhub.Backend`) this plugin provides."""
