"""SPEC §9 modifiers, boolean masks and §11 offsets in the triton kernels, under Triton's interpreter.

The kernels are called through the backend (``forward_for_grad`` / ``backward``, as the core calls
them) on tiny CPU shapes and compared with a float64 torch autograd formula written here from the
SPEC (softcap, bias, bool mask, sinks, offsets, rules, sync, GQA): out, lse, dq, dk, dv, dbias and
dsinks. Outputs start as NaN-free fresh tensors and are checked NaN-free. The module re-runs
itself in a child pytest with ``TRITON_INTERPRET=1`` (set before triton is imported, as
tests/test_triton_interpret.py does).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnhub.rules import Causal, Full, Local

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

CHILD = os.environ.get("TRITON_INTERPRET") == "1"

FWD_TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
GRAD_TOL = {"float32": 1e-4, "float16": 8e-3, "bfloat16": 4e-2}


if not CHILD:

    def test_cap_max_policy() -> None:
        """The bound as every row's max only where its exponentials stay normal in P's dtype."""
        from attnhub.request import build_request
        from attnhub_backends.triton.shape import cap_max as _cap_max

        def req_for(dtype, softcap, scale=None, bias=None):
            q = torch.zeros(1, 1, 4, 8, dtype=dtype)
            req, _ = build_request(q, q, q, "causal", "none_front", scale, "bhsd", False)
            return dataclasses.replace(req, softcap=softcap, bias=bias), q

        assert _cap_max(*req_for(torch.bfloat16, 30.0)) and _cap_max(*req_for(torch.float32, 41.0))
        assert not _cap_max(*req_for(torch.bfloat16, 42.0))  # 42·log2(e) > 60
        assert not _cap_max(*req_for(torch.float16, 30.0))  # float16 exponentials would be subnormal
        assert not _cap_max(*req_for(torch.bfloat16, None))
        assert not _cap_max(*req_for(torch.bfloat16, 30.0, bias=(1, 1, 4, 4)))
        assert not _cap_max(*req_for(torch.bfloat16, 30.0, scale=-0.5))

    @pytest.mark.slow
    def test_modifiers_under_interpreter() -> None:
        """Runs this module's cases in a child pytest under ``TRITON_INTERPRET=1``."""
        here = Path(__file__)
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(here.parent.parent))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here)],
            cwd=here.parent.parent, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


