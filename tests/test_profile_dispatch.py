"""Measured dispatch: auto follows this device's profile, skips backends that failed certification
here, finds the nearest measured class, and drops its cached choices when the profile changes."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import attnhub
from attnhub import REGISTRY, Backend, hookimpl, profile
from attnhub.dispatch import CACHE
from attnhub.shapes import request_from_shapes
from attnhub_backends.reference import kernel


class _Counting(Backend):
    frameworks = ("numpy",)
    dtypes = ("float32", "float64")

    def __init__(self):
        self.runs = 0

    def forward(self, q, k, v, req, mask=None, operands=None):
        self.runs += 1
        out, lse = kernel.forward(q, k, v, req, mask)
        return out.astype(q.dtype), lse.astype(np.float32 if q.dtype != np.float64 else np.float64)


class HighPriority(_Counting):
    name = "t_prof_high"
    priority = 20


class LowPriority(_Counting):
    name = "t_prof_low"
    priority = 10


class Plugin:
    def __init__(self, *backends):
        self.backends = list(backends)

    @hookimpl
    def attnhub_backends(self):
        return self.backends


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty user cache dir and no shipped profiles; profiles are re-read around the test."""
    monkeypatch.setenv("ATTNHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNHUB_BACKEND", raising=False)
    monkeypatch.delenv("ATTNHUB_DISABLE", raising=False)
    monkeypatch.delenv("ATTNHUB_AUTOTUNE", raising=False)
    monkeypatch.setattr(profile, "SHIPPED_DIR", tmp_path / "shipped")
    profile.reload()
    yield tmp_path
    monkeypatch.undo()
    profile.reload()


@pytest.fixture
def pair(cache_dir):
    plugin = Plugin(HighPriority(), LowPriority())
    REGISTRY.register_plugin(plugin)
    yield {b.name: b for b in plugin.backends}
    REGISTRY.unregister_plugin(plugin)


def qkv(n=8, d=16):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, 2, n, d)).astype(np.float32) for _ in range(3)]


def req_of(n=8, d=16, mask=None, **kw):
    return request_from_shapes((1, 2, n, d), (1, 2, n, d), (1, 2, n, d), mask=mask, **kw)


def cpu_key():
    key = profile.device_key("cpu")
    assert key is not None and key.startswith("cpu:")
    return key


def measure(times, n=8, d=16, mask=None):
    """Record ``times`` for the class of a (1, 2, n, d) float32 NumPy request in the user profile."""
    return profile.record(cpu_key(), [(profile.request_class(req_of(n, d, mask)), times, "test")], {})


def test_without_a_profile_priority_decides(pair):
    exp = attnhub.explain(*qkv())
    assert exp.chosen == "t_prof_high" and exp.measured is None
    assert "order: by the prior" in str(exp) and exp.basis == "prior"
    assert "can run it (later in the prior's order)" in str(exp)


def test_profile_makes_auto_pick_the_measured_faster_backend(pair):
    path = measure({"t_prof_high": 2.5, "t_prof_low": 1.25})
    assert path.parent == profile.cache_dir() / "profiles" and path.exists()
    exp = attnhub.explain(*qkv())
    assert exp.chosen == "t_prof_low"
    text = str(exp)
    assert "CHOSEN (measured 1.250 ms)" in text
    assert "can run it (measured 2.500 ms)" in text
    assert "reference" in text and "can run it (not measured)" in text
    assert str(path) in text
    attnhub.attention(*qkv())
    assert pair["t_prof_low"].runs == 1 and pair["t_prof_high"].runs == 0


def test_measured_backend_beats_unmeasured_higher_priority(pair):
    measure({"t_prof_low": 9.0, "t_prof_high": None})  # None: it failed to run when measured
    assert attnhub.explain(*qkv()).chosen == "t_prof_low"


def test_explicit_and_other_classes_ignore_the_profile(pair):
    measure({"t_prof_high": 2.0, "t_prof_low": 1.0})
    assert attnhub.explain(*qkv(), backend="t_prof_high").chosen == "t_prof_high"
    # the causal class was not measured: priority
    assert attnhub.explain(*qkv(), mask="causal").chosen == "t_prof_high"


