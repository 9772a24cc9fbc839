"""The settings registry: every ATTNHUB_* name in shipped code is declared, values parse one way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnhub import settings
from attnhub_backends.cuda import knobs as _cuda_knobs  # noqa: F401  (backends declare their dev settings)
from attnhub_backends.jax import knobs as _jax_knobs  # noqa: F401
from attnhub_backends.triton import knobs as _triton_knobs  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("attnhub", "attnhub_backends", "attnhub_conformance")
NAME = re.compile(r"ATTNHUB_[A-Z0-9][A-Z0-9_]*")


def _shipped_names() -> list[tuple[str, str, str]]:
    """(file, name, the character after it) for every ATTNHUB_* token in shipped Python files."""
    found = []
    for top in SHIPPED:
        for path in sorted((ROOT / top).rglob("*.py")):
            text = path.read_text()
            for m in NAME.finditer(text):
                found.append((str(path.relative_to(ROOT)), m.group(), text[m.end() : m.end() + 1]))
    return found


def test_every_name_in_shipped_code_is_declared():
    undeclared = sorted({(f, n) for f, n, after in _shipped_names() if n not in settings.SETTINGS})
    assert not undeclared, f"ATTNHUB_* names read but not declared in attnhub/settings.py: {undeclared}"


def test_no_name_is_built_at_run_time():
    built = sorted({(f, n) for f, n, after in _shipped_names() if after == "{"})
    assert not built, f"setting names built with f-strings cannot be checked: {built}"


def test_scan_sees_an_undeclared_name(tmp_path, monkeypatch):
    """The scan itself works: a file reading an undeclared name is caught."""
    (tmp_path / "attnhub").mkdir()
    (tmp_path / "attnhub" / "x.py").write_text('os.environ.get("ATTNHUB_NOT_A_SETTING")\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        with pytest.raises(AssertionError, match="ATTNHUB_NOT_A_SETTING"):
            test_every_name_in_shipped_code_is_declared()
    finally:
        ROOT = saved


def test_undeclared_name_raises():
    with pytest.raises(KeyError, match="not a declared"):
        settings.raw("ATTNHUB_NOPE")
    with pytest.raises(KeyError):
        settings.external("ATTNHUB_BACKEND")


def test_values_parse_and_default(monkeypatch):
    monkeypatch.delenv("ATTNHUB_DISABLE", raising=False)
    assert settings.value("ATTNHUB_DISABLE") == frozenset()
    monkeypatch.setenv("ATTNHUB_DISABLE", " triton, cuda ,")
    assert settings.value("ATTNHUB_DISABLE") == frozenset({"triton", "cuda"})
    monkeypatch.setenv("ATTNHUB_TRITON_TUNE", "0")
    assert settings.value("ATTNHUB_TRITON_TUNE") is False
    monkeypatch.setenv("ATTNHUB_TRITON_TUNE", "")
    assert settings.value("ATTNHUB_TRITON_TUNE") is True  # empty means unset


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("ATTNHUB_CUDA_BWD", "fast")
    with pytest.raises(settings.SettingError, match=r"ATTNHUB_CUDA_BWD takes .*'fast'"):
        settings.value("ATTNHUB_CUDA_BWD")


def test_every_setting_is_documented():
    for s in settings.SETTINGS.values():
        assert s.meaning and s.audience in ("user", "dev"), s.name
