"""attnhub.keras.DotProductAttention: output equals attnhub.attention, a functional model trains a
few steps, and the model round-trips through model.save / keras.models.load_model."""

from __future__ import annotations

import numpy as np
import pytest

import attnhub
from attnhub import Causal, Full, Local, SpecError

# imported by the fixture below, not at collection (see test_tf_backend.py)
tf = keras = DotProductAttention = rule_from_config = rule_to_config = None


@pytest.fixture(autouse=True, scope="module")
def _keras():
    global tf, keras, DotProductAttention, rule_from_config, rule_to_config
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    if keras.config.backend() != "tensorflow":
        pytest.skip("Keras runs another backend")
    from attnhub.keras import DotProductAttention, rule_from_config, rule_to_config


L, F, H, D = 12, 6, 2, 4


def _model(rule):
    inp = keras.Input((L, F))
    heads = [keras.layers.Reshape((L, H, D))(keras.layers.Dense(H * D)(inp)) for _ in range(3)]
    att = DotProductAttention(mask=rule, layout="bshd", name="attn")(*heads)
    out = keras.layers.Dense(1)(keras.layers.Flatten()(att))
    return keras.Model(inp, out)


@pytest.mark.parametrize("rule", [Full(), Causal(), Local(3, 1, True), Local((2,))])
def test_rule_config_round_trip(rule):
    assert rule_from_config(rule_to_config(rule)) == rule


def test_bad_rule_raises():
    with pytest.raises(SpecError):
        DotProductAttention(mask="sliding")


def test_layer_equals_attention_with_explicit_mask():
    rng = np.random.default_rng(0)
    q, k, v = (tf.constant(rng.standard_normal((2, 3, 10, 4)), tf.float32) for _ in range(3))
    layer = DotProductAttention(mask="causal", scale=0.3)
    np.testing.assert_allclose(
        layer(q, k, v).numpy(), attnhub.attention(q, k, v, mask="causal", scale=0.3).numpy(), rtol=1e-6
    )
    m = tf.constant(rng.random((2, 1, 10, 10)) < 0.5)
    np.testing.assert_allclose(
        layer(q, k, v, attention_mask=m).numpy(),
        attnhub.attention(q, k, v, mask=m, scale=0.3).numpy(),
        rtol=1e-6,
    )


def test_functional_model_trains_and_round_trips(tmp_path):
    keras.utils.set_random_seed(0)
    model = _model(Local(3, causal=True))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((24, L, F)).astype("float32")
    y = x[:, :, 0].sum(axis=1, keepdims=True)
    before = [w.numpy().copy() for w in model.trainable_weights]
    hist = model.fit(x, y, epochs=4, batch_size=8, verbose=0)  # unknown batch size inside fit
    losses = hist.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert any(not np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights))

    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    layer = loaded.get_layer("attn")
    assert isinstance(layer, DotProductAttention)
    assert layer.rule == Local(3, causal=True) and layer.layout == "bshd"
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6, atol=1e-6
    )
