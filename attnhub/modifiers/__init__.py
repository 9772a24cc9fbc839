"""SPEC §9 score modifiers as objects (:class:`ScoreModifier`), one module each.

Every module of this package that defines ``MODIFIER`` is one: found here, in module-name order,
so that adding a modifier is adding its module (and the backends that compute it); no other core
file names it. The core asks :data:`MODIFIERS` for validation, cache keys, decline reasons and
descriptions (attnhub/extras.py, attnhub/backend.py, attnhub/request.py).
"""

from __future__ import annotations

import importlib
import pkgutil

from attnhub.modifiers.base import Call, ScoreModifier

#: The modifiers of SPEC's first edition, which keep dedicated request and operand fields.
BUILT_IN = ("bias", "softcap", "sinks")


def _discover() -> dict[str, ScoreModifier]:
    found: dict[str, ScoreModifier] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"{__name__}.{info.name}")
        m = getattr(mod, "MODIFIER", None)
        if isinstance(m, ScoreModifier):
            found[m.name] = m
    return found


_FOUND = _discover()
#: name -> modifier, the built-in ones first (in SPEC's order), then the added ones by name.
MODIFIERS: dict[str, ScoreModifier] = {n: _FOUND[n] for n in BUILT_IN} | {
    n: m for n, m in sorted(_FOUND.items()) if n not in BUILT_IN
}
#: The modifiers added since the first edition: they travel in ``Request.more``/``Operands.more``.
ADDED: dict[str, ScoreModifier] = {n: m for n, m in MODIFIERS.items() if n not in BUILT_IN}

__all__ = ["ADDED", "BUILT_IN", "MODIFIERS", "Call", "ScoreModifier"]
