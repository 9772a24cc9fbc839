"""The cuda backend without a GPU: NVRTC compiles every kernel variant, the disk cache is reused across
processes, compile errors are readable, and the mask parameters encode SPEC §2-3 exactly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from attnhub.positions import dense_rule_mask
from attnhub.request import Request
from attnhub.rules import Causal, Full, Local

pytest.importorskip("cuda.core", reason="the cuda extra (cuda-core, NVRTC) is not installed")
compiler = pytest.importorskip("attnhub_backends.cuda.compiler")
from attnhub_backends.cuda import choice, tiles, variants  # noqa: E402
from attnhub_backends.cuda.mask import mask_values  # noqa: E402

ARCHS = ("sm_80", "sm_90")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNHUB_CACHE_DIR", str(tmp_path))
    return tmp_path / "cuda"


def _compile(job):
    variant, arch = job
    return compiler.compile_variant(variant, arch)


def test_every_variant_compiles_for_sm80_and_sm90():
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(v, a) for v in variants.all_variants() for a in ARCHS]
    with ProcessPoolExecutor(2) as ex:
        cubins = list(ex.map(_compile, jobs))
    for (variant, arch), cubin in zip(jobs, cubins):
        assert cubin[:4] == b"\x7fELF", (variant.name, arch)
        for kernel in variant.kernels:
            assert kernel.encode() in cubin, f"{kernel} missing from {variant.name} ({arch})"
    assert len({v.name for v in variants.all_variants()}) == len(variants.all_variants())


def test_every_wgmma_variant_compiles_for_sm90a():
    """The Hopper kernels (wgmma needs the sm_90a target): NVRTC builds every variant to a cubin that
    exports its kernels."""
    from concurrent.futures import ProcessPoolExecutor

    wgmma = variants.wgmma_variants()
    jobs = [(v, variants.WGMMA_ARCH) for v in wgmma]
    with ProcessPoolExecutor(2) as ex:
        cubins = list(ex.map(_compile, jobs))
    for variant, cubin in zip(wgmma, cubins):
        assert cubin[:4] == b"\x7fELF", variant.name
        for kernel in variant.kernels:
            assert kernel.encode() in cubin, f"{kernel} missing from {variant.name}"
    assert len({v.name for v in wgmma}) == len(wgmma)


def test_cache_reused_across_processes(cache):
    variant = variants.simt_variant("float32")
    before = compiler.COMPILES
    first = compiler.get_cubin(variant, "sm_80")
    assert before + 1 == compiler.COMPILES
    assert len(list(cache.glob("*.cubin"))) == 1
    script = textwrap.dedent(
        """
        import json, time
        t0 = time.perf_counter()
        from attnhub_backends.cuda import compiler, variants
        t1 = time.perf_counter()
        data = compiler.get_cubin(variants.simt_variant("float32"), "sm_80")
        t2 = time.perf_counter()
        print(json.dumps({"compiles": compiler.COMPILES, "size": len(data), "load_s": t2 - t1}))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["compiles"] == 0, "the second process compiled instead of loading the cached cubin"
    assert got["size"] == len(first)
    assert got["load_s"] < 1.0, got


def test_cache_key_depends_on_source_arch_and_defines():
    a = compiler.cache_key(variants.simt_variant("float32"), "sm_80")
    assert a != compiler.cache_key(variants.simt_variant("float32"), "sm_90")
    assert a != compiler.cache_key(variants.simt_variant("float64"), "sm_80")
    assert a == compiler.cache_key(variants.simt_variant("float32"), "sm_80")


def test_compile_error_is_attnhub_error_with_log(tmp_path, monkeypatch):
    from attnhub.errors import AttnhubError

    kdir = tmp_path / "kernels"
    kdir.mkdir()
    (kdir / "common.cuh").write_text((compiler.KERNEL_DIR / "common.cuh").read_text())
    (kdir / "fwd_simt.cu").write_text('extern "C" __global__ void attn_fwd_simt() { int x = ; }\n')
    monkeypatch.setattr(compiler, "KERNEL_DIR", kdir)
    with pytest.raises(AttnhubError, match=r"(?s)fwd_simt.*sm_80.*expected an expression"):
        compiler.compile_variant(variants.simt_variant("float32"), "sm_80")


# --- the mask parameters, evaluated in Python exactly as common.cuh does on the device ------------


