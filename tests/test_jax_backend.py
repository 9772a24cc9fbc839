"""The jax backend against the float64 reference: rules x sync x 1-d/2-d x GQA x dtypes, jit, grad, vmap."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import attnhub  # noqa: E402
from attnhub import Causal, Full, Local  # noqa: E402
from attnhub.frameworks import numpy_dtype  # noqa: E402
from attnhub.operands import Operands  # noqa: E402
from attnhub.request import build_request  # noqa: E402
from attnhub_backends.reference import kernel  # noqa: E402

#: SPEC §6 (forward, gradient) tolerances.
TOL = {"float64": (1e-10, 1e-9), "float32": (2e-5, 1e-4), "float16": (2e-3, 8e-3), "bfloat16": (1.6e-2, 4e-2)}

RULES = [Full(), Causal(), Local(3), Local(2, log2_stride=1, causal=True), Local(5, log2_stride=2)]
SYNCS = ["none_front", "scale_front", "scale_end", "none_end"]
SHAPES = [((19,), (45,)), ((45,), (19,)), ((6, 5), (3, 10))]


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Small tiles, so that small problems span many tiles, skip some and pack lanes."""
    monkeypatch.setenv("ATTNHUB_JAX_TILES", "8,8")


def canon(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape[0], x.shape[1], -1, x.shape[-1])


def err(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(got), fin), "finite pattern differs from the reference"
    if not fin.any():
        return 0.0
    e = got[fin] - ref[fin]
    nr, mr = np.linalg.norm(ref[fin]), np.abs(ref[fin]).max()
    return max(np.linalg.norm(e) / (nr or 1.0), np.abs(e).max() / (mr or 1.0))


def inputs(rng, dtype, sq, sk, hq=4, hkv=2, b=2, d=8, dv=8, big=False):
    """Rounded N(0, 1) inputs: float64 NumPy copies (for the reference) and jax arrays."""
    npdt = numpy_dtype(dtype)
    q = rng.standard_normal((b, hq, *sq, d)) * (8.0 if big else 1.0)
    k = rng.standard_normal((b, hkv, *sk, d))
    v = rng.standard_normal((b, hkv, *sk, dv))
    xs = [a.astype(npdt).astype(np.float64) for a in (q, k, v)]
    return xs, [jnp.asarray(a.astype(npdt)) for a in xs]


def reference(xs, rule, sync, mask=None, dout=None):
    req, _ = build_request(*xs, rule if mask is None else mask, sync, None, "bhsd", True)
    mc = None if mask is None else mask.reshape(req.bias if req.bias is not None else req.rule.shape)
    # A float mask is the bias (SPEC §9): it travels as an operand, a boolean one as the mask.
    ops = Operands(bias=mc) if req.bias is not None else None
    mc = None if ops is not None else mc
    out, lse = kernel.forward(*(canon(x) for x in xs), req, mc, ops)
    grads = None
    if dout is not None:
        grads = kernel.backward(*(canon(x) for x in xs), canon(dout), req, mc, None, ops)[:3]
    return out, lse, grads


def grads_of(js, rule, sync, dout, **kw):
    def loss(q, k, v):
        out = attnhub.attention(q, k, v, mask=rule, sync=sync, backend="jax", **kw)
        return jnp.sum(out.astype(jnp.float32 if out.dtype != jnp.float64 else out.dtype) * dout)

    return jax.grad(loss, argnums=(0, 1, 2))(*js)


#: rules x sync on the 1-d cross-attention shape; a sample of them on the others (CI time).
FORWARD_CASES = [(r, s, SHAPES[0]) for r in RULES for s in SYNCS] + [
    (r, s, shape) for r in RULES[1:] for s, shape in (("scale_end", SHAPES[1]), ("none_end", SHAPES[2]))
]


@pytest.mark.parametrize(
    "rule,sync,shape",
    FORWARD_CASES,
    ids=[f"{r.describe()}-{s}-{'x'.join(map(str, sh[0]))}" for r, s, sh in FORWARD_CASES],
)
def test_forward_matches_reference(rng, rule, sync, shape):
    xs, js = inputs(rng, "float32", *shape, big=rule == Causal())
    out, lse = attnhub.attention(*js, mask=rule, sync=sync, backend="jax", return_lse=True)
    ref_out, ref_lse, _ = reference(xs, rule, sync)
    assert out.dtype == jnp.float32 and lse.dtype == jnp.float32
    assert out.shape == xs[0].shape[:-1] + (8,)
    assert err(canon(np.asarray(out)), ref_out) < TOL["float32"][0]
    assert err(np.asarray(lse).reshape(ref_lse.shape), ref_lse) < TOL["float32"][0]


