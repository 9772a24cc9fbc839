"""The ``tf`` backend's SPEC §9-§11 arguments (bias/dbias, softcap, sinks/dsinks, q/k lengths with
both padding sides, packed sequences, offsets) against a float64 dense formula written here in
NumPy, forward and backward, eagerly, inside ``tf.function`` (symbolic lengths) and under XLA."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from attnhub import Causal, Full, Local
from attnhub.operands import Operands
from attnhub.positions import axis_positions, rule_mask
from attnhub.request import build_request
from attnhub_backends.tf import tiles

tf = None  # imported by the fixture below: TensorFlow loaded before triton aborts triton's LLVM


@pytest.fixture(autouse=True, scope="module")
def _tensorflow():
    global tf
    tf = pytest.importorskip("tensorflow")


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Small tiles so that short test sequences cross several tiles (and skip some)."""
    monkeypatch.setattr(tiles, "BLOCK_Q", 8)
    monkeypatch.setattr(tiles, "BLOCK_K", 8)


SYNCS = ("none_front", "scale_front", "scale_end", "none_end")
RULES = (Full(), Causal(), Local(3), Local(2, 1, True))
FWD_TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
GRAD_TOL = {"float64": 1e-9, "float32": 1e-4, "float16": 8e-3, "bfloat16": 4e-2}


# ---------------------------------------------------------------- the float64 dense formula


def _keep(rule, sync, nq, nk, lq, lk, side, q_offset=0, k_offset=0):
    """(nq, nk) attended pairs of one entry with lq valid queries and lk valid keys (SPEC §10)."""
    keep = np.zeros((nq, nk), bool)
    pq, pk = axis_positions(lq, lk, sync)
    pq, pk = pq + q_offset, pk + k_offset
    r0, c0 = (0, 0) if side == "right" else (nq - lq, nk - lk)
    if lq and lk:
        keep[r0 : r0 + lq, c0 : c0 + lk] = rule_mask(rule, [pq], [pk], pq, pk)
    valid = np.zeros(nq, bool)
    valid[r0 : r0 + lq] = True
    return keep, valid


def dense(
    q, k, v, *, keep, q_valid=None, scale=None, softcap=None, bias=None, sinks=None, dout=None, dlse=None
):
    """SPEC §9 in float64: (out, lse) and, with ``dout``, the gradients (dq, dk, dv, dbias, dsinks).

    ``keep`` (B|1, Hq|1, Nq, Nk) bool: the pairs the rule, masks and lengths attend; ``q_valid``
    (B, Nq): rows that are queries (others: out 0, lse -inf, no gradient).
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, hq, nq, d = q.shape
    g = hq // k.shape[1]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scale = 1 / np.sqrt(d) if scale is None else scale
    u = scale * np.einsum("bhid,bhjd->bhij", q, kk)
    th = None
    if softcap is not None:
        th = np.tanh(u / softcap)
        u = softcap * th
    s = u if bias is None else u + np.asarray(bias, np.float64)
    s = np.where(keep, s, -np.inf)
    mx = s.max(-1, initial=-np.inf)
    sk = None if sinks is None else np.asarray(sinks, np.float64)[None, :, None]
    if sk is not None:
        mx = np.maximum(mx, sk)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(s - mx[..., None])
    den = e.sum(-1) + (0 if sk is None else np.exp(sk - mx))
    lse = np.where(den > 0, mx + np.log(np.where(den > 0, den, 1)), -np.inf)
    p = np.where(den[..., None] > 0, e / np.where(den > 0, den, 1)[..., None], 0.0)
    qv = np.ones((b, nq), bool) if q_valid is None else np.asarray(q_valid)
    p = np.where(qv[:, None, :, None], p, 0.0)
    lse = np.where(qv[:, None, :], lse, -np.inf)
    out = p @ vv
    if dout is None:
        return out, lse, None
    do = np.where(qv[:, None, :, None], np.asarray(dout, np.float64), 0.0)
    dd = (do * out).sum(-1) - (0 if dlse is None else np.where(qv[:, None, :], dlse, 0.0))
    ds = p * (do @ vv.transpose(0, 1, 3, 2) - dd[..., None])
    dbias = None
    if bias is not None:
        axes = tuple(a for a in range(4) if np.shape(bias)[a] == 1)
        dbias = ds.sum(axis=axes, keepdims=True)
    dsinks = None
    if sk is not None:
        p_sink = np.where(np.isfinite(lse), np.exp(sk - np.where(np.isfinite(lse), lse, 0)), 0.0)
        dsinks = -(p_sink * dd).sum(axis=(0, 2))
    du = ds if th is None else ds * (1 - th**2)
    dq = scale * du @ kk
    dkk = scale * du.transpose(0, 1, 3, 2) @ q
    dvv = p.transpose(0, 1, 3, 2) @ do
    fold = lambda x: x.reshape(b, hq // g, g, *x.shape[2:]).sum(2)  # noqa: E731
    return out, lse, (dq, fold(dkk), fold(dvv), dbias, dsinks)


def padded_keep(rule, sync, b, nq, nk, ql, kl, side, q_offset=0, k_offset=0):
    ql = [nq] * b if ql is None else ql
    kl = [nk] * b if kl is None else kl
    parts = [_keep(rule, sync, nq, nk, ql[i], kl[i], side, q_offset, k_offset) for i in range(b)]
    return np.stack([p[0] for p in parts])[:, None], np.stack([p[1] for p in parts])


# ---------------------------------------------------------------- helpers


def _inputs(rng, b, hq, hkv, nq, nk, d=8, dv=6, big=False):
    q = rng.standard_normal((b, hq, nq, d)) * (8.0 if big else 1.0)
    return q, rng.standard_normal((b, hkv, nk, d)), rng.standard_normal((b, hkv, nk, dv))


def _request(q, k, v, rule, sync, **fields):
    req, _ = build_request(*(tf.constant(x) for x in (q, k, v)), rule, sync, None, "bhsd", True)
    return replace(req, needs_grad=True, **fields)


def _assert_close(got, want, tol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), f"{what}: -inf pattern differs"
    fin = np.isfinite(want)
    assert np.isfinite(got[fin]).all(), f"{what}: non-finite values"
    g, w = got[fin], want[fin]
    if w.size == 0:
        return
    scale_n, scale_m = max(np.linalg.norm(w), 1e-30), max(np.abs(w).max(), 1e-30)
    rel, mx = np.linalg.norm(g - w) / scale_n, np.abs(g - w).max() / scale_m
    assert rel < tol and mx < tol, f"{what}: rel {rel:.2e} max {mx:.2e} tol {tol:.0e}"


def _run(req, q, k, v, ops, dout, dlse, mask=None, dtype="float64", fn=None):
    """The backend's forward_for_grad and backward (as the TF glue calls them)."""
    from attnhub_backends.tf.backend import TFBackend

    be = TFBackend()

    def call(q, k, v, ops, dout, dlse):
        out, lse, saved = be.forward_for_grad(q, k, v, req, mask, operands=ops)
        grads = be.backward(q, k, v, saved, lse, dout, req, mask, dlse=dlse, operands=ops)
        return out, lse, grads

    if fn is not None:
        call = fn(call)
    # half types go through float32 (NumPy has no bfloat16); the values are already rounded
    via = np.float64 if dtype == "float64" else np.float32
    t = [tf.cast(tf.constant(np.asarray(x, via)), dtype) for x in (q, k, v)]
    lse_dtype = "float64" if dtype == "float64" else "float32"
    out, lse, grads = call(
        *t, ops, tf.cast(tf.constant(np.asarray(dout, via)), dtype), tf.constant(dlse.astype(lse_dtype))
    )
    return out.numpy(), lse.numpy(), [None if x is None else x.numpy() for x in grads]


