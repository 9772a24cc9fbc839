"""The pre-bound fast path (attnhub/fastpath.py, issue 21): a repeated call with the same signature
gives what the general path gives, and a changed signature never reuses a stale entry."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attnhub  # noqa: E402
from attnhub import REGISTRY, Backend, BackendError, hookimpl  # noqa: E402
from attnhub.dispatch import CACHE  # noqa: E402
from attnhub.extras import NONE, Extras  # noqa: E402
from attnhub.plan import plan_for  # noqa: E402
from attnhub_backends.sdpa import backend as sdpa_backend  # noqa: E402

TOL = {"float64": 1e-10, "float32": 2e-5, "bfloat16": 1.6e-2, "float16": 2e-3}
GRAD_TOL = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 4e-2, "float16": 8e-3}


pytestmark = pytest.mark.usefixtures("sdpa_registered")


def _inputs(shape, dtype="float32", seed=0, grad=False, peaked=False, lk=None):
    """Fresh random q, k, v (bhsd); ``peaked``: large logits, each row's probability on one key."""
    b, h, n, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, h, lk or n, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, lk or n, d, generator=g, dtype=torch.float64)
    if peaked:  # logits up to ~40 apart: softmax rows close to one-hot
        q, k = q * 6.0, k * 6.0
    dt = getattr(torch, dtype)
    return [x.to(dt).requires_grad_(grad) for x in (q, k, v)]


def _rel(got, want):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return ((got - want).abs().max() / (want.abs().max() or 1.0)).item()


def _reference(q, k, v, **kw):
    ref = [x.detach().double().cpu().requires_grad_(x.requires_grad) for x in (q, k, v)]
    kw = {n: a for n, a in kw.items() if n != "backend"}
    return ref, attnhub.attention(*ref, backend="reference", **kw)


def _check(q, k, v, dtype, grad=False, **kw):
    """Two calls of the same signature (the second takes the fast path) against the reference."""
    ref, want = _reference(q, k, v, **kw)
    for _ in range(2):
        got = attnhub.attention(q, k, v, **kw)
        assert got.dtype == q.dtype and got.shape == want.shape
        assert torch.isfinite(got).all()  # every element written
        assert _rel(got, want) < TOL[dtype], _rel(got, want)
        if grad:
            assert got.grad_fn is not None
            dout = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
            want_g = torch.autograd.grad(want, ref, dout, retain_graph=True)
            got_g = torch.autograd.grad(got, (q, k, v), dout.to(q.dtype))
            for a, b in zip(got_g, want_g, strict=True):
                assert _rel(a, b) < GRAD_TOL[dtype], _rel(a, b)
        else:
            assert got.grad_fn is None


