"""NaN and Inf through the sdpa-* backends (issue 36, item 2).

SPEC §4: NaN or Inf in the inputs propagate to the affected outputs (never silently replaced),
while fully masked rows give exactly out = 0, lse = -inf. SPEC §10: padded query rows give out = 0,
lse = -inf and zero gradients, and padded keys are never attended, so what they hold (NaN
included) cannot matter. Each case runs with gradients, against the float64 reference on fresh
random inputs; for padding, the reference runs on the same inputs with the padded slots holding
finite random values (their contents must not matter). The CUDA kernels' tests are marked ``gpu``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import attnhub  # noqa: E402
from attnhub import BackendUnsupported, Local  # noqa: E402

pytestmark = pytest.mark.usefixtures("sdpa_registered")

NAN, INF = float("nan"), float("inf")
#: SPEC §6 (forward, gradient) bounds of the max error relative to the reference's largest value.
TOL = {"float64": (1e-10, 1e-9), "float32": (2e-5, 1e-4), "float16": (2e-3, 8e-3), "bfloat16": (1.6e-2, 4e-2)}
CUDA_SDPA = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn")


def _randn(*shape, seed: int, dtype: str = "float32", device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(getattr(torch, dtype)).to(device)


def _qkv(b=2, hq=4, hkv=4, lq=12, lk=12, d=16, dtype="float32", seed=0, device="cpu"):
    return [
        _randn(b, h, n, d, seed=seed + i, dtype=dtype, device=device)
        for i, (h, n) in enumerate(((hq, lq), (hkv, lk), (hkv, lk)))
    ]


def _run(fn, arrays, grad, seed=7, **kw):
    """(out, lse, grads of the arrays) of ``fn(*arrays, return_lse=True, **kw)``; grads are None
    without ``grad`` (then the call runs without autograd)."""
    leaves = [x.detach().clone().requires_grad_(grad) for x in arrays]
    out, lse = fn(*leaves, return_lse=True, **kw)
    if not grad:
        return out, lse, None
    dout = _randn(*out.shape, seed=seed, dtype="float64").to(out.dtype).to(out.device)
    return out, lse, torch.autograd.grad(out, leaves, dout)


def _reference(fn, arrays, grad, **kw):
    kw = {
        k: (x.double().cpu() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
        for k, x in kw.items()
    }
    return _run(fn, [x.double().cpu() for x in arrays], grad, backend="reference", **kw)


def _assert_close(got, want, tol, what):
    """NaN exactly where the reference has NaN; elsewhere within ``tol`` of the reference's largest
    finite value (infinities equal)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (
        f"{what}: NaN at {torch.isnan(got).nonzero().tolist()[:6]}, reference NaN at "
        f"{torch.isnan(want).nonzero().tolist()[:6]}"
    )
    finite = torch.isfinite(want)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(
        got[torch.isinf(want)], want[torch.isinf(want)]
    )
    if finite.any():
        top = want[finite].abs().max().item() or 1.0
        err = (got[finite] - want[finite]).abs().max().item() / top
        assert err < tol, f"{what}: max error {err:.3g} >= {tol}"


def _assert_grads_close(got, want, tol):
    """Gradients finite and close to the reference's wherever the reference's are finite."""
    for name, a, b in zip("qkv", got, want, strict=True):
        a, b = a.detach().double().cpu(), b.detach().double().cpu()
        finite = torch.isfinite(b)
        assert torch.isfinite(a[finite]).all(), f"d{name}: non-finite where the reference is finite"
        if finite.any():
            top = b[finite].abs().max().item() or 1.0
            err = (a[finite] - b[finite]).abs().max().item() / top
            assert err < tol, f"d{name}: max error {err:.3g} >= {tol}"