def _check(got, want, dtype="float64", names=("dq", "dk", "dv", "dbias", "dsinks")):
    out, lse, grads = got
    rout, rlse, rgrads = want
    _assert_close(out, rout, FWD_TOL[dtype], "out")
    _assert_close(lse, rlse, FWD_TOL[dtype], "lse")
    for name, g, r in zip(names, grads, rgrads, strict=False):
        if r is None:
            assert g is None, f"{name}: returned but not asked for"
        else:
            assert g is not None, f"{name}: missing"
            _assert_close(g, r, GRAD_TOL[dtype], name)


def _upstream(rng, b, hq, nq, dv):
    return rng.standard_normal((b, hq, nq, dv)), rng.standard_normal((b, hq, nq))


# ---------------------------------------------------------------- the formula itself


def test_dense_formula_matches_finite_differences():
    """The oracle's analytic gradients against central differences (softcap, bias, sinks, lengths)."""
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng, 2, 2, 1, 5, 6, 3, 2)
    bias = rng.standard_normal((1, 2, 5, 6))
    sinks = rng.standard_normal(2)
    keep, qv = padded_keep(Causal(), "none_end", 2, 5, 6, [4, 2], [6, 3], "left")
    dout, dlse = _upstream(rng, 2, 2, 5, 2)
    kw = dict(keep=keep, q_valid=qv, softcap=2.0)

    def loss(q, k, v, bias, sinks):
        out, lse, _ = dense(q, k, v, bias=bias, sinks=sinks, **kw)
        return (out * dout).sum() + np.where(np.isfinite(lse), lse * dlse, 0).sum()

    _, _, grads = dense(q, k, v, bias=bias, sinks=sinks, dout=dout, dlse=dlse, **kw)
    args = [q, k, v, bias, sinks]
    for i, g in enumerate(grads):
        num = np.zeros_like(args[i])
        for idx in np.ndindex(args[i].shape):
            hi = [a.copy() for a in args]
            lo = [a.copy() for a in args]
            hi[i][idx] += 1e-6
            lo[i][idx] -= 1e-6
            num[idx] = (loss(*hi) - loss(*lo)) / 2e-6
        np.testing.assert_allclose(g, num, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- §9 score modifiers

BIAS_SHAPES = [(2, 4, 20, 27), (1, 4, 20, 27), (2, 1, 1, 27), (1, 1, 20, 1), (1, 1, 1, 1), (2, 4, 1, 27)]


@pytest.mark.parametrize("shape", BIAS_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
def test_bias_with_rules_gqa_lse(shape, rule):
    rng = np.random.default_rng(hash((shape, rule.describe())) % 2**32)
    sync = "none_end" if isinstance(rule, Causal) else "scale_front"
    q, k, v = _inputs(rng, 2, 4, 2, 20, 27)
    bias = rng.standard_normal(shape) * 2
    dout, dlse = _upstream(rng, 2, 4, 20, 6)
    keep, _ = padded_keep(rule, sync, 2, 20, 27, None, None, "right")
    req = _request(q, k, v, rule, sync, bias=shape, bias_grad=True)
    got = _run(req, q, k, v, Operands(bias=tf.constant(bias)), dout, dlse)
    _check(got, dense(q, k, v, keep=keep, bias=bias, dout=dout, dlse=dlse))


@pytest.mark.parametrize("sync", SYNCS)
def test_bias_neg_inf_excludes_and_masked_pairs_stay_excluded(sync):
    """-inf in the bias excludes a pair (a whole row too: out 0, lse -inf); a +large bias never
    revives a pair the rule excludes."""
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, 1, 2, 2, 12, 17)
    bias = rng.standard_normal((1, 2, 12, 17)) + 30 * (rng.random((1, 2, 12, 17)) < 0.3)
    bias[rng.random(bias.shape) < 0.2] = -np.inf
    bias[0, 1, 4, :] = -np.inf
    dout, dlse = _upstream(rng, 1, 2, 12, 6)
    keep, _ = padded_keep(Local(3, causal=True), sync, 1, 12, 17, None, None, "right")
    req = _request(q, k, v, Local(3, causal=True), sync, bias=bias.shape, bias_grad=True)
    got = _run(req, q, k, v, Operands(bias=tf.constant(bias)), dout, dlse)
    want = dense(q, k, v, keep=keep, bias=bias, dout=dout, dlse=dlse)
    _check(got, want)
    assert np.isneginf(got[1][0, 1, 4]) and (got[0][0, 1, 4] == 0).all()


def test_bias_without_grad_returns_none_and_float32_bias_with_float32():
    rng = np.random.default_rng(4)
    q, k, v = _inputs(rng, 2, 2, 1, 16, 16)
    bias = rng.standard_normal((2, 1, 16, 16)).astype(np.float32)
    dout, dlse = _upstream(rng, 2, 2, 16, 6)
    keep, _ = padded_keep(Causal(), "none_front", 2, 16, 16, None, None, "right")
    req = _request(q.astype("f4"), k.astype("f4"), v.astype("f4"), Causal(), "none_front", bias=bias.shape)
    got = _run(req, q, k, v, Operands(bias=tf.constant(bias)), dout, dlse, dtype="float32")
    qr, kr, vr = (x.astype("f4") for x in (q, k, v))
    ref = dense(qr, kr, vr, keep=keep, bias=bias, dout=dout.astype("f4"), dlse=dlse.astype("f4"))
    _check(got, (ref[0], ref[1], (*ref[2][:3], None, None)), "float32")


def test_bool_mask_composes_with_bias():
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, 2, 2, 2, 10, 14)
    bias = rng.standard_normal((1, 2, 10, 14))
    mask = rng.random((2, 1, 10, 14)) < 0.6
    dout, dlse = _upstream(rng, 2, 2, 10, 6)
    req, _ = build_request(
        *(tf.constant(x) for x in (q, k, v)), tf.constant(mask), "none_front", None, "bhsd", True
    )
    req = replace(req, needs_grad=True, bias=bias.shape, bias_grad=True)
    got = _run(req, q, k, v, Operands(bias=tf.constant(bias)), dout, dlse, mask=tf.constant(mask))
    _check(got, dense(q, k, v, keep=mask, bias=bias, dout=dout, dlse=dlse))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
