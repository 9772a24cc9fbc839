"""Property-based fuzzing of ``attnhub.attention`` across NumPy, torch (CPU), TensorFlow and JAX.

Valid requests (random small shapes, layouts, dtypes, rules, sync modes, scales, GQA, Dqk != Dv,
lse, empty dimensions) must match the float64 reference within SPEC §6's forward tolerances;
invalid ones must raise ``SpecError``; nothing else may escape. Deterministic (derandomized, no
example database); ``ATTNHUB_FUZZ_EXAMPLES=N`` runs N examples per test instead of the CI default.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import attnhub  # noqa: E402
from attnhub import Causal, Full, Local, SpecError  # noqa: E402
from attnhub.rules import SYNC_MODES  # noqa: E402

torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")
jax = pytest.importorskip("jax")
jnp = jax.numpy

# Tests read this directly: tests are not shipped code, so it is not an attnhub setting.
EXAMPLES = int(os.environ.get("ATTNHUB_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(
    max_examples=EXAMPLES or 300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
FRAMEWORKS = ("numpy", "torch", "tensorflow", "jax")
LAYOUTS = ("bhsd", "bshd", "bhds")
#: SPEC §6 forward tolerances (relative L2 and max error) by dtype.
TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 2e-3}


def to_framework(a: np.ndarray, fw: str):
    if fw == "numpy":
        return a
    if fw == "torch":
        return torch.from_numpy(np.array(a))
    if fw == "tensorflow":
        return tf.constant(a)
    return jnp.asarray(a)


def to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x)


def in_layout(a: np.ndarray, layout: str, ndim: int) -> np.ndarray:
    """a is (B, H, *S, D); bring it to ``layout``."""
    rank = a.ndim
    if layout == "bshd":
        return np.moveaxis(a, 1, rank - 2)
    if layout == "bhds":
        return np.moveaxis(a, rank - 1, 2)
    return a


@st.composite
def requests(draw):
    fw = draw(st.sampled_from(FRAMEWORKS))
    dtypes = {"numpy": ("float32", "float64", "float16"), "torch": ("float32", "float64", "float16")}.get(
        fw, ("float32", "float64") if fw == "tensorflow" or jax.config.jax_enable_x64 else ("float32",)
    )
    dtype = draw(st.sampled_from(dtypes))
    ndim = draw(st.sampled_from((1, 1, 2)))
    b = draw(st.sampled_from((1, 1, 2, 0)))
    hkv = draw(st.sampled_from((1, 2)))
    hq = hkv * draw(st.sampled_from((1, 2)))
    if ndim == 1:
        sq = (draw(st.integers(0, 6)),)
        sk = (draw(st.integers(0, 6)),)
    else:
        sq = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        sk = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dqk = draw(st.sampled_from((1, 4, 8)))
    dv = draw(st.sampled_from((4, 8, 4, 0)))
    layout = draw(st.sampled_from(LAYOUTS))
    sync = draw(st.sampled_from(SYNC_MODES))
    scale = draw(st.sampled_from((None, None, 0.5, -1.0, 0.0, 2)))
    lse = draw(st.booleans())
    kind = draw(st.sampled_from(("none", "causal", "full", "Causal", "local", "bool", "float")))
    mask_spec = None
    if kind == "local":
        mask_spec = Local(
            draw(st.integers(1, 4)) if ndim == 1 else draw(st.sampled_from((1, 2, (1, 2), (3,)))),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
        )
    elif kind in ("bool", "float"):
        mask_spec = (kind, draw(st.sampled_from(("full", "row", "scalar"))))
    else:
        mask_spec = {"none": None, "causal": "causal", "full": Full(), "Causal": Causal()}[kind]
    seed = draw(st.integers(0, 2**16))
    return dict(
        fw=fw, dtype=dtype, ndim=ndim, b=b, hq=hq, hkv=hkv, sq=sq, sk=sk, dqk=dqk, dv=dv,
        layout=layout, sync=sync, scale=scale, lse=lse, mask=mask_spec, seed=seed,
    )  # fmt: skip


def build(r):
    rng = np.random.default_rng(r["seed"])
    npd = np.float16 if r["dtype"] == "float16" else np.dtype(r["dtype"])
    shapes = {
        "q": (r["b"], r["hq"], *r["sq"], r["dqk"]),
        "k": (r["b"], r["hkv"], *r["sk"], r["dqk"]),
        "v": (r["b"], r["hkv"], *r["sk"], r["dv"]),
    }
    host = {
        n: in_layout(rng.standard_normal(s).astype(npd), r["layout"], r["ndim"]) for n, s in shapes.items()
    }
    nq, nk = math.prod(r["sq"]), math.prod(r["sk"])
    mask_np = mask = r["mask"]
    if isinstance(r["mask"], tuple):
        kind, shape = r["mask"]
        full = {"full": (r["b"], r["hq"], nq, nk), "row": (nq, nk), "scalar": (1,)}[shape]
        if kind == "bool":
            mask_np = rng.random(full) < 0.7
        else:
            mask_np = rng.standard_normal(full).astype(npd)
            mask_np[rng.random(full) < 0.2] = -np.inf
        mask = to_framework(mask_np, r["fw"])
    arrays = {n: to_framework(a, r["fw"]) for n, a in host.items()}
    ref_mask = (
        mask_np.astype(np.float64) if isinstance(mask_np, np.ndarray) and mask_np.dtype != bool else mask_np
    )
    ref_args = {n: a.astype(np.float64) for n, a in host.items()}
    return arrays, mask, ref_args, ref_mask


def close(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    got = got.astype(np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.size == 0:
        return
    fin = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), fin), what
    assert np.array_equal(got[~fin], want[~fin]), what
    e, w = got[fin] - want[fin], want[fin]
    if w.size == 0:
        return
    assert np.linalg.norm(e) <= tol * max(np.linalg.norm(w), 1e-30) + 1e-300, what
    assert np.max(np.abs(e)) <= tol * max(np.max(np.abs(w)), 1e-30) + 1e-300, what


@FUZZ
@given(requests())
def test_valid_requests_match_the_reference(r):
    arrays, mask, ref_args, ref_mask = build(r)
    kw = dict(sync=r["sync"], scale=r["scale"], layout=r["layout"], return_lse=r["lse"])
    got = attnhub.attention(arrays["q"], arrays["k"], arrays["v"], mask=mask, **kw)
    want = attnhub.attention(
        ref_args["q"], ref_args["k"], ref_args["v"], mask=ref_mask, backend="reference", **kw
    )
    if not r["lse"]:
        got, want = (got,), (want,)
    assert len(got) == len(want)
    out = to_numpy(got[0])
    assert str(out.dtype) == r["dtype"]
    close(out, want[0], TOL[r["dtype"]], "out")
    if r["lse"]:
        lse = to_numpy(got[1])
        assert str(lse.dtype) == ("float64" if r["dtype"] == "float64" else "float32")
        close(lse, want[1], max(TOL[r["dtype"]], 1e-6 if r["dtype"] != "float64" else 0), "lse")


def _frameworks_other_than(fw):
    return [f for f in FRAMEWORKS if f != fw]


CORRUPTIONS = (
    "k_framework", "v_framework", "mask_framework", "k_list", "v_tuple", "q_scalar", "scale_bool",
    "scale_nan", "scale_inf", "scale_str", "scale_list", "scale_multi", "scale_huge", "scale_complex",
    "lse_int", "lse_none", "layout_int", "layout_bad", "sync_none", "sync_bad", "backend_none",
    "backend_list", "q_rank3", "heads", "dqk", "kv_len", "dtype_int", "dtype_mismatch", "mask_shape",
    "mask_int", "mask_str", "mask_list", "window_zero", "window_bool", "stride_neg", "window_tuple",
    "sparse_q", "batch", "mask_sparse",
)  # fmt: skip


@FUZZ
@given(
    st.sampled_from(FRAMEWORKS),
    st.sampled_from(CORRUPTIONS),
    st.sampled_from(LAYOUTS),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_invalid_requests_raise_spec_error(fw, corruption, layout, warm, seed):
    rng = np.random.default_rng(seed)

    def arr(shape, dtype=np.float32):  # logical (B, H, S, D), stored in ``layout``
        return in_layout(rng.standard_normal(shape).astype(dtype), layout, 1)

    base = {n: arr((1, 2, 3, 4)) for n in "qkv"}
    args = {n: to_framework(a, fw) for n, a in base.items()}
    kw: dict = dict(layout=layout)
    if warm:  # a valid call first: the invalid one must not be served from its cached plan
        attnhub.attention(args["q"], args["k"], args["v"], **kw)
    other = _frameworks_other_than(fw)[seed % 3]
    c = corruption
    if c in ("k_framework", "v_framework"):
        args[c[0]] = to_framework(base[c[0]], other)
    elif c == "mask_framework":
        kw["mask"] = to_framework(np.ones((3, 3), bool), other)
    elif c == "k_list":
        args["k"] = base["k"].tolist()
    elif c == "v_tuple":
        args["v"] = tuple(base["v"].ravel())
    elif c == "q_scalar":
        args["q"] = 1.5
    elif c.startswith("scale_"):
        kw["scale"] = {
            "scale_bool": True, "scale_nan": float("nan"), "scale_inf": -math.inf, "scale_str": "1",
            "scale_list": [0.5], "scale_multi": to_framework(np.ones(2, np.float32), fw),
            "scale_huge": 10**400, "scale_complex": 1 + 1j,
        }[c]  # fmt: skip
    elif c == "lse_int":
        kw["return_lse"] = 1
    elif c == "lse_none":
        kw["return_lse"] = None
    elif c == "layout_int":
        kw["layout"] = 3
    elif c == "layout_bad":
        kw["layout"] = "bsdh"
    elif c == "sync_none":
        kw["sync"] = None
    elif c == "sync_bad":
        kw["sync"] = "front"
    elif c == "backend_none":
        kw["backend"] = None
    elif c == "backend_list":
        kw["backend"] = ["reference"]
    elif c == "q_rank3":
        args["q"] = to_framework(base["q"][0], fw)
    elif c == "heads":
        args["k"] = to_framework(arr((1, 3, 3, 4)), fw)
        args["v"] = args["k"]
    elif c == "dqk":
        args["k"] = to_framework(arr((1, 2, 3, 5)), fw)
    elif c == "kv_len":
        args["v"] = to_framework(arr((1, 2, 4, 4)), fw)
    elif c == "dtype_int":
        args = {n: to_framework(a.astype(np.int32), fw) for n, a in base.items()}
    elif c == "dtype_mismatch":
        args["k"] = to_framework(base["k"].astype(np.float16), fw)
    elif c == "mask_shape":
        kw["mask"] = to_framework(np.ones((2, 2), bool), fw)
    elif c == "mask_int":
        kw["mask"] = to_framework(np.ones((3, 3), np.int32), fw)
    elif c == "mask_str":
        kw["mask"] = "diagonal"
    elif c == "mask_list":
        kw["mask"] = [[True] * 3] * 3
    elif c == "batch":
        args["k"] = to_framework(arr((2, 2, 3, 4)), fw)
        args["v"] = args["k"]
    elif c == "sparse_q":
        if fw != "torch":
            return
        args["q"] = args["q"].to_sparse()
    elif c == "mask_sparse":
        if fw != "torch":
            return
        kw["mask"] = torch.ones(3, 3).to_sparse()
    if c.startswith(("window", "stride")):
        make = {
            "window_zero": lambda: Local(0),
            "window_bool": lambda: Local(True),
            "stride_neg": lambda: Local(2, -1),
            "window_tuple": lambda: Local((1, 2, 3)),
        }[c]
        with pytest.raises(SpecError):
            attnhub.attention(args["q"], args["k"], args["v"], mask=make(), **kw)
        return
    with pytest.raises(SpecError):
        attnhub.attention(args["q"], args["k"], args["v"], **kw)
