"""Backend registry: loads every plugin of the ``attnhub`` entry-point group through pluggy.

Each plugin is loaded and asked for its backends in isolation: one that fails to import or
register is recorded in ``load_errors`` (shown by ``attnhub info``) and the others keep working.
"""

from __future__ import annotations

import threading
import traceback
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy

from attnhub import hookspecs
from attnhub.backend import Backend


@dataclass
class LoadError:
    """A plugin that could not be loaded or that raised while registering."""

    plugin: str
    error: str
    detail: str


class Registry:
    """Backends by name, loaded lazily on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backends: dict[str, Backend] | None = None
        self.load_errors: list[LoadError] = []
        self._extra_plugins: list[Any] = []
        #: Called after the set of backends may have changed (the dispatcher drops its cache).
        self.on_reset: list[Any] = []

    def register_plugin(self, plugin: Any) -> None:
        """Register a plugin object or module in-process (tests, notebooks); reloads the registry."""
        with self._lock:
            self._extra_plugins.append(plugin)
            self._backends = None
        self._notify()

    def unregister_plugin(self, plugin: Any) -> None:
        with self._lock:
            self._extra_plugins.remove(plugin)
            self._backends = None
        self._notify()

    def reload(self) -> None:
        """Forget the loaded backends; the next use rescans the entry points."""
        with self._lock:
            self._backends = None
        self._notify()

    def _notify(self) -> None:
        for callback in self.on_reset:
            callback()

    def backends(self) -> dict[str, Backend]:
        found = self._backends
        if found is None:
            with self._lock:
                if self._backends is None:
                    self._backends = self._load()
                found = self._backends
        return found

    def _load(self) -> dict[str, Backend]:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        errors: list[LoadError] = []
        sources: list[tuple[str, Any]] = []
        for ep in metadata.entry_points(group=hookspecs.PROJECT):
            label = f"{ep.name} ({ep.value})"
            try:
                sources.append((label, ep.load()))
            except Exception as exc:  # isolate a broken plugin
                errors.append(LoadError(label, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        sources.extend((repr(p), p) for p in self._extra_plugins)

        result: dict[str, Backend] = {}
        for label, plugin in sources:
            try:
                if pm.is_registered(plugin):
                    continue
                pm.register(plugin, name=label)
                impls = [h for h in pm.hook.attnhub_backends.get_hookimpls() if h.plugin is plugin]
                for impl in impls:
                    for backend in impl.function() or []:
                        if not isinstance(backend, Backend) or not backend.name:
                            raise TypeError(f"{backend!r} is not a named attnhub.Backend")
                        if backend.name in result:
                            raise ValueError(f"backend name {backend.name!r} is already registered")
                        result[backend.name] = backend
            except Exception as exc:
                errors.append(LoadError(label, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        self.load_errors = errors
        return dict(sorted(result.items(), key=lambda kv: (-kv[1].priority, kv[0])))


REGISTRY = Registry()