@pytest.mark.parametrize("big", [False, True])
def test_softcap(rule, big):
    rng = np.random.default_rng(6 + big)
    q, k, v = _inputs(rng, 2, 4, 1, 19, 23, big=big)
    dout, dlse = _upstream(rng, 2, 4, 19, 6)
    keep, _ = padded_keep(rule, "scale_end", 2, 19, 23, None, None, "right")
    req = _request(q, k, v, rule, "scale_end", softcap=3.5)
    got = _run(req, q, k, v, None, dout, dlse)
    _check(got, dense(q, k, v, keep=keep, softcap=3.5, dout=dout, dlse=dlse), names=("dq", "dk", "dv"))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
@pytest.mark.parametrize("with_bias", [False, True])
def test_sinks_with_softcap_and_bias(rule, with_bias):
    """Sinks, with some fully masked rows (a -inf bias row): out 0 and lse = sinks[h] there."""
    rng = np.random.default_rng(8 + with_bias)
    q, k, v = _inputs(rng, 2, 4, 2, 18, 21, big=True)
    sinks = rng.standard_normal(4) * 3
    sinks[1] = 40.0  # a sink that dominates
    bias = None
    if with_bias:
        bias = rng.standard_normal((2, 1, 18, 21))
        bias[1, 0, 3, :] = -np.inf
    dout, dlse = _upstream(rng, 2, 4, 18, 6)
    keep, _ = padded_keep(rule, "none_end", 2, 18, 21, None, None, "right")
    req = _request(
        q, k, v, rule, "none_end", softcap=5.0, sinks=True, sinks_grad=True,
        bias=None if bias is None else bias.shape, bias_grad=with_bias,
    )  # fmt: skip
    ops = Operands(sinks=tf.constant(sinks), bias=None if bias is None else tf.constant(bias))
    got = _run(req, q, k, v, ops, dout, dlse)
    want = dense(q, k, v, keep=keep, softcap=5.0, sinks=sinks, bias=bias, dout=dout, dlse=dlse)
    _check(got, want)
    if with_bias:
        np.testing.assert_array_equal(got[1][1, :, 3], sinks)
        assert (got[0][1, :, 3] == 0).all()


def test_sinks_on_rows_whose_blocks_attend_nothing():
    """A causal none_front request with Lq > Lk... rows in skipped blocks still get lse = sinks."""
    rng = np.random.default_rng(10)
    q, k, v = _inputs(rng, 1, 2, 1, 24, 8)
    sinks = np.array([-100.0, 1.5])
    mask = Local(2, causal=True)
    dout, dlse = _upstream(rng, 1, 2, 24, 6)
    keep, _ = padded_keep(mask, "none_front", 1, 24, 8, None, None, "right")
    assert not keep[0, 0, 16:].any()  # whole row blocks attend nothing (skipped by the plan)
    req = _request(q, k, v, mask, "none_front", sinks=True, sinks_grad=True)
    got = _run(req, q, k, v, Operands(sinks=tf.constant(sinks)), dout, dlse)
    _check(got, dense(q, k, v, keep=keep, sinks=sinks, dout=dout, dlse=dlse))


# ---------------------------------------------------------------- §10 padded batches


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
def test_lengths(side, sync, rule):
    rng = np.random.default_rng(hash((side, sync, rule.describe())) % 2**32)
    b, nq, nk = 4, 17, 22
    ql, kl = [17, 9, 0, 5], [22, 13, 7, 0]
    q, k, v = _inputs(rng, b, 4, 2, nq, nk)
    dout, dlse = _upstream(rng, b, 4, nq, 6)
    keep, qv = padded_keep(rule, sync, b, nq, nk, ql, kl, side)
    req = _request(q, k, v, rule, sync, q_lengths=True, k_lengths=True, padding_side=side)
    ops = Operands(q_lengths=tf.constant(ql, tf.int32), k_lengths=tf.constant(kl, tf.int32))
    got = _run(req, q, k, v, ops, dout, dlse)
    want = dense(q, k, v, keep=keep, q_valid=qv, dout=dout, dlse=dlse)
    _check(got, want, names=("dq", "dk", "dv"))
    assert (got[0].transpose(0, 2, 1, 3)[~qv] == 0).all()  # padded rows: exactly 0


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("which", ["q", "k"])
def test_one_lengths_with_bias_sinks_softcap(side, which):
    """Only one of q_lengths/k_lengths, composed with bias (grad), sinks (grad) and softcap."""
    rng = np.random.default_rng(11)
    b, nq, nk = 3, 13, 19
    lens = [13, 4, 1] if which == "q" else [19, 8, 2]
    q, k, v = _inputs(rng, b, 2, 1, nq, nk, big=True)
    bias = rng.standard_normal((b, 2, nq, nk))
    sinks = rng.standard_normal(2)
    dout, dlse = _upstream(rng, b, 2, nq, 6)
    ql, kl = (lens, None) if which == "q" else (None, lens)
    keep, qv = padded_keep(Causal(), "none_end", b, nq, nk, ql, kl, side)
    req = _request(
        q, k, v, Causal(), "none_end", q_lengths=which == "q", k_lengths=which == "k", padding_side=side,
        bias=bias.shape, bias_grad=True, sinks=True, sinks_grad=True, softcap=4.0,
    )  # fmt: skip
    arr = tf.constant(lens, tf.int32)
    ops = Operands(
        bias=tf.constant(bias), sinks=tf.constant(sinks),
        q_lengths=arr if which == "q" else None, k_lengths=arr if which == "k" else None,
    )  # fmt: skip
    got = _run(req, q, k, v, ops, dout, dlse)
    want = dense(q, k, v, keep=keep, q_valid=qv, bias=bias, sinks=sinks, softcap=4.0, dout=dout, dlse=dlse)
    _check(got, want)


