"""The jax backend's SPEC §9-§11 arguments on the CPU against a float64 dense formula.

bias (+ dbias), softcap, sinks (+ dsinks), q/k lengths (both padding sides, every sync mode),
packed sequences, offsets and paged caches, alone and combined, with GQA and rules, under
``jax.jit`` (every array traced) and ``jax.grad`` (bias and sinks differentiated). The dense
formula is written here: masks from SPEC §2-§3 positions of each valid segment, the forward in
NumPy float64, gradients by JAX autodiff of the same formula in float64.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import attnhub  # noqa: E402
from attnhub import Causal, Full, Local  # noqa: E402
from attnhub.frameworks import numpy_dtype  # noqa: E402
from attnhub.operands import Operands  # noqa: E402
from attnhub.positions import axis_positions, rule_mask  # noqa: E402
from attnhub.request import build_request  # noqa: E402
from attnhub_backends.jax import plan as planning  # noqa: E402
from attnhub_backends.jax.backend import JaxBackend  # noqa: E402

TOL = {"float64": (1e-10, 1e-9), "float32": (2e-5, 1e-4), "float16": (2e-3, 8e-3), "bfloat16": (1.6e-2, 4e-2)}
BACKEND = JaxBackend()
SYNCS = ["none_front", "scale_front", "scale_end", "none_end"]


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Small tiles, so that small problems span many tiles, skip some and pack lanes."""
    monkeypatch.setenv("ATTNHUB_JAX_TILES", "8,8")


# ---- the dense float64 formula ----------------------------------------------------------------
def segment_mask(rule, lq: int, lk: int, sync: str, qo: int = 0, ko: int = 0) -> np.ndarray:
    """(lq, lk) bool: the rule on one valid segment (SPEC §2 positions of the segment, §11 offsets)."""
    pq, pk = axis_positions(lq, lk, sync)
    pq, pk = pq + qo, pk + ko
    return rule_mask(rule, [pq], [pk], pq, pk)


def padded_keep(rule, sync, nq, nk, qlens, klens, side, qo=0, ko=0):
    """(B, 1, nq, nk) keep and (B, 1, nq) valid-row masks of a padded batch."""
    b = len(qlens)
    keep = np.zeros((b, 1, nq, nk), bool)
    rows = np.zeros((b, 1, nq), bool)
    for i, (lq, lk) in enumerate(zip(qlens, klens)):
        q0 = 0 if side == "right" else nq - lq
        k0 = 0 if side == "right" else nk - lk
        keep[i, 0, q0 : q0 + lq, k0 : k0 + lk] = segment_mask(rule, lq, lk, sync, qo, ko)
        rows[i, 0, q0 : q0 + lq] = True
    return keep, rows


def packed_keep(rule, sync, cu_q, cu_k):
    """(1, 1, Tq, Tk) block-diagonal keep of packed sequences."""
    keep = np.zeros((1, 1, cu_q[-1], cu_k[-1]), bool)
    for n in range(len(cu_q) - 1):
        a, b, c, d = cu_q[n], cu_q[n + 1], cu_k[n], cu_k[n + 1]
        keep[0, 0, a:b, c:d] = segment_mask(rule, b - a, d - c, sync)
    return keep


def dense(xp, q, k, v, keep, scale, bias=None, softcap=None, sinks=None, rows=None):
    """(out, lse) of SPEC §4 and §9 on dense arrays (``xp``: numpy or jax.numpy, float64)."""
    g = q.shape[1] // k.shape[1]
    k, v = xp.repeat(k, g, axis=1), xp.repeat(v, g, axis=1)
    s = scale * xp.einsum("bhqd,bhkd->bhqk", q, k, optimize=True)
    if softcap is not None:
        s = softcap * xp.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    s = xp.where(keep, s, -np.inf)
    m = s.max(axis=-1)
    if sinks is not None:
        m = xp.maximum(m, sinks[None, :, None])
    m = xp.where(xp.isfinite(m), m, 0.0)
    e = xp.exp(s - m[..., None])
    den = e.sum(axis=-1)
    if sinks is not None:
        den = den + xp.exp(sinks[None, :, None] - m)
    empty = den == 0
    safe = xp.where(empty, 1.0, den)
    out = xp.einsum("bhqk,bhkd->bhqd", e / safe[..., None], v, optimize=True)
    lse = xp.where(empty, -np.inf, xp.log(safe) + m)
    if rows is not None:
        out = xp.where(rows[..., None], out, 0.0)
        lse = xp.where(rows, lse, -np.inf)
    return out, lse