def _bound(q, k, v, mask="causal", backend="sdpa-cpu", **kw):
    plan = plan_for(q, k, v, mask, kw.get("sync", "none_front"), kw.get("scale"), "bhsd", False, backend)
    return plan


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("mask", [None, "causal"])
@pytest.mark.parametrize("grad", [False, True])
def test_fast_path_matches_the_reference(dtype, mask, grad):
    q, k, v = _inputs((2, 3, 17, 16), dtype, seed=1, grad=grad, lk=23)
    _check(q, k, v, dtype, grad=grad, mask=mask, backend="sdpa-cpu", scale=0.41)
    plan = plan_for(q, k, v, mask, "none_front", 0.41, "bhsd", False, "sdpa-cpu")
    assert plan.call is not plan.execute
    # Bound to the kernel itself, but for half gradients (run in float32 by the general path).
    fast = sdpa_backend.SdpaCpu()._bind_fast(plan.req)
    assert (fast is None) == (grad and dtype in ("bfloat16", "float16"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fast_path_on_large_logits_and_peaked_rows(dtype):
    q, k, v = _inputs((1, 2, 24, 32), dtype, seed=2, grad=True, peaked=True)
    _check(q, k, v, dtype, grad=True, mask="causal", backend="sdpa-cpu")


def test_auto_takes_the_fast_path_and_gives_the_general_paths_result():
    q, k, v = _inputs((1, 2, 16, 32), seed=4)
    plan = _bound(q, k, v, backend="auto")
    assert plan.backend.name == "sdpa-cpu"
    assert plan.call is not plan.execute and plan.call.plan is plan
    fast = attnhub.attention(q, k, v, mask="causal")
    slow = plan.execute(q, k, v, "causal")
    assert torch.equal(fast, slow)


def test_what_is_not_plain_takes_the_general_path():
    q, k, v = _inputs((1, 2, 8, 16), seed=5)
    for kw in ({"return_lse": True}, {"layout": "bshd"}, {"softcap": 5.0}):
        layout, lse = kw.get("layout", "bhsd"), kw.get("return_lse", False)
        extras = Extras(softcap=kw["softcap"]) if "softcap" in kw else NONE
        plan = plan_for(q, k, v, "causal", "none_front", None, layout, lse, "auto", extras)
        assert plan.call == plan.execute, kw
    mask = torch.rand(1, 1, 8, 8) > 0.3
    mask[..., 0] = True
    plan = plan_for(q, k, v, mask, "none_front", None, "bhsd", False, "auto")
    assert plan.call == plan.execute


def test_a_changed_signature_never_reuses_a_stale_entry():
    """Shape, dtype, kwargs, requires_grad and grad mode each make a new plan with the right result."""
    CACHE.clear()
    base = _inputs((1, 2, 12, 16), seed=6)
    _check(*base, "float32", mask="causal")
    _check(*_inputs((1, 2, 13, 16), seed=7), "float32", mask="causal")  # new shape
    _check(*_inputs((1, 2, 12, 16), "float64", seed=8), "float64", mask="causal")  # new dtype
    _check(*base, "float32", mask=None)  # new mask
    _check(*base, "float32", mask="causal", scale=0.9)  # new scale
    _check(*base, "float32", mask="causal", sync="none_end")  # new sync
    _check(*base, "float32", mask="causal", backend="reference")  # new backend
    grad = [x.detach().requires_grad_(True) for x in base]
    _check(*grad, "float32", grad=True, mask="causal")  # requires_grad flipped
    with torch.no_grad():  # grad mode flipped: no graph
        out = attnhub.attention(*grad, mask="causal")
        assert out.grad_fn is None and not out.requires_grad
    _check(*grad, "float32", grad=True, mask="causal")  # and back
    with attnhub.use_backend("reference"):  # an override changes the key too
        plan = _bound(*base, backend="auto")
        assert plan.backend.name == "reference"
    assert _bound(*base, backend="auto").backend.name == "sdpa-cpu"


def test_strides_are_checked_per_call():
    """The key holds no strides: a transposed view of a signature first seen contiguous still runs
    right (the kernel misreads rows whose last stride is not 1)."""
    q, k, v = _inputs((1, 2, 16, 16), seed=9)
    _check(q, k, v, "float32", mask="causal")
    qt, kt, vt = (x.transpose(-1, -2).contiguous().transpose(-1, -2) for x in (q, k, v))
    assert qt.stride(-1) != 1 and qt.shape == q.shape
    _check(qt, kt, vt, "float32", mask="causal")


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_negative_and_zero_scales_take_the_general_path(scale):
    q, k, v = _inputs((1, 2, 10, 8), seed=10)
    req = _bound(q, k, v, scale=scale).req
    assert sdpa_backend.SdpaCpu()._bind_fast(req) is None
    _check(q, k, v, "float32", mask="causal", scale=scale, backend="sdpa-cpu")


def test_half_gradients_take_the_float32_general_path():
    q, k, v = _inputs((1, 2, 10, 16), "bfloat16", seed=11, grad=True)
    req = _bound(q, k, v).req
    assert req.needs_grad and sdpa_backend.SdpaCpu()._bind_fast(req) is None


class _Faulty(Backend):
    """Raises, or returns a wrong shape, on the fast path's second call."""

    name = "faulty-fast"
    priority = 1000
    frameworks = ("numpy",)

    def __init__(self):
        self.mode = "ok"

    def forward(self, q, k, v, req, mask=None, operands=None):
        out = np.zeros(q.shape[:3] + (v.shape[-1],), dtype=q.dtype)
        if self.mode == "raise":
            raise RuntimeError("boom")
        if self.mode == "shape":
            out = out[:, :, :1]
        return out, None


def test_fast_path_names_a_failing_backend():
    backend = _Faulty()

    class Plugin:
        @hookimpl
        def attnhub_backends(self):
            return [backend]

    plugin = Plugin()
    REGISTRY.register_plugin(plugin)
    try:
        q, k, v = (
            np.random.default_rng(12).standard_normal((1, 1, 4, 8)).astype(np.float32) for _ in range(3)
        )
        attnhub.attention(q, k, v)
        backend.mode = "raise"
        with pytest.raises(BackendError, match="faulty-fast.*raised RuntimeError: boom"):
            attnhub.attention(q, k, v)
        backend.mode = "shape"
        with pytest.raises(BackendError, match="faulty-fast.*wrong result"):
            attnhub.attention(q, k, v)
    finally:
        REGISTRY.unregister_plugin(plugin)


# --- SDPA's kernel flags (the CUDA backends' pin), exercised with torch's CPU flash kernel --------


def _flag_state():
    return [g() for g in sdpa_backend._flags("FLASH_ATTENTION").getters]


def test_flags_pin_one_kernel_and_restore_what_they_found():
    flags = sdpa_backend._flags("FLASH_ATTENTION")
    before = _flag_state()
    saved = flags.pin()
    assert _flag_state() == flags.wanted and sum(flags.wanted) == 1
    inner = sdpa_backend._flags("MATH").pin()  # nested: restores the flash pin
    assert _flag_state() == sdpa_backend._flags("MATH").wanted
    sdpa_backend._flags("MATH").restore(inner)
    assert _flag_state() == flags.wanted
    flags.restore(saved)
    assert _flag_state() == before


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_flash_bound_call_pins_the_kernel(monkeypatch, causal):
    """sdpa-flash's bound call (its GPU fast path) on CPU tensors, where the flash flag also picks
    torch's CPU flash kernel: the right result, only that kernel enabled during the call, the flags
    restored after it, also when the call raises."""
    flash = sdpa_backend.SdpaFlash()
    monkeypatch.setattr(type(flash), "_gqa_mode", lambda self, req: "none")
    # The pinned SDPA call; the kernel's own op (taken for contiguous inputs) has no CPU kernel.
    monkeypatch.setattr(type(flash), "_direct_op", lambda self, *a: None)
    q, k, v = _inputs((1, 2, 9, 16), seed=13)
    mask = "causal" if causal else None
    req = _bound(q, k, v, mask=mask, backend="sdpa-cpu").req
    fn = flash.bind(req)
    before = _flag_state()
    seen = []
    real = torch._C._nn.scaled_dot_product_attention

    def spy(*args, **kw):
        seen.append(_flag_state())
        return real(*args, **kw)

    monkeypatch.setattr(torch._C._nn, "scaled_dot_product_attention", spy)
    fn = flash.bind(req)  # binds the spy
    out, lse = fn(q, k, v, None)
    assert lse is None and seen == [sdpa_backend._flags("FLASH_ATTENTION").wanted]
    assert _flag_state() == before
    _, want = _reference(q, k, v, mask=mask)
    assert _rel(out, want) < TOL["float32"]
    qt = q.transpose(-1, -2).contiguous().transpose(-1, -2)  # the general path (strides)
    assert _rel(fn(qt, k, v, None)[0], want) < TOL["float32"]
    with pytest.raises(RuntimeError):
        fn(q, k[..., :8], v, None)  # head dims differ: torch raises inside the pin
    assert _flag_state() == before


def test_flags_around_without_the_five_flag_layout():
    """The generic pin (a torch with other than five SDPA flags) pins during the call, restores after."""
    flags = sdpa_backend._Flags("FLASH_ATTENTION")
    flags.getters, flags.setters, flags.wanted = flags.getters[:4], flags.setters[:4], flags.wanted[:4]
    before = _flag_state()
    seen = []

    def fn(q, k, v):
        seen.append(_flag_state()[:4])
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        flags.around(fn)(None, None, None)
    assert seen == [flags.wanted] and _flag_state() == before


@pytest.mark.gpu
@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("name", ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn"])
def test_sdpa_cuda_bound_calls(name, gqa):
    """On a GPU: each SDPA kernel's bound call (the vendor fast path) on the issue's small shapes
    gives the reference's result, keeps SDPA's flags as it found them, and takes transposed views."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(14)
    for b, h, lq, lk in [(1, 8, 1, 512), (1, 8, 128, 128), (8, 12, 512, 512)]:
        hk = h // 4 if gqa else h
        q = torch.randn(b, h, lq, 64, device="cuda", dtype=torch.float16, generator=g)
        k, v = (torch.randn(b, hk, lk, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
        exp = attnhub.explain(q, k, v, mask="causal", backend=name)
        if exp.chosen is None:  # declined: said why, and refused when named
            reasons = next(x.reasons for x in exp.verdicts if x.name == name)
            assert reasons and all(r.strip() for r in reasons)
            continue
        plan = _bound(q, k, v, backend=name)
        assert plan.call is not plan.execute
        before = _flag_state()
        _, want = _reference(q, k, v, mask="causal")
        for x in (q, q.transpose(-1, -2).contiguous().transpose(-1, -2)):
            got = attnhub.attention(x, k, v, mask="causal", backend=name)
            assert _rel(got, want) < TOL["float16"], (name, b, h, lq, lk)
            assert _flag_state() == before


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, op",
    [
        ("sdpa-flash", "_scaled_dot_product_flash_attention"),
        ("sdpa-efficient", "_scaled_dot_product_efficient_attention"),
        ("sdpa-cudnn", "_scaled_dot_product_cudnn_attention"),
    ],
)
def test_sdpa_cuda_direct_op(monkeypatch, name, op):
    """On a GPU: for contiguous inputs the bound call runs the kernel's own op (each call
    counted), with the reference's output and float16 gradients; transposed views take the pinned
    SDPA call instead (the op is not called)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    calls = []
    real = getattr(torch, op)

    def spy(*args, **kw):
        calls.append(kw.get("scale"))
        return real(*args, **kw)

    monkeypatch.setattr(torch, op, spy)  # read when a plan is bound: fresh plans below
    CACHE.clear()
    g = torch.Generator(device="cuda").manual_seed(21)
    for grad, mask in [(False, "causal"), (False, None), (True, "causal")]:
        q, k, v = (
            torch.randn(2, 4, 200, 64, device="cuda", dtype=torch.float16, generator=g).requires_grad_(grad)
            for _ in range(3)
        )
        if attnhub.explain(q, k, v, mask=mask, backend=name).chosen is None:
            continue  # declined (this torch or GPU); test_sdpa_cuda_bound_calls checks the reasons
        ref, want = _reference(q, k, v, mask=mask)
        before = len(calls)
        for _ in range(2):  # the plan's first call (checked) and a later one (checked once)
            got = attnhub.attention(q, k, v, mask=mask, backend=name)
            assert got.dtype == torch.float16 and torch.isfinite(got).all()
            assert _rel(got, want) < TOL["float16"], (name, mask, grad)
        assert len(calls) == before + 2 and calls[-1] == pytest.approx(64**-0.5)
        if grad:
            dout = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
            want_g = torch.autograd.grad(want, ref, dout)
            got_g = torch.autograd.grad(got, (q, k, v), dout.to(device="cuda", dtype=torch.float16))
            for a, b in zip(got_g, want_g, strict=True):
                assert _rel(a, b) < GRAD_TOL["float16"], (name, _rel(a, b))
        qt = q.detach().transpose(-1, -2).contiguous().transpose(-1, -2)
        got = attnhub.attention(qt, k.detach(), v.detach(), mask=mask, backend=name)
        assert _rel(got, want) < TOL["float16"] and len(calls) == before + 2


def test_a_fixed_result_bound_call_is_checked_on_its_first_call_only(monkeypatch):
    """A bound call marked fixed_result (torch's own ops) is checked on the plan's first call,
    and a wrong first result is still refused; later calls skip the check."""
    q, k, v = _inputs((1, 2, 11, 16), seed=17)
    plan = _bound(q, k, v)
    assert plan.call.__name__ == "first"
    _, want = _reference(q, k, v, mask="causal")
    assert _rel(attnhub.attention(q, k, v, mask="causal", backend="sdpa-cpu"), want) < TOL["float32"]
    assert plan.call.__name__ == "unchecked" and plan.call.plan is plan
    assert _rel(attnhub.attention(q, k, v, mask="causal", backend="sdpa-cpu"), want) < TOL["float32"]

    cpu = sdpa_backend.SdpaCpu
    real_bind = cpu.bind

    def wrong_bind(self, req):
        fn = real_bind(self, req)

        def bad(q, k, v, mask):
            return fn(q, k, v, mask)[0][..., :3], None

        bad.fixed_result = True
        return bad

    monkeypatch.setattr(cpu, "bind", wrong_bind)
    q2, k2, v2 = _inputs((1, 2, 13, 16), seed=18)
    with pytest.raises(BackendError, match="wrong result"):
        attnhub.attention(q2, k2, v2, mask="causal", backend="sdpa-cpu")


def test_a_scale_array_is_read_on_every_call():
    """A one-element scale array may change in place between calls: never a stale cached value."""
    q, k, v = _inputs((1, 2, 8, 16), seed=15)
    s = torch.tensor(0.5)
    first = attnhub.attention(q, k, v, mask="causal", scale=s)
    s.fill_(2.0)
    _, want = _reference(q, k, v, mask="causal", scale=2.0)
    again = attnhub.attention(q, k, v, mask="causal", scale=s)
    assert _rel(again, want) < TOL["float32"] and not torch.equal(first, again)
    for scale in (np.float32(2.0), np.float64(2.0), 2):  # numbers: cached or not, the same result
        assert _rel(attnhub.attention(q, k, v, mask="causal", scale=scale), want) < TOL["float32"]
