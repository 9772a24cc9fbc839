"""Bad inputs are SpecErrors naming the argument whatever came before (SPEC §7, §8, §12): each case
here once escaped as a raw Python error, or was accepted after a cache hit on an equal-hashing call."""

import pickle

import numpy as np
import pytest

import attnhub
from attnhub import BackendError, BackendUnsupported, Local, NoBackendError, SpecError

torch = pytest.importorskip("torch")


def np_qkv(shape=(1, 2, 5, 4)):
    rng = np.random.default_rng(1)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]


def expect(argument, call):
    with pytest.raises(SpecError) as info:
        call()
    assert info.value.argument == argument, str(info.value)
    return info.value


def other_arrays(x):
    """x as an array of each other framework."""
    import jax.numpy as jnp
    import tensorflow as tf

    x = np.array(x)
    return {
        "numpy": x,
        "torch": torch.from_numpy(x.copy()),
        "jax": jnp.asarray(x),
        "tensorflow": tf.constant(x),
    }


@pytest.mark.parametrize("qf", ["numpy", "torch", "jax", "tensorflow"])
@pytest.mark.parametrize("kf", ["numpy", "torch", "jax", "tensorflow"])
@pytest.mark.parametrize("which", ["k", "v"])
def test_mixed_frameworks_name_the_argument_in_any_order(qf, kf, which):
    if qf == kf:
        pytest.skip("same framework")
    q, k, v = np_qkv()
    attnhub.attention(other_arrays(q)[qf], other_arrays(k)[qf], other_arrays(v)[qf])  # warm the cache
    args = {"q": other_arrays(q)[qf], "k": other_arrays(k)[qf], "v": other_arrays(v)[qf]}
    args[which] = other_arrays(args[which] if qf == "numpy" else np.asarray(args[which]))[kf]
    expect(which, lambda: attnhub.attention(args["q"], args["k"], args["v"]))


@pytest.mark.parametrize("which", ["k", "v"])
def test_a_list_is_not_an_array(which):
    q, k, v = np_qkv()
    attnhub.attention(q, k, v)
    args = {"k": k, "v": v}
    args[which] = k.tolist()
    expect(which, lambda: attnhub.attention(q, args["k"], args["v"]))


@pytest.mark.parametrize(
    "good, bad",
    [
        (dict(scale=1), dict(scale=True)),
        (dict(scale=0), dict(scale=False)),
        (dict(scale=1.0), dict(scale=np.bool_(True))),
        (dict(return_lse=True), dict(return_lse=1)),
        (dict(return_lse=False), dict(return_lse=0)),
        (dict(return_lse=True), dict(return_lse=np.bool_(True))),
    ],
)
def test_cache_does_not_confuse_equal_hashes(good, bad):
    q, k, v = np_qkv()
    attnhub.attention(q, k, v, **good)
    attnhub.attention(q, k, v, **good)
    (argument,) = bad
    expect(argument, lambda: attnhub.attention(q, k, v, **bad))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(backend=["reference"]),
        dict(backend=None),
        dict(backend=""),
        dict(scale=10**400),
        dict(scale=np.array([0.5, 0.5])),
        dict(scale=torch.ones(3)),
        dict(scale=torch.tensor(0.5, requires_grad=True)),
        dict(scale=float("nan")),
        dict(scale="0.5"),
        dict(scale=1j),
        dict(layout=3),
        dict(layout=["bhsd"]),
        dict(sync=None),
        dict(sync=0),
        dict(return_lse=None),
        dict(mask=[[True]]),
        dict(mask=np.ma.masked_array(np.zeros((5, 5)))),
    ],
    ids=repr,
)
def test_wrong_types_name_the_argument(kwargs):
    q, k, v = np_qkv()
    attnhub.attention(q, k, v)
    (argument,) = kwargs
    expect(argument, lambda: attnhub.attention(q, k, v, **kwargs))
    expect(argument, lambda: attnhub.explain(q, k, v, **kwargs))


@pytest.mark.parametrize("scale", [np.float32(0.5), np.array(0.5), np.array([0.5]), torch.tensor(0.5), 2])
def test_one_element_scales_are_numbers(scale):
    q, k, v = np_qkv()
    got = attnhub.attention(q, k, v, scale=scale)
    np.testing.assert_allclose(
        got, attnhub.attention(q, k, v, scale=float(np.asarray(scale).reshape(()))), rtol=1e-6
    )


@pytest.mark.parametrize("which", ["q", "k", "v", "mask"])
@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr"])
def test_sparse_torch_tensors_name_the_argument(which, layout):
    q, k, v = (torch.from_numpy(x) for x in np_qkv())
    args = {"q": q, "k": k, "v": v, "mask": torch.ones(5, 5, dtype=torch.bool)}
    attnhub.attention(args["q"], args["k"], args["v"], mask=args["mask"])
    x = args[which]
    args[which] = x.to_sparse() if layout == "sparse_coo" else x.reshape(-1, x.shape[-1]).to_sparse_csr()
    expect(which, lambda: attnhub.attention(args["q"], args["k"], args["v"], mask=args["mask"]))


def test_tf_sparse_and_ragged_are_rejected():
    import tensorflow as tf

    q, k, v = (tf.constant(x) for x in np_qkv())
    expect("k", lambda: attnhub.attention(q, tf.sparse.from_dense(k), v))


def test_jax_local_window_beyond_int32_equals_the_reference():
    import jax.numpy as jnp

    q, k, v = np_qkv((1, 1, 6, 4))
    for rule in (Local(2**31), Local(2**31, causal=True), Local(2**30, log2_stride=2)):
        want = attnhub.attention(q, k, v, mask=rule, backend="reference")
        got = attnhub.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), mask=rule, backend="jax")
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "error",
    [
        SpecError("scale", "a number", True),
        BackendUnsupported("x", ["a", "b"]),
        NoBackendError({"x": ["a"]}),
        BackendError("x", "numpy/cpu float32", "boom"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_rebuild_from_args_message_and_pickle(error):
    for copy in (pickle.loads(pickle.dumps(error)), type(error)(*error.args), type(error)(str(error))):
        assert type(copy) is type(error) and str(copy) == str(error)
    assert type(error).__init__ is Exception.__init__  # what AutoGraph needs to re-raise it as is


def test_spec_error_inside_autograph_tf_function():
    import tensorflow as tf

    @tf.function(autograph=True)
    def f(q):
        if tf.reduce_sum(q) > 0:  # something for AutoGraph to convert
            q = q * 1.0
        return attnhub.attention(q, q, q, layout="nope")

    with pytest.raises(SpecError) as info:
        f(tf.ones((1, 1, 3, 4)))
    assert info.value.argument == "layout"
    with pytest.raises(ValueError):
        f(tf.ones((1, 1, 3, 5)))