def test_nearest_bucket_lookup(pair):
    measure({"t_prof_high": 2.0, "t_prof_low": 1.0}, n=16)  # Lq = Lk = 2^4
    exact = profile.lookup(req_of(16))
    assert exact is not None and exact.exact
    near = profile.lookup(req_of(32))  # one octave on each axis: distance 2
    assert near is not None and not near.exact and near.cls[1:] == (4, 4)
    assert "nearest measured class" in near.describe()
    assert profile.lookup(req_of(20)).exact  # round(log2(20)) == 4
    assert profile.lookup(req_of(64)) is None  # four octaves away: no measurement applies
    assert profile.lookup(req_of(16, d=128)) is None  # another head-dim bucket
    assert profile.lookup(req_of(16, mask="causal")) is None
    assert attnhub.explain(*qkv(32)).chosen == "t_prof_low"
    assert attnhub.explain(*qkv(64)).chosen == "t_prof_high"


def test_nearest_prefers_the_closest_of_several(cache_dir):
    key = cpu_key()
    fam = profile.request_class(req_of(8))[0]
    prof = profile.Profile(key)
    for lq in (3, 6, 9):
        prof.add((fam, lq, lq), profile.Entry({"a": float(lq)}, "x"))
    assert prof.nearest((fam, 5, 6))[1].ms == {"a": 6.0}
    assert prof.nearest((fam, 8, 9))[1].ms == {"a": 9.0}
    assert prof.nearest((fam, 0, 0)) is None


def test_request_class_fields():
    fam, lq, lk = profile.request_class(req_of(1000, d=96, sync="none_end", needs_grad=True))
    d = dict(zip(profile.FAMILY_FIELDS, fam))
    assert (lq, lk) == (10, 10) and d["dim"] == 128 and d["sync"] == "*" and d["grad"] and not d["gqa"]
    fam2, *_ = profile.request_class(req_of(8, mask="causal", sync="none_end"))
    assert dict(zip(profile.FAMILY_FIELDS, fam2))["sync"] == "none_end"
    gqa = request_from_shapes((1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16))
    assert dict(zip(profile.FAMILY_FIELDS, profile.request_class(gqa)[0]))["gqa"]


def test_profile_change_invalidates_the_dispatch_cache(pair):
    attnhub.attention(*qkv())
    assert pair["t_prof_high"].runs == 1
    assert len(CACHE) > 0
    measure({"t_prof_high": 2.0, "t_prof_low": 1.0})  # writing a profile reloads it
    attnhub.attention(*qkv())
    assert pair["t_prof_low"].runs == 1
    # a profile file changed behind the process's back is read again by reload()
    path = profile.user_profile_path(cpu_key())
    data = json.loads(path.read_text())
    data["entries"][0]["ms"] = {"t_prof_high": 0.5, "t_prof_low": 1.0}
    path.write_text(json.dumps(data))
    attnhub.attention(*qkv())
    assert pair["t_prof_low"].runs == 2  # still cached
    profile.reload()
    assert len(CACHE) == 0
    attnhub.attention(*qkv())
    assert pair["t_prof_high"].runs == 2


def test_user_profile_overrides_shipped(pair, cache_dir):
    key = cpu_key()
    shipped = cache_dir / "shipped"
    shipped.mkdir()
    cls = profile.class_to_json(profile.request_class(req_of()))
    other = profile.class_to_json(profile.request_class(req_of(mask="causal")))
    payload = {
        "schema": profile.SCHEMA,
        "device": key,
        "entries": [
            {"class": cls, "ms": {"t_prof_high": 1.0, "t_prof_low": 2.0}},
            {"class": other, "ms": {"t_prof_high": 3.0, "t_prof_low": 2.0}},
        ],
    }
    (shipped / f"{profile.slug(key)}.json").write_text(json.dumps(payload))
    # a profile of another device in the right file is ignored
    profile.reload()
    assert attnhub.explain(*qkv(), mask="causal").chosen == "t_prof_low"  # from the shipped file
    measure({"t_prof_high": 2.0, "t_prof_low": 1.0})
    assert attnhub.explain(*qkv()).chosen == "t_prof_low"  # the user's class replaced the shipped one
    assert attnhub.explain(*qkv(), mask="causal").chosen == "t_prof_low"  # the shipped class remains