def _check(arrays, dtype, grad, fn=attnhub.attention, ref_arrays=None, **kw):
    """sdpa's out, lse and gradients against the reference's (run on ``ref_arrays`` when given)."""
    fwd, bwd = TOL[dtype]
    out, lse, grads = _run(fn, arrays, grad, **{"backend": "sdpa-cpu", **kw})
    kw.pop("backend", None)
    want, want_lse, want_grads = _reference(fn, ref_arrays or arrays, grad, **kw)
    _assert_close(out, want, fwd, "out")
    _assert_close(lse, want_lse, max(fwd, 1e-6), "lse")
    if grad:
        _assert_grads_close(grads, want_grads, bwd)
    return out, lse, grads


# ---------------------------------------------------------------------------------------------
# NaN / Inf propagation (SPEC §4)

PROPAGATION = [
    pytest.param({}, {}, id="full"),
    pytest.param({"mask": "causal"}, {}, id="causal"),
    pytest.param({}, {"hq": 8, "hkv": 2}, id="gqa"),
    pytest.param({"mask": "causal", "sync": "none_end"}, {"lq": 5, "lk": 12}, id="causal-none_end"),
    pytest.param({"mask": Local(3)}, {}, id="local"),
    pytest.param({"bias": "bias"}, {}, id="bias"),
    pytest.param({"k_lengths": torch.tensor([7, 12])}, {}, id="k_lengths"),
]


def _with_bias(kw, q, k):
    if kw.get("bias") == "bias":
        kw = dict(kw, bias=_randn(1, q.shape[1], q.shape[2], k.shape[2], seed=42, dtype=str(q.dtype)[6:]))
    return kw


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("kw, shape", PROPAGATION)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nan_in_a_query_row_propagates(kw, shape, dtype, grad):
    """The reported bug: a NaN in q[0, 0, 1, 2] gave output row 1 = 0 (the kernel takes a row whose
    logits are all NaN for a fully masked one)."""
    q, k, v = _qkv(dtype=dtype, **shape)
    q[0, 0, 1, 2] = NAN
    kw = _with_bias(kw, q, k)
    out, lse, _ = _check((q, k, v), dtype, grad, **kw)
    assert torch.isnan(out[0, 0, 1]).all() and torch.isnan(lse[0, 0, 1])


def test_reported_reproduction():
    """The issue's own call (auto picks sdpa-cpu for torch CPU tensors once it is certified here)."""
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    q[0, 0, 1, 2] = NAN
    out = attnhub.attention(q, k, v, backend="sdpa-cpu")
    assert torch.isnan(out[0, 0, 1]).all() and torch.isfinite(out[0, 0, [0, 2, 3]]).all()
    assert torch.isfinite(out[0, 1]).all()


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("lk", [5, 12, 40])
@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_non_finite_query_entry_matches_the_reference(value, lk, grad):
    """Inf in q too (±inf logits make the row NaN in float64), over key counts below and above the
    kernel's vector width (its row max treats NaN differently in its vector and scalar tails)."""
    q, k, v = _qkv(lk=lk)
    q[1, 2, 3, 4] = value
    _check((q, k, v), "float32", grad)


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_nan_in_an_attended_key_propagates_to_the_rows_that_attend_it(mask, grad):
    q, k, v = _qkv(lq=6, lk=6)
    k[0, 1, 3, 0] = NAN
    v[1, 2, 0, 5] = NAN  # a key every row attends: NaN in a masked key's v is unspecified (semantics.md)
    out, _, _ = _check((q, k, v), "float32", grad, mask=mask)
    if mask == "causal":  # rows before key 3 do not attend it
        assert torch.isfinite(out[0, 1, :3]).all() and torch.isnan(out[0, 1, 3:]).all()


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_every_query_row_nan(grad):
    """Every row recomputed: the exact fallback keeps its memory to one (b, h) block at a time."""
    q, k, v = _qkv(hq=8, hkv=2)
    q[:] = NAN
    out, lse, _ = _check((q, k, v), "float32", grad, mask="causal")
    assert torch.isnan(out).all() and torch.isnan(lse).all()


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_fully_masked_rows_stay_zero_next_to_nan_rows(grad):
    """none_end with Lq > Lk leaves the first rows with no key: out = 0 and lse = -inf exactly,
    even with a NaN in such a row's q, while a NaN in an attended row propagates."""
    q, k, v = _qkv(lq=12, lk=5)
    q[0, 0, 1, 0] = NAN  # row 1 attends no key (rows 0..6 are before the first key)
    q[0, 0, 9, 0] = NAN  # row 9 attends keys 0..2
    out, lse, grads = _check((q, k, v), "float32", grad, mask="causal", sync="none_end")
    assert torch.equal(out[:, :, :7], torch.zeros_like(out[:, :, :7]))
    assert torch.isneginf(lse[:, :, :7]).all() and torch.isnan(out[0, 0, 9]).all()
    if grad:
        assert torch.equal(grads[0][:, :, :7], torch.zeros_like(grads[0][:, :, :7]))


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_bool_mask_empty_row_with_nan_stays_zero(grad):
    q, k, v = _qkv(lq=6, lk=7)
    mask = _randn(1, 1, 6, 7, seed=3) > -0.3
    mask[..., 2, :] = False  # row 2 attends nothing
    q[:, :, 2] = NAN
    q[1, 3, 4, 1] = NAN
    out, lse, _ = _check((q, k, v), "float32", grad, mask=mask)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2])) and torch.isneginf(lse[:, :, 2]).all()


