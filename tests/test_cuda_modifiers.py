"""The cuda backend's SPEC §9-§11 host logic without a GPU: which kernels serve softcap / bias, the
launch arguments of the modifiers and the dbias reduction, the offsets in the rule parameters, the
declines (with where to go instead), and NVRTC building the modifier variants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attnhub.operands import Operands
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local

pytest.importorskip("cuda.core", reason="the cuda extra (cuda-core, NVRTC) is not installed")
torch = pytest.importorskip("torch")
compiler = pytest.importorskip("attnhub_backends.cuda.compiler")
from attnhub_backends.cuda import choice, variants  # noqa: E402
from attnhub_backends.cuda.backend import CudaBackend, unserved_reasons  # noqa: E402
from attnhub_backends.cuda.mask import mask_values, offset_reasons  # noqa: E402
from attnhub_backends.cuda.mods import ScoreMods  # noqa: E402
from attnhub_backends.cuda.tiles import BWD_WGMMA_WARPGROUPS, WGMMA_CONFIGS  # noqa: E402
from tests.test_cuda_compile import _Mask  # noqa: E402

H100_SMEM = 232448


def _req(dtype="bfloat16", d=128, n=256, rule=None, **kw) -> Request:
    rule = Causal() if rule is None else rule
    base = Request("torch", "cuda:0", dtype, "bhsd", 2, 4, 2, (n,), (n,), d, d, rule, "none_front", 0.125)
    return dataclasses.replace(base, **kw)


@pytest.mark.parametrize(
    "mods", [{"softcap": 30.0}, {"bias": (1, 4, 256, 256)}, {"softcap": 5.0, "bias": (2, 1, 1, 256)}]
)
def test_modified_requests_run_on_wgmma_or_simt(mods):
    """Only the wgmma (sm_90, half types) and SIMT kernels are built with modifiers: a modified
    request never reaches the mma.sync, 3xTF32 or 3xFP16 kernels."""
    half = _req(needs_grad=True, **mods)
    assert choice.forward_kernel(half, "sm_90", H100_SMEM).family == "wgmma"
    assert choice.backward_kernel(half, "sm_90", H100_SMEM).family == "wgmma"
    assert choice.forward_kernel(half, "sm_80", 166912).family == "simt"
    assert choice.backward_kernel(half, "sm_80", 166912).family == "simt"
    f32 = _req("float32", n=8192, **mods)
    assert choice.f32_kernel(f32) == "f16x3"  # the dense request's kernel
    assert choice.forward_kernel(f32, "sm_90", H100_SMEM).family == "simt"
    assert choice.smem_reasons(half, H100_SMEM) == []
    # dense requests keep their kernels
    assert choice.forward_kernel(_req(), "sm_80", 166912).family == "mma"
    assert choice.forward_kernel(_req("float32", n=8192), "sm_90", H100_SMEM).family == "f16x3"


def test_variants_with_mods_differ_only_by_the_define():
    """Dense variants carry no MODS define (so their source text, cache key and code are unchanged);
    modifier variants never fold the scale after the row max (SCALE_POS)."""
    dense = variants.wgmma_variant("float16", 64, 64)
    assert "MODS" not in dict(dense.defines) and dict(dense.defines).get("SCALE_POS") == 1
    mod = variants.wgmma_variant("float16", 64, 64, mods=3)
    assert dict(mod.defines)["MODS"] == 3 and "SCALE_POS" not in dict(mod.defines)
    assert variants.simt_variant("float32").defines == (("ATT_DTYPE", 2),)
    assert dict(variants.bwd_variant("float64", mods=7).defines)["MODS"] == 7
    names = [v.name for v in variants.mod_variants() + variants.wgmma_mod_variants()]
    assert len(names) == len(set(names))
    assert not set(names) & {v.name for v in variants.all_variants() + variants.wgmma_variants()}


def test_score_mods_arguments_and_dbias_reduction():
    req = _req("float16", d=64, n=5, bias=(1, 4, 1, 5), softcap=7.5, needs_grad=True, bias_grad=True)
    bias = torch.randn(1, 4, 1, 5, dtype=torch.float16)
    mods = ScoreMods.of(req, Operands(bias=bias), torch.float32, grad=True)
    assert mods.bits == variants.MOD_SOFTCAP | variants.MOD_BIAS | variants.MOD_DBIAS
    assert mods.bias.dtype == torch.float32 and torch.equal(mods.bias, bias.float())
    ptr, sb, sh, sq, sk, cap, ds = mods.args
    assert int(ptr) == mods.bias.data_ptr() and int(ds) == mods.ds.data_ptr()
    assert (int(sb), int(sh), int(sq), int(sk)) == (0, 5, 0, 1)  # broadcast axes read stride 0
    assert float(cap) == 7.5 and mods.ds.shape == (2, 4, 5, 5) and not mods.ds.any()
    g = torch.randn(2, 4, 5, 5)
    mods.ds.copy_(g)
    db = mods.dbias(bias)
    assert db.shape == bias.shape and db.dtype == bias.dtype
    torch.testing.assert_close(db.float(), g.sum(dim=(0, 2), keepdim=True), rtol=2e-3, atol=2e-3)
    # forward: no dS buffer; softcap alone: no bias pointer
    fwd = ScoreMods.of(req, Operands(bias=bias), torch.float32)
    assert fwd.bits == 3 and fwd.ds is None and int(fwd.args[-1]) == 0
    cap_only = ScoreMods.of(_req(softcap=2.0), None, torch.float32, grad=True)
    assert cap_only.bits == variants.MOD_SOFTCAP and int(cap_only.args[0]) == 0
    assert ScoreMods.of(_req(), None, torch.float32) is None
    with pytest.raises(ValueError, match="operands.bias"):
        ScoreMods.of(_req(bias=(1, 1, 1, 256)), None, torch.float32)


@pytest.mark.parametrize("rule", [Full(), Causal(), Local(3), Local(4, causal=True), Local(2, 1, True)])
@pytest.mark.parametrize("offsets", [(0, 5), (7, 0), (3, 3), (20, 2), (1, 40)])
@pytest.mark.parametrize("lens", [(9, 9), (6, 23), (23, 6)])
def test_offsets_in_the_rule_parameters(rule, offsets, lens):
    """q_offset / k_offset (SPEC §11): the kernels' Mask, evaluated as common.cuh does, attends
    exactly the pairs of positions (i + q_offset, j + k_offset), and its tile classes are sound."""
    (nq, nk), (qo, ko) = lens, offsets
    req = _req(n=1, rule=rule, seq_q=(nq,), seq_k=(nk,), q_offset=qo, k_offset=ko)
    m = _Mask(mask_values(req))
    p, r = np.arange(nq)[:, None] + qo, np.arange(nk)[None, :] + ko
    if isinstance(rule, Full):
        want = np.ones((nq, nk), bool)
    elif isinstance(rule, Causal):
        want = p >= r
    else:
        d, s = np.abs(p - r), 1 << rule.log2_stride
        want = (d % s == 0) & (d // s < rule.window) & ((p >= r) if rule.causal else True)
    got = np.array([[m.attend(m.qpos(i), m.kpos(j)) for j in range(nk)] for i in range(nq)])
    np.testing.assert_array_equal(got, want)
    for bq, bk in ((1, 1), (4, 8), (8, 4)):
        for q0 in range(0, nq, bq):
            for k0 in range(0, nk, bk):
                q1, k1 = min(q0 + bq, nq) - 1, min(k0 + bk, nk) - 1
                block, cls = want[q0 : q1 + 1, k0 : k1 + 1], m.tile(q0, q1, k0, k1)
                assert cls != 0 or not block.any(), (q0, k0)
                assert cls != 2 or block.all(), (q0, k0)
    if m.one_interval(nq, nk):
        for i in range(nq):
            lo, hi = m.key_interval(i, nk)
            np.testing.assert_array_equal([lo <= j <= hi for j in range(nk)], want[i])
        for j in range(nk):
            lo, hi = m.query_interval(j, nq)
            np.testing.assert_array_equal([lo <= i <= hi for i in range(nq)], want[:, j])


def test_offset_limit_declines():
    assert offset_reasons(_req(q_offset=5, k_offset=3)) == []
    (reason,) = offset_reasons(_req(q_offset=1 << 30))
    assert "2**30" in reason and "backend='triton'" in reason


@pytest.mark.parametrize(
    "kw, what",
    [
        ({"sinks": True}, "sinks"),
        ({"k_lengths": True}, "lengths"),
        ({"q_lengths": True, "padding_side": "left"}, "lengths"),
        ({"varlen": True}, "attention_varlen"),
        ({"paged": 16, "k_lengths": True}, "paged"),
        ({"rule": ExplicitMask("bool", (1, 1, 256, 256))}, "boolean mask"),
    ],
)
def test_declines_say_where_to_go(kw, what):
    """What the kernels do not take is declined with a reason naming it and another backend."""
    req = _req(**kw)
    reasons = unserved_reasons(req)
    assert reasons and all("backend='triton'" in r for r in reasons)
    assert any(what in r for r in reasons)
    cpu = dataclasses.replace(req, device="cpu")  # check() without a GPU: the declines still show
    assert any(what in r for r in CudaBackend().check(cpu))


def test_served_modifiers_are_not_declined():
    req = dataclasses.replace(_req(softcap=3.0, q_offset=4), device="cpu")
    reasons = CudaBackend().check(req)
    assert all("cuda devices" in r for r in reasons), reasons
    assert {"softcap", "offsets"} <= CudaBackend.features


def test_bias_is_declined_until_its_gpu_tests_pass():
    """The bias path failed its H100 tests (NaN on rows a -inf bias excludes): not declared."""
    req = dataclasses.replace(_req(bias=(1, 1, 256, 256), bias_grad=True), device="cpu")
    assert any("bias" in r for r in CudaBackend().check(req))
    assert not {"bias", "dbias"} & CudaBackend.features


def _compile(job):
    variant, arch = job
    return variant.name, compiler.compile_variant(variant, arch)


def test_modifier_variants_compile():
    """NVRTC builds a modifier variant of each kernel source (every variant: the device run's
    precompile): SIMT forward / backward for sm_80, wgmma forward / backward for sm_90a."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = [
        (variants.simt_variant("bfloat16", o_f32=True, mods=3), "sm_80"),
        (variants.simt_variant("float64", mods=1), "sm_80"),
        (variants.bwd_variant("float32", mods=7), "sm_80"),
        (
            variants.wgmma_variant("bfloat16", 128, 128, WGMMA_CONFIGS[(128, 128)], mods=3),
            variants.WGMMA_ARCH,
        ),
        (
            variants.bwd_wgmma_variant("float16", 64, 64, BWD_WGMMA_WARPGROUPS[(64, 64)], mods=7),
            variants.WGMMA_ARCH,
        ),
    ]
    with ProcessPoolExecutor(2) as ex:
        for (variant, _), (name, cubin) in zip(jobs, ex.map(_compile, jobs)):
            assert cubin[:4] == b"\x7fELF", name
            for kernel in variant.kernels:
                assert kernel.encode() in cubin, (kernel, name)