def test_profile_of_another_device_is_ignored(pair, cache_dir):
    key = cpu_key()
    path = profile.user_profile_path(key)
    path.parent.mkdir(parents=True)
    cls = profile.class_to_json(profile.request_class(req_of()))
    payload = {
        "schema": profile.SCHEMA,
        "device": "cpu:another",
        "entries": [{"class": cls, "ms": {"t_prof_low": 1}}],
    }
    path.write_text(json.dumps(payload))
    profile.reload()
    assert attnhub.explain(*qkv()).chosen == "t_prof_high"


def _report(backend, failed):
    return {
        "schema": "attnhub-certify-report/2",
        "backend": backend,
        "mode": "quick",
        "device": "cpu",
        "summary": {
            "cases": 10,
            "passed": 10 - failed,
            "failed": failed,
            "declined": 0,
            "certified": not failed,
        },
    }


def test_failed_certification_on_this_device_is_never_picked(pair):
    measure({"t_prof_high": 2.0, "t_prof_low": 1.0})
    path = profile.store_certify_report(_report("t_prof_low", failed=3))
    assert path is not None and path.exists()
    exp = attnhub.explain(*qkv())
    assert exp.chosen == "t_prof_high"
    low = next(v for v in exp.verdicts if v.name == "t_prof_low")
    assert any("failed certification on this device" in r and str(path) in r for r in low.reasons)
    assert "failed certification on this device" in str(exp)
    attnhub.attention(*qkv())
    assert pair["t_prof_low"].runs == 0
    # naming it still runs it (certify itself does)
    attnhub.attention(*qkv(), backend="t_prof_low")
    assert pair["t_prof_low"].runs == 1
    # a passing report replaces the failing one
    profile.store_certify_report(_report("t_prof_low", failed=0))
    assert attnhub.explain(*qkv()).chosen == "t_prof_low"


def test_failed_certification_on_another_device_does_not_count(pair, cache_dir):
    path = profile.certify_report_path("t_prof_high", "cpu:another")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**_report("t_prof_high", 2), "device_key": "cpu:another"}))
    profile.reload()
    assert attnhub.explain(*qkv()).chosen == "t_prof_high"


# --- ATTNHUB_AUTOTUNE ----------------------------------------------------------------------------


class _TorchMath(Backend):
    frameworks = ("torch",)
    dtypes = ("float32",)
    delay = 0.0

    def __init__(self):
        self.runs = 0

    def forward(self, q, k, v, req, mask=None, operands=None):
        import torch

        self.runs += 1
        time.sleep(self.delay)
        s = (q @ k.transpose(-1, -2)) * req.scale
        lse = torch.logsumexp(s, -1)
        return torch.softmax(s, -1) @ v, lse


class SlowTorch(_TorchMath):
    name = "t_auto_slow"
    priority = 30
    delay = 0.1  # far above the noise of a loaded machine


class FastTorch(_TorchMath):
    name = "t_auto_fast"
    priority = 20


@pytest.fixture
def torch_pair(cache_dir, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("ATTNHUB_DISABLE", "sdpa-cpu")  # the pair (and reference) are the candidates
    plugin = Plugin(SlowTorch(), FastTorch())
    REGISTRY.register_plugin(plugin)
    yield {b.name: b for b in plugin.backends}
    REGISTRY.unregister_plugin(plugin)


def test_autotune_measures_an_unknown_class_on_first_call(torch_pair, monkeypatch):
    import torch

    monkeypatch.setenv("ATTNHUB_DISABLE", "reference,sdpa-cpu")  # two candidates, one much slower
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    before = [x.clone() for x in (q, k, v)]
    assert attnhub.explain(q, k, v).chosen == "t_auto_slow"  # priority, nothing measured
    monkeypatch.setenv("ATTNHUB_AUTOTUNE", "1")
    out = attnhub.attention(q, k, v)
    assert torch.allclose(out, torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, -1) @ v, atol=1e-5)
    for x, y in zip((q, k, v), before):
        assert torch.equal(x, y)  # the caller's data is untouched
    exp = attnhub.explain(q, k, v)
    assert exp.chosen == "t_auto_fast" and exp.measured is not None and exp.measured.exact, str(exp)
    times = exp.measured.ms
    assert set(times) == {"t_auto_fast", "t_auto_slow"} and times["t_auto_fast"] < times["t_auto_slow"]
    assert profile.user_profile_path(cpu_key()).exists()
    # a measured class is not timed again
    runs = torch_pair["t_auto_slow"].runs
    attnhub.attention(torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8))
    assert torch_pair["t_auto_slow"].runs == runs


