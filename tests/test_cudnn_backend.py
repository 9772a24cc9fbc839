"""The ``cudnn`` backend (cuDNN SDPA graphs through nvidia-cudnn-frontend).

CPU tests (run everywhere): it registers without importing torch or cudnn, says why it is
unavailable, declines what it does not serve with reasons, and its mapping of SPEC's causal rule
onto cuDNN's top-left / bottom-right diagonal is SPEC's mask. GPU tests (``-m gpu``; skipped without
CUDA or without the ``cudnn`` package): out, lse and dq/dk/dv against a float64 reference, the
graph cache, inputs left intact. Written 2026-11-28 without a GPU: the GPU tests have not run yet.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnhub  # noqa: E402
from attnhub import REGISTRY, BackendUnsupported  # noqa: E402
from attnhub.dispatch import backend_reasons  # noqa: E402
from attnhub.positions import dense_rule_mask  # noqa: E402
from attnhub.rules import Causal, Full, Local  # noqa: E402
from attnhub.shapes import request_from_shapes  # noqa: E402
from attnhub_backends import cudnn as cudnn_plugin  # noqa: E402
from attnhub_backends.cudnn import backend as cb  # noqa: E402
from attnhub_backends.cudnn import scope  # noqa: E402
from attnhub_backends.cudnn.backend import Cudnn  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cudnn_registered():
    """The plugin registered for this module, as its entry point does once installed."""
    if "cudnn" in REGISTRY.backends():
        yield
        return
    REGISTRY.register_plugin(cudnn_plugin)
    yield
    REGISTRY.unregister_plugin(cudnn_plugin)


def _req(q, k, v, dtype="float16", **kw):
    return request_from_shapes(q, k, v, dtype=dtype, framework="torch", device="cuda", **kw)


# ---------------------------------------------------------------------------------------------
# CPU: registration, availability, declines, the causal mapping
# ---------------------------------------------------------------------------------------------


def test_registers_with_its_declared_contract():
    be = REGISTRY.backends()["cudnn"]
    assert isinstance(be, Cudnn)
    assert be.vendor is True
    assert be.priority == 43 and be.heavy_calls_from == 2e10
    from attnhub_backends.sdpa.backend import SdpaCudnn

    assert be.priority > SdpaCudnn.priority  # tried before torch's wrapper of the same kernels
    assert be.frameworks == ("torch",) and be.device_types == ("cuda",)
    assert set(be.dtypes) == {"float16", "bfloat16"}
    assert be.features == frozenset({"1d", "full", "causal", "local", "gqa", "lse", "backward"})


def test_registry_load_imports_neither_torch_nor_cudnn():
    code = (
        "import sys; import attnhub_backends.cudnn as p; [b] = p.attnhub_backends(); "
        "b.check; assert 'torch' not in sys.modules and 'cudnn' not in sys.modules, "
        "sorted(m for m in sys.modules if m in ('torch', 'cudnn'))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_pyproject_declares_the_entry_point_and_extra():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)["project"]
    assert meta["entry-points"]["attnhub"]["cudnn"] == "attnhub_backends.cudnn"
    assert any(d.startswith("nvidia-cudnn-frontend") for d in meta["optional-dependencies"]["cudnn"])


def _find_spec_without(*missing):
    real = importlib.util.find_spec

    def fake(name, *a, **kw):
        return None if name in missing else real(name, *a, **kw)

    return fake


def test_unavailable_without_the_package(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", _find_spec_without("cudnn"))
    why = Cudnn().availability()
    assert why and "pip install 'attnhub[cudnn]'" in why and "nvidia-cudnn-frontend" in why


def test_unavailable_without_torch(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", _find_spec_without("torch"))
    why = Cudnn().availability()
    assert why and "torch" in why and "attnhub[cudnn]" in why


def test_unavailable_without_a_gpu(monkeypatch):
    real = importlib.util.find_spec
    stand_in = importlib.machinery.ModuleSpec("cudnn", None)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a, **kw: stand_in if n == "cudnn" else real(n, *a, **kw)
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Cudnn().availability() == "no CUDA GPU is visible to torch"


def _fake_cudnn(frontend="1.32.0", runtime=91900, fails=False):
    mod = types.SimpleNamespace(__version__=frontend)

    def backend_version():
        if fails:
            raise OSError("libcudnn.so.9: cannot open shared object file")
        return runtime

    mod.backend_version = backend_version
    return mod


@pytest.mark.parametrize(
    ("fake", "expect"),
    [
        (_fake_cudnn(), None),
        (_fake_cudnn(runtime=90600), None),
        (_fake_cudnn(frontend="1.12.0"), "nvidia-cudnn-frontend 1.12.0 is too old"),
        (_fake_cudnn(runtime=90501), "cuDNN 9.5.1 is too old"),
        (_fake_cudnn(runtime=91000), "9.10.0 has known SDPA bugs"),
        (_fake_cudnn(fails=True), "could not be loaded"),
    ],
)
def test_runtime_versions(fake, expect):
    why = cb.runtime_reason(fake)
    assert why == expect if expect is None else (why is not None and expect in why)


DECLINED = [
    # (q, k, v shapes, request kwargs, replace, expected substring of a reason)
    (
        (2, 4, 40, 64),
        (2, 4, 17, 64),
        (2, 4, 17, 64),
        dict(mask="causal", sync="none_end"),
        {},
        "Lq > Lk (40 > 17)",
    ),
    (
        (1, 2, 12, 64),
        (1, 2, 24, 64),
        (1, 2, 24, 64),
        dict(mask="causal", sync="scale_end"),
        {},
        "diagonal band",
    ),
    (
        (1, 2, 12, 64),
        (1, 2, 24, 64),
        (1, 2, 24, 64),
        dict(mask="causal", sync="scale_front"),
        {},
        "diagonal band",
    ),
    ((1, 2, 32, 64), (1, 2, 32, 64), (1, 2, 32, 64), dict(mask=Local(4, 1)), {}, "strided windows"),
    ((1, 2, 40, 64), (1, 2, 30, 64), (1, 2, 30, 64), dict(mask=Local(4)), {}, "without keys"),
    ((1, 2, 32, 60), (1, 2, 32, 60), (1, 2, 32, 64), {}, {}, "multiples of 8"),
    ((1, 2, 32, 64), (1, 2, 32, 64), (1, 2, 32, 128), {}, {}, "Dv <= Dqk"),
    ((1, 2, 32, 264), (1, 2, 32, 264), (1, 2, 32, 264), {}, {}, "head dims up to 256"),
    ((1, 2, 1, 64), (1, 2, 1, 64), (1, 2, 1, 64), {}, {}, "Lq = Lk = 1"),
    ((1, 2, 4, 4, 64), (1, 2, 4, 4, 64), (1, 2, 4, 4, 64), {}, {}, "1-d sequences only"),
    (
        (1, 2, 32, 64),
        (1, 2, 32, 64),
        (1, 2, 32, 64),
        {},
        {"softcap": 30.0},
        "does not take softcap; use backend=",
    ),
    ((1, 2, 32, 64), (1, 2, 32, 64), (1, 2, 32, 64), {}, {"bias": (1, 1, 32, 32)}, "additive bias"),
    ((1, 2, 32, 64), (1, 2, 32, 64), (1, 2, 32, 64), {}, {"sinks": True}, "sinks"),
    ((1, 2, 32, 64), (1, 2, 32, 64), (1, 2, 32, 64), {}, {"k_lengths": True}, "NaN stored in padding"),
    ((1, 2, 32, 64), (1, 2, 32, 64), (1, 2, 32, 64), {}, {"q_offset": 5}, "q_offset/k_offset"),
    ((1, 2, 32, 64), (1, 2, 32, 64), (1, 2, 32, 64), dict(dtype="float32"), {}, "dtypes float16, bfloat16"),
    ((1, 2, 32, 64), (1, 2, 32, 64), (1, 2, 32, 64), {}, {"symbolic": True}, "concrete"),
]


@pytest.mark.parametrize("case", DECLINED, ids=lambda c: c[-1])
def test_declines_with_a_reason(case):
    q, k, v, kw, replace, expect = case
    req = dataclasses.replace(_req(q, k, v, **kw), **replace)
    reasons = Cudnn().check(req)
    assert reasons, "accepted a request it does not serve"
    assert any(expect in r for r in reasons), reasons


def test_declines_cpu_tensors():
    req = request_from_shapes(
        (1, 2, 32, 64), (1, 2, 32, 64), (1, 2, 32, 64), dtype="float16", framework="torch"
    )
    assert any("runs on cuda devices" in r for r in Cudnn().check(req))


ACCEPTED = [
    ((2, 8, 77, 64), (2, 2, 131, 64), (2, 2, 131, 64), dict(mask="causal", sync="none_end")),
    ((2, 8, 131, 64), (2, 2, 77, 64), (2, 2, 77, 64), dict(mask="causal", sync="none_front")),
    ((2, 8, 131, 64), (2, 2, 77, 64), (2, 2, 77, 64), dict(mask=None, sync="none_end")),
    ((1, 4, 64, 128), (1, 4, 64, 128), (1, 4, 64, 128), dict(mask="causal", sync="scale_end")),
    (
        (1, 4, 64, 256),
        (1, 4, 96, 256),
        (1, 4, 96, 128),
        dict(mask="causal", needs_grad=True, return_lse=True),
    ),
    ((1, 4, 1, 64), (1, 4, 300, 64), (1, 4, 300, 64), dict(mask="causal", sync="none_end", dtype="bfloat16")),
]


@pytest.mark.parametrize("case", ACCEPTED, ids=str)
def test_accepts_its_scope(case):
    """No static reason for requests in scope. (cuDNN's own verdict on the graph is
    ``late_reasons``, asked by dispatch only when about to choose cudnn.)"""
    q, k, v, kw = case
    assert Cudnn().check(_req(q, k, v, **kw)) == []


@pytest.mark.parametrize("sync", ["none_front", "none_end", "scale_front", "scale_end"])
@pytest.mark.parametrize("lens", [(7, 7), (5, 9), (9, 5), (1, 6), (13, 3)], ids=str)
@pytest.mark.parametrize("rule", [Full(), Causal()], ids=lambda r: r.describe())
def test_cudnn_diagonal_is_spec_mask(rule, lens, sync):
    """For every accepted request, cuDNN's mask (reference: test/python/sdpa/fp16_ref.py masks
    ``triu(diagonal=1)`` top-left, ``triu(diagonal=s_kv - s_q + 1)`` bottom-right) equals SPEC's."""
    lq, lk = lens
    req = _req((1, 1, lq, 64), (1, 1, lk, 64), (1, 1, lk, 64), mask=rule, sync=sync)
    if scope.reasons(req):
        return
    align = scope.alignment(req)
    keep = np.ones((lq, lk), dtype=bool)
    if align == "top_left":
        keep = ~np.triu(keep, 1)
    elif align == "bottom_right":
        keep = ~np.triu(keep, lk - lq + 1)
    spec = np.asarray(dense_rule_mask(rule, (lq,), (lk,), sync)).reshape(lq, lk)
    assert np.array_equal(keep, spec)
    assert keep.any(axis=1).all(), "an accepted request has a row without keys"