def test_padded_garbage_never_leaks():
    """NaN in padded queries, keys and values (an uninitialized cache) stays out of every result."""
    rng = np.random.default_rng(12)
    b, nq, nk = 2, 9, 14
    ql, kl = [6, 9], [10, 3]
    q, k, v = _inputs(rng, b, 2, 2, nq, nk)
    q[0, :, 6:], k[0, :, 10:], v[0, :, 10:], k[1, :, 3:], v[1, :, 3:] = np.nan, np.nan, np.nan, np.inf, np.nan
    dout, dlse = _upstream(rng, b, 2, nq, 6)
    keep, qv = padded_keep(Full(), "none_front", b, nq, nk, ql, kl, "right")
    req = _request(q, k, v, Full(), "none_front", q_lengths=True, k_lengths=True)
    ops = Operands(q_lengths=tf.constant(ql, tf.int32), k_lengths=tf.constant(kl, tf.int32))
    got = _run(req, q, k, v, ops, dout, dlse)
    clean = [np.nan_to_num(x, nan=0.0, posinf=0.0) for x in (q, k, v)]
    want = dense(*clean, keep=keep, q_valid=qv, dout=dout, dlse=dlse)
    _check(got, want, names=("dq", "dk", "dv"))


# ---------------------------------------------------------------- §10 packed sequences


def dense_varlen(q, k, v, cu_q, cu_k, rule, sync, **kw):
    """Each packed sequence as its own problem (canonical (1, H, T, D) arrays)."""
    dout, dlse = kw.pop("dout"), kw.pop("dlse")
    hq, dv = q.shape[1], v.shape[-1]
    out, lse = np.zeros((1, hq, q.shape[2], dv)), np.full((1, hq, q.shape[2]), -np.inf)
    dq, dk, dv_, dsinks = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v), 0
    for n in range(len(cu_q) - 1):
        rq, rk = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
        lq, lk = rq.stop - rq.start, rk.stop - rk.start
        if lq == 0:
            continue
        keep, _ = _keep(rule, sync, lq, lk, lq, lk, "right")
        o, ls, g = dense(
            q[:, :, rq], k[:, :, rk], v[:, :, rk], keep=keep, dout=dout[:, :, rq], dlse=dlse[:, :, rq], **kw
        )
        out[:, :, rq], lse[:, :, rq] = o, ls
        dq[:, :, rq], dk[:, :, rk], dv_[:, :, rk] = g[0], g[1], g[2]
        dsinks = dsinks + (0 if g[4] is None else g[4])
    return out, lse, (dq, dk, dv_, None, dsinks if kw.get("sinks") is not None else None)


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
def test_varlen(sync, rule):
    rng = np.random.default_rng(hash((sync, rule.describe())) % 2**32)
    cu_q, cu_k = [0, 5, 5, 17, 20, 26], [0, 9, 12, 19, 19, 33]
    q, k, v = _inputs(rng, 1, 4, 2, 26, 33)
    sinks = rng.standard_normal(4)
    dout, dlse = _upstream(rng, 1, 4, 26, 6)
    req = _request(q, k, v, rule, sync, varlen=True, softcap=6.0, sinks=True, sinks_grad=True)
    ops = Operands(
        sinks=tf.constant(sinks), cu_seqlens_q=tf.constant(cu_q, tf.int32), cu_seqlens_k=tf.constant(cu_k, tf.int32),
        max_seqlen_q=12, max_seqlen_k=14,
    )  # fmt: skip
    got = _run(req, q, k, v, ops, dout, dlse)
    want = dense_varlen(q, k, v, cu_q, cu_k, rule, sync, softcap=6.0, sinks=sinks, dout=dout, dlse=dlse)
    _check(got, want)


# ---------------------------------------------------------------- §11 offsets


@pytest.mark.parametrize("offsets", [(0, 5), (7, 0), (30, 12), (3, 40)])
@pytest.mark.parametrize("rule", RULES[1:], ids=lambda r: r.describe())
def test_offsets(offsets, rule):
    rng = np.random.default_rng(13)
    qo, ko = offsets
    q, k, v = _inputs(rng, 2, 2, 1, 15, 21)
    bias = rng.standard_normal((1, 2, 1, 21))
    dout, dlse = _upstream(rng, 2, 2, 15, 6)
    keep, _ = padded_keep(rule, "none_front", 2, 15, 21, None, None, "right", qo, ko)
    req = _request(q, k, v, rule, "none_front", q_offset=qo, k_offset=ko, bias=bias.shape, bias_grad=True)
    got = _run(req, q, k, v, Operands(bias=tf.constant(bias)), dout, dlse)
    _check(got, dense(q, k, v, keep=keep, bias=bias, dout=dout, dlse=dlse))


def test_offsets_with_lengths():
    rng = np.random.default_rng(14)
    q, k, v = _inputs(rng, 2, 2, 2, 11, 16)
    ql, kl = [11, 6], [9, 16]
    dout, dlse = _upstream(rng, 2, 2, 11, 6)
    keep, qv = padded_keep(Causal(), "none_front", 2, 11, 16, ql, kl, "right", 4, 0)
    req = _request(q, k, v, Causal(), "none_front", q_offset=4, q_lengths=True, k_lengths=True)
    ops = Operands(q_lengths=tf.constant(ql, tf.int32), k_lengths=tf.constant(kl, tf.int32))
    got = _run(req, q, k, v, ops, dout, dlse)
    _check(got, dense(q, k, v, keep=keep, q_valid=qv, dout=dout, dlse=dlse), names=("dq", "dk", "dv"))