def test_autotune_decides_only_near_the_measured_size(torch_pair, monkeypatch):
    """A class measured on first use holds the request's B·Hq: a batch far larger with the same
    lengths is measured on its own, not decided by the small one's times."""
    import torch

    from attnhub import tuner

    monkeypatch.setattr(tuner, "_tried", set())  # this process's earlier tests measured (1, 2, 16, 8)
    monkeypatch.setenv("ATTNHUB_DISABLE", "reference,sdpa-cpu")
    monkeypatch.setenv("ATTNHUB_AUTOTUNE", "1")
    small = torch.randn(1, 2, 16, 8)
    attnhub.attention(small, small, small)
    hit = profile.lookup(attnhub.explain(small, small, small).request)
    assert hit is not None and len(hit.cls) == 4  # sized: (family, Lq, Lk, B·Hq octaves)
    runs = torch_pair["t_auto_slow"].runs
    big = torch.randn(16, 8, 16, 8)  # B·Hq 128 against 2: six octaves away
    attnhub.attention(big, big, big)
    assert torch_pair["t_auto_slow"].runs > runs  # timed again for its own size
    assert attnhub.explain(big, big, big).measured.cls[3] == 7


def test_autotune_is_off_by_default(torch_pair):
    import torch

    q = torch.randn(1, 2, 16, 8)
    attnhub.attention(q, q, q)
    assert torch_pair["t_auto_slow"].runs == 1 and torch_pair["t_auto_fast"].runs == 0
    assert not profile.user_profile_path(cpu_key()).exists()


# --- sized (host-bound) classes: narrow, preferred where they apply (issue 21) -------------------


def sized_req(b=1, h=2, n=8):
    return request_from_shapes((b, h, n, 16), (b, h, n, 16), (b, h, n, 16))


def test_a_sized_class_applies_near_its_size_and_beats_the_unsized_one(pair):
    small = profile.request_class(sized_req(1, 2, 8), sized=True)  # B*Hq = 2: octave 1
    assert len(small) == 4 and small[:3] == profile.request_class(sized_req(1, 2, 8))
    profile.record(
        cpu_key(),
        [
            (profile.request_class(sized_req(1, 2, 8)), {"t_prof_high": 1.0, "t_prof_low": 2.0}, "big"),
            (small, {"t_prof_high": 2.0, "t_prof_low": 1.0}, "small"),
        ],
        {},
    )
    hit = profile.lookup(sized_req(1, 2, 8))
    assert hit is not None and hit.exact and hit.cls == small and hit.ms["t_prof_low"] == 1.0
    assert attnhub.explain(*qkv()).chosen == "t_prof_low"  # qkv(): (1, 2, 8, 16)
    near = profile.lookup(sized_req(1, 4, 8))  # B*Hq one octave up: still the small class
    assert near is not None and not near.exact and near.cls == small
    # Two octaves away in B*Hq, or one in B*Hq and one in length: the unsized class.
    for far in (sized_req(2, 4, 8), sized_req(1, 4, 16), sized_req(16, 16, 8)):
        got = profile.lookup(far)
        assert got is not None and len(got.cls) == 3 and got.ms["t_prof_high"] == 1.0, far
    text = str(attnhub.explain(*qkv()))
    assert "B*Hq~2^1" in text


def test_a_sized_class_alone_does_not_capture_big_requests(pair):
    small = profile.request_class(sized_req(1, 2, 8), sized=True)
    profile.record(cpu_key(), [(small, {"t_prof_high": 2.0, "t_prof_low": 1.0}, "small")], {})
    assert profile.lookup(sized_req(8, 8, 8)) is None  # B*Hq = 64: 5 octaves away
    rng = np.random.default_rng(1)
    big = [rng.standard_normal((8, 8, 8, 16)).astype(np.float32) for _ in range(3)]
    assert attnhub.explain(*big).chosen == "t_prof_high"  # priority, as without a profile