# ---------------------------------------------------------------------------------------------
# The float64 reference the GPU tests use, checked here against attnhub's reference backend
# ---------------------------------------------------------------------------------------------


def reference(q, k, v, rule, sync, scale):
    """(out, lse, p) in float64 on the CPU with SPEC's mask (attnhub.positions), GQA by repeating
    kv heads; differentiable when the inputs require grad."""
    q, k, v = (x.double().cpu() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    lq, lk = q.shape[2], k.shape[2]
    keep = torch.from_numpy(np.asarray(dense_rule_mask(rule, (lq,), (lk,), sync)).reshape(lq, lk))
    s = (scale * q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return p @ v, lse, p


def rounded_grads(q, k, v, p, dout, scale, dtype):
    """SPEC §6's rounded formula (attnhub_conformance/rounded.py) in torch: what a tensor-core kernel
    storing O, P and dS in ``dtype`` inherits; half gradients may be within 2x of its errors."""

    def r(x):
        return x.to(dtype).double()

    q, k, v, dout = (x.detach().double().cpu() for x in (q, k, v, dout))
    b, hq, hkv = q.shape[0], q.shape[1], k.shape[1]
    g = hq // hkv
    ke, ve = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    out = r(r(p) @ ve)
    delta = (dout * out).sum(-1, keepdim=True)
    dt = r(p * (dout @ ve.transpose(-1, -2) - delta))

    def per_kv(x):
        return x.reshape(b, hkv, g, *x.shape[2:]).sum(2)

    return (
        r(scale * dt @ ke),
        r(per_kv(scale * dt.transpose(-1, -2) @ q)),
        r(per_kv(r(p).transpose(-1, -2) @ dout)),
    )


def test_reference_matches_attnhub_reference():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 9, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 13, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 13, 8, generator=gen, dtype=torch.float64)
    for rule, sync in [(Full(), "none_front"), (Causal(), "none_front"), (Causal(), "none_end")]:
        out, lse, _ = reference(q, k, v, rule, sync, 0.3)
        want, want_lse = attnhub.attention(
            q, k, v, mask=rule, sync=sync, scale=0.3, backend="reference", return_lse=True
        )
        assert torch.allclose(out, want, atol=1e-12) and torch.allclose(lse, want_lse, atol=1e-12)


def test_rounded_grads_are_the_exact_grads_in_float64():
    """With rounding to float64 (none), the formula is the exact gradient (autograd of reference)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 11, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 11, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(1, 4, 7, 8, generator=gen, dtype=torch.float64)
    g = 2
    s = 0.5 * q @ k.repeat_interleave(g, 1).transpose(-1, -2)
    keep = torch.ones(7, 11, dtype=torch.bool).tril(11 - 7)
    out = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v.repeat_interleave(g, 1)
    want = torch.autograd.grad(out, (q, k, v), dout)
    _, _, p = reference(q.detach(), k.detach(), v.detach(), Causal(), "none_end", 0.5)
    got = rounded_grads(q, k, v, p, dout, 0.5, torch.float64)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# CPU: every call into ``cudnn``, against a stand-in with frontend 1.32's signatures
# (tests/fake_cudnn.py says where each one was read) that computes cuDNN's own reference
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def fake_cudnn(monkeypatch):
    """``sys.modules["cudnn"]`` is the stand-in, torch believes in one sm90 GPU (device 0, current
    stream 0x5150), and CUDA allocations land on the CPU; the graph cache, handles and workspaces
    start empty."""
    from attnhub_backends.cudnn import graphs
    from tests import fake_cudnn as fake

    fake.reset()
    monkeypatch.setitem(sys.modules, "cudnn", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0x5150)
    )

    class _Device:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "device", _Device)
    real_empty = torch.empty

    def empty(*args, device=None, **kw):
        if device is not None and torch.device(device).type == "cuda":
            device = "cpu"
        return real_empty(*args, device=device, **kw)

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(graphs, "_GRAPHS", type(graphs._GRAPHS)())
    monkeypatch.setattr(graphs, "_HANDLES", {})
    monkeypatch.setattr(graphs, "_WORKSPACES", {})
    monkeypatch.setattr(graphs, "STATS", {"builds": 0, "hits": 0, "refused": 0})
    yield fake


FAKE_CASES = [
    # (q, k, v shapes, rule, sync, scale, expected alignment)
    ((2, 4, 7, 16), (2, 4, 7, 16), (2, 4, 7, 16), Full(), "none_front", 0.25, None),
    ((1, 4, 5, 16), (1, 2, 9, 16), (1, 2, 9, 8), Causal(), "none_end", 0.3, "BOTTOM_RIGHT"),
    ((1, 4, 9, 16), (1, 1, 5, 16), (1, 1, 5, 16), Causal(), "none_front", 0.3, "TOP_LEFT"),
    ((1, 2, 6, 16), (1, 2, 6, 16), (1, 2, 6, 16), Causal(), "scale_end", -0.4, "TOP_LEFT"),
]


@pytest.mark.parametrize("case", FAKE_CASES, ids=lambda c: f"{c[3].describe()}-{c[4]}-{c[5]}")
def test_fake_cudnn_forward_backward(fake_cudnn, case):
    """forward and backward through the graphs module give SPEC's out, lse and gradients: the
    stand-in computes what cuDNN's reference does with the arguments the backend passes, so a
    wrong mask alignment, scale, Stats binding or the (-q, -scale) trick's dq shows here."""
    qs, ks, vs, rule, sync, scale, align = case
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(s, generator=gen, dtype=torch.float64).to(torch.float16) for s in (qs, ks, vs))
    req = _req(qs, ks, vs, mask=rule, sync=sync, scale=scale, needs_grad=True, return_lse=True)
    be = Cudnn()
    assert be.check(req) == [] and be.late_reasons(req) == []
    assert {g.node["op"] for g in fake_cudnn.GRAPHS} == {"sdpa", "sdpa_backward"}
    out, lse = be.forward(q, k, v, req)
    want, want_lse, _ = reference(q, k, v, rule, sync, scale)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32 and lse.shape == want_lse.shape
    assert torch.allclose(out.double(), want, atol=2e-3) and torch.allclose(lse.double(), want_lse, atol=1e-5)
    dout = torch.randn(tuple(out.shape), generator=gen, dtype=torch.float64).to(torch.float16)
    got = be.backward(q, k, v, out, lse, dout, req)
    ref = [x.double().requires_grad_(True) for x in (q, k, v)]
    want_g = torch.autograd.grad(reference(*ref, rule, sync, scale)[0], ref, dout.double())
    for a, w, x in zip(got, want_g, (q, k, v)):
        assert a.shape == x.shape and a.dtype == x.dtype
        assert torch.allclose(a.double(), w, atol=1e-2, rtol=1e-2)
    # The masking arguments are the preferred ones (no deprecated use_causal_mask*).
    for g in fake_cudnn.GRAPHS:
        p = g.node["params"]
        assert p["attn_scale"] == abs(scale)
        if align is None:
            assert "diagonal_alignment" not in p and "diagonal_band_right_bound" not in p
        else:
            assert p["diagonal_alignment"].name == align and p["diagonal_band_right_bound"] == 0