def test_a_row_with_lse_zero_is_not_taken_for_nan():
    """lse = 0 exactly is also a legitimate value (one key, logit 0): such rows keep their output."""
    q, k, v = _qkv(lk=1)
    k.zero_()
    _check((q, k, v), "float32", False)
    # dq and dk are 0 in exact arithmetic (one key): only dv has a scale to compare against.
    _, _, grads = _run(attnhub.attention, (q, k, v), True, backend="sdpa-cpu")
    _, _, want = _reference(attnhub.attention, (q, k, v), True)
    _assert_close(grads[2], want[2], TOL["float32"][1], "dv")


def test_the_callers_tensors_are_not_modified():
    q, k, v = _qkv()
    q[0, 0, 1, 2] = NAN
    k[1, 0, 9:] = NAN
    before = [x.clone() for x in (q, k, v)]
    attnhub.attention(
        q, k, v, mask="causal", k_lengths=torch.tensor([12, 9]), q_lengths=torch.tensor([4, 12])
    )
    for a, b in zip((q, k, v), before):
        assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num())


# ---------------------------------------------------------------------------------------------
# Padded batches (SPEC §10): NaN in padded query rows and in padded keys

Q_LENGTHS, K_LENGTHS = torch.tensor([5, 12, 0]), torch.tensor([8, 12, 3])

PADDED = [
    pytest.param({}, {}, id="full"),
    pytest.param({"mask": "causal"}, {}, id="causal"),
    pytest.param({"mask": "causal", "sync": "none_end"}, {}, id="causal-none_end"),
    pytest.param({"mask": Local(3)}, {}, id="local"),
    pytest.param({"mask": "causal"}, {"hq": 8, "hkv": 2}, id="causal-gqa"),
    pytest.param({"bias": "bias"}, {}, id="bias"),
    pytest.param({"bias": "bias", "mask": "causal"}, {"hq": 4, "hkv": 2}, id="bias-causal-gqa"),
]


def _padded(n, lengths, side):
    """(B, N) bool: True at padded slots."""
    idx = torch.arange(n)[None, :]
    return idx >= lengths[:, None] if side == "right" else idx < (n - lengths)[:, None]