# ---------------------------------------------------------------- graphs: symbolic operands


@pytest.mark.parametrize("jit", [False, True])
def test_tf_function_with_symbolic_lengths_bias_sinks(jit):
    """Lengths, bias and sinks are graph inputs (no value on the host while tracing); one trace
    serves several length vectors."""
    rng = np.random.default_rng(15)
    b, nq, nk = 3, 12, 15
    q, k, v = _inputs(rng, b, 2, 1, nq, nk)
    bias = rng.standard_normal((b, 1, nq, nk))
    sinks = rng.standard_normal(2)
    dout, dlse = _upstream(rng, b, 2, nq, 6)
    req = _request(
        q, k, v, Local(4, causal=True), "none_end", q_lengths=True, k_lengths=True, padding_side="left",
        bias=bias.shape, bias_grad=True, sinks=True, sinks_grad=True, softcap=3.0,
    )  # fmt: skip
    traces = []
    from attnhub_backends.tf.backend import TFBackend

    be = TFBackend()

    @tf.function(jit_compile=jit)
    def step(q, k, v, bias, sinks, ql, kl, dout, dlse):
        traces.append(1)
        assert ql.shape == (b,)  # symbolic: a graph tensor here
        ops = Operands(bias=bias, sinks=sinks, q_lengths=ql, k_lengths=kl)
        out, lse, saved = be.forward_for_grad(q, k, v, req, None, operands=ops)
        return out, lse, be.backward(q, k, v, saved, lse, dout, req, None, dlse=dlse, operands=ops)

    for ql, kl in (([12, 5, 0], [15, 9, 4]), ([3, 12, 7], [1, 15, 0])):
        keep, qv = padded_keep(Local(4, causal=True), "none_end", b, nq, nk, ql, kl, "left")
        args = [tf.constant(x) for x in (q, k, v, bias, sinks)]
        args += [tf.constant(ql, tf.int32), tf.constant(kl, tf.int32), tf.constant(dout), tf.constant(dlse)]
        out, lse, grads = step(*args)
        got = (out.numpy(), lse.numpy(), [g.numpy() for g in grads])
        want = dense(
            q, k, v, keep=keep, q_valid=qv, bias=bias, sinks=sinks, softcap=3.0, dout=dout, dlse=dlse
        )
        _check(got, want)
    assert len(traces) == 1


@pytest.mark.parametrize("jit", [False, True])
def test_tf_function_varlen_symbolic_cu_seqlens(jit):
    from attnhub_backends.tf.backend import TFBackend

    rng = np.random.default_rng(16)
    q, k, v = _inputs(rng, 1, 2, 2, 14, 18)
    dout, dlse = _upstream(rng, 1, 2, 14, 6)
    req = _request(q, k, v, Causal(), "none_end", varlen=True)
    be = TFBackend()

    @tf.function(jit_compile=jit)
    def step(q, k, v, cq, ck, dout, dlse):
        ops = Operands(cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=14, max_seqlen_k=18)
        out, lse, saved = be.forward_for_grad(q, k, v, req, None, operands=ops)
        return out, lse, be.backward(q, k, v, saved, lse, dout, req, None, dlse=dlse, operands=ops)

    for cu_q, cu_k in (([0, 4, 14], [0, 10, 18]), ([0, 0, 9, 14], [0, 3, 3, 18])):
        args = [tf.constant(x) for x in (q, k, v)]
        args += [
            tf.constant(cu_q, tf.int32),
            tf.constant(cu_k, tf.int32),
            tf.constant(dout),
            tf.constant(dlse),
        ]
        out, lse, grads = step(*args)
        got = (out.numpy(), lse.numpy(), [g.numpy() for g in grads])
        _check(
            got,
            dense_varlen(q, k, v, cu_q, cu_k, Causal(), "none_end", dout=dout, dlse=dlse),
            names=("dq", "dk", "dv"),
        )


# ---------------------------------------------------------------- plan and declared features


def test_ragged_plan_skips_only_what_lengths_cannot_revive():
    """Right padding with none_front keeps the causal plan's empty tiles; none_end with right
    padding moves positions per entry, so no tile is skipped; no ragged tile is unmasked."""
    q, k, v = _inputs(np.random.default_rng(0), 1, 1, 1, 32, 32)
    dense_req = _request(q, k, v, Causal(), "none_front")
    right = _request(q, k, v, Causal(), "none_front", k_lengths=True)
    moved = _request(q, k, v, Causal(), "none_end", k_lengths=True)
    p_dense, p_right, p_moved = (tiles.plan_for(r) for r in (dense_req, right, moved))
    assert p_right.computed_pairs == p_dense.computed_pairs < 32 * 32 == p_moved.computed_pairs
    assert not any(t.full for blk in p_right.blocks + p_moved.blocks for t in blk.tiles)


def test_declared_features():
    from attnhub_backends.tf.backend import TFBackend

    feats = {"bias", "dbias", "softcap", "sinks", "lengths", "varlen", "offsets", "paged"}
    assert feats <= TFBackend().features


# ---------------------------------------------------------------- §10 paged KV cache