@pytest.mark.parametrize(
    ("lq", "lk", "rule", "sync"),
    [
        (40, 40, Local(5), "none_front"),
        (40, 40, Local(5, causal=True), "none_front"),
        (24, 56, Local(7), "none_end"),
        (24, 56, Local(7, causal=True), "none_end"),
        (36, 30, Local(9), "none_front"),  # Lq > Lk top-left, every row within 9 of a key
        (24, 56, Local(3), "none_front"),
    ],
    ids=lambda x: str(x),
)
def test_fake_cudnn_windows_are_spec_bands(fake_cudnn, lq, lk, rule, sync):
    """SPEC §3's Local(w) (|P - R| < w, and P >= R when causal) as cuDNN's diagonal band (left bound
    w, right bound w - 1 or 0) on the alignment of the sync mode: out, lse and gradients against
    SPEC's mask (attnhub's positions), the stand-in computing cuDNN's reference band."""
    qs, ks = (1, 2, lq, 64), (1, 2, lk, 64)
    gen = torch.Generator().manual_seed(lq + lk)
    q, k, v = (torch.randn(s, generator=gen, dtype=torch.float64).to(torch.float16) for s in (qs, ks, ks))
    req = _req(qs, ks, ks, mask=rule, sync=sync, needs_grad=True, return_lse=True)
    be = Cudnn()
    assert be.check(req) == [] and be.late_reasons(req) == []
    out, lse = be.forward(q, k, v, req)
    want, want_lse, _ = reference(q, k, v, rule, sync, 1 / 8)
    assert torch.allclose(out.double(), want, atol=2e-3) and torch.allclose(lse.double(), want_lse, atol=1e-5)
    dout = torch.randn(tuple(out.shape), generator=gen, dtype=torch.float64).to(torch.float16)
    got = be.backward(q, k, v, out, lse, dout, req)
    ref = [x.double().requires_grad_(True) for x in (q, k, v)]
    want_g = torch.autograd.grad(reference(*ref, rule, sync, 1 / 8)[0], ref, dout.double())
    for a, w in zip(got, want_g):
        assert torch.allclose(a.double(), w, atol=1e-2, rtol=1e-2)