class _Mask:
    def __init__(self, args):
        (self.lqx, self.lkx, self.aqy, self.bqy, self.aqx, self.bqx, self.aky, self.bky, self.akx, self.bkx,
         self.mx, self.rule, self.wy, self.wx, self.log2s, self.lcausal) = (int(a) for a in args)  # fmt: skip

    def qpos(self, n):
        iy, ix = divmod(n, self.lqx)
        py, px = iy * self.aqy + self.bqy, ix * self.aqx + self.bqx
        return py, px, py * self.mx + px

    def kpos(self, n):
        iy, ix = divmod(n, self.lkx)
        py, px = iy * self.aky + self.bky, ix * self.akx + self.bkx
        return py, px, py * self.mx + px

    def attend(self, q, k):
        if self.rule == 0:
            return True
        if self.rule == 1:
            return q[2] >= k[2]
        dy, dx, sm = abs(q[0] - k[0]), abs(q[1] - k[1]), (1 << self.log2s) - 1
        ok = (
            (dy & sm) == 0
            and (dy >> self.log2s) < self.wy
            and (dx & sm) == 0
            and (dx >> self.log2s) < self.wx
        )
        return ok and (not self.lcausal or q[2] >= k[2])

    def ranges(self, n0, n1, lx, ay, by, ax, bx):
        iy0, iy1 = n0 // lx, n1 // lx
        y = (iy0 * ay + by, iy1 * ay + by)
        if iy0 == iy1:
            return y, ((n0 - iy0 * lx) * ax + bx, (n1 - iy1 * lx) * ax + bx)
        return y, (bx, (lx - 1) * ax + bx)

    def tile(self, q0, q1, k0, k1):
        if self.rule == 0:
            return 2
        if self.rule == 1 or self.lcausal:
            if self.qpos(q1)[2] < self.kpos(k0)[2]:
                return 0
            if self.rule == 1:
                return 2 if self.qpos(q0)[2] >= self.kpos(k1)[2] else 1
        qy, qx = self.ranges(q0, q1, self.lqx, self.aqy, self.bqy, self.aqx, self.bqx)
        ky, kx = self.ranges(k0, k1, self.lkx, self.aky, self.bky, self.akx, self.bkx)

        def dist(a, b):
            return b[0] - a[1] if b[0] > a[1] else (a[0] - b[1] if a[0] > b[1] else 0)

        if dist(qy, ky) >= self.wy << self.log2s or dist(qx, kx) >= self.wx << self.log2s:
            return 0
        return 1

    # Mirrors of common.cuh's interval fast path for 1-d rules (C integer division truncates).
    def one_interval(self, nq, nk):
        return (
            self.lqx == nq and self.lkx == nk and self.bqy == 0 and self.bky == 0 and self.mx < 1 << 29
            and (self.rule != 2 or self.log2s == 0)
        )  # fmt: skip

    @staticmethod
    def floordiv(a, b):
        if b == 1:
            return a
        return a // b if a >= 0 else -((-a + b - 1) // b)

    def key_interval(self, n, nk):
        qx = n * self.aqx + self.bqx
        lo, hi = 0, nk - 1
        if self.rule == 1 or (self.rule == 2 and self.lcausal):
            hi = min(hi, self.floordiv(qx - self.bkx, self.akx))
        if self.rule == 2:
            lo = max(lo, -self.floordiv(-(qx - self.wx + 1 - self.bkx), self.akx))
            hi = min(hi, self.floordiv(qx + self.wx - 1 - self.bkx, self.akx))
        return lo, max(hi, -1)

    def query_interval(self, n, nq):
        kx = n * self.akx + self.bkx
        lo, hi = 0, nq - 1
        if self.rule == 1 or (self.rule == 2 and self.lcausal):
            lo = max(lo, -self.floordiv(-(kx - self.bqx), self.aqx))
        if self.rule == 2:
            lo = max(lo, -self.floordiv(-(kx - self.wx + 1 - self.bqx), self.aqx))
            hi = min(hi, self.floordiv(kx + self.wx - 1 - self.bqx, self.aqx))
        return lo, max(hi, -1)


def _interval_class(lo0, hi0, lo1, hi1, c0, c1):
    if c1 < lo0 or c0 > hi1:
        return 0
    return 2 if lo1 <= c0 and hi0 >= c1 else 1


def _req(seq_q, seq_k, rule, sync):
    return Request("torch", "cuda:0", "float16", "bhsd", 1, 1, 1, seq_q, seq_k, 64, 64, rule, sync, 0.125)


