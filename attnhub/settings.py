"""Every ``ATTNHUB_*`` environment variable, declared once and read one way.

A setting has a name, a parser, a default, a one-line meaning and an audience: ``user`` settings are
part of the interface (README, ``attnhub info --settings``); ``dev`` settings pin kernel choices
for tuning and experiments and may change between releases; a backend declares its own dev
settings with :func:`declare` in its package (``attnhub_backends/<name>/knobs.py``), so the core
names no backend's knobs. Shipped code reads a setting only through :func:`value` (parsed,
validated) or :func:`raw` (the string, for cache keys); a name that is not declared raises
``KeyError`` and ``tests/test_settings.py`` fails on any ``ATTNHUB_*`` literal in shipped code
that is not declared.

Values are re-read from the environment at each call (a dict lookup), so ``monkeypatch.setenv``
and ``os.environ[...] = ...`` take effect at once; parsing is cached per raw string.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from attnhub.errors import AttnhubError

__all__ = [
    "SETTINGS",
    "Setting",
    "SettingError",
    "declare",
    "declared",
    "external",
    "raw",
    "snapshot",
    "value",
]


class SettingError(AttnhubError):
    """An ``ATTNHUB_*`` environment variable holds a value its setting does not accept."""


@dataclass(frozen=True)
class Setting:
    """One environment variable: how to parse it, its default, what it means, who it is for."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    meaning: str
    audience: str = "dev"  # "user" or "dev"
    expects: str = ""  # what a valid value looks like, for the error message and `info --settings`


# --- parsers -----------------------------------------------------------------------------------


def _autotune_mode(text: str) -> str:
    """``ATTNHUB_AUTOTUNE``: "on" (every class the profile lacks), "off", or "auto" (the default:
    CUDA requests long enough to time, :func:`attnhub.tuner.worth_measuring`)."""
    low = text.strip().lower()
    if low in ("", "auto"):
        return "auto"
    return "on" if _flag(low) else "off"


