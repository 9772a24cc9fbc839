"""A third-party backend can fail; attnhub keeps dispatching and says which backend failed."""

import numpy as np
import pytest

import attnhub
from attnhub import REGISTRY, BackendError, SpecError


class Faulty(attnhub.Backend):
    name = "faulty"
    priority = 500
    frameworks = ("numpy", "torch")
    features = frozenset({"1d", "2d", "full", "causal", "local", "gqa", "lse", "backward"})

    def __init__(self, mode):
        self.mode = mode

    def availability(self):
        if self.mode == "availability":
            raise ValueError("probe exploded")
        return None

    def check(self, req):
        if self.mode == "check":
            raise ValueError("check exploded")
        return super().check(req)

    def forward(self, q, k, v, req, mask=None, operands=None):
        from attnhub.frameworks import adapter_for

        ad = adapter_for(q)
        if self.mode == "forward":
            raise KeyError("kernel exploded")
        if self.mode == "spec":
            raise SpecError("mask", "something", "other")
        if self.mode == "memory":
            raise MemoryError("out of memory")
        out = ad.full((req.batch, req.heads_q, req.nq, req.dim_v), 0.0, req.dtype, q)
        lse = ad.full((req.batch, req.heads_q, req.nq), 0.0, "float32", q)
        if self.mode == "shape":
            out = ad.full((req.batch, req.heads_q, req.nq, req.dim_v + 1), 0.0, req.dtype, q)
        if self.mode == "dtype":
            out = ad.full(tuple(out.shape), 0.0, "float64", q)
        if self.mode == "framework":
            out = [[0.0]]
        if self.mode == "lse":
            lse = ad.full((req.batch, req.heads_q, req.nq, 1), 0.0, "float32", q)
        if self.mode == "none":
            return None
        return out, lse

    def backward(self, q, k, v, out, lse, dout, req, mask=None, operands=None, dlse=None):
        raise RuntimeError("backward exploded")


class Plugin:
    def __init__(self, backend):
        self.backend = backend

    @attnhub.hookimpl
    def attnhub_backends(self):
        return [self.backend]


@pytest.fixture
def faulty(request):
    plugin = Plugin(Faulty(request.param))
    REGISTRY.register_plugin(plugin)
    yield plugin.backend
    REGISTRY.unregister_plugin(plugin)


def qkv():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3)]


@pytest.mark.parametrize(
    "faulty, reason",
    [
        ("availability", "availability() raised ValueError: probe exploded"),
        ("check", "check() raised ValueError"),
    ],
    indirect=["faulty"],
)
def test_raising_probe_makes_only_that_backend_unavailable(faulty, reason):
    q, k, v = qkv()
    want = attnhub.attention(q, k, v, backend="reference")
    np.testing.assert_array_equal(attnhub.attention(q, k, v), want)  # auto: the others still work
    exp = attnhub.explain(q, k, v)
    verdict = next(x for x in exp.verdicts if x.name == "faulty")
    assert any(reason in r for r in verdict.reasons), verdict.reasons
    assert exp.chosen == "reference"
    with pytest.raises(attnhub.BackendUnsupported, match="raised ValueError"):
        attnhub.attention(q, k, v, backend="faulty")
    if faulty.mode == "availability":
        record = next(r for r in attnhub.backends() if r.name == "faulty")
        assert not record.available and reason in record.reason


@pytest.mark.parametrize(
    "faulty, problem",
    [
        ("forward", "raised KeyError: 'kernel exploded'"),
        ("none", "raised TypeError"),
        ("shape", "out: expected shape (1, 2, 4, 8), got (1, 2, 4, 9)"),
        ("dtype", "out: expected dtype float32, got float64"),
        ("framework", "out: expected a numpy array, got builtins.list"),
        ("lse", "lse: expected shape (1, 2, 4), got (1, 2, 4, 1)"),
    ],
    indirect=["faulty"],
)
def test_failing_or_wrong_backend_raises_backend_error(faulty, problem):
    q, k, v = qkv()
    for _ in range(2):  # the first call plans, the second runs from the cache
        with pytest.raises(BackendError) as info:
            attnhub.attention(q, k, v, return_lse=True)
        err = info.value
        assert err.backend == "faulty" and problem in str(err), str(err)
        assert "numpy/cpu float32 B=1 Hq=2" in err.request
        if faulty.mode == "forward":
            assert isinstance(err.__cause__, KeyError)


@pytest.mark.parametrize("faulty", ["spec"], indirect=True)
def test_attnhub_errors_from_a_backend_pass_through(faulty):
    q, k, v = qkv()
    with pytest.raises(SpecError):
        attnhub.attention(q, k, v)


@pytest.mark.parametrize("faulty", ["memory"], indirect=True)
def test_out_of_memory_passes_through(faulty):
    q, k, v = qkv()
    with pytest.raises(MemoryError):
        attnhub.attention(q, k, v)


@pytest.mark.parametrize("faulty", ["ok"], indirect=True)
def test_backward_error_names_the_backend(faulty, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("ATTNHUB_DISABLE", "sdpa-cpu")  # the vendor kernel comes first for this request
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in qkv())
    out = attnhub.attention(q, k, v)
    with pytest.raises(BackendError, match="faulty.*backward raised RuntimeError") as info:
        out.sum().backward()
    assert isinstance(info.value.__cause__, RuntimeError)