@pytest.mark.parametrize("jit", [None, False, True])
def test_paged_kv_cache(jit):
    """Blocks gathered per entry (one block shared by two entries, -1 past the length), sinks and
    softcap; dk/dv summed back into the cache blocks."""
    from attnhub_backends.tf.backend import TFBackend

    rng = np.random.default_rng(17)
    b, hq, hkv, bs, nblocks, nq = 3, 4, 2, 4, 7, 3
    table = np.array([[2, 5, 0], [5, 1, -1], [6, -1, -1]], np.int32)
    kl = [11, 6, 3]
    kc = rng.standard_normal((nblocks, bs, hkv, 8))
    vc = rng.standard_normal((nblocks, bs, hkv, 6))
    q = rng.standard_normal((b, hq, nq, 8))
    sinks = rng.standard_normal(hq)
    dout, dlse = _upstream(rng, b, hq, nq, 6)
    idx = np.clip(table, 0, None)
    kg = kc[idx].reshape(b, -1, hkv, 8).transpose(0, 2, 1, 3)
    vg = vc[idx].reshape(b, -1, hkv, 6).transpose(0, 2, 1, 3)
    nk = kg.shape[2]
    req = _request(
        q, kg, vg, Causal(), "none_end", k_lengths=True, paged=bs, sinks=True, sinks_grad=True, softcap=4.0
    )
    ops = Operands(
        sinks=tf.constant(sinks), k_lengths=tf.constant(kl, tf.int32), block_table=tf.constant(table)
    )
    be = TFBackend()

    def call(q, kc, vc, dout, dlse):
        out, lse, saved = be.forward_for_grad(q, kc, vc, req, None, operands=ops)
        return out, lse, be.backward(q, kc, vc, saved, lse, dout, req, None, dlse=dlse, operands=ops)

    if jit is not None:
        call = tf.function(call, jit_compile=jit)
    out, lse, grads = call(*(tf.constant(x) for x in (q, kc, vc, dout, dlse)))
    keep, qv = padded_keep(Causal(), "none_end", b, nq, nk, None, kl, "right")
    want = dense(q, kg, vg, keep=keep, sinks=sinks, softcap=4.0, dout=dout, dlse=dlse)
    dkc, dvc = np.zeros_like(kc), np.zeros_like(vc)
    for g, dc in ((want[2][1], dkc), (want[2][2], dvc)):
        per_block = g.transpose(0, 2, 1, 3).reshape(b, -1, bs, hkv, g.shape[-1])
        for e in range(b):
            for j, blk in enumerate(idx[e]):
                dc[blk] += per_block[e, j]
    want = (want[0], want[1], (want[2][0], dkc, dvc, None, want[2][4]))
    _check((out.numpy(), lse.numpy(), [None if x is None else x.numpy() for x in grads]), want)


def test_row_whose_first_tiles_are_masked_and_later_logits_very_negative():
    """Online softmax: a row with nothing attended in its first tile and logits near -1000 later
    (a large negative bias) must not form 0·exp(+1000)."""
    rng = np.random.default_rng(18)
    q, k, v = _inputs(rng, 1, 1, 1, 8, 24)
    bias = rng.standard_normal((1, 1, 8, 24)) - 1000.0
    bias[:, :, :, :8] = -np.inf  # the first key tile (BLOCK_K = 8)
    dout, dlse = _upstream(rng, 1, 1, 8, 6)
    keep = np.ones((1, 1, 8, 24), bool)
    req = _request(q, k, v, Full(), "none_front", bias=bias.shape, bias_grad=True)
    got = _run(req, q, k, v, Operands(bias=tf.constant(bias)), dout, dlse)
    _check(got, dense(q, k, v, keep=keep, bias=bias, dout=dout, dlse=dlse))


def test_ragged_tiles_without_pairs_are_skipped_at_run_time(monkeypatch):
    """Packed sequences: eagerly, only the tiles whose segments meet are computed."""
    from attnhub_backends.tf import kernel

    calls = {"fwd": 0, "bwd": 0}
    fwd, bwd = kernel._forward_tile, kernel._backward_tile

    def count(name, f):
        def wrapped(*a, **kw):
            calls[name] += 1
            return f(*a, **kw)

        return wrapped

    monkeypatch.setattr(kernel, "_forward_tile", count("fwd", fwd))
    monkeypatch.setattr(kernel, "_backward_tile", count("bwd", bwd))
    rng = np.random.default_rng(19)
    cu = [0, 8, 16, 24, 32]
    q, k, v = _inputs(rng, 1, 2, 1, 32, 32)
    dout, dlse = _upstream(rng, 1, 2, 32, 6)
    req = _request(q, k, v, Causal(), "none_front", varlen=True)
    cu_t = tf.constant(cu, tf.int32)
    ops = Operands(cu_seqlens_q=cu_t, cu_seqlens_k=cu_t, max_seqlen_q=8, max_seqlen_k=8)
    got = _run(req, q, k, v, ops, dout, dlse)
    want = dense_varlen(q, k, v, cu, cu, Causal(), "none_front", dout=dout, dlse=dlse)
    _check(got, want, names=("dq", "dk", "dv"))
    assert calls == {"fwd": 4, "bwd": 4}  # the 4 diagonal 8x8 tiles of 16 (10 the causal plan keeps)


def test_2d_sequences_with_bias_softcap_sinks():
    """§9 composes with 2-d sequences (flat index rules)."""
    from attnhub.positions import grid_positions

    rng = np.random.default_rng(21)
    sq, sk = (4, 5), (6, 5)
    q, k, v = _inputs(rng, 2, 2, 1, 20, 30)
    bias = rng.standard_normal((1, 2, 20, 30))
    sinks = rng.standard_normal(2)
    dout, dlse = _upstream(rng, 2, 2, 20, 6)
    for rule in (Causal(), Local((2, 3), causal=True)):
        pq, pk, fq, fk = grid_positions(sq, sk, "scale_end")
        keep = rule_mask(rule, pq, pk, fq, fk)[None, None]
        q5, k5, v5 = q.reshape(2, 2, *sq, 8), k.reshape(2, 1, *sk, 8), v.reshape(2, 1, *sk, 6)
        req = _request(
            q5,
            k5,
            v5,
            rule,
            "scale_end",
            bias=bias.shape,
            bias_grad=True,
            sinks=True,
            sinks_grad=True,
            softcap=3.0,
        )
        ops = Operands(bias=tf.constant(bias), sinks=tf.constant(sinks))
        got = _run(req, q, k, v, ops, dout, dlse)
        _check(got, dense(q, k, v, keep=keep, bias=bias, sinks=sinks, softcap=3.0, dout=dout, dlse=dlse))