def _flag(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def _name(text: str) -> str:
    return text.strip()


def parse_ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def parse_int(text: str) -> int:
    return int(text)


def parse_ints_n(least: int, most: int | None = None) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated integers, at least ``least`` (and at most ``most``) of them."""

    def parse(text: str) -> tuple[int, ...]:
        vals = parse_ints(text)
        if len(vals) < least or (most is not None and len(vals) > most):
            raise ValueError(text)
        return vals

    return parse


def parse_digits(text: str) -> int:
    """A non-negative integer written in digits only (no sign, no spaces)."""
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def parse_bit(text: str) -> bool:
    """Exactly ``0`` or ``1``."""
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


def parse_choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(text)
        return text

    parse.__name__ = "one of " + ", ".join(allowed)
    return parse


def _path(text: str) -> str:
    return os.path.expanduser(text)


def _pallas_mode(text: str) -> str:
    """ "on", "off" or "interpret" (the jax backend's Pallas path)."""
    mode = {"1": "on", "on": "on", "0": "off", "off": "off", "interpret": "interpret"}.get(
        text.strip().lower()
    )
    if mode is None:
        raise ValueError(text)
    return mode


def parse_positive_pair(text: str) -> tuple[int, int]:
    first, second = (int(x) for x in text.split(","))  # not two values: ValueError
    if first < 1 or second < 1:
        raise ValueError(text)
    return first, second


# --- the registry ------------------------------------------------------------------------------

SETTINGS: dict[str, Setting] = {}


def declare(name: str, parse, default, meaning: str, audience: str = "dev", expects: str = "") -> None:
    """Declare a setting; a backend declares its development settings in its own package, at
    import (attnhub_backends/triton/knobs.py)."""
    assert name.startswith("ATTNHUB_") and name not in SETTINGS, name
    SETTINGS[name] = Setting(name, parse, default, meaning, audience, expects)


# fmt: off
# User-facing.
declare("ATTNHUB_BACKEND", _name, None, "backend that backend='auto' means (as use_backend)", "user", "a backend name")
declare("ATTNHUB_DISABLE", _names, frozenset(), "backends auto dispatch never picks", "user", "name1,name2")
declare("ATTNHUB_CACHE_DIR", _path, None, "where compiled kernels, timing profiles and certify verdicts are kept (default ~/.cache/attnhub)", "user", "a directory")
declare("ATTNHUB_AUTOTUNE", _autotune_mode, "auto", "auto: time the candidates on first use of a request class the profile lacks (auto: on CUDA, for calls long enough to time)", "user", "1 (always), 0 (never) or auto")
declare("ATTNHUB_IPU_EMULATE", _flag, False, "run the ipu backend's PopTorch graph on CPU tensors", "user", "0 or 1")
declare("ATTNHUB_TRITON_TUNE", _flag, True, "use the triton configs that `attnhub warmup --tune` recorded for this GPU", "user", "0 or 1")
declare("ATTNHUB_JAX_PALLAS", _pallas_mode, "on", "jax backend's Pallas GPU path (interpret: Pallas interpreter)", "user", "1 (on), 0 (off) or interpret")
declare("ATTNHUB_JAX_CUDNN", _flag, True, "jax backend's cuDNN path where it serves the exact request", "user", "0 or 1")
declare(
    "ATTNHUB_TRUST_LENGTHS", _flag, False,
    "skip reading q_lengths/k_lengths/cu_seqlens/block tables to check them (no device sync per call; kernels clamp lengths)",
    "user", "0 or 1",
)  # fmt: skip
declare(
    "ATTNHUB_CP_TORCH_MERGE", _flag, False, "context parallelism merges partial results with torch ops, not the fused Triton merge", "user", "0 or 1"
)

# Development settings (pins of kernel choices for tuning and experiments) are declared by the
# backend they belong to, in its package (attnhub_backends/<name>/knobs.py).
# fmt: on


# --- reading -----------------------------------------------------------------------------------


def _posix_environ_data() -> dict[bytes, bytes] | None:
    """``os.environ``'s own store on POSIX, keyed by the encoded name (reading it directly still
    sees every change made through ``os.environ``), else None."""
    data = getattr(os.environ, "_data", None)
    return data if os.name == "posix" and isinstance(data, dict) else None


def _environ_reader() -> Callable[[str], str | None]:
    """A fast reader of one environment variable (``os.environ.get`` costs ~1 us): from
    :func:`_posix_environ_data` where it exists, else ``os.environ.get``."""
    data = _posix_environ_data()
    if data is not None:
        encoded: dict[str, bytes] = {}

        def read(name: str, _data=data, _encoded=encoded, _fsencode=os.fsencode) -> str | None:
            key = _encoded.get(name)
            if key is None:
                key = _encoded[name] = _fsencode(name)
            found = _data.get(key)
            return None if found is None else os.fsdecode(found)

        return read
    return os.environ.get


_read = _environ_reader()


def key_reader(name: str) -> Callable[[], Any]:
    """A zero-argument reader of ``name``'s raw value for cache keys: two reads give equal results
    exactly when the variable did not change (bytes or None on POSIX, ``os.environ``'s text
    elsewhere); a C-level call, for what is read on every call. ``name``: a declared attnhub
    setting or another project's variable."""
    if name.startswith("ATTNHUB_") and name not in SETTINGS:
        raise KeyError(f"{name} is not a declared attnhub setting (attnhub/settings.py)")
    data = _posix_environ_data()
    if data is not None:
        return partial(data.get, os.fsencode(name))
    return partial(os.environ.get, name)


def external(name: str) -> str | None:
    """Another project's environment variable (``TRITON_INTERPRET``, ``XDG_CACHE_HOME``), read fast."""
    if name.startswith("ATTNHUB_"):
        raise KeyError(f"{name}: read attnhub settings with settings.value or settings.raw")
    return _read(name)


def declared(name: str) -> Setting:
    """The declaration of ``name``; ``KeyError`` for an undeclared name (a bug in the caller)."""
    return SETTINGS[name]


def raw(name: str) -> str | None:
    """The variable's text, None when unset or empty (for cache keys and messages)."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not a declared attnhub setting (attnhub/settings.py)")
    text = _read(name)
    return text if text else None


@lru_cache(maxsize=256)
def _parsed(name: str, text: str) -> Any:
    setting = SETTINGS[name]
    try:
        return setting.parse(text)
    except (ValueError, TypeError):
        expects = setting.expects or getattr(setting.parse, "__name__", "a valid value")
        raise SettingError(f"{name} takes {expects}, got {text!r}") from None


def value(name: str) -> Any:
    """The parsed value of a setting, or its default when unset or empty.

    Raises :class:`SettingError` (naming the variable, what it takes and what it holds) for a
    value its parser rejects.
    """
    text = raw(name)
    return SETTINGS[name].default if text is None else _parsed(name, text)


def snapshot(*names: str) -> tuple[str | None, ...]:
    """The raw values of ``names``, for folding into a cache key."""
    return tuple(raw(n) for n in names)