def test_sized_classes_round_trip_through_json():
    cls = profile.request_class(sized_req(8, 12, 512), sized=True)
    d = profile.class_to_json(cls)
    assert d["bh"] == 7 and profile.class_from_json(d) == cls
    plain = profile.request_class(sized_req(8, 12, 512))
    assert "bh" not in profile.class_to_json(plain)
    assert profile.class_from_json(profile.class_to_json(plain)) == plain


# --- the prior (no profile for the device) and trusted first-use timings (issue 37) ---------------


class OwnKernel(_Counting):
    name = "t_prior_own"
    priority = 90
    features = _Counting.features | {"softcap", "offsets"}


class VendorKernel(_Counting):
    name = "t_prior_vendor"
    priority = 10
    vendor = True
    features = _Counting.features | {"softcap", "offsets"}


@pytest.fixture
def own_and_vendor(cache_dir, monkeypatch):
    monkeypatch.setenv("ATTNHUB_DISABLE", "reference")
    plugin = Plugin(OwnKernel(), VendorKernel())
    REGISTRY.register_plugin(plugin)
    yield {b.name: b for b in plugin.backends}
    REGISTRY.unregister_plugin(plugin)


@pytest.mark.parametrize("mask", [None, "causal"])
def test_prior_takes_the_vendor_kernel_for_plain_requests(own_and_vendor, mask):
    exp = attnhub.explain(*qkv(), mask=mask)
    assert exp.measured is None and exp.basis == "prior"
    assert exp.chosen == "t_prior_vendor" and exp.order == ["t_prior_vendor", "t_prior_own"], str(exp)
    assert "chosen: t_prior_vendor (by prior)" in str(exp)


@pytest.mark.parametrize(
    "kw", [{"mask": attnhub.Local(3)}, {"softcap": 5.0}, {"mask": "causal", "q_offset": 2}], ids=str
)
def test_prior_takes_own_kernels_for_everything_else(own_and_vendor, kw):
    """Windows, SPEC §9-§11 arguments: the vendor kernel may run them (here: softcap), but attnhub's
    own kernels compute them natively; priority decides among the own kernels."""
    exp = attnhub.explain(*qkv(), **kw)
    assert exp.chosen == "t_prior_own", str(exp)


def test_measured_times_overrule_the_prior(own_and_vendor):
    measure({"t_prior_own": 1.0, "t_prior_vendor": 2.0})
    exp = attnhub.explain(*qkv())
    assert exp.chosen == "t_prior_own" and exp.basis == "user profile" and not exp.incomplete


@pytest.mark.parametrize(("vendor_ms", "chosen"), [(1.02, "t_prior_vendor"), (1.05, "t_prior_own")])
def test_measured_times_within_the_tie_leave_the_choice_to_the_prior(own_and_vendor, vendor_ms, chosen):
    """Two times within MEASURED_TIE (3%) of each other are one kernel's run-to-run noise (cudnn
    and sdpa-cudnn run the same kernels): the prior orders them; a larger gap overrules it."""
    measure({"t_prior_own": 1.0, "t_prior_vendor": vendor_ms})
    assert attnhub.explain(*qkv()).chosen == chosen


def test_a_class_lacking_the_priors_vendor_kernel_is_incomplete(own_and_vendor, monkeypatch):
    """A class measured before the vendor kernel could run the request (the SDPA kernels and bf16
    gradients until 2026-11-28): the measured backend still leads, but the class is incomplete,
    and a first-use measurement (ATTNHUB_AUTOTUNE=1 on the CPU) completes it."""
    from attnhub import tuner

    measure({"t_prior_own": 1.0})
    exp = attnhub.explain(*qkv())
    assert exp.chosen == "t_prior_own" and exp.incomplete and "t_prior_vendor" in str(exp)
    seen = []

    def fake_time_class(case, names, device, *a, **kw):
        seen.append(list(names))
        return tuner.ClassTimes({"t_prior_vendor": 0.5, "t_prior_own": 1.0}, {}, {}, True)

    monkeypatch.setattr(tuner, "time_class", fake_time_class)
    monkeypatch.setattr(tuner, "_tried", set())
    monkeypatch.setattr(tuner, "can_measure", lambda req: True)
    monkeypatch.setenv("ATTNHUB_AUTOTUNE", "1")
    attnhub.attention(*qkv())
    assert seen == [["t_prior_vendor", "t_prior_own"]]  # timed in the prior's order
    exp = attnhub.explain(*qkv())
    assert exp.chosen == "t_prior_vendor" and exp.basis == "first-use measurement", str(exp)


