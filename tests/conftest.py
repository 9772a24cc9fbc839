import contextlib
import os
import zlib

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# JAX grabs 75 % of a GPU's memory at its first use; with `pytest -n N` one JAX worker then starves
# every torch/triton worker of memory (seen on the H100: 76 tests failed with OOM). Allocate on demand.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# TensorFlow and Triton each load their own LLVM; loading Triton's library after a test module has
# imported TensorFlow aborts the interpreter (torch._dynamo imports triton lazily, e.g. in
# test_bench's FlexAttention test). Loading Triton first, before collection imports any test
# module, avoids the clash.
with contextlib.suppress(ImportError):
    import triton  # noqa: F401


def pytest_collection_modifyitems(config, items):
    """GPU tests run on the device machine; here they are skipped with the reason shown."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU: run `make gpu-test` on the device machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test id so failures reproduce."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.fixture
def reads(monkeypatch):
    """The arrays attnhub reads on the host (one entry per read), from now on (tests/test_host_path*.py)."""
    from attnhub import readings

    seen: list = []
    real = readings.host_values

    def counted(x):
        seen.append(x)
        return real(x)

    monkeypatch.setattr(readings, "host_values", counted)
    return seen


@pytest.fixture(scope="module")
def sdpa_registered():
    """The sdpa-* plugin registered for a test module, as its entry point does once installed."""
    from attnhub import REGISTRY
    from attnhub_backends import sdpa as sdpa_plugin

    if "sdpa-cpu" in REGISTRY.backends():  # installed with its entry point
        yield
        return
    REGISTRY.register_plugin(sdpa_plugin)
    yield
    REGISTRY.unregister_plugin(sdpa_plugin)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty user cache dir (yielded) and no shipped profiles, for the tuner's tests; profiles
    are re-read around the test (tests/test_profile_dispatch.py keeps a variant of its own)."""
    pytest.importorskip("torch")
    from attnhub import profile

    monkeypatch.setenv("ATTNHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNHUB_BACKEND", raising=False)
    monkeypatch.delenv("ATTNHUB_DISABLE", raising=False)
    monkeypatch.delenv("ATTNHUB_AUTOTUNE", raising=False)
    monkeypatch.setattr(profile, "SHIPPED_DIR", tmp_path / "shipped")
    profile.reload()
    yield tmp_path / "cache"
    monkeypatch.undo()
    profile.reload()