def _positions_keep(rule, lq: int, lk: int, sync: str, qo: int, ko: int):
    """(Lq, Lk) bool rule mask for 1-d sequences with offsets (none_front) from SPEC §2-3, §11."""
    from attnhub.positions import dense_rule_mask

    if not (qo or ko):
        return torch.from_numpy(dense_rule_mask(rule, (lq,), (lk,), sync).copy())
    p = torch.arange(lq)[:, None] + qo
    r = torch.arange(lk)[None, :] + ko
    if isinstance(rule, Full):
        return torch.ones(lq, lk, dtype=torch.bool)
    if isinstance(rule, Causal):
        return p >= r
    (w,) = rule.windows(1)
    d = p - r
    near = (d.abs() % rule.stride == 0) & (d.abs() // rule.stride < w)
    return near & (d >= 0) if rule.causal else near


def dense(q, k, v, scale, keep, softcap=None, bias=None, sinks=None):
    """float64 (out, lse) of SPEC §9 (differentiable): t = softcap·tanh(scale·qk/softcap) + bias,
    excluded pairs -inf, sinks one more zero-value logit per head."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    t = scale * q @ k.transpose(-1, -2)
    if softcap is not None:
        t = softcap * torch.tanh(t / softcap)
    if bias is not None:
        t = t + bias
    t = t.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        col = sinks[None, :, None, None].expand(t.shape[0], -1, t.shape[2], 1)
        t = torch.cat([t, col], dim=-1)
    m = t.detach().amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(t - m)  # no NaN in the gradient of a fully excluded row (all terms 0)
    den = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(den == 0, torch.ones_like(den), den)
    lse = torch.logsumexp(t.detach(), dim=-1)
    out = p[..., : k.shape[2]] @ v
    return out, lse


def run_case(
    *,
    dtype: str = "float32",
    b: int = 2,
    hq: int = 2,
    hkv: int = 2,
    lq: int = 24,
    lk: int = 24,
    d: int = 16,
    rule=None,
    sync: str = "none_front",
    softcap: float | None = None,
    bias_shape: tuple | None = None,
    bias_dtype: str | None = None,
    bias_grad: bool = True,
    mask: torch.Tensor | None = None,
    sinks: bool = False,
    offsets: tuple[int, int] = (0, 0),
    boost: float = 1.0,
    seed: int = 0,
    bias_scale: float = 1.0,
    bias_edit=None,
    bias_view=None,
    grid: tuple[tuple[int, int], tuple[int, int]] | None = None,
    device: str = "cpu",
    inputs_edit=None,
) -> None:
    """One case through the backend against :func:`dense` (SPEC §6 tolerances)."""
    from attnhub.operands import Operands
    from attnhub.request import build_request
    from attnhub.rules import ExplicitMask
    from attnhub_backends.triton.backend import TritonBackend

    rule = Full() if rule is None else rule
    g = torch.Generator().manual_seed(seed)
    tdt = getattr(torch, dtype)
    q64 = torch.randn(b, hq, lq, d, generator=g, dtype=torch.float64) * boost
    k64 = torch.randn(b, hkv, lk, d, generator=g, dtype=torch.float64)
    v64 = torch.randn(b, hkv, lk, d, generator=g, dtype=torch.float64)
    if inputs_edit is not None:
        inputs_edit(q64, k64)
    q, k, v = (x.to(tdt).to(device) for x in (q64, k64, v64))
    if mask is not None:
        mask = mask.to(device)
    first = (rule if grid is None else None) if mask is None else mask  # 2-d: the rule comes below
    req, _ = build_request(q, k, v, first, sync, None, "bhsd", True)
    bias = sk = None
    if bias_shape is not None:
        bdt = getattr(torch, bias_dtype or dtype)
        bias = torch.randn(bias_shape, generator=g, dtype=torch.float64) * bias_scale
        if bias_edit is not None:
            bias_edit(bias)
        bias = bias.to(bdt).to(device)
        if bias_view is not None:
            bias = bias_view(bias)
    if sinks:
        sk = torch.randn(hq, generator=g, dtype=torch.float64).to(tdt).to(device)
    if grid is not None:  # 2-d sequences, flattened row-major as the backend receives them
        assert grid[0][0] * grid[0][1] == lq and grid[1][0] * grid[1][1] == lk
        req = dataclasses.replace(req, seq_q=grid[0], seq_k=grid[1], rule=rule)
    req = dataclasses.replace(
        req, needs_grad=True, bias=None if bias is None else tuple(bias.shape),
        bias_grad=bias is not None and bias_grad, softcap=softcap, sinks=sinks, sinks_grad=sinks,
        q_offset=offsets[0], k_offset=offsets[1],
    )  # fmt: skip
    be = TritonBackend()
    assert be.check(req) == [], be.check(req)
    ops = Operands(bias=bias, sinks=sk)
    mask_arg = mask.reshape(req.rule.shape) if isinstance(req.rule, ExplicitMask) else None
    out, lse, saved = be.forward_for_grad(q, k, v, req, mask_arg, operands=ops)
    dout64 = torch.randn(out.shape, generator=g, dtype=torch.float64)
    dout64 = dout64.to(device)
    grads = be.backward(q, k, v, saved, lse, dout64.to(tdt), req, mask_arg, operands=ops)

    # the float64 oracle, on the rounded inputs
    if grid is None:
        keep = _positions_keep(plan_rule(req), lq, lk, sync, *offsets)
    else:
        from attnhub.positions import dense_rule_mask

        keep = torch.from_numpy(dense_rule_mask(plan_rule(req), grid[0], grid[1], sync).copy())
    keep = keep[None, None].to(device)
    if mask is not None:
        keep = keep & mask
    keep = keep.expand(b, hq, lq, lk)
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    bd = bias.double().requires_grad_() if bias is not None else None
    sd = sk.double().requires_grad_() if sk is not None else None
    # dS per element (a zero full-shape bias): the terms that dbias sums over broadcast dims
    zd = torch.zeros(b, hq, lq, lk, dtype=torch.float64, device=device, requires_grad=True)
    want_out, want_lse = dense(qd, kd, vd, req.scale, keep, softcap, zd if bd is None else bd + zd, sd)
    want_out.backward(dout64)

    def close(name, got, want, tol, terms=None):
        """SPEC §6 relative errors; ``terms``: the absolute values a reduction summed (a sum that
        cancels to about 0 is judged against them)."""
        assert got is not None, f"{name} missing"
        assert got.shape == want.shape, f"{name} shape {tuple(got.shape)} != {tuple(want.shape)}"
        gd = got.detach().double()
        assert not torch.isnan(gd).any(), f"NaN in {name}"
        err = gd - want.detach()
        ref = want.detach().abs() if terms is None else torch.maximum(want.detach().abs(), terms)
        scale = max(float(ref.max()), 1e-300)
        rel = float(err.norm() / max(float(ref.norm()), 1e-300))
        mx = float(err.abs().max()) / scale
        assert rel < tol and mx < tol, f"{name} error {rel:.2e}/{mx:.2e} >= {tol} ({req.describe()})"

    close("out", out, want_out, FWD_TOL[dtype])
    masked = torch.isneginf(want_lse)
    assert torch.equal(torch.isneginf(lse), masked), "lse -inf pattern differs"
    assert (out.double()[masked] == 0).all()
    lse_tol = 1e-4 * max(1.0, boost**2) * (50 if dtype != "float32" else 1)
    assert torch.allclose(lse.double()[~masked], want_lse.detach()[~masked], rtol=lse_tol, atol=lse_tol)
    tol = GRAD_TOL[dtype]
    for name, got, x in zip(("dq", "dk", "dv"), grads[:3], (qd, kd, vd), strict=True):
        close(name, got, x.grad, tol)
    if bias is not None or sinks:
        assert len(grads) == 5
        if bias is not None and bias_grad:
            dims = [i for i in range(4) if bias.shape[i] == 1]
            terms = zd.grad.abs().sum(dim=dims, keepdim=True) if dims else zd.grad.abs()
            close("dbias", grads[3], bd.grad, tol, terms)
            assert grads[3].dtype == bias.dtype
        else:
            assert grads[3] is None
        if sinks:
            close("dsinks", grads[4], sd.grad, tol)
    else:
        assert len(grads) == 3


def plan_rule(req):
    from attnhub_backends.triton.modifiers import plan_rule as pr

    return pr(req)


def padding_mask(b: int, lq: int, lk: int, lengths: list[int], causal: bool = True) -> torch.Tensor:
    """(B, 1, Lq, Lk) bool: batch entry i attends keys < lengths[i] (causally), its padded query
    rows attend nothing."""
    q = torch.arange(lq)[:, None]
    kk = torch.arange(lk)[None, :]
    rows = []
    for n in lengths:
        m = (kk < n) & (q < n)
        if causal:
            m = m & (kk <= q)
        rows.append(m)
    return torch.stack(rows)[:, None]


if CHILD:

    @pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
    def test_softcap(dtype) -> None:
        run_case(dtype=dtype, rule=Causal(), softcap=5.0, boost=4.0, lq=33, lk=40, sync="none_end")

    def test_softcap_local_gqa() -> None:
        run_case(rule=Local(5, causal=True), softcap=2.0, hq=4, hkv=2, lq=40, lk=40, boost=3.0)

    @pytest.mark.parametrize(
        "shape", [(1, 2, 24, 24), (2, 1, 24, 24), (2, 2, 1, 24), (1, 1, 24, 1), (2, 2, 24, 24), (1, 1, 1, 1)]
    )
    def test_bias_shapes_and_dbias_reduction(shape) -> None:
        run_case(rule=Causal(), bias_shape=shape)

    def test_bias_float32_on_half_inputs_and_noncontiguous() -> None:
        run_case(dtype="bfloat16", rule=Full(), bias_shape=(1, 2, 24, 24), bias_dtype="float32")
        run_case(dtype="float16", rule=Local(4), bias_shape=(2, 2, 12, 24), sync="scale_end", lq=12, lk=24)
        # strided layouts: a transposed copy, and a 0-stride expanded view of full shape
        run_case(rule=Causal(), bias_shape=(2, 2, 24, 24), bias_view=lambda x: x.mT.contiguous().mT)
        run_case(rule=Causal(), bias_shape=(1, 2, 24, 1), bias_view=lambda x: x.expand(1, 2, 24, 24))

    def test_bias_gqa_none_end_and_no_grad() -> None:
        run_case(rule=Causal(), hq=4, hkv=1, bias_shape=(1, 4, 24, 30), lk=30, sync="none_end")
        run_case(rule=Full(), bias_shape=(2, 1, 1, 24), bias_grad=False)

    def test_2d_rules_with_bias_softcap_sinks() -> None:
        run_case(
            rule=Causal(), grid=((4, 6), (4, 6)), sync="none_end", bias_shape=(1, 2, 24, 24), softcap=3.0
        )
        run_case(
            rule=Local((2, 3)), grid=((3, 8), (6, 8)), lq=24, lk=48, sync="scale_end", sinks=True,
            bias_shape=(2, 1, 24, 48), hq=2, hkv=1,
        )  # fmt: skip

    def test_bias_neg_inf_excludes() -> None:
        """A -inf bias excludes pairs; a row excluded entirely gives out 0, lse -inf."""

        def edit(bias):
            bias[..., 3, :] = float("-inf")  # row 3 excluded entirely
            bias[..., 5:9, 2:20] = float("-inf")

        run_case(rule=Causal(), bias_shape=(1, 1, 24, 24), bias_edit=edit)
        run_case(rule=Full(), bias_shape=(1, 1, 24, 24), bias_edit=edit, sinks=True)

    def test_large_logits_peaked_rows() -> None:
        run_case(rule=Causal(), bias_shape=(1, 2, 24, 24), bias_scale=20.0, boost=6.0, softcap=30.0)

    def test_bool_mask_padding_with_padded_queries() -> None:
        m = padding_mask(2, 48, 48, [48, 19])
        run_case(mask=m, lq=48, lk=48, hq=4, hkv=2)

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    def test_padding_shaped_masks_run_as_lengths(monkeypatch, dtype) -> None:
        """Masks that are padding patterns (mask_forms.py) run forward on the ragged kernels (the
        call is recorded) and match the dense formula, gradients included (mask backward)."""
        from attnhub_backends.triton import ragged_launch

        calls = []
        real = ragged_launch.forward
        monkeypatch.setattr(ragged_launch, "forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
        left = torch.stack([(i >= 40 - n) & (j >= 40 - n) & (j <= i) for n in (40, 13)])[:, None]
        i = torch.arange(24)[:, None]  # queries at the end of longer key sequences (bottom-right)
        end = torch.stack([j <= i + 16, (i < 10) & (j < 20) & (j <= i + 10)])[:, None]
        for m in (padding_mask(2, 40, 40, [40, 13]), left, end, padding_mask(1, 40, 40, [29], causal=False)):
            before = len(calls)
            run_case(dtype=dtype, mask=m, lq=m.shape[2], lk=m.shape[3], hq=4, hkv=2, boost=3.0)
            assert len(calls) > before

    def test_bool_mask_per_head_random_and_rows_empty() -> None:
        g = torch.Generator().manual_seed(5)
        m = torch.rand(2, 2, 40, 36, generator=g) > 0.5
        m[:, :, :16, :16] = True  # a FULL tile
        m[:, :, 16:32, :] = False  # EMPTY tiles, fully masked rows
        run_case(mask=m, lq=40, lk=36)

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    def test_softcap_rows_at_the_lower_bound(dtype) -> None:
        """Rows whose every score sits near -softcap: with the bound as every row's max
        (shape.cap_max, softcap 40) their exponentials are about 2^-115, still normal floats;
        then a softcap past the bound's range (50: the running max) on the same rows."""

        def edit(q, k):
            k[..., 0] += 8.0
            q[:, :, :8, 0] = -60.0  # q·k about -480, scaled -120: tanh(-3) saturates

        run_case(dtype=dtype, rule=Causal(), softcap=40.0, inputs_edit=edit, sinks=True)
        run_case(dtype=dtype, rule=Causal(), softcap=50.0, inputs_edit=edit)

    def test_softcap_bool_mask_rows_empty_and_sinks() -> None:
        """Softcap without a bias (the forward caps only each row's max): random mask with EMPTY
        tiles and fully masked rows (out 0, lse -inf), large logits; then with sinks."""
        g = torch.Generator().manual_seed(8)
        m = torch.rand(2, 1, 40, 36, generator=g) > 0.4
        m[:, :, 16:32, :] = False
        run_case(mask=m, lq=40, lk=36, softcap=3.0, boost=6.0)
        run_case(mask=m, lq=40, lk=36, softcap=3.0, boost=6.0, sinks=True)

    def test_bool_mask_broadcast_rows_with_bias_softcap_sinks() -> None:
        m = torch.rand(1, 1, 1, 24) > 0.3
        run_case(mask=m, bias_shape=(2, 1, 24, 24), softcap=4.0, sinks=True, boost=2.0)

    def test_mask_summary_cached_and_version_checked() -> None:
        from attnhub_backends.triton import mask_summary

        m = padding_mask(2, 32, 32, [32, 10]).view(torch.uint8)
        p1 = mask_summary.mask_plan(m, Full(), (32,), (32,), "none_front", 16, 16)
        p2 = mask_summary.mask_plan(m, Full(), (32,), (32,), "none_front", 16, 16)
        assert p1 is p2
        m[0, 0, 0, 0] = 0
        p3 = mask_summary.mask_plan(m, Full(), (32,), (32,), "none_front", 16, 16)
        assert p3 is not p1
        s = mask_summary.summary(padding_mask(2, 32, 32, [32, 10]), 16, 16)
        assert s.shape == (2, 1, 2, 2)
        assert s[1, 0, 1, 1] == 0 and s[0, 0, 1, 0] == 2 and s[0, 0, 0, 0] == 1

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    def test_sinks(dtype) -> None:
        run_case(dtype=dtype, rule=Causal(), sinks=True, lq=40, lk=20, hq=4, hkv=1)  # fully masked rows

    def test_sinks_local_gqa_bias() -> None:
        run_case(rule=Local(6, causal=True), sinks=True, hq=4, hkv=2, bias_shape=(1, 4, 24, 24))

    @pytest.mark.parametrize(
        "rule,offsets",
        [(Causal(), (10, 3)), (Causal(), (0, 9)), (Local(5, causal=True), (7, 0)), (Local(3), (-4, 2))],
    )
    def test_offsets(rule, offsets) -> None:
        run_case(rule=rule, offsets=offsets, lq=24, lk=40)

    def test_offsets_with_modifiers() -> None:
        run_case(rule=Causal(), offsets=(5, 0), softcap=3.0, bias_shape=(1, 2, 24, 24), sinks=True)

    def test_offsets_2d_declined() -> None:
        from attnhub.request import Request
        from attnhub_backends.triton.backend import TritonBackend

        req = Request(
            framework="torch", device="cpu", dtype="float32", layout="bhsd", batch=1, heads_q=1,
            heads_kv=1, seq_q=(4, 4), seq_k=(4, 4), dim_qk=8, dim_v=8, rule=Causal(), sync="none_end",
            scale=1.0, q_offset=2,
        )  # fmt: skip
        reasons = TritonBackend().check(req)
        assert any("q_offset" in r for r in reasons), reasons

    @pytest.mark.parametrize("cfg", ["32,16,1,1,0,1", "16,16,1,1,0,0"])
    def test_band_walk_and_other_tiles(monkeypatch, cfg) -> None:
        """The forward's band walk (and another tile shape) with every modifier and a bool mask."""
        monkeypatch.setenv("ATTNHUB_TRITON_FWD_CFG", cfg)
        m = padding_mask(2, 48, 48, [48, 29])
        run_case(mask=m, lq=48, lk=48, softcap=5.0, bias_shape=(1, 2, 48, 48), sinks=True, boost=2.0)
        run_case(rule=Causal(), lq=40, lk=40, softcap=5.0, bias_shape=(2, 1, 40, 40), offsets=(3, 0))
        run_case(rule=Local(9, causal=True), lq=40, lk=40, sinks=True, sync="none_end")

    API_CASES = [
        # (layout, mask, kwargs): through attnhub.attention, triton against the reference backend
        ("bhsd", "causal", {"softcap": 4.0, "bias": (1, 4, 20, 20), "sinks": True}),
        ("bshd", Local(5, causal=True), {"bias": (2, 1, 20, 1), "q_offset": 3}),
        ("bhsd", "bool", {"sinks": True}),
        ("bhsd", "float", {}),  # a float mask arrives as a bias
        ("bhsd", "bool", {"bias": (1, 1, 20, 20), "softcap": 2.0}),
    ]

    @pytest.mark.parametrize("case", API_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{sorted(c[2])}")
    def test_api_against_reference(case) -> None:
        """The public call (the core's validation, canonical forms and autograd glue) on triton
        against ``backend="reference"`` (float64 inputs): out, lse and every gradient."""
        import attnhub

        layout, mask, kw = case
        g = torch.Generator().manual_seed(7)
        b, hq, hkv, n, d = 2, 4, 2, 20, 16

        def make(h):
            x = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
            return x.transpose(1, 2).contiguous() if layout == "bshd" else x

        q64, k64, v64 = make(hq), make(hkv), make(hkv)
        extra64 = {}
        if kw.get("bias") is not None:
            extra64["bias"] = torch.randn(kw["bias"], generator=g, dtype=torch.float64)
        if kw.get("sinks"):
            extra64["sinks"] = torch.randn(hq, generator=g, dtype=torch.float64)
        if mask == "bool":
            mask = padding_mask(b, n, n, [n, 11])
        elif mask == "float":
            mask = torch.randn(b, 1, n, n, generator=g, dtype=torch.float64)
        scalars = {key: val for key, val in kw.items() if key not in ("bias", "sinks")}

        def run(dtype, backend):
            xs = [x.to(dtype).requires_grad_() for x in (q64, k64, v64)]
            ex = {key: val.to(dtype).requires_grad_() for key, val in extra64.items()}
            m = (
                mask.to(dtype).requires_grad_()
                if isinstance(mask, torch.Tensor) and mask.is_floating_point()
                else mask
            )
            out, lse = attnhub.attention(
                *xs, mask=m, layout=layout, backend=backend, return_lse=True, **ex, **scalars
            )
            dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
            out.backward(dout.to(dtype))
            grads = [x.grad for x in xs] + [val.grad for val in ex.values()]
            if isinstance(m, torch.Tensor) and m.is_floating_point():
                grads.append(m.grad)
            return out, lse, grads

        out, lse, grads = run(torch.float32, "triton")
        want_out, want_lse, want_grads = run(torch.float64, "reference")
        assert torch.allclose(out.double(), want_out, atol=2e-5 * float(want_out.detach().abs().max()))
        fin = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(lse), fin)
        assert torch.allclose(lse.double()[fin], want_lse[fin], atol=1e-4)
        assert len(grads) == len(want_grads)
        for got, want in zip(grads, want_grads, strict=True):
            assert got is not None and got.shape == want.shape
            err = float((got.double() - want).abs().max())
            # a dbias summed over keys cancels to ~0: judged on the scale of the terms it sums
            assert err <= 1e-4 * max(float(want.abs().max()), 0.1), err

    def test_split_kv_and_gqa_packing_with_modifiers(monkeypatch) -> None:
        """Decoding shapes: keys split over programs (the sink joins split 0 only) and GQA rows
        packed into one tile, with every modifier; a bool mask (no packing) split too."""
        monkeypatch.setenv("ATTNHUB_TRITON_SPLITS", "3")
        run_case(
            rule=Causal(), sync="none_end", b=2, hq=8, hkv=2, lq=2, lk=60, sinks=True, softcap=3.0,
            bias_shape=(2, 8, 2, 60), boost=2.0,
        )  # fmt: skip
        m = torch.rand(2, 1, 3, 50, generator=torch.Generator().manual_seed(2)) > 0.4
        m[1, :, 1, :] = False  # a fully masked row
        run_case(mask=m, b=2, hq=4, hkv=1, lq=3, lk=50, sinks=True)
