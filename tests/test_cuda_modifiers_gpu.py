"""The cuda backend's SPEC §9 and §11 arguments on an NVIDIA GPU: softcap, bias (with dbias) and
q_offset / k_offset, forward and backward, against a float64 torch formula (SPEC §6 tolerances).

The backend is called the way the core calls it (forward_for_grad, then backward with operands),
every output allocated by the kernels' launchers poisoned with NaN first.
Run on the device machine: ``python -m pytest -q -m gpu tests/test_cuda_modifiers_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnhub.operands import Operands
from attnhub.positions import dense_rule_mask
from attnhub.request import Request
from attnhub.rules import Causal, Full, Local

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

FWD_TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
GRAD_TOL = {"float64": 1e-9, "float32": 1e-4, "float16": 8e-3, "bfloat16": 4e-2}
TDT = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    """torch.empty / empty_like return NaN-filled float tensors: an element a kernel does not write
    shows up as NaN."""
    empty, empty_like = torch.empty, torch.empty_like

    def fill(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: fill(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: fill(empty_like(*a, **kw)))


def _close(name: str, got, ref, tol: float) -> None:
    g, r = got.detach().double().cpu().numpy(), ref.detach().double().cpu().numpy()
    assert g.shape == r.shape, (name, g.shape, r.shape)
    assert not np.isnan(g).any(), f"{name}: NaN (an element not written?)"
    e = g - r
    rel = np.linalg.norm(e) / max(np.linalg.norm(r), 1e-300)
    mx = np.abs(e).max(initial=0.0) / max(np.abs(r).max(initial=0.0), 1e-300)
    assert rel < tol and mx < tol, f"{name}: rel {rel:.3g} max {mx:.3g} tol {tol:.1g}"


def _rule_mask(rule, seq_q, seq_k, sync, q_offset=0, k_offset=0) -> np.ndarray:
    if not (q_offset or k_offset):
        return dense_rule_mask(rule, seq_q, seq_k, sync)
    p = np.arange(seq_q[0])[:, None] + q_offset
    r = np.arange(seq_k[0])[None, :] + k_offset
    if isinstance(rule, Full):
        return np.ones((p.size, r.size), bool)
    if isinstance(rule, Causal):
        return p >= r
    d, s = np.abs(p - r), 1 << rule.log2_stride
    return (d % s == 0) & (d // s < rule.window) & ((p >= r) if rule.causal else True)


def _reference(q, k, v, allowed, scale, softcap, bias):
    """float64 (out, lse) of SPEC §4 / §9 with torch autograd (inputs already float64)."""
    group = q.shape[1] // k.shape[1]
    b, hq = q.shape[:2]
    qf, kf, vf = q.flatten(2, -2), k.flatten(2, -2), v.flatten(2, -2)
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    t = scale * qf @ kf.transpose(-1, -2)
    if softcap is not None:
        t = softcap * torch.tanh(t / softcap)
    if bias is not None:
        t = t + bias
    t = t.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(t, -1)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(t - safe[..., None])
    return p @ vf, lse


def _run(
    rng, dtype, seq_q, seq_k, rule, sync="none_front", d=(64, 64), hq=4, hkv=2, b=2, softcap=None,
    bias_shape=None, bias_grad=True, qscale=1.0, scale=None, q_offset=0, k_offset=0, bias_fn=None,
):  # fmt: skip
    """Forward and backward through CudaBackend against _reference; returns the reference lse."""
    from attnhub_backends.cuda.backend import CudaBackend

    dqk, dv = d
    dt = TDT[dtype]

    def make(shape, s=1.0):
        return torch.from_numpy(rng.standard_normal(shape) * s).to(dt).cuda()

    q, k, v = make((b, hq, *seq_q, dqk), qscale), make((b, hkv, *seq_k, dqk)), make((b, hkv, *seq_k, dv))
    bias = None
    if bias_shape is not None:
        bias = make(bias_shape, 2.0)
        if bias_fn is not None:
            bias = bias_fn(bias)
    scale = dqk**-0.5 if scale is None else scale
    req = Request(
        "torch", "cuda:0", dtype, "bhsd", b, hq, hkv, tuple(seq_q), tuple(seq_k), dqk, dv, rule, sync,
        scale, True, True, bias=bias_shape, bias_grad=bias_grad and bias is not None, softcap=softcap,
        q_offset=q_offset, k_offset=k_offset,
    )  # fmt: skip
    be = CudaBackend()
    if bias is not None:  # not declared yet (attnhub_backends/cuda/backend.py): declined with its reason
        assert any("bias" in r for r in be.check(req)), be.check(req)
        return None
    assert be.check(req) == [], be.check(req)
    ops = Operands(bias=bias) if bias is not None else None
    kw = {"operands": ops} if req.modified else {}
    out, lse, saved = be.forward_for_grad(q, k, v, req, **kw)
    dout = make(out.shape)
    grads = be.backward(q, k, v, saved, lse, dout, req, **kw)
    torch.cuda.synchronize()

    allowed = torch.from_numpy(_rule_mask(rule, tuple(seq_q), tuple(seq_k), sync, q_offset, k_offset)).cuda()
    leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
    bias64 = bias.double().requires_grad_(True) if bias is not None else None
    ref_out, ref_lse = _reference(*leaves, allowed, scale, softcap, bias64)
    ref_out = ref_out.reshape(out.shape)
    inputs = leaves + ([bias64] if req.bias_grad else [])
    ref_g = torch.autograd.grad(ref_out, inputs, dout.double())

    _close("out", out, ref_out, FWD_TOL[dtype])
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), "lse -inf pattern differs"
    assert bool((lse[~finite] == float("-inf")).all())
    if finite.any():
        _close("lse", lse[finite], ref_lse[finite], FWD_TOL[dtype])
    if req.bias is not None:
        assert len(grads) == 5 and grads[4] is None
        assert (grads[3] is None) == (not req.bias_grad)
    else:
        assert len(grads) == 3
    names = ["dq", "dk", "dv", "dbias"][: len(ref_g)]
    for name, got, ref in zip(names, grads, ref_g):
        assert got.dtype == (dt if name != "dbias" else bias.dtype), name
        _close(name, got.reshape(ref.shape), ref, GRAD_TOL[dtype])
    return ref_lse


RULES = [
    (Full(), "none_front"),
    (Causal(), "none_end"),
    (Local(17), "none_front"),
    (Local(9, 1, True), "scale_end"),
]
MODS = {
    "softcap": {"softcap": 5.0},
    "bias": {"bias_shape": (2, 4, 200, 333)},
    "bias-bcast+softcap": {"softcap": 2.5, "bias_shape": (1, 4, 1, 333)},
    "bias-rows+softcap": {"softcap": 30.0, "bias_shape": (2, 1, 200, 1)},
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize("d", [(64, 64), (128, 128)], ids=str)
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r[0].describe()}-{r[1]}")
@pytest.mark.parametrize("mods", list(MODS), ids=str)
def test_modifiers(rng, dtype, d, rule, mods):
    """GQA, lengths off the tiles, every kernel that takes modifiers (wgmma for half types on sm_90,
    SIMT for float32 / float64), forward and backward with dbias."""
    _run(rng, dtype, (200,), (333,), rule[0], rule[1], d=d, **MODS[mods])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("d", [(64, 128), (128, 64), (40, 72)], ids=str)
def test_modifiers_head_dims_large_logits(rng, dtype, d):
    """Large logits (q scaled by 8: peaked rows) and unequal / odd head dims (SIMT for (40, 72))."""
    _run(
        rng,
        dtype,
        (150,),
        (270,),
        Causal(),
        "none_end",
        d=d,
        qscale=8.0,
        softcap=20.0,
        bias_shape=(1, 1, 150, 270),
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_bias_minus_inf_excludes_pairs_and_rows(rng, dtype):
    """A bias of -inf excludes its pairs; a row it excludes entirely gives out 0, lse -inf and zero
    gradients (never NaN), whatever the rule."""

    def holes(bias):
        bias = bias.clone()
        bias[:, :, 3] = float("-inf")  # row 3 fully excluded
        bias[:, :, 10:20, ::3] = float("-inf")
        return bias

    ref_lse = _run(rng, dtype, (130,), (140,), Full(), d=(64, 64), bias_shape=(2, 4, 130, 140), bias_fn=holes)
    assert ref_lse is None  # declined: the bias is not declared by the cuda backend yet


@pytest.mark.parametrize("env", ["ATTNHUB_CUDA_FWD=mma", "ATTNHUB_CUDA_BWD=simt", "ATTNHUB_CUDA_BWD=split"])
def test_half_types_on_the_simt_kernels(rng, monkeypatch, env):
    """Where the wgmma kernels do not run a half-type request with modifiers, the SIMT ones do."""
    name, value = env.split("=")
    monkeypatch.setenv(name, value)
    _run(
        rng,
        "bfloat16",
        (100,),
        (190,),
        Local(40, causal=True),
        "none_end",
        d=(128, 128),
        softcap=8.0,
        bias_shape=(2, 4, 100, 190),
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_modifiers_2d_and_negative_scale(rng, dtype):
    """2-d sequences (the bias over flattened positions) and a negative scale."""
    _run(rng, dtype, (6, 10), (12, 20), Causal(), "scale_end", softcap=4.0, bias_shape=(1, 4, 60, 240))
    _run(rng, dtype, (9, 7), (5, 11), Local((2, 3)), "none_end", bias_shape=(2, 1, 63, 55), scale=-0.2)


def test_bias_without_grad(rng):
    """A bias the caller does not differentiate: no dS buffer, dbias None."""
    _run(rng, "float16", (128,), (128,), Causal(), d=(128, 128), bias_shape=(2, 4, 128, 128), bias_grad=False)


OFFSET_KERNELS = [
    ("bfloat16", None), ("float16", "ATTNHUB_CUDA_FWD=mma"), ("bfloat16", "ATTNHUB_CUDA_BWD=fused"),
    ("float16", "ATTNHUB_CUDA_BWD=split"), ("bfloat16", "ATTNHUB_CUDA_BWD=simt"), ("float32", "ATTNHUB_CUDA_F32=tf32"),
    ("float32", "ATTNHUB_CUDA_F32=f16x3"), ("float32", "ATTNHUB_CUDA_F32=simt"), ("float64", None),
]  # fmt: skip


@pytest.mark.parametrize("case", OFFSET_KERNELS, ids=lambda c: f"{c[0]}-{c[1]}")
@pytest.mark.parametrize("rule", [Causal(), Local(33, causal=True), Local(20)], ids=lambda r: r.describe())
@pytest.mark.parametrize("offsets", [(200, 0), (0, 70), (1000, 990)], ids=str)
def test_offsets(rng, monkeypatch, case, rule, offsets):
    """q_offset / k_offset (SPEC §11) on every kernel family: a chunk of queries at its global
    positions against its keys; rows the rule leaves empty give out 0, lse -inf."""
    dtype, env = case
    if env:
        name, value = env.split("=")
        monkeypatch.setenv(name, value)
    _run(rng, dtype, (128,), (333,), rule, d=(64, 64), q_offset=offsets[0], k_offset=offsets[1])


def test_offsets_with_modifiers(rng):
    _run(
        rng,
        "bfloat16",
        (128,),
        (256,),
        Causal(),
        d=(128, 128),
        q_offset=128,
        softcap=10.0,
        bias_shape=(1, 4, 128, 256),
    )
    _run(
        rng,
        "float32",
        (128,),
        (256,),
        Local(50, causal=True),
        q_offset=128,
        k_offset=3,
        bias_shape=(2, 4, 1, 256),
    )


# --- through the public API, against backend="reference" on CPU copies -----------------------------


def _api_case(rng, dtype, rule, seq=(150, 260), **kw):
    import attnhub

    dt = TDT[dtype]
    b, hq, hkv, d = 2, 4, 2, 64
    nq, nk = seq
    shapes = [(b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, d)]
    cpu = [torch.from_numpy(rng.standard_normal(s)).to(dt).requires_grad_(True) for s in shapes]
    gpu = [x.detach().cuda().requires_grad_(True) for x in cpu]
    extra_cpu, extra_gpu = {}, {}
    for name in ("bias", "mask_array"):
        if name in kw:
            t = torch.from_numpy(rng.standard_normal(kw.pop(name)) * 2).to(dt)
            key = "mask" if name == "mask_array" else name
            extra_cpu[key] = t.clone().requires_grad_(True)
            extra_gpu[key] = t.cuda().requires_grad_(True)
    mask = {} if "mask" in extra_cpu else {"mask": rule}
    ref_out, ref_lse = attnhub.attention(
        *cpu, backend="reference", return_lse=True, **mask, **extra_cpu, **kw
    )
    out, lse = attnhub.attention(*gpu, backend="cuda", return_lse=True, **mask, **extra_gpu, **kw)
    _close("out", out, ref_out, FWD_TOL[dtype])
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse).cpu(), finite)
    _close("lse", lse.cpu()[finite], ref_lse[finite], FWD_TOL[dtype])
    dout = torch.from_numpy(rng.standard_normal(tuple(out.shape))).to(dt)
    leaves_cpu = cpu + list(extra_cpu.values())
    leaves_gpu = gpu + list(extra_gpu.values())
    ref_g = torch.autograd.grad(ref_out, leaves_cpu, dout)
    got_g = torch.autograd.grad(out, leaves_gpu, dout.cuda())
    for name, got, ref in zip(["dq", "dk", "dv", "dbias"], got_g, ref_g):
        _close(name, got, ref, GRAD_TOL[dtype])


def _declines_bias(rng, dtype, rule, **kw) -> None:
    """The cuda backend does not declare "bias" (its MODS bias path gave NaN on rows a -inf bias
    empties: backend.py), so a bias or a float mask given to it by name is declined, not run."""
    import attnhub
    from attnhub.errors import BackendUnsupported

    dt = TDT[dtype]
    q = torch.from_numpy(rng.standard_normal((2, 4, 150, 64))).to(dt).cuda()
    k = torch.from_numpy(rng.standard_normal((2, 2, 260, 64))).to(dt).cuda()
    with pytest.raises(BackendUnsupported, match="does not take an additive bias"):
        attnhub.attention(q, k, k, backend="cuda", **({"mask": rule} if rule is not None else {}), **kw)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("rule", [Causal(), Local(17)], ids=lambda r: r.describe())
def test_api_softcap_bias(rng, dtype, rule):
    dt = TDT[dtype]
    _declines_bias(rng, dtype, rule, softcap=7.0, bias=torch.zeros(1, 4, 150, 260, dtype=dt, device="cuda"))
    _api_case(rng, dtype, rule, softcap=7.0)
    _api_case(rng, dtype, rule, softcap=3.0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_api_float_mask_and_offsets(rng, dtype):
    """A float mask= array (SDPA's additive attn_mask: a bias with the rule Full) is declined like a
    bias; q_offset and k_offset run."""
    _declines_bias(rng, dtype, None, mask=torch.zeros(1, 1, 150, 260, dtype=TDT[dtype], device="cuda"))
    _api_case(rng, dtype, Causal(), q_offset=110)
    _api_case(rng, dtype, Local(40, causal=True), q_offset=200, k_offset=30, softcap=9.0)
