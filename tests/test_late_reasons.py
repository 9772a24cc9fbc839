"""Backend.late_reasons: a costly probe (cuDNN building a graph per shape) that auto asks only of
the candidate it is about to choose, while a named backend, explain and certify ask it always."""

import numpy as np
import pytest

import attnhub
from attnhub import REGISTRY, BackendUnsupported


class Probed(attnhub.Backend):
    frameworks = ("numpy",)
    features = frozenset({"1d", "full", "causal", "gqa", "lse"})

    def __init__(self, name, priority, decline=None):
        self.name, self.priority, self.decline = name, priority, decline
        self.probed = []

    def late_reasons(self, req):
        self.probed.append(req.nk)
        return [self.decline] if self.decline and req.nk % 2 else []

    def forward(self, q, k, v, req, mask=None, operands=None):
        return REGISTRY.backends()["reference"].forward(q, k, v, req, mask)


class Plugin:
    def __init__(self, *backends):
        self.backends = backends

    @attnhub.hookimpl
    def attnhub_backends(self):
        return list(self.backends)


@pytest.fixture
def pair():
    first = Probed("probed-first", 600, decline="no engine for an odd key count")
    second = Probed("probed-second", 590)
    plugin = Plugin(first, second)
    REGISTRY.register_plugin(plugin)
    yield first, second
    REGISTRY.unregister_plugin(plugin)


def _qkv(nk, rng):
    q = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, nk, 8)).astype(np.float32) for _ in range(2))
    return q, k, v


def test_auto_probes_only_down_to_the_chosen_candidate(pair):
    first, second = pair
    rng = np.random.default_rng(7)
    for nk in (4, 6, 8, 10):  # even: the first candidate's probe passes, the second is never asked
        q, k, v = _qkv(nk, rng)
        out = attnhub.attention(q, k, v)
        np.testing.assert_array_equal(out, attnhub.attention(q, k, v, backend="reference"))
    assert first.probed == [4, 6, 8, 10]
    assert second.probed == [], "auto probed a candidate it did not choose"


def test_a_late_decline_passes_to_the_next_candidate(pair):
    first, second = pair
    q, k, v = _qkv(5, np.random.default_rng(8))
    assert attnhub.explain(q, k, v).chosen == "probed-second"
    attnhub.attention(q, k, v)
    assert 5 in second.probed
    exp = attnhub.explain(q, k, v)  # explain probes every backend and shows the late reason
    [verdict] = [x for x in exp.verdicts if x.name == "probed-first"]
    assert verdict.reasons == ["no engine for an odd key count"]
    with pytest.raises(BackendUnsupported, match="no engine for an odd key count"):
        attnhub.attention(q, k, v, backend="probed-first")


def test_a_raising_probe_declines_only_that_backend(pair, monkeypatch):
    first, _ = pair

    def boom(req):
        raise ValueError("graph build exploded")

    monkeypatch.setattr(first, "late_reasons", boom)
    q, k, v = _qkv(4, np.random.default_rng(9))
    assert attnhub.explain(q, k, v).chosen == "probed-second"
    [verdict] = [x for x in attnhub.explain(q, k, v).verdicts if x.name == "probed-first"]
    assert verdict.reasons == ["late_reasons() raised ValueError: graph build exploded"]
