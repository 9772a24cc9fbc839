"""AutoGraph must not rewrite attnhub's own Python (dispatch, plugin loading, backends' trace-time
code) when a tf.function calls an entry point: it converted attention_varlen and
attention_kvcache, and with them the dispatcher, which then failed inside a full test run
(``tf__clear() takes from 0 to 1 positional arguments but 3 were given``)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import attnhub
from attnhub import dispatch
from attnhub.dispatch import DISPATCHER

tf = pytest.importorskip("tensorflow")


def _converted_attnhub_frames() -> list[str]:
    """Names of the AutoGraph-converted functions on the stack, the test's own ``step`` aside."""
    names = []
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name.startswith("tf__") and code.co_name != "tf__step":  # converted functions
            names.append(code.co_name)
        frame = frame.f_back
    return names


@pytest.mark.parametrize("entry", ["attention", "attention_varlen", "attention_kvcache"])
def test_entry_points_run_unconverted_inside_tf_function(entry, monkeypatch):
    seen: list[list[str]] = []
    real = dispatch.explain_request

    def spy(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        seen.append(_converted_attnhub_frames())
        return real(*args, **kw)

    monkeypatch.setattr(dispatch, "explain_request", spy)
    DISPATCHER.clear()
    rng = np.random.default_rng(5)
    q = tf.constant(rng.standard_normal((2, 2, 3, 8)).astype(np.float32))
    kv = tf.constant(rng.standard_normal((2, 2, 5, 8)).astype(np.float32))

    @tf.function(autograph=True)
    def step(q, kv):
        if entry == "attention":
            return attnhub.attention(q, kv, kv, mask="causal")
        if entry == "attention_varlen":
            qp = tf.reshape(tf.transpose(q, (0, 2, 1, 3)), (6, 2, 8))
            kp = tf.reshape(tf.transpose(kv, (0, 2, 1, 3)), (10, 2, 8))
            cu_q, cu_k = tf.constant([0, 3, 6], tf.int32), tf.constant([0, 5, 10], tf.int32)
            return attnhub.attention_varlen(qp, kp, kp, cu_q, cu_k)
        lengths = tf.constant([5, 4], tf.int32)
        return attnhub.attention_kvcache(q, kv, kv, lengths)

    step(q, kv)
    assert seen, "dispatch was not reached"
    assert all(not s for s in seen), f"AutoGraph converted attnhub's code: {seen}"