def _fill(x, padded, value):
    """A copy of x (B, H, N, D) with ``value`` (a scalar or an array like x) at the padded slots."""
    where = padded[:, None, :, None].expand_as(x)
    return torch.where(where, value, x)


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("kw, shape", PADDED)
@pytest.mark.parametrize("which", ["queries", "keys", "both"])
def test_nan_in_padded_slots_does_not_matter(which, kw, shape, side, grad):
    """Padded query rows: out 0, lse -inf, zero dq; padded keys: never attended (dk = dv = 0), so
    valid rows equal the reference run with finite values in the padded slots."""
    q, k, v = _qkv(b=3, **shape)
    kw = dict(_with_bias(kw, q, k), q_lengths=Q_LENGTHS, k_lengths=K_LENGTHS, padding_side=side)
    pad_q, pad_k = _padded(q.shape[2], Q_LENGTHS, side), _padded(k.shape[2], K_LENGTHS, side)
    finite = [_randn(*x.shape, seed=11 + i) for i, x in enumerate((q, k, v))]
    nan_q = _fill(q, pad_q, NAN) if which in ("queries", "both") else q
    nan_k, nan_v = (_fill(x, pad_k, NAN) for x in (k, v)) if which in ("keys", "both") else (k, v)
    ref = (_fill(q, pad_q, finite[0]), _fill(k, pad_k, finite[1]), _fill(v, pad_k, finite[2]))
    out, lse, grads = _check((nan_q, nan_k, nan_v), "float32", grad, ref_arrays=ref, **kw)
    rows = pad_q[:, None, :].expand(lse.shape)
    assert torch.equal(out[rows], torch.zeros_like(out[rows])) and torch.isneginf(lse[rows]).all()
    if grad:
        dq, dk, dv = grads
        assert not dq[rows].any()
        keys = pad_k[:, None, :].expand(dk.shape[:3])
        assert not dk[keys].any() and not dv[keys].any()


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_nan_in_padded_slots_other_dtypes(dtype):
    q, k, v = _qkv(b=3, dtype=dtype)
    pad_q, pad_k = _padded(12, Q_LENGTHS, "left"), _padded(12, K_LENGTHS, "left")
    finite = [_randn(*x.shape, seed=11 + i, dtype=dtype) for i, x in enumerate((q, k, v))]
    kw = dict(mask="causal", q_lengths=Q_LENGTHS, k_lengths=K_LENGTHS, padding_side="left", sync="none_end")
    nan = (_fill(q, pad_q, NAN), _fill(k, pad_k, NAN), _fill(v, pad_k, NAN))
    ref = (_fill(q, pad_q, finite[0]), _fill(k, pad_k, finite[1]), _fill(v, pad_k, finite[2]))
    _check(nan, dtype, True, ref_arrays=ref, **kw)


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_nan_in_a_valid_query_row_of_a_padded_batch_propagates(grad):
    q, k, v = _qkv(b=3)
    q[1, 2, 7, 0] = NAN
    out, _, _ = _check((q, k, v), "float32", grad, mask="causal", q_lengths=Q_LENGTHS, k_lengths=K_LENGTHS)
    assert torch.isnan(out[1, 2, 7]).all()