def test_fake_cudnn_bound_call_binds_dense_tensors_and_copies_other_strides(fake_cudnn):
    """The fast path's bound call (``Cudnn.bind``): dense inputs go to cuDNN as they are, a view
    with other strides is copied to the declared row-major layout first (the stand-in rejects a
    buffer whose strides differ from the graph's), and both give SPEC's out."""
    qs, ks = (2, 4, 48, 64), (2, 2, 80, 64)
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(s, generator=gen, dtype=torch.float64).to(torch.float16) for s in (qs, ks, ks))
    req = _req(qs, ks, ks, mask="causal", sync="none_end")
    be = Cudnn()
    assert be.check(req) == [] and be.late_reasons(req) == []
    fn = be.bind(req)
    assert fn is not None and fn.fixed_result
    want, _, _ = reference(q, k, v, Causal(), "none_end", 1 / 8)
    out, lse = fn(q, k, v, None)
    assert lse is None and torch.allclose(out.double(), want, atol=2e-3)
    strided = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]  # bhsd values, bshd memory
    assert strided[0].stride() != q.stride()
    out2, _ = fn(*strided, None)
    assert torch.equal(out2, out)
    assert be.bind(dataclasses.replace(req, needs_grad=True)) is None  # gradients take forward/backward


def test_fake_cudnn_calls_and_arguments(fake_cudnn):
    """The build sequence, data types, handle, stream and variant pack, as the frontend takes them."""
    qs, ks = (2, 8, 64, 64), (2, 2, 96, 64)
    q, k, v = (torch.randn(s).to(torch.bfloat16) for s in (qs, ks, ks))
    req = _req(qs, ks, ks, dtype="bfloat16", mask="causal", sync="none_end")
    be = Cudnn()
    assert be.check(req) == [] and be.late_reasons(req) == []
    [g] = fake_cudnn.GRAPHS
    dt = fake_cudnn.data_type
    assert g.init["io_data_type"] is dt.BFLOAT16
    assert g.init["intermediate_data_type"] is dt.FLOAT and g.init["compute_data_type"] is dt.FLOAT
    assert isinstance(g.init["handle"], fake_cudnn.Handle)
    assert g.steps == [
        "validate", "build_operation_graph", "create_execution_plans", "check_support", "build_plans",
        "get_workspace_size",
    ]  # fmt: skip
    assert g.heuristics == [fake_cudnn.heur_mode.A, fake_cudnn.heur_mode.FALLBACK]
    assert g.node["params"]["generate_stats"] is False  # no lse asked, no backward: no Stats
    assert g.node["outputs"]["Stats"] is None
    out, lse = be.forward(q, k, v, req)
    assert lse is None and out.shape == (2, 8, 64, 64)
    stream_sets = [c for c in fake_cudnn.CALLS if c[0] == "set_stream"]
    assert stream_sets and all(c[2] == 0x5150 for c in stream_sets)
    [(_, graph, handle, stream)] = [c for c in fake_cudnn.CALLS if c[0] == "execute"]
    assert graph is g and handle is g.init["handle"] and stream == 0x5150
    # A second call with the same signature builds nothing.
    be.forward(q, k, v, req)
    assert len(fake_cudnn.GRAPHS) == 1


