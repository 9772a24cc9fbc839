"""The jax backend on an NVIDIA GPU: the cuDNN path and the blockwise path against the reference."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import attnhub  # noqa: E402
from attnhub import Causal, Full, Local  # noqa: E402
from attnhub.frameworks import numpy_dtype  # noqa: E402
from attnhub.request import build_request  # noqa: E402
from attnhub_backends.reference import kernel  # noqa: E402

pytestmark = pytest.mark.gpu
TOL = {"float32": (2e-5, 1e-4), "float16": (2e-3, 8e-3), "bfloat16": (1.6e-2, 4e-2)}


@pytest.fixture(autouse=True)
def needs_jax_gpu():
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax sees no GPU")


def err(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert np.array_equal(np.isfinite(got), np.isfinite(ref))
    fin = np.isfinite(ref)
    e = got[fin] - ref[fin]
    return max(np.linalg.norm(e) / np.linalg.norm(ref[fin]), np.abs(e).max() / np.abs(ref[fin]).max())


def case(rng, dtype, sq, sk, hq, hkv, d, rule, sync, big=False):
    npdt = numpy_dtype(dtype)
    q = rng.standard_normal((2, hq, sq, d)) * (8.0 if big else 1.0)
    k = rng.standard_normal((2, hkv, sk, d))
    v = rng.standard_normal((2, hkv, sk, d))
    dout = rng.standard_normal((2, hq, sq, d))
    xs = [a.astype(npdt).astype(np.float64) for a in (q, k, v, dout)]
    js = [jnp.asarray(a.astype(npdt)) for a in xs]
    req, _ = build_request(*xs[:3], rule, sync, None, "bhsd", True)
    ref = kernel.forward(*xs[:3], req), kernel.backward(*xs, req)
    return js, ref


def run_and_grad(js, rule, sync):
    def loss(q, k, v):
        out = attnhub.attention(q, k, v, mask=rule, sync=sync, backend="jax")
        return jnp.sum(out.astype(jnp.float32) * js[3].astype(jnp.float32)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*js[:3])
    return out, grads


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rule", [Causal(), Full()], ids=["causal", "full"])
def test_cudnn_path_matches_reference(rng, dtype, rule):
    js, ((ref_out, _), ref_g) = case(rng, dtype, 256, 256, 8, 2, 64, rule, "none_front", big=True)
    note = next(v.note for v in attnhub.explain(*js[:3], mask=rule).verdicts if v.name == "jax")
    assert note.startswith("path=cudnn"), note
    out, grads = run_and_grad(js, rule, "none_front")
    fwd, bwd = TOL[dtype]
    assert err(out.astype(jnp.float32), ref_out) < fwd
    for g, r in zip(grads, ref_g):
        assert err(g.astype(jnp.float32), r) < bwd


@pytest.mark.parametrize(
    "dtype,path", [("bfloat16", "pallas"), ("bfloat16", "blockwise"), ("float32", "blockwise")]
)
@pytest.mark.parametrize(
    "rule,sync,sq,sk",
    [
        (Local(8, log2_stride=1), "scale_end", 200, 300),
        (Causal(), "scale_end", 150, 600),
        (Local(16, causal=True), "none_end", 64, 256),
    ],
    ids=["local-stride", "causal-scale_end", "local-causal-none_end"],
)
def test_pallas_and_blockwise_paths_on_gpu(rng, monkeypatch, dtype, path, rule, sync, sq, sk):
    from attnhub_backends.jax import pallas

    if path == "blockwise":
        monkeypatch.setenv("ATTNHUB_JAX_PALLAS", "0")
    elif pallas.mode() == "off":
        pytest.skip("ATTNHUB_JAX_PALLAS=0")
    js, ((ref_out, _), ref_g) = case(rng, dtype, sq, sk, 4, 4, 64, rule, sync)
    note = next(v.note for v in attnhub.explain(*js[:3], mask=rule, sync=sync).verdicts if v.name == "jax")
    assert note.startswith(f"path={path}"), note
    out, grads = run_and_grad(js, rule, sync)
    fwd, bwd = TOL[dtype]
    assert err(out.astype(jnp.float32), ref_out) < fwd
    for g, r in zip(grads, ref_g):
        assert err(g.astype(jnp.float32), r) < bwd


@pytest.mark.parametrize(
    "sq,sk,rule", [(31, 17, Full()), (33, 33, Causal())], ids=["full-31x17", "causal-33"]
)
def test_grad_with_odd_lengths_on_gpu(rng, sq, sk, rule):
    """cuDNN's backward rejects odd lengths: auto dispatch must pick a path whose grad runs."""
    js, ((ref_out, _), ref_g) = case(rng, "bfloat16", sq, sk, 4, 2, 32, rule, "none_end")
    out, grads = run_and_grad(js, rule, "none_end")
    fwd, bwd = TOL["bfloat16"]
    assert err(out.astype(jnp.float32), ref_out) < fwd
    for g, r in zip(grads, ref_g):
        assert err(g.astype(jnp.float32), r) < bwd


def test_vmap_and_jit_on_the_cudnn_path(rng):
    js, _ = case(rng, "bfloat16", 128, 128, 4, 4, 64, Causal(), "none_front")
    stack = [jnp.stack([x, x]) for x in js[:3]]
    f = jax.jit(jax.vmap(lambda q, k, v: attnhub.attention(q, k, v, mask="causal")))
    out = f(*stack)
    one = attnhub.attention(*js[:3], mask="causal")
    np.testing.assert_allclose(np.asarray(out[1], np.float32), np.asarray(one, np.float32), atol=2e-2)
