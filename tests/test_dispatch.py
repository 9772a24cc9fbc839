"""Auto dispatch, explicit choice, overrides, explain, errors and plugin isolation."""

import sys
import textwrap
import threading

import numpy as np
import pytest
from click.testing import CliRunner

import attnhub
from attnhub import REGISTRY, Backend, BackendUnsupported, NoBackendError, hookimpl
from attnhub.cli import main
from attnhub_backends.reference import kernel


class CountingBackend(Backend):
    """A test double: float32/float64 NumPy only, counts how often it is asked and run."""

    name = "counting"
    priority = 10
    frameworks = ("numpy",)
    dtypes = ("float32", "float64")

    def __init__(self):
        self.checks = 0
        self.runs = 0

    def check(self, req):
        self.checks += 1
        return super().check(req)

    def forward(self, q, k, v, req, mask=None, operands=None):
        self.runs += 1
        out, lse = kernel.forward(q, k, v, req, mask)
        return out.astype(q.dtype), lse.astype(np.float32 if q.dtype != np.float64 else np.float64)


class Plugin:
    def __init__(self):
        self.backend = CountingBackend()

    @hookimpl
    def attnhub_backends(self):
        return [self.backend]


@pytest.fixture
def counting(monkeypatch):
    monkeypatch.delenv("ATTNHUB_BACKEND", raising=False)
    monkeypatch.delenv("ATTNHUB_DISABLE", raising=False)
    plugin = Plugin()
    REGISTRY.register_plugin(plugin)
    yield plugin.backend
    REGISTRY.unregister_plugin(plugin)


def qkv(dtype=np.float32, rng=None):
    rng = rng or np.random.default_rng(0)
    return [rng.standard_normal((1, 2, 6, 8)).astype(dtype) for _ in range(3)]


def test_auto_picks_highest_priority_that_accepts(counting):
    attnhub.attention(*qkv(np.float32))
    assert counting.runs == 1
    assert attnhub.explain(*qkv(np.float32)).chosen == "counting"
    exp = attnhub.explain(*qkv(np.float16))
    assert exp.chosen == "reference"
    assert "supports dtypes float32, float64, got float16" in str(exp)


def test_choice_is_cached_per_signature(counting):
    for _ in range(5):
        attnhub.attention(*qkv())
    assert counting.checks == 1 and counting.runs == 5
    attnhub.attention(*qkv(), mask="causal")
    assert counting.checks == 2


def test_explicit_backend(counting):
    attnhub.attention(*qkv(), backend="reference")
    assert counting.runs == 0
    with pytest.raises(BackendUnsupported, match="supports dtypes float32, float64, got float16") as info:
        attnhub.attention(*qkv(np.float16), backend="counting")
    assert info.value.backend == "counting" and info.value.reasons


def test_unknown_backend_name(counting):
    with pytest.raises(BackendUnsupported, match="no backend of that name is registered"):
        attnhub.attention(*qkv(), backend="nonexistent")


def test_use_backend_context(counting):
    with attnhub.use_backend("reference"):
        attnhub.attention(*qkv())
        assert attnhub.explain(*qkv()).mode == "use_backend"
    assert counting.runs == 0
    attnhub.attention(*qkv())
    assert counting.runs == 1


def test_env_backend(counting, monkeypatch):
    monkeypatch.setenv("ATTNHUB_BACKEND", "reference")
    attnhub.attention(*qkv())
    assert counting.runs == 0
    monkeypatch.setenv("ATTNHUB_BACKEND", "counting")
    with pytest.raises(BackendUnsupported):
        attnhub.attention(*qkv(np.float16))


def test_env_disable(counting, monkeypatch):
    monkeypatch.setenv("ATTNHUB_DISABLE", "counting")
    attnhub.attention(*qkv())
    assert counting.runs == 0
    monkeypatch.setenv("ATTNHUB_DISABLE", "counting, reference")
    with pytest.raises(NoBackendError) as info:
        attnhub.attention(*qkv())
    assert info.value.reasons["reference"] == ["disabled by ATTNHUB_DISABLE"]
    assert "counting: disabled by ATTNHUB_DISABLE" in str(info.value)


def test_no_backend_lists_every_reason(counting):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.zeros(1, 2, 4, 8, device="meta") for _ in range(3))
    with pytest.raises(NoBackendError) as info:
        attnhub.attention(q, k, v)
    msg = str(info.value)
    assert "reference: runs on cpu devices, the inputs are on meta" in msg
    assert "counting: takes numpy arrays, got a torch array" in msg


def test_explain_renders_a_table(counting):
    text = str(attnhub.explain(*qkv(np.float16)))
    assert "CHOSEN" in text and "counting" in text and "chosen: reference" in text


def test_results_agree_across_threads(counting):
    rng = np.random.default_rng(1)
    inputs = [qkv(rng=rng) for _ in range(16)]
    want = [attnhub.attention(*x, backend="reference") for x in inputs]
    got = [None] * 16

    def work(i):
        got[i] = attnhub.attention(*inputs[i], mask=None)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6)


class RaisingPlugin:
    @hookimpl
    def attnhub_backends(self):
        raise RuntimeError("this plugin is broken on purpose")


def test_plugin_raising_in_hook_is_isolated():
    plugin = RaisingPlugin()
    REGISTRY.register_plugin(plugin)
    try:
        names = [r.name for r in attnhub.backends()]
        assert "reference" in names
        assert any("broken on purpose" in e.error for e in REGISTRY.load_errors)
        assert attnhub.attention(*qkv()).shape == (1, 2, 6, 8)
    finally:
        REGISTRY.unregister_plugin(plugin)


def test_plugin_failing_at_import_is_reported_by_info(tmp_path, monkeypatch):
    dist = tmp_path / "throwaway_attnhub_plugin-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: throwaway-attnhub-plugin\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[attnhub]\nthrowaway = throwaway_attnhub_plugin\n")
    (tmp_path / "throwaway_attnhub_plugin.py").write_text(
        textwrap.dedent("""\
            raise ImportError("throwaway plugin cannot import its framework")
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    REGISTRY.reload()
    try:
        result = CliRunner().invoke(main, ["info", "--no-errors"])
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())
        assert "throwaway" in text and "cannot import its framework" in text
        assert "reference" in text and "available" in text
        assert attnhub.attention(*qkv()).shape == (1, 2, 6, 8)
    finally:
        monkeypatch.undo()
        sys.modules.pop("throwaway_attnhub_plugin", None)
        REGISTRY.reload()
    REGISTRY.backends()
    assert not any("throwaway" in e.plugin for e in REGISTRY.load_errors)