# ---------------------------------------------------------------------------------------------
# Packed sequences and the contiguous KV cache (SPEC §10)


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_varlen_nan_stays_in_its_sequence(mask, grad):
    """A NaN query row in sequence 0 and a NaN key in sequence 2: sequence 1 stays finite."""
    cu_q = torch.tensor([0, 5, 11, 20], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 9, 21], dtype=torch.int32)
    q = _randn(20, 4, 16, seed=1)
    k, v = _randn(21, 2, 16, seed=2), _randn(21, 2, 16, seed=3)
    q[2, 1, 3] = NAN
    k[15, 0, 0] = NAN

    def varlen(q, k, v, **kw):
        return attnhub.attention_varlen(q, k, v, cu_q, cu_k, **kw)

    out, lse, _ = _check((q, k, v), "float32", grad, fn=varlen, mask=mask)
    assert torch.isnan(out[2, 1]).all() and torch.isfinite(out[5:11]).all()


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_kvcache_nan_beyond_the_lengths_does_not_matter(grad):
    """attention_kvcache with a contiguous cache: rows past k_lengths hold NaN (unwritten cache)."""
    lengths = torch.tensor([17, 40, 1], dtype=torch.int32)
    q = _randn(3, 8, 2, 16, seed=1)
    kc, vc = _randn(3, 2, 40, 16, seed=2), _randn(3, 2, 40, 16, seed=3)
    pad = _padded(40, lengths.long(), "right")
    finite = [_randn(3, 2, 40, 16, seed=s) for s in (4, 5)]
    nan = (q, _fill(kc, pad, NAN), _fill(vc, pad, NAN))
    ref = (q, _fill(kc, pad, finite[0]), _fill(vc, pad, finite[1]))

    def kvcache(q, kc, vc, **kw):
        return attnhub.attention_kvcache(q, kc, vc, lengths, **kw)

    out, _, grads = _check(nan, "float32", grad, fn=kvcache, ref_arrays=ref)
    assert torch.isfinite(out).all()
    if grad:
        assert not grads[1][pad[:, None, :].expand(grads[1].shape[:3])].any()


# ---------------------------------------------------------------------------------------------
# SDPA's CUDA kernels (run by the lead on a GPU)


def _cuda_or_skip(name, arrays, **kw):
    """``name``'s output, or a skip with the reasons it declines the request for."""
    try:
        return attnhub.attention(*arrays, backend=name, **kw)
    except BackendUnsupported as e:
        pytest.skip(f"{name} declines: {e}")


def _cuda_check(name, arrays, ref_arrays=None, grad=True, **kw):
    """The CUDA backend's out (and gradients) against the reference (no lse: these backends decline it)."""
    fwd, bwd = TOL["float16"]
    leaves = [x.detach().clone().requires_grad_(grad) for x in arrays]
    out = _cuda_or_skip(name, leaves, **kw)
    want, _, want_grads = _reference(attnhub.attention, ref_arrays or arrays, grad, **kw)
    _assert_close(out, want, fwd, f"{name} out")
    if grad:
        dout = _randn(*out.shape, seed=7, dtype="float64").to(out.dtype).to(out.device)
        _assert_grads_close(torch.autograd.grad(out, leaves, dout), want_grads, bwd)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("name", CUDA_SDPA)
@pytest.mark.parametrize("mask", [None, "causal"])
@pytest.mark.parametrize("hkv", [4, 2], ids=["mha", "gqa"])
def test_cuda_nan_in_a_query_row_propagates(name, mask, hkv):
    q, k, v = _qkv(hkv=hkv, lq=130, lk=130, d=64, dtype="float16", device="cuda")
    q[0, 0, 1, 2] = NAN
    q[1, 3, 100] = NAN
    out = _cuda_check(name, (q, k, v), mask=mask)
    assert torch.isnan(out[0, 0, 1]).all() and torch.isnan(out[1, 3, 100]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("name", CUDA_SDPA)
@pytest.mark.parametrize("value", [INF, -INF], ids=["inf", "-inf"])
def test_cuda_inf_in_a_query_row_matches_the_reference(name, value):
    q, k, v = _qkv(lq=70, lk=70, d=64, dtype="float16", device="cuda")
    q[1, 2, 3, 4] = value
    _cuda_check(name, (q, k, v), grad=False)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CUDA_SDPA)
@pytest.mark.parametrize("mask", [None, "causal"])
def test_cuda_nan_in_an_attended_key_propagates(name, mask):
    """Key 0, which every row attends under both rules: a NaN at a key some rows do not attend may
    reach those rows too (docs/semantics.md; the H200 showed it for causal), so it is not tested."""
    q, k, v = _qkv(lq=70, lk=70, d=64, dtype="float16", device="cuda")
    k[0, 1, 0, 0] = NAN
    v[1, 2, 0, 5] = NAN
    _cuda_check(name, (q, k, v), mask=mask)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CUDA_SDPA)