def loss_of(out, lse, dout, dlse, xp):
    return (out * dout).sum() + (xp.where(xp.isfinite(lse), lse, 0.0) * dlse).sum()


def dense_grads(xs, keep, scale, bias, softcap, sinks, rows, dout, dlse):
    """Gradients of loss_of by JAX autodiff of the dense formula in float64."""
    with jax.enable_x64(True):
        args = [jnp.asarray(x, jnp.float64) for x in xs]
        b = None if bias is None else jnp.asarray(bias, jnp.float64)
        s = None if sinks is None else jnp.asarray(sinks, jnp.float64)

        def loss(q, k, v, b, s):
            o, lse = dense(jnp, q, k, v, keep, scale, b, softcap, s, rows)
            return loss_of(o, lse, dout, dlse, jnp)

        gs = jax.grad(loss, argnums=(0, 1, 2, 3, 4))(*args, b, s)
        return [None if g is None else np.asarray(g) for g in gs]


def err(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(got), fin), "finite pattern differs from the formula"
    assert np.array_equal(got[~fin], ref[~fin]), "infinite entries differ"
    if not fin.any():
        return 0.0
    e = got[fin] - ref[fin]
    nr, mr = np.linalg.norm(ref[fin]), np.abs(ref[fin]).max()
    return max(np.linalg.norm(e) / (nr or 1.0), np.abs(e).max() / (mr or 1.0))


