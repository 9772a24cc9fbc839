"""The jax backend's SPEC §9-§11 arguments on an NVIDIA GPU, realistic shapes, half precision.

The same float64 dense formula as tests/test_jax_modifiers.py; the backend's default GPU tiles.
cuDNN serves right-padded lengths with the rule Full, the Pallas kernel softcap, sinks and
offsets; everything else runs the blockwise path.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from attnhub import Causal, Full, Local  # noqa: E402
from attnhub.operands import Operands  # noqa: E402
from tests.test_jax_modifiers import (  # noqa: E402
    BACKEND,
    TOL,
    check_case,
    dense,
    dense_grads,
    err,
    make_request,
    padded_keep,
    rounded,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def needs_jax_gpu():
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax sees no GPU")


BIG = {"b": 2, "hq": 8, "hkv": 2, "nq": 1024, "nk": 1024, "d": 128, "dv": 128}


def test_bias_dbias_causal(rng):
    check_case(
        rng, Causal(), "none_front", dtype="bfloat16", bias_shape=(1, 8, 1024, 1024), path="blockwise", **BIG
    )


def test_alibi_like_bias_with_local_window(rng):
    check_case(rng, Local(256, causal=True), "none_end", dtype="float16", bias_shape=(1, 8, 1, 1024), **BIG)


def test_softcap_sinks_left_padding(rng):
    check_case(
        rng, Causal(), "none_end", dtype="bfloat16", softcap=30.0, sinks=True, big=True,
        qlens=[1024, 517], klens=[900, 1024], side="left", path="blockwise", **BIG,
    )  # fmt: skip


def test_varlen_packed(rng):
    cu = ([0, 300, 301, 1000, 1536], [0, 512, 700, 1400, 2048])
    check_case(rng, Causal(), "none_end", dtype="bfloat16", cu=cu, hq=8, hkv=2, d=64, dv=64, sinks=True)


def test_pallas_softcap_sinks(rng):
    check_case(
        rng,
        Causal(),
        "none_front",
        dtype="bfloat16",
        softcap=20.0,
        sinks=True,
        big=True,
        path="pallas",
        **BIG,
    )


def test_offsets_chunked_prefill(rng):
    check_case(
        rng, Causal(), "none_front", dtype="bfloat16", qo=1024, ko=0, b=1, hq=8, hkv=2, nq=512, nk=1536, d=128
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cudnn_right_padding(rng, dtype, monkeypatch):
    """Right-padded lengths, rule Full, no lse: the cuDNN path, a length 0 on both sides included
    (it is off until this test passed: cudnn.LENGTHS_VERIFIED)."""
    from attnhub_backends.jax import cudnn

    monkeypatch.setattr(cudnn, "LENGTHS_VERIFIED", True)
    b, hq, hkv, n, d = 3, 8, 2, 512, 128
    xs = [
        rounded(rng, (b, hq, n, d), dtype, 8.0),
        rounded(rng, (b, hkv, n, d), dtype),
        rounded(rng, (b, hkv, n, d), dtype),
    ]
    qlens, klens = [512, 100, 0], [37, 0, 512]
    req = make_request(xs, Full(), "none_front", dtype, q_lengths=True, k_lengths=True, return_lse=False)
    assert BACKEND.path_for(req)[0] == "cudnn", BACKEND.path_for(req)
    keep, rows = padded_keep(Full(), "none_front", n, n, qlens, klens, "right")
    ref_out, _ = dense(np, *xs, keep, req.scale, rows=rows)
    dout = rounded(rng, ref_out.shape, dtype)
    ref_g = dense_grads(xs, keep, req.scale, None, None, None, rows, dout, np.zeros(ref_out.shape[:3]))
    ops = {"q_lengths": jnp.asarray(qlens, jnp.int32), "k_lengths": jnp.asarray(klens, jnp.int32)}

    def loss(q, k, v):
        out, _ = BACKEND.run(q, k, v, req, None, Operands(**ops))
        return (out.astype(jnp.float32) * jnp.asarray(dout, jnp.float32)).sum(), out

    js = [jnp.asarray(x, dtype) for x in xs]
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*js)
    fwd, bwd = TOL[dtype]
    assert err(out, ref_out) < fwd
    for g, r in zip(grads, ref_g[:3]):
        assert err(g, r) < bwd


def test_paged_decode(rng):
    b, hq, hkv, d, bs, nblocks, mb = 4, 16, 4, 128, 64, 80, 16
    q = rounded(rng, (b, hq, 1, d), "bfloat16")
    kc = rounded(rng, (nblocks, bs, hkv, d), "bfloat16")
    vc = rounded(rng, (nblocks, bs, hkv, d), "bfloat16")
    table = rng.permutation(nblocks)[: b * mb].reshape(b, mb).astype(np.int32)
    klens = np.array([1024, 1, 777, 64], np.int32)
    kg = np.transpose(kc[table].reshape(b, mb * bs, hkv, d), (0, 2, 1, 3))
    vg = np.transpose(vc[table].reshape(b, mb * bs, hkv, d), (0, 2, 1, 3))
    req = make_request(
        [q, kg, vg], Causal(), "none_end", "bfloat16", paged=bs, k_lengths=True, return_lse=True
    )
    keep, _ = padded_keep(Causal(), "none_end", 1, mb * bs, [1] * b, list(klens), "right")
    ref_out, ref_lse = dense(np, q, kg, vg, keep, req.scale)
    f = jax.jit(
        lambda q, kc, vc, t, kl: BACKEND.run(q, kc, vc, req, None, Operands(k_lengths=kl, block_table=t))
    )
    args = [jnp.asarray(x, jnp.bfloat16) for x in (q, kc, vc)] + [jnp.asarray(table), jnp.asarray(klens)]
    out, lse = f(*args)
    assert err(out, ref_out) < TOL["bfloat16"][0] and err(lse, ref_lse) < TOL["bfloat16"][0]
    jax.block_until_ready(f(*args))
    t0 = time.perf_counter()
    for _ in range(20):
        out = f(*args)
    jax.block_until_ready(out)
    print(f"paged decode B={b} Hq={hq} Lk<=1024 bf16: {(time.perf_counter() - t0) / 20 * 1e6:.0f} us/call")