def test_fake_cudnn_refusal_is_a_cached_reason(fake_cudnn):
    fake_cudnn.REFUSE.append("no engine for this configuration")
    req = _req((1, 2, 64, 64), (1, 2, 64, 64), (1, 2, 64, 64), mask="causal")
    assert Cudnn().check(req) == [], "check() asked cuDNN: a graph per new shape on every dispatch"
    assert fake_cudnn.GRAPHS == []
    for _ in range(2):
        why = Cudnn().late_reasons(req)
        assert len(why) == 1 and "no engine for this configuration" in why[0] and "backend=" in why[0]
    assert len(fake_cudnn.GRAPHS) == 1, "a refusal was built twice"


@pytest.mark.parametrize(
    ("shapes", "kw"),
    [
        (((0, 2, 8, 64), (0, 2, 8, 64), (0, 2, 8, 64)), {}),  # B = 0: empty, answered by the core
        (((1, 2, 8, 64), (1, 2, 0, 64), (1, 2, 0, 64)), {}),  # Lk = 0: fully masked rows
        (((1, 2, 8, 264), (1, 2, 8, 264), (1, 2, 8, 264)), {}),  # declined by max_head_dim
        (((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64)), dict(mask=Local(2, 1))),  # declined statically
    ],
    ids=["B=0", "Lk=0", "D=264", "Local"],
)
def test_check_builds_no_graph_it_does_not_need(fake_cudnn, shapes, kw):
    """No cuDNN graph for an empty request (the core never calls the backend; its graph would have
    zero extents) nor for one the declared or static rules decline already."""
    backend_reasons(Cudnn(), _req(*shapes, **kw), frozenset())  # check(), then late_reasons()
    assert fake_cudnn.GRAPHS == []


