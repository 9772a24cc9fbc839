"""The cuda backend against the float64 reference on an NVIDIA GPU (SPEC §6 tolerances).

Run on the device machine: ``python -m pytest -q -m gpu tests/test_cuda_gpu.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnhub
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
def _float32_on_f16x3(monkeypatch):
    """float32 tests run the 3xFP16 kernel at every size (by default small calls take 3xTF32, see
    choice.F16X3_MIN_WORK); tests that name a kernel set ATTNHUB_CUDA_F32 themselves."""
    monkeypatch.setenv("ATTNHUB_CUDA_F32", "f16x3")


def _err(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    g, r = got.detach().double().cpu().numpy(), ref.detach().double().cpu().numpy()
    assert not np.isnan(g).any(), "NaN in the output"
    e = g - r
    nr = max(np.linalg.norm(r), 1e-300)
    mr = max(np.abs(r).max(initial=0.0), 1e-300)
    return float(np.linalg.norm(e) / nr), float(np.abs(e).max(initial=0.0) / mr)


def _close(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    rel, mx = _err(got, ref)
    assert rel < tol and mx < tol, f"{name}: rel {rel:.3g} max {mx:.3g} tol {tol:.1g}"


def _inputs(rng, dtype, b, hq, hkv, sq, sk, dqk, dv, qscale=1.0):
    def make(shape, s=1.0):
        x = torch.from_numpy(rng.standard_normal(shape) * s).to(TDT[dtype])
        return x

    q = make((b, hq, *sq, dqk), qscale)
    k = make((b, hkv, *sk, dqk))
    v = make((b, hkv, *sk, dv))
    return q, k, v


def _check(
    rng, dtype, sq, sk, rule, sync, dqk=64, dv=64, hq=4, hkv=2, b=2, qscale=1.0, grad=False, scale=None
):
    q, k, v = _inputs(rng, dtype, b, hq, hkv, sq, sk, dqk, dv, qscale)
    cpu = [x.clone().requires_grad_(grad) for x in (q, k, v)]
    kw = {"mask": rule, "sync": sync, "scale": scale, "return_lse": True}
    ref_out, ref_lse = attnhub.attention(*cpu, backend="reference", **kw)
    gpu = [x.cuda().requires_grad_(grad) for x in (q, k, v)]
    out, lse = attnhub.attention(*gpu, backend="cuda", **kw)
    torch.cuda.synchronize()
    _close("out", out, ref_out, FWD_TOL[dtype])
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite), "lse -inf pattern differs"
    assert bool((lse.cpu()[~finite] == -np.inf).all())
    if finite.any():
        _close("lse", lse.cpu()[finite], ref_lse[finite], FWD_TOL[dtype])
    if grad:
        dout = torch.from_numpy(rng.standard_normal(tuple(out.shape))).to(TDT[dtype])
        ref_g = torch.autograd.grad(ref_out, cpu, dout)
        got_g = torch.autograd.grad(out, gpu, dout.cuda())
        for name, a, r in zip("qkv", got_g, ref_g):
            _close(f"d{name}", a, r, GRAD_TOL[dtype])


RULES = [
    Full(),
    Causal(),
    Local(5),
    Local(3, log2_stride=1, causal=True),
]
SYNCS = ["none_front", "scale_front", "scale_end", "none_end"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("lens", [(77, 200), (200, 77), (130, 130)], ids=str)
def test_forward_1d(rng, dtype, rule, sync, lens):
    _check(rng, dtype, (lens[0],), (lens[1],), rule, sync)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize(
    "rule",
    [Full(), Causal(), Local((2, 3)), Local(2, log2_stride=1, causal=True)],
    ids=lambda r: r.describe(),
)
@pytest.mark.parametrize("sync", SYNCS)
def test_forward_2d(rng, dtype, rule, sync):
    _check(rng, dtype, (6, 10), (12, 20), rule, sync)
    _check(rng, dtype, (12, 20), (5, 9), rule, sync)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("dims", [(64, 64), (128, 128), (64, 128), (128, 64), (40, 72)], ids=str)
@pytest.mark.parametrize("rule", [Full(), Causal()], ids=lambda r: r.describe())
def test_forward_dims_large_logits(rng, dtype, dims, rule):
    _check(rng, dtype, (300,), (333,), rule, "none_end", dqk=dims[0], dv=dims[1], qscale=8.0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dims", [(1, 1), (33, 17), (128, 128)], ids=str)
def test_forward_simt_dims(rng, dtype, dims):
    _check(rng, dtype, (70,), (45,), Causal(), "none_front", dqk=dims[0], dv=dims[1], qscale=8.0)


F32_TILES = [
    "tf32:4,64,2", "tf32:8,64,1", "tf32:4,32,1", "tf32:8,32,2", "tf32:4,64,1/2",
    "f16x3:4,64,1", "f16x3:4,32,1", "f16x3:8,64,1", "f16x3:4,32,2", "f16x3:8,32,1",
]  # fmt: skip


def _f32_env(monkeypatch, config: str) -> None:
    """ATTNHUB_CUDA_F32 and the tile variables of "kernel:warps,bn,rb[/pvc]"."""
    kern, _, spec = config.partition(":")
    tile, _, pvc = spec.partition("/")
    monkeypatch.setenv("ATTNHUB_CUDA_F32", kern)
    monkeypatch.setenv("ATTNHUB_CUDA_TF32" if kern == "tf32" else "ATTNHUB_CUDA_F16X3", tile)
    if pvc:
        monkeypatch.setenv("ATTNHUB_CUDA_TF32_PVC", pvc)


@pytest.mark.parametrize("config", F32_TILES)
@pytest.mark.parametrize("dims", [(64, 64), (128, 128)], ids=str)
def test_forward_float32_tensor_core_tiles(rng, monkeypatch, config, dims):
    # 3xTF32 and 3xFP16 float32 forwards at float32 tolerance (plain TF32 misses it ~10x) for every
    # tile shape, with long rows (many key tiles), large logits, GQA and lengths off the tiles.
    # "tile/pvc": also P V summed in several chunks per key tile (ATTNHUB_CUDA_TF32_PVC).
    _f32_env(monkeypatch, config)
    _check(rng, "float32", (700,), (1500,), Full(), "none_end", dqk=dims[0], dv=dims[1], qscale=8.0)
    _check(rng, "float32", (333,), (333,), Causal(), "none_front", dqk=dims[0], dv=dims[1], qscale=8.0)


def test_forward_float32_default_choice(rng, monkeypatch):
    # Without ATTNHUB_CUDA_F32: a small call on 3xTF32, a larger one on 3xFP16 (choice.f32_kernel).
    monkeypatch.delenv("ATTNHUB_CUDA_F32")
    _check(rng, "float32", (100,), (100,), Causal(), "none_front", hq=2, hkv=1, b=1)
    _check(
        rng, "float32", (1024,), (1024,), Full(), "none_front", dqk=128, dv=128, hq=8, hkv=8, b=1, qscale=8.0
    )


@pytest.mark.parametrize("kern", ["f16x3", "tf32"])
@pytest.mark.parametrize("dims", [(64, 64), (128, 128)], ids=str)
def test_forward_float32_long_flat_rows(rng, monkeypatch, kern, dims):
    # Flat softmax over 4096 keys: the output is a small average of many terms, so float32 errors
    # of the P V sums show at full size. Summing whole rows in the tensor core's (truncating) float32
    # accumulator gave 2.9e-5 on such rows (tools/dev/cuda_f32.py, L = 4096), over the 2e-5
    # tolerance; chunked sums gave ~1e-6.
    monkeypatch.setenv("ATTNHUB_CUDA_F32", kern)
    _check(rng, "float32", (256,), (4096,), Full(), "none_front", dqk=dims[0], dv=dims[1], hq=2, hkv=1, b=1)


@pytest.mark.parametrize("scale", [-0.4, 0.0, 0.3])
@pytest.mark.parametrize(
    "dtype,mode",
    [
        ("float32", "f16x3"),
        ("float32", "tf32"),
        ("bfloat16", "wgmma"),
        ("bfloat16", "mma"),
        ("float16", "mma"),
    ],
)
def test_tensor_core_kernels_with_custom_scales(rng, monkeypatch, dtype, mode, scale):
    # A scale <= 0 (SPEC allows any finite one) reverses or flattens the logits' order: the kernels
    # built for it scale before the row max (SCALE_POS = 0). Forward, and for the half types backward.
    if dtype == "float32":
        monkeypatch.setenv("ATTNHUB_CUDA_F32", mode)
    else:
        monkeypatch.setenv("ATTNHUB_CUDA_FWD", mode)
    grad = dtype != "float32"
    _check(rng, dtype, (150,), (200,), Causal(), "none_end", qscale=3.0, scale=scale, grad=grad)
    _check(rng, dtype, (70,), (333,), Full(), "none_front", dqk=128, dv=128, scale=scale, grad=grad)


@pytest.mark.parametrize("dims", [(64, 64), (128, 128), (64, 128)], ids=str)
@pytest.mark.parametrize("rule", [Full(), Causal()], ids=lambda r: r.describe())
def test_forward_float32_f16x3_magnitudes(rng, dims, rule):
    # 3xFP16 scales each (batch, head) of q, k, v by its own power of two into float16's range: heads
    # of very different magnitudes (1e-30 .. 1e30; float16 overflows at 65504 and underflows below
    # 6e-8), each at float32 tolerance on its own. Logits stay moderate (q and k scales multiply to
    # 1e-19 .. 8): larger ones put every float32 kernel outside the tolerance.
    b, hq, hkv, n = 2, 4, 2, 300
    q, k, v = _inputs(rng, "float32", b, hq, hkv, (n,), (n,), dims[0], dims[1])
    q = q * torch.tensor([1e-3, 5e2, 3e-9, 4e-4, 1e-12, 7e7, 5.0, 1e-5]).reshape(b, hq, 1, 1)
    k = k * torch.tensor([1e-2, 2e4, 1e-7, 1.0]).reshape(b, hkv, 1, 1)
    v = v * torch.tensor([1e30, 1e-30, 1e5, 1e-6]).reshape(b, hkv, 1, 1)
    ref = attnhub.attention(q, k, v, mask=rule, backend="reference")
    out = attnhub.attention(q.cuda(), k.cuda(), v.cuda(), mask=rule, backend="cuda").cpu()
    for bi in range(b):
        for h in range(hq):
            _close(f"out[{bi}, {h}]", out[bi, h], ref[bi, h], FWD_TOL["float32"])


def test_forward_float32_f16x3_range_within_a_head(rng):
    # Rows of v 1e6 apart inside one head: with each query attending only its own key (Local(1)),
    # every output row is its key's v row, and each must be within float32 tolerance on its own
    # (docs/backends/cuda.md: per element down to ~1e-7 of the head's largest |x|).
    q, k, v = _inputs(rng, "float32", 1, 2, 2, (256,), (256,), 64, 64)
    v = v * torch.where(torch.arange(256) % 2 == 0, 1.0, 1e-6).reshape(1, 1, 256, 1)
    out = attnhub.attention(q.cuda(), k.cuda(), v.cuda(), mask=Local(1), backend="cuda").cpu()
    ref = attnhub.attention(q, k, v, mask=Local(1), backend="reference")
    for h in range(2):
        for i in range(256):
            _close(f"out[0, {h}, {i}]", out[0, h, i], ref[0, h, i], FWD_TOL["float32"])


def test_forward_float32_f16x3_non_finite(rng):
    # An infinite or NaN value reaches every row that attends it (as inf or NaN: inf times a zero
    # low part is NaN); the rest of its head keeps its scale (the maximum is over finite elements).
    q, k, v = _inputs(rng, "float32", 1, 2, 2, (64,), (64,), 64, 64)
    v[0, 0, 10, 3] = float("inf")
    v[0, 1, 20, 5] = float("nan")
    out = attnhub.attention(q.cuda(), k.cuda(), v.cuda(), backend="cuda").cpu()
    ref = attnhub.attention(q, k, v, backend="reference")
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), fin) and not fin.all()
    rel, mx = _err(out[fin], ref[fin])
    assert rel < FWD_TOL["float32"] and mx < FWD_TOL["float32"], (rel, mx)


@pytest.mark.parametrize(
    "rule", [Full(), Causal(), Local(3, log2_stride=1, causal=True)], ids=lambda r: r.describe()
)
def test_forward_float32_simt_forced(rng, monkeypatch, rule):
    # ATTNHUB_CUDA_F32=simt keeps the CUDA-core float32 kernel reachable at head dims 64/128.
    monkeypatch.setenv("ATTNHUB_CUDA_F32", "simt")
    _check(rng, "float32", (200,), (77,), rule, "scale_end", qscale=8.0)
    _check(rng, "float32", (6, 10), (12, 20), rule, "none_front", dqk=128, dv=128)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_mqa_and_noncontiguous(rng, dtype):
    q, k, v = _inputs(rng, dtype, 2, 6, 1, (150,), (150,), 64, 64)
    ref = attnhub.attention(q, k, v, mask=Causal(), backend="reference")
    # bshd layout: the canonical views are strided, not contiguous.
    qg, kg, vg = (x.cuda().transpose(1, 2).contiguous() for x in (q, k, v))
    out = attnhub.attention(qg, kg, vg, mask=Causal(), layout="bshd", backend="cuda")
    _close("out", out.transpose(1, 2), ref, FWD_TOL[dtype])
    # Slices of wider rows: 16-byte aligned (read in place) and offset by 3 elements (copied first).
    for off in (0, 3):
        wide = [torch.zeros(*x.shape[:-1], 80, dtype=x.dtype, device="cuda") for x in (q, k, v)]
        views = []
        for w, x in zip(wide, (q, k, v)):
            w[..., off : off + 64] = x.cuda()
            views.append(w[..., off : off + 64])
        out = attnhub.attention(*views, mask=Causal(), backend="cuda")
        _close(f"out (offset {off})", out, ref, FWD_TOL[dtype])


def test_fully_masked_rows(rng):
    # none_end with Lk < Lq: the first queries sit before every key under the causal rule.
    _check(rng, "bfloat16", (100,), (30,), Causal(), "none_end", grad=True)
    _check(rng, "float32", (100,), (30,), Causal(), "none_end", grad=True)
    _check(rng, "float64", (100,), (30,), Local(40), "none_end", grad=True)
    # Where every row attends at most one key, dq is exactly 0 (dS = P (dP - delta) with P one-hot
    # and O = V): the backward must return zeros, not round-off.
    q, k, v = (x.cuda().requires_grad_(True) for x in _inputs(rng, "float32", 1, 2, 2, (40,), (90,), 32, 32))
    out = attnhub.attention(q, k, v, mask=Local(1, log2_stride=3), sync="scale_end", backend="cuda")
    (dq,) = torch.autograd.grad(out, (q,), torch.randn_like(out))
    assert bool((dq == 0).all())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
@pytest.mark.parametrize(
    "rule", [Full(), Causal(), Local(4, log2_stride=1, causal=True)], ids=lambda r: r.describe()
)
def test_backward(rng, dtype, rule):
    _check(rng, dtype, (90,), (70,), rule, "none_end", dqk=64, dv=32, grad=True)
    _check(rng, dtype, (5, 7), (6, 8), rule, "scale_front", dqk=16, dv=24, hq=2, hkv=1, grad=True)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_inputs_unchanged_and_stream(rng, dtype):
    # float32: 3xFP16's preparation (zeroed maxima, absmax, split) runs on the caller's stream too.
    q, k, v = (x.cuda() for x in _inputs(rng, dtype, 1, 2, 2, (257,), (257,), 128, 128))
    before = [x.clone() for x in (q, k, v)]
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = attnhub.attention(q, k, v, mask=Causal(), backend="cuda")
    s.synchronize()
    for a, b in zip((q, k, v), before):
        assert torch.equal(a, b)
    ref = attnhub.attention(*(x.cpu() for x in (q, k, v)), mask=Causal(), backend="reference")
    _close("out", out, ref, FWD_TOL[dtype])


# Backward kernels: ATTNHUB_CUDA_BWD, then (wgmma) warpgroups and grid order.
BWD_MODES = ["wgmma", "wgmma/wg1", "wgmma/heads", "fused", "split"]


def _set_bwd_mode(monkeypatch, mode: str) -> None:
    kind, _, extra = mode.partition("/")
    monkeypatch.setenv("ATTNHUB_CUDA_BWD", kind)
    if extra == "wg1":
        monkeypatch.setenv("ATTNHUB_CUDA_BWD_WG", "1")
    elif extra:
        monkeypatch.setenv("ATTNHUB_CUDA_BWD_ORDER", extra)


# Half-type forward kernels: ATTNHUB_CUDA_FWD, the wgmma tile (warpgroups, keys per tile) and, after
# "+p", the pipelined loop forced off (0) or on (1).
FWD_MODES = [
    "mma",
    "wgmma/2,64",
    "wgmma/2,128",
    "wgmma/1,64",
    "wgmma/3,128",
    "wgmma/2,64+p0",
    "wgmma/2,128+p1",
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("dims", [(64, 64), (128, 128), (64, 128), (128, 64)], ids=str)
@pytest.mark.parametrize(
    "rule", [Full(), Causal(), Local(9, log2_stride=1, causal=True)], ids=lambda r: r.describe()
)
@pytest.mark.parametrize("mode", FWD_MODES)
def test_forward_tensor_core_kernels(rng, monkeypatch, dtype, dims, rule, mode):
    # Both forwards on Hopper (wgmma by default, mma.sync forced) and the wgmma tiles: lengths off the
    # tiles, GQA, fully masked rows (none_end, Lk < Lq), 2-d with scaled positions, large logits.
    kind, _, tile = mode.partition("/")
    tile, _, pipe = tile.partition("+p")
    monkeypatch.setenv("ATTNHUB_CUDA_FWD", kind)
    if tile:
        monkeypatch.setenv("ATTNHUB_CUDA_WGMMA", tile)
    if pipe:  # the pipelined loop on (1) or off (0) whatever the head dims' default
        monkeypatch.setenv("ATTNHUB_CUDA_WGMMA_PIPE", pipe)
    _check(rng, dtype, (150,), (97,), rule, "none_end", dqk=dims[0], dv=dims[1])
    _check(rng, dtype, (9, 11), (6, 13), rule, "scale_end", dqk=dims[0], dv=dims[1], hq=2, hkv=1)
    _check(rng, dtype, (300,), (333,), rule, "none_front", dqk=dims[0], dv=dims[1], qscale=8.0)
    _check(rng, dtype, (1,), (333,), rule, "none_end", dqk=dims[0], dv=dims[1])  # decoding: one query


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("dims", [(64, 64), (128, 128), (64, 128), (128, 64)], ids=str)
@pytest.mark.parametrize(
    "rule", [Full(), Causal(), Local(9, log2_stride=1, causal=True)], ids=lambda r: r.describe()
)
@pytest.mark.parametrize("mode", BWD_MODES)
def test_backward_tensor_cores(rng, monkeypatch, dtype, dims, rule, mode):
    # Lengths off the tile sizes, GQA, and (none_end with Lk < Lq) fully masked rows under causal rules;
    # every backward kernel (wgmma on Hopper, with one or two warpgroups and either grid order; fused:
    # dQ through float32 atomics; split: dK/dV and dQ kernels).
    _set_bwd_mode(monkeypatch, mode)
    _check(rng, dtype, (150,), (97,), rule, "none_end", dqk=dims[0], dv=dims[1], grad=True)
    _check(rng, dtype, (9, 11), (6, 13), rule, "scale_end", dqk=dims[0], dv=dims[1], hq=2, hkv=1, grad=True)
    _check(rng, dtype, (1,), (97,), rule, "none_end", dqk=dims[0], dv=dims[1], grad=True)


@pytest.mark.parametrize("mode", BWD_MODES)
def test_backward_tensor_cores_large_logits(rng, monkeypatch, mode):
    _set_bwd_mode(monkeypatch, mode)
    _check(rng, "bfloat16", (200,), (200,), Causal(), "none_front", dqk=128, dv=128, qscale=8.0, grad=True)


@pytest.mark.parametrize("mode", BWD_MODES)
@pytest.mark.parametrize("rule", [Full(), Causal()], ids=lambda r: r.describe())
def test_backward_tensor_cores_many_key_tiles(rng, monkeypatch, mode, rule):
    # 6-12 key tiles add into each dQ row (fused, wgmma: concurrent float32 reductions), query heads 4
    # per kv head.
    _set_bwd_mode(monkeypatch, mode)
    _check(rng, "bfloat16", (700,), (740,), rule, "none_end", dqk=128, dv=64, hq=8, hkv=2, b=1, grad=True)