@pytest.mark.parametrize(
    "rule,sync,shape",
    [
        (Causal(), "none_end", ((45,), (19,))),
        (Local(2, log2_stride=1, causal=True), "scale_end", ((19,), (45,))),
        (Local((2, 3)), "scale_front", ((6, 5), (3, 10))),
        (Full(), "none_front", ((13,), (21,))),
    ],
    ids=["causal-none_end", "local-stride-causal-scale_end", "local2d", "full"],
)
def test_grad_matches_reference(rng, rule, sync, shape):
    xs, js = inputs(rng, "float32", *shape, hq=6, hkv=2, dv=5)
    dout = rng.standard_normal(xs[0].shape[:-1] + (5,)).astype(np.float32).astype(np.float64)
    got = grads_of(js, rule, sync, jnp.asarray(dout, jnp.float32))
    _, _, ref = reference(xs, rule, sync, dout=dout)
    for g, r in zip(got, ref):
        assert err(canon(np.asarray(g)), r) < TOL["float32"][1]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_dtypes_forward_and_grad(rng, dtype):
    rule, sync, shape = Local(4, causal=True), "scale_end", ((24,), (40,))
    with jax.enable_x64(dtype == "float64"):
        xs, js = inputs(rng, dtype, *shape, hq=4, hkv=1, big=True)
        dout = rng.standard_normal(xs[0].shape[:-1] + (8,)).astype(numpy_dtype(dtype)).astype(np.float64)
        out, lse = attnhub.attention(*js, mask=rule, sync=sync, backend="jax", return_lse=True)
        got = grads_of(js, rule, sync, jnp.asarray(dout, out.dtype))
        assert out.dtype == js[0].dtype
        assert lse.dtype == (jnp.float64 if dtype == "float64" else jnp.float32)
        assert all(g.dtype == js[0].dtype for g in got)
        f64 = [
            np.asarray(x.astype(jnp.float64 if dtype == "float64" else jnp.float32)) for x in (out, lse, *got)
        ]
    ref_out, ref_lse, ref_g = reference(xs, rule, sync, dout=dout)
    fwd, bwd = TOL[dtype]
    assert err(canon(f64[0]), ref_out) < fwd
    assert err(f64[1].reshape(ref_lse.shape), ref_lse) < fwd
    for g, r in zip(f64[2:], ref_g):
        assert err(canon(g), r) < bwd


def test_fully_masked_rows_are_zero_with_zero_grads(rng):
    rule, sync = Causal(), "none_end"  # Lq > Lk: the first Lq - Lk queries see no key
    xs, js = inputs(rng, "float32", (30,), (12,))
    out, lse = attnhub.attention(*js, mask=rule, sync=sync, backend="jax", return_lse=True)
    dead = np.isneginf(np.asarray(lse))
    assert dead[:, :, :18].all() and not dead[:, :, 18:].any()
    assert np.all(np.asarray(out)[:, :, :18] == 0)
    dout = rng.standard_normal((2, 4, 30, 8))
    g = grads_of(js, rule, sync, jnp.asarray(dout, jnp.float32))
    assert all(np.isfinite(np.asarray(x)).all() for x in g)
    assert np.all(np.asarray(g[0])[:, :, :18] == 0)
    _, _, ref = reference(xs, rule, sync, dout=dout)
    for x, r in zip(g, ref):
        assert err(canon(np.asarray(x)), r) < TOL["float32"][1]


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("mshape", ["full", "bcast", "per-key"])
def test_explicit_masks(rng, kind, mshape):
    xs, js = inputs(rng, "float32", (17,), (23,))
    b, hq, nq, nk = 2, 4, 17, 23
    shape = {"full": (b, hq, nq, nk), "bcast": (1, 1, nq, nk), "per-key": (b, 1, 1, nk)}[mshape]
    if kind == "bool":
        m = rng.random(shape) < 0.6
        if mshape != "per-key":
            m[..., 3, :] = False  # a fully masked row
    else:
        m = (rng.standard_normal(shape) * 2).astype(np.float32).astype(np.float64)
        m[rng.random(shape) < 0.2] = -np.inf
    jm = jnp.asarray(m if kind == "bool" else m.astype(np.float32))
    out, lse = attnhub.attention(*js, mask=jm, backend="jax", return_lse=True)
    dout = rng.standard_normal((b, hq, nq, 8))
    ref_out, ref_lse, ref_g = reference(xs, None, "none_front", mask=m, dout=dout)
    assert err(np.asarray(out), ref_out) < TOL["float32"][0]
    assert err(np.asarray(lse), ref_lse) < TOL["float32"][0]
    g = grads_of(js, jm, "none_front", jnp.asarray(dout, jnp.float32))
    for x, r in zip(g, ref_g):
        assert err(np.asarray(x), r) < TOL["float32"][1]