def test_bool_mask_with_lengths_and_sinks():
    rng = np.random.default_rng(22)
    q, k, v = _inputs(rng, 3, 2, 2, 10, 13)
    mask = rng.random((3, 2, 10, 13)) < 0.7
    sinks = rng.standard_normal(2)
    ql, kl = [10, 4, 7], [13, 9, 0]
    dout, dlse = _upstream(rng, 3, 2, 10, 6)
    keep, qv = padded_keep(Full(), "none_end", 3, 10, 13, ql, kl, "left")
    req, _ = build_request(
        *(tf.constant(x) for x in (q, k, v)), tf.constant(mask), "none_end", None, "bhsd", True
    )
    req = replace(
        req, needs_grad=True, q_lengths=True, k_lengths=True, padding_side="left", sinks=True, sinks_grad=True
    )
    ops = Operands(
        sinks=tf.constant(sinks), q_lengths=tf.constant(ql, tf.int32), k_lengths=tf.constant(kl, tf.int32)
    )
    got = _run(req, q, k, v, ops, dout, dlse, mask=tf.constant(mask))
    _check(got, dense(q, k, v, keep=keep & mask, q_valid=qv, sinks=sinks, dout=dout, dlse=dlse))


def test_float32_lengths_bias_sinks_softcap_large_logits():
    rng = np.random.default_rng(23)
    q, k, v = (x.astype(np.float32) for x in _inputs(rng, 2, 4, 2, 24, 31, big=True))
    bias = rng.standard_normal((2, 4, 24, 31)).astype(np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    ql, kl = [24, 11], [31, 17]
    dout, dlse = (x.astype(np.float32) for x in _upstream(rng, 2, 4, 24, 6))
    keep, qv = padded_keep(Causal(), "none_end", 2, 24, 31, ql, kl, "right")
    req = _request(
        q, k, v, Causal(), "none_end", q_lengths=True, k_lengths=True, bias=bias.shape, bias_grad=True,
        sinks=True, sinks_grad=True, softcap=20.0,
    )  # fmt: skip
    ops = Operands(
        bias=tf.constant(bias), sinks=tf.constant(sinks),
        q_lengths=tf.constant(ql, tf.int32), k_lengths=tf.constant(kl, tf.int32),
    )  # fmt: skip
    got = _run(req, q, k, v, ops, dout, dlse, dtype="float32")
    assert got[0].dtype == np.float32 and got[1].dtype == np.float32
    assert got[2][3].dtype == np.float32 and got[2][4].dtype == np.float32
    want = dense(q, k, v, keep=keep, q_valid=qv, bias=bias, sinks=sinks, softcap=20.0, dout=dout, dlse=dlse)
    _check(got, want, "float32")


# ---------------------------------------------------------------- through attnhub.attention


def _loss_grads(call, inputs, watch, dout, dlse, graph):
    """(out, lse, gradients of sum(out·dout) + sum(lse·dlse) for ``inputs[i]``, i in ``watch``)."""

    def step(*xs):
        with tf.GradientTape() as tape:
            for i in watch:
                tape.watch(xs[i])
            out, lse = call(*xs)
            finite = tf.math.is_finite(lse)
            loss = tf.reduce_sum(out * dout) + tf.reduce_sum(tf.where(finite, lse * dlse, tf.zeros_like(lse)))
        return out, lse, tape.gradient(loss, [xs[i] for i in watch])

    if graph:
        step = tf.function(step)
    out, lse, grads = step(*inputs)
    return out.numpy(), lse.numpy(), [g.numpy() for g in grads]


def _against_reference(call, inputs, watch, dout, dlse, names):
    want = _loss_grads(lambda *xs: call(*xs, backend="reference"), inputs, watch, dout, dlse, False)
    for graph in (False, True):
        got = _loss_grads(lambda *xs: call(*xs, backend="tf"), inputs, watch, dout, dlse, graph)
        _check(got, want, names=names)


API_CASES = [
    # (rule, sync, bias shape, softcap, sinks, lengths, side, offsets)
    (Causal(), "none_end", (2, 4, 13, 18), None, False, None, "right", (0, 0)),
    (Full(), "none_front", (1, 1, 1, 18), 4.0, True, None, "right", (0, 0)),
    (Local(3, causal=True), "scale_end", (2, 1, 13, 1), 2.5, True, None, "right", (0, 0)),
    (Causal(), "none_end", (2, 4, 13, 18), 3.0, True, ([13, 6], [18, 4]), "left", (0, 0)),
    (Local(4), "scale_front", None, None, True, ([7, 13], [18, 0]), "right", (0, 0)),
    (Causal(), "none_front", (2, 1, 13, 18), None, True, ([9, 13], [11, 18]), "right", (5, 2)),
    (Local(2, 1, True), "none_front", None, 6.0, False, None, "right", (10, 3)),
]


@pytest.mark.parametrize("case", API_CASES, ids=[str(i) for i in range(len(API_CASES))])
def test_attention_api_against_reference(case):
    import attnhub

    rule, sync, bshape, softcap, with_sinks, lengths, side, (qo, ko) = case
    rng = np.random.default_rng(20 + API_CASES.index(case))
    q, k, v = _inputs(rng, 2, 4, 2, 13, 18, big=True)
    dout, dlse = _upstream(rng, 2, 4, 13, 6)
    inputs = [tf.constant(x) for x in (q, k, v)]
    names = ["dq", "dk", "dv"]
    if bshape is not None:
        inputs.append(tf.constant(rng.standard_normal(bshape)))
        names.append("dbias")
    if with_sinks:
        inputs.append(tf.constant(rng.standard_normal(4)))
        names.append("dsinks")
    watch = range(len(inputs))
    if lengths is not None:  # graph inputs in the tf.function run: symbolic there
        inputs += [tf.constant(x, tf.int32) for x in lengths]

    def call(q, k, v, *more, backend):
        more = list(more)
        bias = more.pop(0) if bshape is not None else None
        sinks = more.pop(0) if with_sinks else None
        ql, kl = more if lengths is not None else (None, None)
        return attnhub.attention(
            q, k, v, mask=rule, sync=sync, bias=bias, softcap=softcap, sinks=sinks, q_lengths=ql,
            k_lengths=kl, padding_side=side, q_offset=qo, k_offset=ko, backend=backend, return_lse=True,
        )  # fmt: skip

    _against_reference(call, inputs, watch, tf.constant(dout), tf.constant(dlse), names)


@pytest.mark.parametrize("sync", ["none_front", "scale_end", "none_end"])
def test_attention_varlen_api_against_reference(sync):
    import attnhub

    rng = np.random.default_rng(40)
    cu_q, cu_k = [0, 6, 6, 15, 19], [0, 4, 11, 22, 30]
    q = rng.standard_normal((19, 4, 8))
    k, v = rng.standard_normal((30, 2, 8)), rng.standard_normal((30, 2, 6))
    dout, dlse = rng.standard_normal((19, 4, 6)), rng.standard_normal((4, 19))
    inputs = [tf.constant(x) for x in (q, k, v, rng.standard_normal(4))]
    inputs += [tf.constant(cu_q, tf.int32), tf.constant(cu_k, tf.int32)]

    def call(q, k, v, sinks, cq, ck, backend):
        return attnhub.attention_varlen(
            q, k, v, cq, ck, mask=Local(3, causal=True), sync=sync,
            softcap=5.0, sinks=sinks, backend=backend, return_lse=True,
        )  # fmt: skip

    names = ["dq", "dk", "dv", "dsinks"]
    _against_reference(call, inputs, range(4), tf.constant(dout), tf.constant(dlse), names)


@pytest.mark.parametrize("paged", [False, True])
def test_attention_kvcache_api_against_reference(paged):
    import attnhub

    rng = np.random.default_rng(41 + paged)
    b, hq, hkv, lq = 3, 4, 2, 3
    kl = [12, 5, 3]
    q = rng.standard_normal((b, hq, lq, 8))
    if paged:
        table = tf.constant([[4, 0, 2], [0, 3, 0], [1, 0, 0]], tf.int32)
        k, v = rng.standard_normal((5, 4, hkv, 8)), rng.standard_normal((5, 4, hkv, 6))
    else:
        table = None
        k, v = rng.standard_normal((b, hkv, 12, 8)), rng.standard_normal((b, hkv, 12, 6))
    dout, dlse = _upstream(rng, b, hq, lq, 6)
    inputs = [tf.constant(x) for x in (q, k, v, rng.standard_normal(hq))] + [tf.constant(kl, tf.int32)]

    def call(q, k, v, sinks, lengths, backend):
        return attnhub.attention_kvcache(
            q, k, v, lengths, block_table=table, softcap=7.0, sinks=sinks, backend=backend, return_lse=True
        )

    names = ["dq", "dk", "dv", "dsinks"]
    _against_reference(call, inputs, range(4), tf.constant(dout), tf.constant(dlse), names)


def test_float_mask_gradient_through_attention():
    """mask=<float array> is bias= with the rule Full: its gradient reaches the caller."""
    import attnhub

    rng = np.random.default_rng(30)
    q, k, v = _inputs(rng, 2, 2, 1, 9, 12)
    dout, dlse = _upstream(rng, 2, 2, 9, 6)
    inputs = [tf.constant(x) for x in (q, k, v, rng.standard_normal((2, 1, 9, 12)))]

    def call(q, k, v, m, backend):
        return attnhub.attention(q, k, v, mask=m, backend=backend, return_lse=True)

    _against_reference(
        call, inputs, range(4), tf.constant(dout), tf.constant(dlse), ["dq", "dk", "dv", "dbias"]
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_bias_sinks_lengths_softcap(dtype):
    """Half inputs (rounded, the oracle runs on the rounded values); float32 bias and sinks."""
    rng = np.random.default_rng(51)
    tdt = tf.as_dtype(dtype)
    rnd = lambda x: tf.cast(tf.cast(x, tdt), tf.float64).numpy()  # noqa: E731
    q, k, v = (rnd(x) for x in _inputs(rng, 2, 4, 2, 20, 26, big=True))
    bias = rng.standard_normal((1, 4, 20, 26)).astype(np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    dout, dlse = _upstream(rng, 2, 4, 20, 6)
    dout = rnd(dout)
    ql, kl = [20, 13], [26, 9]
    keep, qv = padded_keep(Local(5, causal=True), "none_end", 2, 20, 26, ql, kl, "left")
    req = _request(
        q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), Local(5, causal=True), "none_end",
        q_lengths=True, k_lengths=True, padding_side="left", bias=bias.shape, bias_grad=True, sinks=True,
        sinks_grad=True, softcap=10.0,
    )  # fmt: skip
    req = replace(req, dtype=dtype)
    ops = Operands(
        bias=tf.constant(bias), sinks=tf.constant(sinks),
        q_lengths=tf.constant(ql, tf.int32), k_lengths=tf.constant(kl, tf.int32),
    )  # fmt: skip
    got = _run(req, q, k, v, ops, dout, dlse, dtype=dtype)
    want = dense(q, k, v, keep=keep, q_valid=qv, bias=bias, sinks=sinks, softcap=10.0, dout=dout, dlse=dlse)
    _check(got, want, dtype)


def test_modifiers_are_deterministic():
    """The backend declares "deterministic": the paged (shared block), ragged and sinks paths too."""
    from attnhub_backends.tf.backend import TFBackend

    rng = np.random.default_rng(52)
    table = np.array([[1, 0], [1, 2]], np.int32)  # block 1 shared: its gradient is a sum
    kc, vc = rng.standard_normal((3, 4, 1, 8)), rng.standard_normal((3, 4, 1, 6))
    q = rng.standard_normal((2, 2, 5, 8))
    sinks = rng.standard_normal(2)
    dout, dlse = _upstream(rng, 2, 2, 5, 6)
    req = _request(
        q, np.zeros((2, 1, 8, 8)), np.zeros((2, 1, 8, 6)), Causal(), "none_end", k_lengths=True, paged=4,
        sinks=True, sinks_grad=True,
    )  # fmt: skip
    ops = Operands(
        sinks=tf.constant(sinks), k_lengths=tf.constant([7, 8], tf.int32), block_table=tf.constant(table)
    )
    be = TFBackend()
    runs = []
    for _ in range(2):
        out, lse, saved = be.forward_for_grad(*(tf.constant(x) for x in (q, kc, vc)), req, None, operands=ops)
        grads = be.backward(
            *(tf.constant(x) for x in (q, kc, vc)), saved, lse, tf.constant(dout), req, None,
            dlse=tf.constant(dlse), operands=ops,
        )  # fmt: skip
        runs.append([out.numpy(), lse.numpy(), *(g.numpy() for g in grads if g is not None)])
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)