def _timed_rounds(monkeypatch, first: dict, again: dict) -> list:
    """First-use measurement on (ATTNHUB_AUTOTUNE=1) with time_candidates giving ``first`` on its
    first call and ``again`` after; the list of the names each call timed."""
    from attnhub import tuner

    calls = []

    def fake(case, names, device, warmup=None, rep=None, how=None):
        figures = first if not calls else again
        calls.append(list(names))
        if how is not None:
            how.update({n: "fake" for n in names})
        return {n: figures[n] for n in names}, {}

    monkeypatch.setattr(tuner, "time_candidates", fake)
    monkeypatch.setattr(tuner, "_tried", set())
    monkeypatch.setattr(tuner, "can_measure", lambda req: True)
    monkeypatch.setenv("ATTNHUB_AUTOTUNE", "1")
    return calls


def test_a_timing_the_rounds_disagree_on_is_never_persisted(own_and_vendor, monkeypatch):
    """The challenger is faster in both rounds, but its slower figure does not beat the prior's
    faster one: the order is noise. Nothing is recorded, and the prior keeps deciding."""
    calls = _timed_rounds(
        monkeypatch, {"t_prior_vendor": 0.7, "t_prior_own": 0.6}, {"t_prior_vendor": 1.0, "t_prior_own": 0.9}
    )
    out = attnhub.attention(*qkv())
    assert len(calls) == 2  # timed, then re-timed
    assert out.shape == (1, 2, 8, 16)
    assert not profile.user_profile_path(cpu_key()).exists()
    exp = attnhub.explain(*qkv())
    assert exp.chosen == "t_prior_vendor" and exp.basis == "prior"


def test_a_timing_both_rounds_agree_on_is_persisted(own_and_vendor, monkeypatch):
    calls = _timed_rounds(
        monkeypatch, {"t_prior_vendor": 1.0, "t_prior_own": 0.5}, {"t_prior_vendor": 0.9, "t_prior_own": 0.4}
    )
    attnhub.attention(*qkv())
    assert len(calls) == 2  # timed, then re-timed
    assert profile.user_profile_path(cpu_key()).exists()
    exp = attnhub.explain(*qkv())
    assert exp.chosen == "t_prior_own" and exp.basis == "first-use measurement"
    assert exp.measured.ms == {"t_prior_vendor": 0.9, "t_prior_own": 0.4}


def test_first_use_measurement_by_default_only_on_cuda_for_long_calls():
    from dataclasses import replace

    from attnhub import settings, tuner

    assert settings.SETTINGS["ATTNHUB_AUTOTUNE"].default == "auto"
    big = request_from_shapes((4, 16, 4096, 128), (4, 16, 4096, 128), (4, 16, 4096, 128), mask="causal")
    small = request_from_shapes((8, 12, 512, 64), (8, 12, 512, 64), (8, 12, 512, 64), mask="causal")
    assert not tuner.worth_measuring(big, "auto")  # a CPU request
    assert tuner.worth_measuring(replace(big, device="cuda:0"), "auto")
    assert not tuner.worth_measuring(replace(small, device="cuda:0"), "auto")  # host-bound size
    assert not tuner.worth_measuring(replace(big, device="cuda:0"), "off")
    assert tuner.worth_measuring(small, "on")
    assert big.flops == 4 * 4 * 16 * 4096 * 4096 * 128 / 2


def test_first_use_timing_is_skipped_where_its_inputs_would_not_fit():
    """Timing allocates fresh inputs: never where that could run a call that fits out of memory."""
    from attnhub import tuner

    req = request_from_shapes((1, 32, 131072, 128), (1, 8, 131072, 128), (1, 8, 131072, 128), mask="causal")
    need = tuner.timing_bytes(req)
    assert need == 2 * (32 + 8 * 2 + 32) * 131072 * 128 * 4  # float32: q, k, v, out, twice
    room = 2 * (need + tuner.FLUSH_BYTES)
    assert tuner.fits(req, room) and not tuner.fits(req, room - 1)


