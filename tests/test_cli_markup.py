"""Text with square brackets (install hints, reasons, errors, versions) reaches the terminal intact.

rich reads ``[cuda]`` in ``pip install 'attnhub[cuda]'`` as a markup tag and drops it unless the text
is escaped; these tests feed bracketed text through ``attnhub info`` and ``attnhub demo``.
"""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

import attnhub
from attnhub.api import BackendRecord
from attnhub.cli import main
from attnhub.registry import REGISTRY, LoadError

HINT = "needs torch with CUDA: pip install 'attnhub[cuda]'"


def _records() -> list[BackendRecord]:
    """One unavailable backend whose reason carries an install hint, one with a bracketed version."""
    common = dict(frameworks=("torch",), device_types=("cuda",), dtypes=("float16",), features=("causal",))
    return [
        BackendRecord("fake-cuda", False, HINT, 90, **common, version=None, disabled=False),
        BackendRecord("fake-ok", True, None, 10, **common, version="fake 1.0 [nightly]", disabled=True),
    ]


def _invoke(*args: str) -> str:
    result = CliRunner(env={"COLUMNS": "400"}).invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_info_prints_install_hints_versions_and_load_errors_with_brackets(monkeypatch):
    monkeypatch.setattr("attnhub.cli.info.backends", _records)
    error = LoadError("plugin[x]", "ImportError: pip install 'attnhub[triton]'", "Traceback [detail]")
    monkeypatch.setattr(REGISTRY, "load_errors", [error])
    out = _invoke("info")
    assert "pip install 'attnhub[cuda]'" in out
    assert "fake 1.0 [nightly]" in out
    assert "plugin[x]" in out and "pip install 'attnhub[triton]'" in out
    assert "(disabled by ATTNHUB_DISABLE)" in out  # the markup of attnhub's own text still renders


def test_demo_prints_install_hints_with_brackets(monkeypatch):
    import attnhub.cli.demo as demo

    monkeypatch.setattr(attnhub, "backends", _records)
    monkeypatch.setattr(demo, "_converters", lambda: {"numpy": lambda a, dt: a.astype(np.float32)})
    out = _invoke("demo")
    assert "pip install 'attnhub[cuda]'" in out
    assert "numpy" in out and "reference" in out
