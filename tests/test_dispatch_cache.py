"""The one dispatch cache: bounded, shared by attention's fast path and Dispatcher.choose."""

import threading

import numpy as np
import pytest

import attnhub
from attnhub import REGISTRY
from attnhub import dispatch as dispatch_mod
from attnhub.dispatch import CACHE, DISPATCHER, DispatchCache
from attnhub_backends.reference import kernel
from tests import test_dispatch

#: The counting test backend of test_dispatch, registered for the test that asks for it.
counting = test_dispatch.counting


@pytest.fixture
def small_cache(monkeypatch):
    """A small bound on the process's cache (same object: api and Dispatcher keep seeing it)."""
    monkeypatch.setattr(CACHE, "maxsize", 16)
    monkeypatch.setattr(CACHE, "_half", 8)
    CACHE.clear()
    yield CACHE
    CACHE.clear()


def qkv(n, d=4, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 1, n, d)).astype(dtype) for _ in range(3)]


def reference(q, k, v, mask=None):
    """The reference kernel called directly (no dispatch: it would ask the counting backend too)."""
    from attnhub.request import build_request

    req = build_request(q, k, v, mask, "none_front", None, "bhsd", False)[0]
    return kernel.forward(q, k, v, req, None)[0]


def test_cache_stays_within_its_bound_and_results_stay_right(counting, small_cache):
    # 40 distinct signatures (sequence lengths), each adding a plan and a choice: 80 entries offered.
    for n in range(1, 41):
        q, k, v = qkv(n)
        out = attnhub.attention(q, k, v, mask="causal")
        assert len(small_cache) <= small_cache.maxsize
        np.testing.assert_allclose(out, reference(q, k, v, "causal"), rtol=1e-6, atol=1e-6)
    assert counting.runs == 40
    # An evicted signature dispatches again and still gives the right answer.
    checks = counting.checks
    q, k, v = qkv(1)
    np.testing.assert_allclose(attnhub.attention(q, k, v, mask="causal"), reference(q, k, v, "causal"))
    assert counting.checks == checks + 1
    assert len(small_cache) <= small_cache.maxsize


def test_recently_used_entries_survive_eviction(counting, small_cache):
    hot = qkv(3)
    attnhub.attention(*hot)
    checks = counting.checks
    for n in range(10, 60):  # many one-off signatures, the hot one used between each
        attnhub.attention(*qkv(n))
        attnhub.attention(*hot)
    assert counting.checks == checks + 50  # the hot signature never dispatched again
    assert len(small_cache) <= small_cache.maxsize


def test_one_cache_for_plans_and_choices(counting):
    """attention's plans and Dispatcher.choose's choices live in CACHE; clearing it re-dispatches."""
    CACHE.clear()
    q, k, v = qkv(5)
    attnhub.attention(q, k, v)
    assert counting.checks == 1
    assert len(CACHE) == 2  # the plan (by call signature) and the choice (by request)
    kinds = {key[0] if key[0] == "choose" else "plan" for key in CACHE.recent}
    assert kinds == {"choose", "plan"}
    attnhub.attention(q, k, v)
    assert counting.checks == 1
    DISPATCHER.clear()  # the same cache
    assert len(CACHE) == 0
    attnhub.attention(q, k, v)
    assert counting.checks == 2
    CACHE.clear()
    attnhub.attention(q, k, v)
    assert counting.checks == 3
    assert DISPATCHER.cache is CACHE


def test_registry_reset_clears_the_cache(counting):
    q, k, v = qkv(5)
    attnhub.attention(q, k, v)
    assert len(CACHE) > 0
    REGISTRY.reload()
    assert len(CACHE) == 0
    attnhub.attention(q, k, v)
    assert counting.checks == 2


def test_no_module_keeps_a_second_cache():
    import attnhub.api as api
    import attnhub.plan as plan

    assert not hasattr(api, "_PLANS") and not hasattr(plan, "_PLANS")
    assert not hasattr(DISPATCHER, "_cache")
    assert dispatch_mod.CACHE is CACHE


def test_dispatch_cache_unit():
    cache = DispatchCache(maxsize=4)
    for i in range(10):
        cache.put(i, str(i))
        assert len(cache) <= 4
    assert cache.get(9) == "9" and cache.get(8) == "8"
    assert cache.get(0) is None
    cache.put(10, "10")  # recent {8: , 9: } is full: it becomes the old generation
    assert cache.get(8) == "8"  # promoted back
    cache.put(11, "11")
    assert cache.get(8) == "8" and cache.get(9) is None
    cache.clear()
    assert len(cache) == 0 and cache.get(8) is None
    with pytest.raises(ValueError):
        DispatchCache(maxsize=1)


def test_cache_is_thread_safe(counting, small_cache):
    errors = []

    def work(seed):
        try:
            for n in range(1, 30):
                q, k, v = qkv(n, seed=seed)
                out = attnhub.attention(q, k, v, mask="causal")
                np.testing.assert_allclose(out, reference(q, k, v, "causal"), atol=1e-5)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(small_cache) <= small_cache.maxsize


def test_a_named_backend_is_chosen_from_its_own_verdict_alone(monkeypatch):
    """A first call naming its backend examines that backend only (explain_request would import and
    probe every registered backend); a named backend that declines still says why."""
    seen: list[str] = []
    real = dispatch_mod.backend_reasons

    def spy(b, req, disabled, named=True, late=True):  # noqa: ANN001, ANN202
        seen.append(b.name)
        return real(b, req, disabled, named, late)

    monkeypatch.setattr(dispatch_mod, "backend_reasons", spy)
    DISPATCHER.clear()
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)) for _ in range(3))
    out = attnhub.attention(q, k, v, mask="causal", backend="reference")
    assert seen == ["reference"]
    ref = attnhub.attention(q, k, v, mask="causal")  # auto: every backend examined
    assert len(seen) > 2
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(attnhub.BackendUnsupported, match="triton"):
        attnhub.attention(q, k, v, backend="triton")  # NumPy arrays: the triton backend declines


def test_auto_does_not_probe_backends_of_another_device(monkeypatch):
    """On a plan miss auto declines a backend for another device type from its declaration, without
    calling its availability() (a driver lookup or a package search on every new signature); a
    named backend is still probed, as its availability says what to fix."""
    probed: list[str] = []

    class OtherDevice(attnhub.Backend):
        name = "other-device-test"
        frameworks = ("numpy",)
        device_types = ("ipu",)

        def availability(self):
            probed.append(self.name)
            return "the test device's runtime is not installed"

    class Plugin:
        @attnhub.hookimpl
        def attnhub_backends(self):
            return [OtherDevice()]

    plugin = Plugin()
    attnhub.REGISTRY.register_plugin(plugin)
    try:
        DISPATCHER.clear()
        q = np.random.default_rng(1).standard_normal((1, 1, 3, 8))
        exp = attnhub.explain(q, q, q)
        reasons = next(v.reasons for v in exp.verdicts if v.name == "other-device-test")
        assert probed == [] and reasons == ["runs on ipu devices, the inputs are on cpu"]
        with pytest.raises(attnhub.BackendUnsupported, match="runtime is not installed"):
            attnhub.attention(q, q, q, backend="other-device-test")
        assert probed == ["other-device-test"]
    finally:
        attnhub.REGISTRY.unregister_plugin(plugin)
        DISPATCHER.clear()