def test_cuda_empty_rows_stay_zero_next_to_nan_rows(name):
    """A boolean mask leaving row 2 with no key (with NaN in its q): out = 0 there, NaN elsewhere."""
    q, k, v = _qkv(lq=40, lk=48, d=64, dtype="float16", device="cuda")
    mask = _randn(1, 1, 40, 48, seed=3, device="cuda") > -0.3
    mask[..., 2, :] = False
    q[:, :, 2] = NAN
    q[1, 3, 4, 1] = NAN
    out = _cuda_check(name, (q, k, v), mask=mask)
    assert not out[:, :, 2].any() and torch.isnan(out[1, 3, 4]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("name", CUDA_SDPA)
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("mask", [None, "causal"])
def test_cuda_nan_in_padded_slots_does_not_matter(name, side, mask):
    """Padded query rows and keys full of NaN, where the backend takes lengths (today none of the
    CUDA SDPA backends does: the test then skips with the backend's reasons)."""
    q, k, v = _qkv(b=3, lq=70, lk=70, d=64, dtype="float16", device="cuda")
    ql, kl = torch.tensor([30, 70, 0]), torch.tensor([50, 70, 9])
    pad_q, pad_k = (_padded(70, x, side).cuda() for x in (ql, kl))
    finite = [_randn(*x.shape, seed=11 + i, dtype="float16", device="cuda") for i, x in enumerate((q, k, v))]
    nan = (_fill(q, pad_q, NAN), _fill(k, pad_k, NAN), _fill(v, pad_k, NAN))
    ref = (_fill(q, pad_q, finite[0]), _fill(k, pad_k, finite[1]), _fill(v, pad_k, finite[2]))
    out = _cuda_check(name, nan, ref_arrays=ref, mask=mask, q_lengths=ql, k_lengths=kl, padding_side=side)
    assert not out[pad_q[:, None, :].expand(out.shape[:3])].any()


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_inf_key_next_to_fully_masked_rows(grad):
    """+Inf in k under a materialised mask: the mask's -inf plus the +inf logit is NaN on the rows
    that attend no key (none_end with Lq > Lk: rows 0..3), which must stay 0 (the conformance
    suite's ``inf`` case); rows attending that key are NaN (Inf - Inf)."""
    q, k, v = _qkv(b=2, hq=4, hkv=2, lq=13, lk=9)
    q[1, 0:2, :, 0] = q[1, 0:2, :, 0].abs()
    k[1, 0, 4, 0] = INF
    out, lse, _ = _check((q, k, v), "float32", grad, mask="causal", sync="none_end")
    assert not out[:, :, :4].any() and torch.isneginf(lse[:, :, :4]).all()
    assert torch.isnan(out[1, 0:2, 8:]).all() and torch.isfinite(out[1, 0:2, 4:8]).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_inf_key_on_the_fast_path(dtype):
    """+Inf in k of a plain causal request (the bound fast call): in half dtypes torch's kernel gives
    the rows attending that key lse = +inf and out = 0; SPEC §4 wants NaN there (Inf − Inf). The
    fast path handed only lse = 0 to the general path (certify's full NaN/Inf case found it)."""
    q, k, v = _qkv(b=1, hq=4, hkv=2, lq=24, lk=24, dtype=dtype)
    q[0, 0:2, :, 0] = q[0, 0:2, :, 0].abs()
    k[0, 0, 12, 0] = INF
    for _ in range(2):  # the first call plans, the second takes the bound fast call
        out = attnhub.attention(q, k, v, mask="causal", backend="sdpa-cpu")
        assert torch.isnan(out[0, 0:2, 12:]).all()
        assert torch.isfinite(out[0, 0:2, :12]).all() and torch.isfinite(out[0, 2:]).all()
