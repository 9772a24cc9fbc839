"""SPEC §7: every bad request raises SpecError naming argument, expected and actual, before any kernel."""

import numpy as np
import pytest

import attnhub
from attnhub import Local, SpecError


def arrays(q=(2, 4, 8, 16), k=(2, 2, 8, 16), v=(2, 2, 8, 16), dtype=np.float32):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(dtype) for s in (q, k, v)]


def expect(argument, actual, call):
    with pytest.raises(SpecError) as info:
        call()
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert msg.startswith(argument), msg
    assert "expected" in msg and str(actual) in msg, msg
    return info.value


BAD_KWARGS = [
    ("layout", "xyz", dict(layout="xyz")),
    ("sync", "sideways", dict(sync="sideways")),
    ("mask", "diagonal", dict(mask="diagonal")),
    ("mask", "42", dict(mask=42)),
    ("scale", "inf", dict(scale=float("inf"))),
    ("scale", "nan", dict(scale=float("nan"))),
    ("return_lse", "yes", dict(return_lse="yes")),
]


@pytest.mark.parametrize(("argument", "actual", "kwargs"), BAD_KWARGS)
def test_bad_arguments(argument, actual, kwargs):
    q, k, v = arrays()
    copies = [x.copy() for x in (q, k, v)]
    expect(argument, actual, lambda: attnhub.attention(q, k, v, **kwargs))
    for x, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(x, c)


BAD_SHAPES = [
    ("q.ndim", "3", dict(q=(2, 8, 16))),
    ("q.ndim", "6", dict(q=(1, 2, 2, 2, 2, 16))),
    ("k.ndim/v.ndim", "5", dict(k=(2, 2, 8, 1, 16))),
    ("batch of k/v", "(3, 2)", dict(k=(3, 2, 8, 16))),
    ("heads of v", "1", dict(v=(2, 1, 8, 16))),
    ("heads of q", "3", dict(q=(2, 3, 8, 16))),
    ("head dim of k", "12", dict(k=(2, 2, 8, 12))),
    ("sequence shape of v", "(9,)", dict(v=(2, 2, 9, 16))),
]


@pytest.mark.parametrize(("argument", "actual", "shapes"), BAD_SHAPES)
def test_bad_shapes(argument, actual, shapes):
    q, k, v = arrays(**shapes)
    expect(argument, actual, lambda: attnhub.attention(q, k, v))


def test_mismatched_dtypes():
    q, k, v = arrays()
    expect("k.dtype/v.dtype", "float64", lambda: attnhub.attention(q, k.astype(np.float64), v))


def test_unsupported_dtype():
    q, k, v = arrays(dtype=np.int32)
    expect("q.dtype", "int32", lambda: attnhub.attention(q, k, v))


def test_mismatched_frameworks():
    torch = pytest.importorskip("torch")
    q, k, v = arrays()
    expect("k", "torch", lambda: attnhub.attention(q, torch.from_numpy(k), v))


def test_mismatched_devices():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x) for x in arrays())
    expect("k.device/v.device", "meta", lambda: attnhub.attention(q, k.to("meta"), v))


def test_not_an_array():
    expect("q", "builtins.list", lambda: attnhub.attention([1.0], [1.0], [1.0]))


@pytest.mark.parametrize(
    ("argument", "actual", "make"),
    [
        ("mask.window", "0", lambda: Local(0)),
        ("mask.window", "(2, 0)", lambda: Local((2, 0))),
        ("mask.log2_stride", "31", lambda: Local(2, log2_stride=31)),
        ("mask.log2_stride", "-1", lambda: Local(2, log2_stride=-1)),
        ("mask.causal", "1", lambda: Local(2, causal=1)),
    ],
)
def test_bad_rules(argument, actual, make):
    expect(argument, actual, make)


def test_window_tuple_of_wrong_length():
    q, k, v = arrays()
    expect("mask.window", "(2, 2)", lambda: attnhub.attention(q, k, v, mask=Local((2, 2))))


@pytest.mark.parametrize("shape", [(3, 8), (2, 4, 8, 8, 1), (3, 1, 8, 8), (1, 3, 8, 8)])
def test_explicit_mask_must_broadcast(shape):
    q, k, v = arrays()
    mask = np.ones(shape, dtype=bool)
    expect("mask.shape", str(shape), lambda: attnhub.attention(q, k, v, mask=mask))


def test_explicit_mask_dtype():
    q, k, v = arrays()
    expect("mask.dtype", "int64", lambda: attnhub.attention(q, k, v, mask=np.ones((8, 8), dtype=np.int64)))


def test_explicit_mask_is_not_modified():
    q, k, v = arrays()
    mask = np.tril(np.ones((8, 8), dtype=bool))
    copy = mask.copy()
    attnhub.attention(q, k, v, mask=mask)
    np.testing.assert_array_equal(mask, copy)