class LightVendor(_Counting):
    name = "t_prior_light"
    priority = 5
    vendor = True
    light_calls = True


def test_prior_takes_the_lightest_vendor_call_for_small_requests(own_and_vendor):
    plugin = Plugin(LightVendor())
    REGISTRY.register_plugin(plugin)
    try:
        small = attnhub.explain(*qkv(), mask="causal")  # 10^4 FLOPs: host-bound in a loop
        assert small.order == ["t_prior_light", "t_prior_vendor", "t_prior_own"], str(small)
        big = np.zeros((1, 16, 2048, 64), dtype=np.float32)  # 1.7·10^10 FLOPs
        assert attnhub.explain(big, big, big).order == ["t_prior_vendor", "t_prior_light", "t_prior_own"]
    finally:
        REGISTRY.unregister_plugin(plugin)


class RepeatingLightVendor(LightVendor):
    """Light calls, except for GQA, which it serves by repeating K and V (torch's efficient kernel)."""

    name = "t_prior_light_repeat"

    def light_call(self, req):
        return req.heads_q == req.heads_kv


def test_prior_takes_no_light_call_that_must_repeat_kv(own_and_vendor):
    """A decode step (GQA, one query) must not lead with a kernel that copies the cache per call."""
    plugin = Plugin(RepeatingLightVendor())
    REGISTRY.register_plugin(plugin)
    try:
        assert attnhub.explain(*qkv(), mask="causal").order[0] == "t_prior_light_repeat"
        q = np.zeros((2, 8, 1, 16), dtype=np.float32)
        kv = np.zeros((2, 2, 40, 16), dtype=np.float32)
        assert attnhub.explain(q, kv, kv).order == ["t_prior_vendor", "t_prior_light_repeat", "t_prior_own"]
    finally:
        REGISTRY.unregister_plugin(plugin)


class BuildingVendor(_Counting):
    """A vendor kernel that builds a plan per request shape (cuDNN's graphs)."""

    name = "t_prior_builder"
    priority = 60
    vendor = True
    builds_per_shape = True


@pytest.mark.parametrize(
    ("nq", "chosen"), [(1, "t_prior_vendor"), (16, "t_prior_vendor"), (17, "t_prior_builder")]
)
def test_decode_steps_avoid_a_backend_that_builds_per_shape(own_and_vendor, nq, chosen):
    """A decode step brings a new cache length every step: a backend that builds a plan per shape
    goes last there, even where a profile (one shape timed repeatedly) measured it fastest."""
    plugin = Plugin(BuildingVendor())
    REGISTRY.register_plugin(plugin)
    try:
        req = request_from_shapes((1, 2, nq, 16), (1, 2, 64, 16), (1, 2, 64, 16))
        times = {"t_prior_builder": 1.0, "t_prior_vendor": 1.5, "t_prior_own": 2.0}
        profile.record(cpu_key(), [(profile.request_class(req), times, "test")], {})
        rng = np.random.default_rng(3)
        q = rng.standard_normal((1, 2, nq, 16)).astype(np.float32)
        k, v = (rng.standard_normal((1, 2, 64, 16)).astype(np.float32) for _ in range(2))
        assert attnhub.explain(q, k, v).chosen == chosen
    finally:
        REGISTRY.unregister_plugin(plugin)


class HeavyVendor(_Counting):
    """A vendor kernel whose call costs more host time (cuDNN's frontend): leads only large calls."""

    name = "t_prior_heavy"
    priority = 50
    vendor = True
    heavy_calls_from = 1e10


def test_prior_puts_a_heavy_call_vendor_after_the_others_below_its_threshold(own_and_vendor):
    plugin = Plugin(HeavyVendor())
    REGISTRY.register_plugin(plugin)
    try:
        mid = np.zeros((1, 8, 1024, 64), dtype=np.float32)  # 2.1·10^9 FLOPs: under 10^10
        assert attnhub.explain(mid, mid, mid).order == ["t_prior_vendor", "t_prior_heavy", "t_prior_own"]
        big = np.zeros((1, 16, 2048, 64), dtype=np.float32)  # 1.7·10^10 FLOPs
        assert attnhub.explain(big, big, big).order == ["t_prior_heavy", "t_prior_vendor", "t_prior_own"]
    finally:
        REGISTRY.unregister_plugin(plugin)