SHAPES = [
    ((7,), (19,)),
    ((19,), (7,)),
    ((16,), (16,)),
    ((3, 5), (6, 10)),
    ((6, 10), (2, 3)),
    ((4, 4), (4, 4)),
]
RULES = [Full(), Causal(), Local(2), Local(3, log2_stride=1), Local((1, 2), causal=True), Local(2, 1, True)]


@pytest.mark.parametrize("sync", ["none_front", "scale_front", "scale_end", "none_end"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_mask_params_match_spec(sync, rule, shapes):
    seq_q, seq_k = shapes
    if isinstance(rule, Local) and isinstance(rule.window, tuple) and len(seq_q) == 1:
        rule = Local(rule.window[0], rule.log2_stride, rule.causal)
    want = dense_rule_mask(rule, seq_q, seq_k, sync)
    m = _Mask(mask_values(_req(seq_q, seq_k, rule, sync)))
    nq, nk = want.shape
    qs, ks = [m.qpos(i) for i in range(nq)], [m.kpos(j) for j in range(nk)]
    got = np.array([[m.attend(q, k) for k in ks] for q in qs])
    np.testing.assert_array_equal(got, want)
    # Tile classification is sound: 0 only where nothing is attended, 2 only where all is.
    for bq in (1, 3, 8):
        for bk in (1, 4, 8):
            for q0 in range(0, nq, bq):
                for k0 in range(0, nk, bk):
                    q1, k1 = min(q0 + bq, nq) - 1, min(k0 + bk, nk) - 1
                    block = want[q0 : q1 + 1, k0 : k1 + 1]
                    cls = m.tile(q0, q1, k0, k1)
                    assert cls != 0 or not block.any(), (q0, k0, bq, bk)
                    assert cls != 2 or block.all(), (q0, k0, bq, bk)
    # 1-d Full / Causal / unstrided Local: each query attends exactly one interval of keys (and each
    # key one interval of queries), growing with the index; tile classes from the end rows are sound.
    if not m.one_interval(nq, nk):
        assert len(seq_q) == 2 or (isinstance(rule, Local) and rule.log2_stride > 0)
        return
    rows = [m.key_interval(i, nk) for i in range(nq)]
    for i, (lo, hi) in enumerate(rows):
        np.testing.assert_array_equal([lo <= j <= hi for j in range(nk)], want[i], err_msg=f"row {i}")
    cols = [m.query_interval(j, nq) for j in range(nk)]
    for j, (lo, hi) in enumerate(cols):
        np.testing.assert_array_equal([lo <= i <= hi for i in range(nq)], want[:, j], err_msg=f"col {j}")
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(rows, rows[1:]))
    for bq in (1, 3, 8):
        for bk in (1, 4, 8):
            for q0 in range(0, nq, bq):
                q1 = min(q0 + bq, nq) - 1
                for k0 in range(0, nk, bk):
                    k1 = min(k0 + bk, nk) - 1
                    block = want[q0 : q1 + 1, k0 : k1 + 1]
                    cls = _interval_class(*rows[q0], *rows[q1], k0, k1)
                    assert cls != 0 or not block.any(), (q0, k0, bq, bk)
                    assert cls != 2 or block.all(), (q0, k0, bq, bk)
                    cls_t = _interval_class(*cols[k0], *cols[k1], q0, q1)  # the dK/dV kernel's view
                    assert cls_t != 0 or not block.any(), (q0, k0, bq, bk)
                    assert cls_t != 2 or block.all(), (q0, k0, bq, bk)


def test_backend_declines_with_reasons():
    from attnhub_backends.cuda.backend import CudaBackend

    be = CudaBackend()
    req = Request("torch", "cpu", "float16", "bhsd", 1, 1, 1, (8,), (8,), 160, 64, Full(), "none_front", 0.1)
    reasons = be.check(req)
    assert any("cuda devices" in r for r in reasons)
    assert any("head dims up to 128" in r for r in reasons)
    from attnhub.rules import ExplicitMask

    req2 = Request(
        "numpy", "cpu", "float32", "bhsd", 1, 1, 1, (8,), (8,), 64, 64, ExplicitMask("bool", (1, 1, 8, 8)),
        "none_front", 0.1,
    )  # fmt: skip
    assert any("explicit mask" in r for r in be.check(req2))


def test_shared_memory_limits_pick_smaller_tiles_or_decline(monkeypatch):
    """On GPUs with 99 KiB of shared memory per block (sm_86/sm_89) big tiles shrink or decline."""

    def req(dtype, d, grad):
        return Request(
            "torch", "cuda:0", dtype, "bhsd", 1, 1, 1, (8,), (8,), d, d, Full(), "none_front", 0.1, grad
        )

    cfg = tiles.tile_for("mma", req("bfloat16", 128, True), 101376)
    assert cfg is not None and tiles.mma_smem_bytes(128, 128, cfg) <= 101376
    assert choice.smem_reasons(req("bfloat16", 128, True), 101376) == []
    assert choice.smem_reasons(req("float64", 64, True), 101376) == []
    for kern in ("tf32", "f16x3"):  # the float32 forwards fall back to smaller tiles too
        monkeypatch.setenv("ATTNHUB_CUDA_F32", kern)
        cfg = tiles.tile_for(kern, req("float32", 128, False), 101376)
        assert cfg is not None and tiles.FORWARD_TILES[kern][2](128, 128, cfg) <= 101376
        assert choice.smem_reasons(req("float32", 128, False), 101376) == []
    monkeypatch.delenv("ATTNHUB_CUDA_F32")
    (reason,) = choice.smem_reasons(req("float64", 128, True), 101376)
    assert "backward kernel needs" in reason and "101376" in reason


def test_tile_overrides_from_the_environment(monkeypatch):
    """ATTNHUB_CUDA_MMA / ATTNHUB_CUDA_TF32 override the tiles; a malformed value is a clear error."""
    from attnhub.errors import AttnhubError

    monkeypatch.setenv("ATTNHUB_CUDA_MMA", "8,32")
    assert tiles.mma_config(64, 64) == (8, 32, 1)
    monkeypatch.setenv("ATTNHUB_CUDA_TF32", "4,64,2")
    assert tiles.tf32_config(128, 128) == (4, 64, 2)
    monkeypatch.delenv("ATTNHUB_CUDA_MMA")
    assert tiles.mma_config(64, 64) == tiles.MMA_CONFIGS[(64, 64)]
    monkeypatch.setenv("ATTNHUB_CUDA_TF32", "four")
    with pytest.raises(AttnhubError, match="ATTNHUB_CUDA_TF32"):
        tiles.tf32_config(64, 64)
    monkeypatch.setenv("ATTNHUB_CUDA_TF32", "4,64,2")
    for bad in ("two", "3"):  # not a number; not a divisor of the 8 blocks of a 64-key tile
        monkeypatch.setenv("ATTNHUB_CUDA_TF32_PVC", bad)
        with pytest.raises(AttnhubError, match="ATTNHUB_CUDA_TF32_PVC"):
            variants.tf32_variant(64, 64)
    monkeypatch.setenv("ATTNHUB_CUDA_TF32_PVC", "4")
    assert ("PVC", 4) in variants.tf32_variant(64, 64).defines
    monkeypatch.delenv("ATTNHUB_CUDA_TF32_PVC")
    monkeypatch.setenv("ATTNHUB_CUDA_F16X3", "4,32")
    assert tiles.f16x3_config(128, 128) == (4, 32, 1)
    assert ("BN", 32) in variants.f16x3_variant(128, 128).defines


def test_float32_kernel_choice(monkeypatch):
    """float32 at head dims 64 / 128 runs 3xFP16 from F16X3_MIN_WORK of work on, 3xTF32 below (fewer
    launches); ATTNHUB_CUDA_F32 forces f16x3, tf32 or simt; other requests have no tensor-core float32
    kernel; a bad value is a clear error."""
    from attnhub.errors import AttnhubError

    def req(dtype, d, n=4096):
        return Request(
            "torch", "cuda:0", dtype, "bhsd", 1, 8, 8, (n,), (n,), d, d, Full(), "none_front", 0.1, False
        )

    assert choice.f32_kernel(req("float32", 128)) == "f16x3" and choice.use_f16x3(req("float32", 64))
    assert choice.f32_kernel(req("float32", 128, 1024)) == "tf32"  # 8 * 1024**2 * 256 = 2.1e9 < 4e9
    assert choice.f32_kernel(req("float32", 64, 2048)) == "f16x3"  # 4.3e9
    assert choice.f32_kernel(req("float32", 32)) is None and choice.f32_kernel(req("bfloat16", 64)) is None
    monkeypatch.setenv("ATTNHUB_CUDA_F32", "f16x3")
    assert choice.f32_kernel(req("float32", 64, 8)) == "f16x3"
    monkeypatch.setenv("ATTNHUB_CUDA_F32", "tf32")
    assert choice.use_tf32(req("float32", 64)) and not choice.use_f16x3(req("float32", 64))
    monkeypatch.setenv("ATTNHUB_CUDA_F32", "simt")
    assert choice.f32_kernel(req("float32", 64)) is None
    monkeypatch.setenv("ATTNHUB_CUDA_F32", "fp16")
    with pytest.raises(AttnhubError, match="ATTNHUB_CUDA_F32"):
        choice.f32_kernel(req("float32", 64))


def test_backward_steps_from_the_environment(monkeypatch):
    """ATTNHUB_CUDA_BWD_STEPS picks the backward's steps and row blocks (tuning); bad values are clear errors."""
    from attnhub.errors import AttnhubError

    for dims in ((64, 64), (128, 128)):
        kb_q, qb_n, krb = tiles.bwd_config(*dims)
        assert ("KRB", krb) in variants.bwd_mma_variant("bfloat16", *dims).defines
    monkeypatch.setenv("ATTNHUB_CUDA_BWD_STEPS", "32,16")
    assert tiles.bwd_config(64, 64) == (32, 16, 1)
    v = variants.bwd_mma_variant("bfloat16", 64, 64)
    assert ("KB_Q", 32) in v.defines and ("QB_N", 16) in v.defines
    dkdv, dq = tiles.bwd_mma_smem_bytes(64, 64)
    assert dkdv == 2 * (64 * 128 + 2 * 32 * 128) + 16 * 32 and dq == 2 * (64 * 128 + 2 * 16 * 128)
    monkeypatch.setenv("ATTNHUB_CUDA_BWD_STEPS", "32,64,2")  # 128 keys per dK/dV block
    assert tiles.bwd_config(64, 64) == (32, 64, 2)
    assert tiles.bwd_mma_smem_bytes(64, 64)[0] == 2 * (128 * 128 + 2 * 32 * 128) + 16 * 32
    for bad in ("simt", "32", "48,32", "32,32,3", "32,32,2,1"):
        monkeypatch.setenv("ATTNHUB_CUDA_BWD_STEPS", bad)
        with pytest.raises(AttnhubError, match="ATTNHUB_CUDA_BWD_STEPS"):
            tiles.bwd_config(64, 64)


def test_wgmma_switches_from_the_environment(monkeypatch):
    """The Hopper kernels' tiles and switches: defaults, overrides, smem sizes, clear errors."""
    from attnhub.errors import AttnhubError

    assert tiles.wgmma_config(64, 64) == tiles.WGMMA_CONFIGS[(64, 64)]
    monkeypatch.setenv("ATTNHUB_CUDA_WGMMA", "3,128")
    assert tiles.wgmma_config(128, 128) == (3, 128)
    assert ("NWG", 3) in variants.wgmma_variant("bfloat16", 128, 128).defines
    # Q tile, double-buffered K and V, 1 KB of alignment slack (the plain loop at D = 128)
    assert tiles.wgmma_smem_bytes(128, 128, (3, 128)) == 2 * (192 * 128 + 2 * 128 * 256) + 1024
    for bad in ("2", "4,128", "2,96", "x,y"):
        monkeypatch.setenv("ATTNHUB_CUDA_WGMMA", bad)
        with pytest.raises(AttnhubError, match="ATTNHUB_CUDA_WGMMA"):
            tiles.wgmma_config(64, 64)
    monkeypatch.delenv("ATTNHUB_CUDA_WGMMA")
    assert (("PIPE", 1) in variants.wgmma_variant("bfloat16", 64, 64).defines) == (
        (64, 64) in tiles.WGMMA_PIPE_DIMS
    )
    monkeypatch.setenv("ATTNHUB_CUDA_WGMMA_PIPE", "1")
    assert ("PIPE", 1) in variants.wgmma_variant("bfloat16", 128, 128).defines
    # three K / V buffers when pipelined
    assert tiles.wgmma_smem_bytes(128, 128, (2, 128)) == 2 * (128 * 128 + 3 * 128 * 256) + 1024
    monkeypatch.setenv("ATTNHUB_CUDA_WGMMA_PIPE", "2")
    with pytest.raises(AttnhubError, match="ATTNHUB_CUDA_WGMMA_PIPE"):
        variants.wgmma_variant("bfloat16", 64, 64)
    monkeypatch.delenv("ATTNHUB_CUDA_WGMMA_PIPE")
    v = variants.bwd_wgmma_variant("float16", 64, 64)
    assert ("NWG", tiles.BWD_WGMMA_WARPGROUPS[(64, 64)]) in v.defines and ("BWD_OVERLAP", 1) in v.defines
    assert not any(k == "BWD_OVERLAP" for k, _ in variants.bwd_wgmma_variant("float16", 128, 128).defines)
    # K, V, two Q and dO tiles, dS^T, lse and delta, slack
    assert tiles.bwd_wgmma_smem_bytes(128, 128, 2) == 2 * (128 * 256 * 2 + 128 * 64) + 1024 + 1024
    monkeypatch.setenv("ATTNHUB_CUDA_BWD_WG", "1")
    assert tiles.bwd_wgmma_warpgroups(64, 64) == 1
    for var, bad in (
        ("ATTNHUB_CUDA_BWD_WG", "3"),
        ("ATTNHUB_CUDA_BWD_MINB", "8"),
        ("ATTNHUB_CUDA_BWD_OVERLAP", "y"),
    ):
        monkeypatch.setenv(var, bad)
        with pytest.raises(AttnhubError, match=var):
            variants.bwd_wgmma_variant("bfloat16", 64, 64)
        monkeypatch.delenv(var)


def test_backend_declines_lengths_past_the_grid():
    """Query/key tiles sit on the grid's z axis (at most 65535 blocks): longer sequences are declined."""
    from attnhub_backends.cuda.backend import CudaBackend

    n = 65535 * 64 + 1
    req = Request("torch", "cpu", "bfloat16", "bhsd", 1, 1, 1, (n,), (n,), 64, 64, Full(), "none_front", 0.1)
    assert any("sequences longer than" in r for r in CudaBackend().check(req))
    ok = Request(
        "torch", "cpu", "bfloat16", "bhsd", 1, 1, 1, (4096,), (4096,), 64, 64, Full(), "none_front", 0.1
    )
    assert not any("sequences longer than" in r for r in CudaBackend().check(ok))


def test_backward_mode_and_warps_choices(monkeypatch):
    """Fused backward by default at Dqk = 64 on sm_90+, split otherwise; the environment overrides,
    and bad values are clear errors."""
    from attnhub.errors import AttnhubError

    monkeypatch.delenv("ATTNHUB_CUDA_BWD", raising=False)
    monkeypatch.delenv("ATTNHUB_CUDA_BWD_STEPS", raising=False)
    assert choice.bwd_fused(64, 64, "sm_90") and choice.bwd_fused(64, 128, "sm_100")
    assert not choice.bwd_fused(128, 128, "sm_90") and not choice.bwd_fused(64, 64, "sm_80")
    monkeypatch.setenv("ATTNHUB_CUDA_BWD", "fused")
    assert choice.bwd_fused(128, 128, "sm_80")
    monkeypatch.setenv("ATTNHUB_CUDA_BWD_STEPS", "32,64")  # the fused kernel needs 64-query steps
    assert not choice.bwd_fused(64, 64, "sm_90")
    monkeypatch.setenv("ATTNHUB_CUDA_BWD", "split")
    monkeypatch.delenv("ATTNHUB_CUDA_BWD_STEPS")
    assert not choice.bwd_fused(64, 64, "sm_90")
    monkeypatch.setenv("ATTNHUB_CUDA_BWD", "atomic")
    with pytest.raises(AttnhubError, match="ATTNHUB_CUDA_BWD"):
        choice.bwd_fused(64, 64, "sm_90")
    assert tiles.bwd_warps(64, 64) == 4 and tiles.bwd_block_keys(64, 64) == 64
    monkeypatch.setenv("ATTNHUB_CUDA_BWD_WARPS", "8")
    assert tiles.bwd_block_keys(64, 64) == 128
    assert ("NWK", 8) in variants.bwd_mma_variant("bfloat16", 64, 64).defines
    monkeypatch.setenv("ATTNHUB_CUDA_BWD_WARPS", "6")
    with pytest.raises(AttnhubError, match="ATTNHUB_CUDA_BWD_WARPS"):
        tiles.bwd_warps(64, 64)