# ---- calling the backend ----------------------------------------------------------------------
def rounded(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(numpy_dtype(dtype)).astype(np.float64)


def make_request(xs, rule, sync, dtype, **fields):
    """The request of ``xs`` (float64 NumPy, canonical) with the §9-§11 fields set."""
    with jax.enable_x64(dtype == "float64"):
        q, k, v = (jnp.zeros(x.shape, dtype) for x in xs)
        req, _ = build_request(q, k, v, rule, sync, None, "bhsd", True)
    return replace(req, **fields)


def call(req, js, mask=None, **ops):
    """(out, lse) of the jax backend through ``run`` (the custom_vjp path)."""
    return BACKEND.run(*js, req, mask, Operands(**ops))


def check_case(
    rng,
    rule,
    sync,
    *,
    dtype="float32",
    b=2,
    hq=4,
    hkv=2,
    nq=19,
    nk=27,
    d=8,
    dv=8,
    bias_shape=None,
    softcap=None,
    sinks=False,
    qlens=None,
    klens=None,
    side="right",
    qo=0,
    ko=0,
    big=False,
    cu=None,
    path=None,
):
    """Forward (out, lse) and gradients (q, k, v, bias, sinks) against the dense formula; with
    ``path``, the request must run on that path of the backend."""
    if cu is not None:
        b, nq, nk = 1, cu[0][-1], cu[1][-1]
    xs = [
        rounded(rng, (b, hq, nq, d), dtype, 8.0 if big else 1.0),
        rounded(rng, (b, hkv, nk, d), dtype),
        rounded(rng, (b, hkv, nk, dv), dtype),
    ]
    bias = None if bias_shape is None else rounded(rng, bias_shape, "float32", 2.0)
    sk = rounded(rng, (hq,), "float32", 2.0) if sinks else None
    fields = {"softcap": softcap, "q_offset": qo, "k_offset": ko}
    if bias is not None:
        fields.update(bias=tuple(bias.shape), bias_grad=True)
    if sinks:
        fields.update(sinks=True, sinks_grad=True)
    ops = {}
    if cu is not None:
        fields["varlen"] = True
        ops = {"cu_seqlens_q": jnp.asarray(cu[0], jnp.int32), "cu_seqlens_k": jnp.asarray(cu[1], jnp.int32)}
        ops.update(max_seqlen_q=int(np.diff(cu[0]).max()), max_seqlen_k=int(np.diff(cu[1]).max()))
        keep, rows = packed_keep(rule, sync, *cu), None
    else:
        ql = [nq] * b if qlens is None else qlens
        kl = [nk] * b if klens is None else klens
        keep, rows = padded_keep(rule, sync, nq, nk, ql, kl, side, qo, ko)
        if qlens is not None:
            fields["q_lengths"] = True
            ops["q_lengths"] = jnp.asarray(qlens, jnp.int32)
        if klens is not None:
            fields["k_lengths"] = True
            ops["k_lengths"] = jnp.asarray(klens, jnp.int32)
        fields["padding_side"] = side
    req = make_request(xs, rule, sync, dtype, **fields)
    if path is not None:
        assert BACKEND.path_for(req)[0] == path, BACKEND.path_for(req)
    dout = rounded(rng, (b, hq, nq, dv), dtype)
    dlse = rounded(rng, (b, hq, nq), "float32")
    ref_out, ref_lse = dense(np, *xs, keep, req.scale, bias, softcap, sk, rows)
    ref_g = dense_grads(xs, keep, req.scale, bias, softcap, sk, rows, dout, dlse)

    with jax.enable_x64(dtype == "float64"):
        js = [jnp.asarray(x, dtype) for x in xs]
        wide = jnp.float64 if dtype == "float64" else jnp.float32
        jb = None if bias is None else jnp.asarray(bias, wide)
        js_ = None if sk is None else jnp.asarray(sk, wide)

        def f(q, k, v, bias, sinks):
            return call(req, (q, k, v), bias=bias, sinks=sinks, **ops)

        out, lse = f(*js, jb, js_)

        def loss(q, k, v, bias, sinks):
            o, l = f(q, k, v, bias, sinks)
            acc = jnp.float64 if dtype == "float64" else jnp.float32
            return loss_of(o.astype(acc), l.astype(acc), jnp.asarray(dout, acc), jnp.asarray(dlse, acc), jnp)

        grads = jax.grad(loss, argnums=(0, 1, 2, 3, 4))(*js, jb, js_)
        got = [np.asarray(x, np.float64) for x in (out, lse)]
        got_g = [None if g is None else np.asarray(g, np.float64) for g in grads]
    fwd, bwd = TOL[dtype]
    assert out.dtype == js[0].dtype and out.shape == (b, hq, nq, dv)
    assert err(got[0], ref_out) < fwd
    assert err(got[1], ref_lse) < fwd
    for name, g, r in zip(("dq", "dk", "dv", "dbias", "dsinks"), got_g, ref_g):
        if r is None:
            assert g is None
            continue
        assert g.shape == r.shape, name
        assert err(g, r) < bwd, name
    if rows is not None:  # padded query rows: out 0, lse -inf, zero gradient
        pad = ~np.broadcast_to(rows, got[1].shape)
        assert np.all(got[0][pad] == 0) and np.all(np.isneginf(got[1][pad]))
        assert np.all(got_g[0][pad] == 0)
    return req


RULES = [Full(), Causal(), Local(3), Local(2, log2_stride=1, causal=True)]


# ---- §9 bias ----------------------------------------------------------------------------------
BIAS_SHAPES = [(2, 4, 19, 27), (1, 4, 1, 27), (2, 1, 19, 1), (1, 1, 19, 27), (1, 1, 1, 1)]


@pytest.mark.parametrize("bias_shape", BIAS_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(
    "rule,sync", [(Causal(), "none_end"), (Local(3), "scale_end"), (Full(), "none_front")], ids=str
)
def test_bias_and_dbias(rng, bias_shape, rule, sync):
    check_case(rng, rule, sync, bias_shape=bias_shape)


def test_bias_minus_inf_excludes_and_gqa_mqa(rng):
    """A bias of -inf on a whole row gives a fully masked row (out 0, lse -inf); MQA (Hkv 1)."""
    xs = [rounded(rng, s, "float32") for s in ((1, 3, 9, 8), (1, 1, 12, 8), (1, 1, 12, 8))]
    bias = rounded(rng, (1, 3, 9, 12), "float32")
    bias[0, 1, 4, :] = -np.inf
    bias[0, 2, :, 5] = -np.inf
    req = make_request(xs, Causal(), "none_end", "float32", bias=bias.shape, bias_grad=True)
    out, lse = call(req, [jnp.asarray(x, jnp.float32) for x in xs], bias=jnp.asarray(bias, jnp.float32))
    keep, _ = padded_keep(Causal(), "none_end", 9, 12, [9], [12], "right")
    ref_out, ref_lse = dense(np, *xs, keep, req.scale, bias)
    assert np.isneginf(np.asarray(lse)[0, 1, 4]) and np.all(np.asarray(out)[0, 1, 4] == 0)
    assert err(out, ref_out) < 2e-5 and err(lse, ref_lse) < 2e-5


# ---- §9 softcap and sinks ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "rule,sync", [(Causal(), "none_front"), (Local(2, log2_stride=1, causal=True), "scale_front")], ids=str
)
def test_softcap(rng, rule, sync):
    check_case(rng, rule, sync, softcap=5.0, big=True)


@pytest.mark.parametrize("rule,sync", [(Causal(), "none_end"), (Local(3), "none_front")], ids=str)
def test_sinks(rng, rule, sync):
    check_case(rng, rule, sync, sinks=True, big=True)


def test_sinks_on_fully_masked_rows(rng):
    """Causal none_end with Lq > Lk: rows without keys give out 0 and lse = sinks[h]."""
    req = check_case(rng, Causal(), "none_end", nq=27, nk=11, sinks=True)
    assert req.sinks


@pytest.mark.parametrize("rule", RULES, ids=str)
def test_bias_softcap_sinks_together(rng, rule):
    check_case(rng, rule, "scale_end", bias_shape=(1, 4, 19, 27), softcap=3.0, sinks=True, hq=4, hkv=1)


# ---- §10 lengths ------------------------------------------------------------------------------
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("sync", SYNCS)
def test_lengths_every_sync(rng, side, sync):
    check_case(
        rng, Local(2, log2_stride=1, causal=True), sync, b=3, qlens=[19, 0, 7], klens=[13, 27, 20], side=side
    )


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("rule", [Causal(), Full()], ids=str)
def test_lengths_with_bias_softcap_sinks(rng, side, rule):
    check_case(
        rng, rule, "none_end", b=3, qlens=[5, 19, 1], klens=[0, 27, 9], side=side,
        bias_shape=(3, 1, 19, 27), softcap=4.0, sinks=True,
    )  # fmt: skip


@pytest.mark.parametrize("which", ["q", "k"])
def test_one_side_lengths(rng, which):
    lens = {"qlens": [3, 19]} if which == "q" else {"klens": [27, 4]}
    check_case(rng, Causal(), "none_end", side="left", **lens)


def test_lengths_float64(rng):
    with jax.enable_x64(True):
        check_case(
            rng, Causal(), "none_end", dtype="float64", b=2, qlens=[19, 6], klens=[11, 27],
            bias_shape=(2, 4, 19, 27), softcap=6.0, sinks=True, big=True,
        )  # fmt: skip


# ---- §10 packed sequences ---------------------------------------------------------------------
VARLEN = [
    ([0, 5, 5, 17, 20], [0, 9, 12, 30, 30]),  # an empty query sequence, an empty key sequence
    ([0, 1, 2, 3], [0, 10, 11, 25]),  # decoding: one query per sequence
]


@pytest.mark.parametrize("cu", VARLEN, ids=["mixed", "decode"])
@pytest.mark.parametrize(
    "rule,sync", [(Causal(), "none_end"), (Local(3), "scale_front"), (Full(), "none_front")], ids=str
)
def test_varlen(rng, cu, rule, sync):
    check_case(rng, rule, sync, cu=cu)


def test_varlen_with_bias_softcap_sinks(rng):
    cu = VARLEN[0]
    check_case(rng, Causal(), "none_front", cu=cu, bias_shape=(1, 4, 20, 30), softcap=2.0, sinks=True)


# ---- §11 offsets ------------------------------------------------------------------------------
@pytest.mark.parametrize("qo,ko", [(13, 0), (0, 9), (21, 5), (3, 40)])
@pytest.mark.parametrize("rule", [Causal(), Local(4, log2_stride=1, causal=True), Local(5)], ids=str)
def test_offsets(rng, qo, ko, rule):
    check_case(rng, rule, "none_front", qo=qo, ko=ko)


def test_offsets_with_right_padding(rng):
    check_case(
        rng, Causal(), "none_front", qo=17, ko=2, qlens=[4, 19], klens=[27, 10], bias_shape=(1, 1, 19, 27)
    )


@pytest.mark.parametrize("rule", [Causal(), Local(3), Local(4, log2_stride=2, causal=True)], ids=str)
@pytest.mark.parametrize("qo,ko", [(0, 0), (13, 0), (0, 9), (30, 2)])
def test_shifted_plan_covers_every_attended_pair(rule, qo, ko):
    nq, nk, bq, bk = 37, 53, 8, 16
    pairs = planning.shifted_pairs(rule, nq, nk, qo, ko, bq, bk)
    keep = segment_mask(rule, nq, nk, "none_front", qo, ko)
    for i in range(len(pairs)):
        for j in range(-(-nk // bk)):
            if keep[i * bq : (i + 1) * bq, j * bk : (j + 1) * bk].any():
                assert j in pairs[i]


# ---- §10 paged KV cache -----------------------------------------------------------------------
def test_paged_cache_matches_gathered_keys(rng):
    """k/v (num_blocks, block_size, Hkv, D) read through a block table, k_lengths, none_end."""
    b, hq, hkv, d, bs, nblocks, mb = 2, 4, 2, 8, 4, 9, 3
    q = rounded(rng, (b, hq, 3, d), "float32")
    kc = rounded(rng, (nblocks, bs, hkv, d), "float32")
    vc = rounded(rng, (nblocks, bs, hkv, d), "float32")
    table = np.array([[7, 2, 5], [0, 8, 1]], np.int32)
    klens = np.array([10, 5], np.int32)
    kg = np.transpose(kc[table].reshape(b, mb * bs, hkv, d), (0, 2, 1, 3))
    vg = np.transpose(vc[table].reshape(b, mb * bs, hkv, d), (0, 2, 1, 3))
    req = make_request([q, kg, vg], Causal(), "none_end", "float32", paged=bs, k_lengths=True)
    keep, _ = padded_keep(Causal(), "none_end", 3, mb * bs, [3, 3], list(klens), "right")
    ref_out, ref_lse = dense(np, q, kg, vg, keep, req.scale)
    dout = rounded(rng, ref_out.shape, "float32")

    def f(q, kc, vc, table, klens):
        ops = Operands(k_lengths=klens, block_table=table)
        return BACKEND.run(q, kc, vc, req, None, ops)

    js = [jnp.asarray(x, jnp.float32) for x in (q, kc, vc)]
    out, lse = jax.jit(f)(*js, jnp.asarray(table), jnp.asarray(klens))
    assert err(out, ref_out) < 2e-5 and err(lse, ref_lse) < 2e-5
    gk = jax.grad(lambda kc: (f(js[0], kc, js[2], jnp.asarray(table), jnp.asarray(klens))[0] * dout).sum())(
        js[1]
    )
    with jax.enable_x64(True):

        def ref_loss(kc):
            kg = jnp.transpose(kc[table].reshape(b, mb * bs, hkv, d), (0, 2, 1, 3))
            return (dense(jnp, jnp.asarray(q), kg, jnp.asarray(vg), keep, req.scale)[0] * dout).sum()

        ref_gk = np.asarray(jax.grad(ref_loss)(jnp.asarray(kc)))
    assert err(gk, ref_gk) < 1e-4
    assert np.all(np.asarray(gk)[[3, 4, 6]] == 0)  # blocks no table entry reads


# ---- jit and grad with traced arrays ----------------------------------------------------------
def test_jit_with_every_array_traced(rng):
    """bias, sinks, lengths traced by jax.jit, bias and sinks differentiated under jit: equal to
    the eager call, and no host value needed (new lengths reuse the compiled function)."""
    xs = [rounded(rng, s, "float32") for s in ((2, 4, 19, 8), (2, 2, 27, 8), (2, 2, 27, 8))]
    bias = rounded(rng, (2, 1, 19, 27), "float32")
    sinks = rounded(rng, (4,), "float32")
    req = make_request(
        xs, Local(3, causal=True), "none_end", "float32", bias=bias.shape, bias_grad=True,
        softcap=7.0, sinks=True, sinks_grad=True, q_lengths=True, k_lengths=True, padding_side="left",
    )  # fmt: skip
    js = [jnp.asarray(x, jnp.float32) for x in xs]

    def loss(bias, sinks, ql, kl):
        out, lse = call(req, js, bias=bias, sinks=sinks, q_lengths=ql, k_lengths=kl)
        return (out**2).sum() + jnp.where(jnp.isfinite(lse), lse, 0.0).sum()

    args = (jnp.asarray(bias), jnp.asarray(sinks))
    for ql, kl in (([19, 4], [27, 13]), ([0, 11], [6, 0])):
        lens = (jnp.asarray(ql, jnp.int32), jnp.asarray(kl, jnp.int32))
        traced = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(*args, *lens)
        eager = jax.value_and_grad(loss, argnums=(0, 1))(*args, *lens)
        assert np.allclose(traced[0], eager[0], rtol=1e-5)
        for a, e in zip(traced[1], eager[1]):
            assert np.allclose(a, e, rtol=1e-4, atol=1e-6)
        keep, rows = padded_keep(Local(3, causal=True), "none_end", 19, 27, ql, kl, "left")
        with jax.enable_x64(True):

            def ref(bias, sinks, keep=keep, rows=rows):
                out, lse = dense(jnp, *(jnp.asarray(x) for x in xs), keep, req.scale, bias, 7.0, sinks, rows)
                return (out**2).sum() + jnp.where(jnp.isfinite(lse), lse, 0.0).sum()

            rb, rs = jax.grad(ref, argnums=(0, 1))(
                jnp.asarray(bias, jnp.float64), jnp.asarray(sinks, jnp.float64)
            )
        assert err(traced[1][0], np.asarray(rb)) < 1e-4
        assert err(traced[1][1], np.asarray(rs)) < 1e-4


# ---- declines and paths -----------------------------------------------------------------------
def test_declines_ragged_2d_and_pallas_cudnn_fall_back(rng, monkeypatch):
    q = jnp.zeros((1, 2, 4, 4, 8), jnp.float32)
    req, _ = build_request(q, q, q, Causal(), "none_front", None, "bhsd", False)
    reasons = BACKEND.check(replace(req, q_lengths=True))
    assert any("1-d only" in r for r in reasons)
    xs = [np.zeros((1, 2, 16, 16)) for _ in range(3)]
    r16 = make_request(xs, Full(), "none_front", "float32", bias=(1, 1, 16, 16))
    assert not BACKEND.check(r16)
    from attnhub_backends.jax import cudnn, pallas

    for r in (
        r16,
        replace(r16, bias=None, k_lengths=True, padding_side="left"),
        replace(r16, bias=None, varlen=True),
    ):
        gpu = replace(r, device="cuda:0", dtype="bfloat16")
        assert cudnn.obstacles(gpu) and any("takes no" in w for w in pallas.obstacles(gpu))
    for r in (replace(r16, bias=None, softcap=2.0, sinks=True), replace(r16, bias=None, q_offset=3)):
        gpu = replace(r, device="cuda:0", dtype="bfloat16")
        assert cudnn.obstacles(gpu) and not pallas.obstacles(gpu)
    right = replace(r16, bias=None, device="cuda:0", dtype="bfloat16", k_lengths=True, return_lse=False)
    assert cudnn.obstacles(right) == [
        "cuDNN with sequence lengths awaits its GPU test (cudnn.LENGTHS_VERIFIED)"
    ]
    monkeypatch.setattr(cudnn, "LENGTHS_VERIFIED", True)
    assert not cudnn.obstacles(right)
    assert cudnn.obstacles(replace(right, padding_side="left"))
    assert cudnn.obstacles(replace(right, rule=Causal()))


@pytest.mark.parametrize(
    "rule,fields",
    [
        (Causal(), {"softcap": 4.0, "sinks": True}),
        (Local(40, causal=True), {"qo": 70, "ko": 3, "sinks": True}),
        (Causal(), {"qo": 0, "ko": 150, "softcap": 9.0}),  # early rows see no key: lse = sinks/-inf
    ],
    ids=["softcap-sinks", "offsets-sinks", "offsets-softcap"],
)
def test_pallas_interpret_softcap_sinks_offsets(rng, monkeypatch, rule, fields):
    """The Pallas kernel (in its interpreter) serves softcap, sinks and offsets."""
    monkeypatch.setenv("ATTNHUB_JAX_PALLAS", "interpret")
    check_case(
        rng,
        rule,
        "none_front",
        dtype="bfloat16",
        b=1,
        hq=2,
        hkv=1,
        nq=130,
        nk=200,
        d=16,
        dv=16,
        path="pallas",
        big=True,
        **fields,
    )


# ---- through the public API against backend="reference" ------------------------------------------
API_CASES = {
    "bias-causal-gqa": ({"mask": "causal", "sync": "none_end"}, {"bias": (2, 1, 9, 12)}),
    "softcap-sinks-local": (
        {"mask": Local(3, causal=True), "sync": "scale_end"},
        {"softcap": 2.5, "sinks": True},
    ),
    "lengths-left-all": (
        {"mask": "causal", "sync": "none_end", "padding_side": "left"},
        {"bias": (1, 4, 9, 12), "softcap": 4.0, "sinks": True, "q_lengths": [9, 2], "k_lengths": [0, 7]},
    ),
    "lengths-right-scale": (
        {"mask": Local(2), "sync": "scale_front"},
        {"q_lengths": [4, 9], "k_lengths": [12, 5]},
    ),
    "offsets": ({"mask": Local(4, causal=True), "q_offset": 7, "k_offset": 2}, {"bias": (2, 1, 9, 12)}),
}


def api_args(rng, spec, dtype):
    """Inputs (float64 NumPy) and the keyword arguments of ``spec``; jax arrays of ``dtype``."""
    xs = [rounded(rng, s, "float32") for s in ((2, 4, 9, 8), (2, 2, 12, 8), (2, 2, 12, 8))]
    arrays, kw = {}, {}
    for name, val in spec.items():
        if name == "bias":
            arrays["bias"] = rounded(rng, val, "float32")
        elif name == "sinks":
            arrays["sinks"] = rounded(rng, (4,), "float32")
        elif name.endswith("lengths"):
            kw[name] = jnp.asarray(val, jnp.int32)
        else:
            kw[name] = val
    return xs, arrays, kw


@pytest.mark.parametrize("case", list(API_CASES))
def test_api_against_reference(rng, case):
    """attnhub.attention(backend="jax") against backend="reference": float64 forward on jax arrays
    (within 1e-10), float32 forward and the gradients (dq, dk, dv, dbias, dsinks; eager and under
    jit) against the reference's torch float64 autograd (lse's gradient: the dense-formula tests)."""
    torch = pytest.importorskip("torch")
    base, spec = API_CASES[case]
    xs, arrays, kw = api_args(rng, spec, "float32")
    names = ("q", "k", "v", *arrays)
    with jax.enable_x64(True):
        j64 = [jnp.asarray(x) for x in (*xs, *arrays.values())]
        kw64 = {n: jnp.asarray(np.asarray(v)) if n.endswith("lengths") else v for n, v in kw.items()}

        def run64(be):
            extra = dict(zip(names[3:], j64[3:]))
            return attnhub.attention(*j64[:3], backend=be, return_lse=True, **base, **kw64, **extra)

        (o_j, l_j), (o_r, l_r) = run64("jax"), run64("reference")
        assert err(o_j, o_r) < 1e-10 and err(l_j, l_r) < 1e-10

    dout = rounded(rng, (2, 4, 9, 8), "float32")
    t64 = [torch.tensor(x, requires_grad=True) for x in (*xs, *arrays.values())]
    tkw = {n: torch.tensor(np.asarray(v)) if n.endswith("lengths") else v for n, v in kw.items()}
    o_t, l_t = attnhub.attention(
        *t64[:3], backend="reference", return_lse=True, **base, **tkw, **dict(zip(names[3:], t64[3:]))
    )
    (o_t * torch.tensor(dout)).sum().backward()  # torch's glue gives lse no gradient
    ref_grads = [t.grad.numpy() for t in t64]

    j32 = [jnp.asarray(x, jnp.float32) for x in (*xs, *arrays.values())]

    def loss(*args):
        out, lse = attnhub.attention(
            *args[:3], backend="jax", return_lse=True, **base, **kw, **dict(zip(names[3:], args[3:]))
        )
        return (out * dout).sum()

    o32, l32 = attnhub.attention(
        *j32[:3], backend="jax", return_lse=True, **base, **kw, **dict(zip(names[3:], j32[3:]))
    )
    assert err(o32, o_t.detach().numpy()) < TOL["float32"][0]
    assert err(l32, l_t.detach().numpy()) < TOL["float32"][0]
    for fn in (jax.grad, lambda f, argnums: jax.jit(jax.grad(f, argnums=argnums))):
        got = fn(loss, argnums=tuple(range(len(j32))))(*j32)
        for n, g, r in zip(names, got, ref_grads):
            assert err(g, r) < TOL["float32"][1], n


@pytest.mark.parametrize("sync", ["none_front", "none_end"])
def test_api_varlen_and_kvcache_against_reference(rng, sync):
    """attention_varlen and attention_kvcache (contiguous and paged) of the jax backend against
    the reference, float64 on jax arrays."""
    cu_q, cu_k = np.array([0, 3, 3, 11], np.int32), np.array([0, 7, 9, 20], np.int32)
    sinks = rounded(rng, (4,), "float32")
    with jax.enable_x64(True):
        q, k, v = (jnp.asarray(rounded(rng, s, "float32")) for s in ((11, 4, 8), (20, 2, 8), (20, 2, 8)))
        args = (q, k, v, jnp.asarray(cu_q), jnp.asarray(cu_k))
        kw = {"mask": "causal", "sync": sync, "softcap": 3.0, "sinks": jnp.asarray(sinks), "return_lse": True}
        (o_j, l_j), (o_r, l_r) = (
            attnhub.attention_varlen(*args, backend=b, **kw) for b in ("jax", "reference")
        )
        assert o_j.shape == (11, 4, 8) and l_j.shape == (4, 11)
        assert err(o_j, o_r) < 1e-10 and err(l_j, l_r) < 1e-10

        qd = jnp.asarray(rounded(rng, (2, 4, 2, 8), "float32"))
        kc, vc = (jnp.asarray(rounded(rng, (2, 2, 16, 8), "float32")) for _ in range(2))
        kl = jnp.asarray([16, 5], jnp.int32)
        kw = {"sinks": jnp.asarray(sinks), "return_lse": True}
        (o_j, l_j), (o_r, l_r) = (
            attnhub.attention_kvcache(qd, kc, vc, kl, backend=b, **kw) for b in ("jax", "reference")
        )
        assert err(o_j, o_r) < 1e-10 and err(l_j, l_r) < 1e-10

        kp, vp = (jnp.asarray(rounded(rng, (7, 4, 2, 8), "float32")) for _ in range(2))
        table = jnp.asarray([[6, 0, 3], [2, 5, 1]], jnp.int32)
        kl = jnp.asarray([11, 4], jnp.int32)
        (o_j, l_j), (o_r, l_r) = (
            attnhub.attention_kvcache(qd, kp, vp, kl, block_table=table, backend=b, **kw)
            for b in ("jax", "reference")
        )
        assert err(o_j, o_r) < 1e-10 and err(l_j, l_r) < 1e-10


def test_api_2d_bias_with_bool_mask_against_reference(rng):
    """A bias on a 2-d sequence composed with a boolean mask (a fully masked row included):
    float64 forward against the reference, dq/dk/dv/dbias against its torch autograd."""
    torch = pytest.importorskip("torch")
    xs = [rounded(rng, s, "float32") for s in ((1, 2, 3, 4, 8), (1, 2, 2, 5, 8), (1, 2, 2, 5, 8))]
    bias = rounded(rng, (1, 2, 12, 10), "float32")
    keep = rng.random((1, 1, 12, 10)) < 0.6
    keep[..., 5, :] = False
    dout = rounded(rng, (1, 2, 3, 4, 8), "float32")
    with jax.enable_x64(True):
        j = [jnp.asarray(x) for x in (*xs, bias)]
        kw = {"mask": jnp.asarray(keep), "sync": "scale_end", "return_lse": True}
        (o_j, l_j), (o_r, l_r) = (
            attnhub.attention(*j[:3], bias=j[3], backend=b, **kw) for b in ("jax", "reference")
        )
        assert err(o_j, o_r) < 1e-10 and err(l_j, l_r) < 1e-10
    t = [torch.tensor(x, requires_grad=True) for x in (*xs, bias)]
    out = attnhub.attention(*t[:3], bias=t[3], mask=torch.tensor(keep), sync="scale_end", backend="reference")
    (out * torch.tensor(dout)).sum().backward()

    def loss(q, k, v, b):
        return (
            attnhub.attention(q, k, v, bias=b, mask=jnp.asarray(keep), sync="scale_end", backend="jax") * dout
        ).sum()

    got = jax.grad(loss, argnums=(0, 1, 2, 3))(*(jnp.asarray(x, jnp.float32) for x in (*xs, bias)))
    for g, r in zip(got, t):
        assert err(g, r.grad.numpy()) < TOL["float32"][1]