def test_dense_declares_exact_row_major_strides():
    """A size-1 dim may carry any stride in a torch tensor that is_contiguous(); the graphs declare
    the row-major one, so such a view is copied (and a dense one passed as is)."""
    x = torch.randn(2, 1, 4, 64).permute(0, 2, 1, 3)  # bshd with Lq = 1 seen as bhsd
    assert x.is_contiguous() and x.stride() != (256, 64, 64, 1)
    y = cb._dense(x)
    assert y.stride() == (256, 64, 64, 1) and torch.equal(x, y)
    z = torch.randn(2, 4, 3, 64)
    assert cb._dense(z) is z


# ---------------------------------------------------------------------------------------------
# GPU: against the float64 reference (SPEC §6), graph cache, inputs intact
# ---------------------------------------------------------------------------------------------

FWD_TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}
GRAD_TOL = {"float16": 8e-3, "bfloat16": 4e-2}


def _gpu_ready():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if importlib.util.find_spec("cudnn") is None:
        pytest.skip("nvidia-cudnn-frontend (cudnn) is not installed: pip install 'attnhub[cudnn]'")
    why = Cudnn().availability()
    if why:
        pytest.fail(f"cudnn backend unavailable on a GPU machine with the package: {why}")


def _err(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert not torch.isnan(got).any(), "NaN in the result"
    e = got - want
    return (e.norm() / (want.norm() or 1.0)).item(), (e.abs().max() / (want.abs().max() or 1.0)).item()


def _close(name, got, want, tol, rounded=None):
    """SPEC §6: both errors under ``tol``; a half gradient also passes within 2x the errors of
    the rounded formula (``rounded``)."""
    rel, mx = _err(got, want)
    if rel < tol and mx < tol:
        return
    if rounded is not None:
        r_rel, r_mx = _err(rounded, want)
        if rel <= 2 * r_rel and mx <= 2 * r_mx:
            return
    pytest.fail(f"{name}: relative {rel:.3g}, max {mx:.3g}; tolerance {tol:g}")


def _inputs(shape_q, hkv, lk, dv, dtype, seed, qscale=1.0):
    gen = torch.Generator().manual_seed(seed)
    b, hq, lq, dqk = shape_q
    q = torch.randn(b, hq, lq, dqk, generator=gen, dtype=torch.float64) * qscale
    k = torch.randn(b, hkv, lk, dqk, generator=gen, dtype=torch.float64)
    v = torch.randn(b, hkv, lk, dv, generator=gen, dtype=torch.float64)
    dt = getattr(torch, dtype)
    return [x.to(dt).cuda() for x in (q, k, v)]


def _run_and_check(q, k, v, rule, sync, dtype, scale=None, grad=True):
    """cudnn's out, lse (and gradients) against the float64 reference on the same rounded inputs;
    the inputs must come back bitwise unchanged."""
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    before = [x.clone() for x in (q, k, v)]
    leaves = [x.detach().requires_grad_(grad) for x in (q, k, v)]
    out, lse = attnhub.attention(*leaves, mask=rule, sync=sync, scale=scale, backend="cudnn", return_lse=True)
    want, want_lse, p = reference(q.detach(), k.detach(), v.detach(), rule, sync, scale)
    assert out.dtype == q.dtype and out.shape == want.shape
    assert lse.dtype == torch.float32 and lse.shape == want_lse.shape
    _close("out", out, want, FWD_TOL[dtype])
    _close("lse", lse, want_lse, FWD_TOL[dtype])
    if grad:
        gen = torch.Generator().manual_seed(99)
        dout = torch.randn(tuple(want.shape), generator=gen, dtype=torch.float64).to(q.dtype)
        got = torch.autograd.grad(out, leaves, dout.cuda())
        ref = [x.detach().double().cpu().requires_grad_(True) for x in (q, k, v)]
        rout, _, _ = reference(*ref, rule, sync, scale)
        want_g = torch.autograd.grad(rout, ref, dout.double())
        rounded = rounded_grads(q, k, v, p.detach(), dout, scale, q.dtype)
        for name, a, w, rr in zip(("dq", "dk", "dv"), got, want_g, rounded):
            assert a.shape == w.shape and a.dtype == q.dtype
            _close(name, a, w, GRAD_TOL[dtype], rr)
    for x, b in zip((q, k, v), before):
        assert torch.equal(x, b), "an input was modified"


LENS = {"eq": (131, 131), "q<k": (77, 131), "q>k": (131, 77)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("qscale", [1.0, 8.0], ids=["logits", "large-logits"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("lens", list(LENS), ids=list(LENS))
@pytest.mark.parametrize("sync", ["none_front", "none_end"])
@pytest.mark.parametrize("rule", [Full(), Causal()], ids=lambda r: r.describe())
def test_gpu_matches_reference(rule, sync, lens, heads, d, qscale, dtype):
    _gpu_ready()
    lq, lk = LENS[lens]
    hq, hkv = heads
    q, k, v = _inputs((2, hq, lq, d), hkv, lk, d, dtype, seed=hash((lq, lk, hq, d)) % 2**31, qscale=qscale)
    if isinstance(rule, Causal) and sync == "none_end" and lq > lk:
        with pytest.raises(BackendUnsupported, match="Lq > Lk"):
            attnhub.attention(q, k, v, mask=rule, sync=sync, backend="cudnn")
        return
    _run_and_check(q, k, v, rule, sync, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(128, 64), (256, 256), (192, 128)], ids=str)
def test_gpu_other_head_dims(dims):
    _gpu_ready()
    q, k, v = _inputs((1, 4, 100, dims[0]), 2, 150, dims[1], "bfloat16", seed=3)
    _run_and_check(q, k, v, Causal(), "none_end", "bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [-0.3, 2.0])
def test_gpu_scale_as_given(scale):
    """Negative scales run as (-q, -scale) (exact)."""
    _gpu_ready()
    q, k, v = _inputs((1, 2, 64, 64), 2, 80, 64, "float16", seed=4)
    _run_and_check(q, k, v, Causal(), "none_front", "float16", scale=scale)


@pytest.mark.gpu
def test_gpu_scale_zero_is_declined_with_a_reason():
    """cuDNN 9.19's graph gave NaN for attn_scale = 0 (H200, 2026-11-28): declined, auto goes elsewhere."""
    _gpu_ready()
    q, k, v = _inputs((1, 2, 64, 64), 2, 80, 64, "float16", seed=4)
    ex = attnhub.explain(q, k, v, mask="causal", scale=0.0)
    assert ex.chosen != "cudnn"
    (cudnn,) = [v for v in ex.verdicts if v.name == "cudnn"]
    assert any("scale = 0" in r for r in cudnn.reasons), cudnn.reasons


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd", "bhds"])
def test_gpu_other_layouts_and_gqa_gradients(layout):
    """Views of other layouts are copied dense before cuDNN sees them (sdpa-cudnn's dq was wrong on
    transposed GQA inputs with torch 2.11 / cuDNN 9.19, tests/test_sdpa_backends.py)."""
    _gpu_ready()
    q, k, v = _inputs((2, 8, 45, 64), 2, 70, 64, "float16", seed=5)
    perm = (0, 2, 1, 3) if layout == "bshd" else (0, 1, 3, 2)
    views = [x.permute(*perm).contiguous().permute(*perm) for x in (q, k, v)]  # bhsd views, other strides
    assert not views[0].is_contiguous()
    leaves = [x.detach().requires_grad_(True) for x in views]
    args = [x.permute(*perm) for x in leaves]  # the caller's layout
    out = attnhub.attention(*args, mask="causal", layout=layout, backend="cudnn")
    out_bhsd = out.permute(*perm)
    want, _, _ = reference(q, k, v, Causal(), "none_front", 1 / 8)
    _close("out", out_bhsd, want, FWD_TOL["float16"])
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, dout)
    leaves2 = [x.detach().contiguous().requires_grad_(True) for x in (q, k, v)]
    out2 = attnhub.attention(*leaves2, mask="causal", backend="cudnn")
    same = torch.autograd.grad(out2, leaves2, dout.permute(*perm).contiguous())
    for a, b in zip(got, same):
        _close("grad vs contiguous", a, b, GRAD_TOL["float16"])


@pytest.mark.gpu
def test_gpu_graph_cache_reuses_graphs():
    """A second call with the same signature builds nothing; a new signature builds again."""
    _gpu_ready()
    from attnhub_backends.cudnn import graphs

    graphs.clear()
    q, k, v = _inputs((1, 4, 96, 64), 2, 96, 64, "float16", seed=6)
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]

    def call(qq, kk, vv):
        out, _ = attnhub.attention(qq, kk, vv, mask="causal", backend="cudnn", return_lse=True)
        torch.autograd.grad(out, (qq, kk, vv), torch.ones_like(out))

    start = graphs.STATS["builds"]
    call(*leaves)
    first = graphs.STATS["builds"] - start
    assert first == 2, f"expected one forward and one backward graph, built {first}"
    call(*[x.detach().clone().requires_grad_(True) for x in (q, k, v)])  # fresh tensors, same signature
    assert graphs.STATS["builds"] - start == first, "the same signature built a graph again"
    q2 = torch.cat([q, q], dim=2)  # a new length: a new signature
    call(*[x.requires_grad_(True) for x in (q2, k.clone(), v.clone())])
    assert graphs.STATS["builds"] - start == first + 2
    assert graphs.cached_count() == 4


@pytest.mark.gpu
def test_gpu_auto_may_pick_it_and_explain_names_it():
    _gpu_ready()
    q, k, v = _inputs((1, 4, 128, 64), 4, 128, 64, "bfloat16", seed=7)
    names = [x.name for x in attnhub.explain(q, k, v, mask="causal").verdicts]
    assert "cudnn" in names