def test_jit_matches_eager_and_traces_once(rng):
    xs, js = inputs(rng, "bfloat16", (33,), (33,), big=True)
    rule = Local(4, log2_stride=1)
    traces = []

    @jax.jit
    def f(q, k, v):
        traces.append(1)
        return attnhub.attention(q, k, v, mask=rule, sync="scale_end", backend="jax", return_lse=True)

    out, lse = f(*js)
    out2, lse2 = f(*js)
    eager, eager_lse = attnhub.attention(*js, mask=rule, sync="scale_end", backend="jax", return_lse=True)
    assert len(traces) == 1
    assert np.array_equal(np.asarray(out2, np.float32), np.asarray(eager, np.float32))
    ref_out, ref_lse, _ = reference(xs, rule, "scale_end")
    assert err(canon(np.asarray(out, np.float32)), ref_out) < TOL["bfloat16"][0]
    assert err(np.asarray(lse), ref_lse) < TOL["bfloat16"][0]


def test_explain_under_jit_names_jax_and_path(rng):
    _, js = inputs(rng, "float32", (16,), (16,))
    seen = {}

    def f(q, k, v):
        e = attnhub.explain(q, k, v, mask="causal")
        seen["chosen"] = e.chosen
        seen["text"] = str(e)
        seen["symbolic"] = e.request.symbolic
        return attnhub.attention(q, k, v, mask="causal")

    jax.jit(f)(*js)
    assert seen["symbolic"] and seen["chosen"] == "jax"
    assert "path=blockwise" in seen["text"]


def test_vmap_over_an_extra_axis(rng):
    xs, js = inputs(rng, "float32", (20,), (20,))
    stack = [jnp.stack([x, x * 0.5 + 1]) for x in js]
    rule = Local(3, causal=True)
    f = jax.vmap(lambda q, k, v: attnhub.attention(q, k, v, mask=rule, backend="jax"))
    out = f(*stack)
    for i in range(2):
        one = attnhub.attention(*(s[i] for s in stack), mask=rule, backend="jax")
        np.testing.assert_allclose(np.asarray(out[i]), np.asarray(one), rtol=1e-6, atol=1e-6)
    # grad of a vmapped call
    g = jax.grad(lambda q: jnp.sum(f(q, stack[1], stack[2]) ** 2))(stack[0])
    g0 = jax.grad(lambda q: jnp.sum(attnhub.attention(q, js[1], js[2], mask=rule, backend="jax") ** 2))(js[0])
    np.testing.assert_allclose(np.asarray(g[0]), np.asarray(g0), rtol=1e-5, atol=1e-5)


def test_gradient_through_lse_matches_dense_autodiff(rng):
    xs, js = inputs(rng, "float32", (12,), (20,))
    rule = Local(3, log2_stride=1)
    w = jnp.asarray(rng.standard_normal((2, 4, 12)), jnp.float32)

    def mine(q, k, v):
        out, lse = attnhub.attention(q, k, v, mask=rule, backend="jax", return_lse=True)
        return jnp.sum(out**2) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * w)

    def dense(q, k, v):
        keep = jnp.asarray(attnhub.positions.dense_rule_mask(rule, (12,), (20,), "none_front"))
        kk, vv = (jnp.repeat(x, 2, axis=1) for x in (k, v))
        s = jnp.einsum("bhqd,bhkd->bhqk", q, kk, precision="highest") / np.sqrt(8)
        s = jnp.where(keep, s, -jnp.inf)
        lse = jax.nn.logsumexp(s, axis=-1)
        out = jnp.einsum("bhqk,bhkd->bhqd", jnp.exp(s - lse[..., None]), vv, precision="highest")
        return jnp.sum(out**2) + jnp.sum(lse * w)

    got = jax.grad(mine, argnums=(0, 1, 2))(*js)
    want = jax.grad(dense, argnums=(0, 1, 2))(*js)
    for g, r in zip(got, want):
        assert err(np.asarray(g), np.asarray(r)) < 1e-4


def test_layouts_and_2d_bshd(rng):
    xs, js = inputs(rng, "float32", (4, 6), (4, 6), hq=2, hkv=2)
    rule = Local((2, 3), causal=True)
    want = attnhub.attention(*js, mask=rule, backend="jax")
    t = lambda x: jnp.moveaxis(x, 1, 3)  # noqa: E731 - bhsd (5-d) -> bshd
    got = attnhub.attention(*(t(x) for x in js), mask=rule, layout="bshd", backend="jax")
    np.testing.assert_allclose(np.asarray(t(want)), np.asarray(got), rtol=1e-6, atol=1e-6)


def test_auto_picks_jax_for_jax_arrays(rng):
    _, js = inputs(rng, "float32", (8,), (8,))
    assert attnhub.explain(*js).chosen == "jax"


def test_nan_propagates_never_invented(rng):
    xs, js = inputs(rng, "float32", (16,), (16,))
    q = js[0].at[0, 0, 3, 0].set(jnp.nan)
    out = np.asarray(attnhub.attention(q, js[1], js[2], mask="causal", backend="jax"))
    assert np.isnan(out[0, 0, 3]).all()
    clean = np.ones(out.shape, bool)
    clean[0, 0, 3] = False
    assert np.isfinite(out[clean]).all()


@pytest.mark.parametrize("tiles", ["8,8", "5,7", "64,64"])
def test_tile_sizes_do_not_change_results(rng, monkeypatch, tiles):
    monkeypatch.setenv("ATTNHUB_JAX_TILES", tiles)
    xs, js = inputs(rng, "float32", (6, 5), (3, 10))
    rule = Local((2, 2), causal=True)
    out, lse = attnhub.attention(*js, mask=rule, sync="scale_end", backend="jax", return_lse=True)
    ref_out, ref_lse, _ = reference(xs, rule, "scale_end")
    assert err(canon(np.asarray(out)), ref_out) < TOL["float32"][0]
    assert err(np.asarray(lse).reshape(ref_lse.shape), ref_lse) < TOL["float32"][0]


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_pallas_kernel_in_interpret_mode(rng, monkeypatch, x64):
    """The GPU Pallas forward kernel's semantics, run by Pallas' interpreter on the CPU."""
    monkeypatch.setenv("ATTNHUB_JAX_PALLAS", "interpret")
    rule, sync = Local((2, 3), log2_stride=1, causal=True), "scale_end"
    xs, js = inputs(rng, "bfloat16", (6, 20), (12, 10), hq=2, hkv=1, d=16, dv=32, big=True)
    note = next(v.note for v in attnhub.explain(*js, mask=rule, sync=sync).verdicts if v.name == "jax")
    assert note.startswith("path=pallas"), note
    with jax.enable_x64(x64):  # index arithmetic must stay int32 under x64 too
        out, lse = attnhub.attention(*js, mask=rule, sync=sync, return_lse=True)
    ref_out, ref_lse, _ = reference(xs, rule, sync)
    assert err(canon(np.asarray(out, np.float32)), ref_out) < TOL["bfloat16"][0]
    assert err(np.asarray(lse).reshape(ref_lse.shape), ref_lse) < TOL["bfloat16"][0]


def _req(**kw):
    from attnhub.request import Request

    base = dict(
        framework="jax", device="cuda:0", dtype="bfloat16", layout="bhsd", batch=2, heads_q=8,
        heads_kv=2, seq_q=(4096,), seq_k=(4096,), dim_qk=128, dim_v=128, rule=Causal(),
        sync="none_front", scale=0.088,
    )  # fmt: skip
    base.update(kw)
    return Request(**base)


@pytest.mark.parametrize(
    "kw,path,why",
    [
        ({}, "cudnn", "serves it exactly"),
        ({"sync": "scale_end"}, "cudnn", "serves it exactly"),  # Sq == Sk: every sync mode agrees
        ({"seq_q": (1024,)}, "pallas", "causal with Sq != Sk"),
        ({"rule": Local(128, log2_stride=1)}, "pallas", "no exact form of local"),
        ({"return_lse": True}, "pallas", "lse rounded"),
        ({"dtype": "float32"}, "blockwise", "float16/bfloat16"),
        ({"rule": Full(), "seq_q": (100,), "seq_k": (300,)}, "cudnn", "serves it exactly"),
        ({"rule": Full(), "seq_q": (31,), "seq_k": (17,)}, "pallas", "even sequence lengths"),
        ({"seq_q": (33,), "seq_k": (33,)}, "pallas", "Lq=33, Lk=33"),
        ({"dim_qk": 100, "dim_v": 100}, "blockwise", "16/32/64/128"),
        ({"device": "cpu"}, "blockwise", "not on an NVIDIA GPU"),
    ],
)
def test_path_choice_and_reasons(kw, path, why):
    from attnhub_backends.jax.backend import JaxBackend

    got, text = JaxBackend().path_for(_req(**kw))
    assert got == path and why in text, text


def test_float64_needs_x64():
    from attnhub_backends.jax.backend import JaxBackend

    with jax.enable_x64(False):
        reasons = JaxBackend().check(_req(dtype="float64", device="cpu"))
    assert any("jax_enable_x64" in r for r in reasons)
    with jax.enable_x64(True):
        assert JaxBackend().check(_req(dtype="float64", device="cpu")) == []
