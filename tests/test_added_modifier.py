"""A score modifier added the documented way (docs/writing-a-backend.md, "Adding a score
modifier"): one ScoreModifier object and a backend that computes it, no other change. Here a
per-head logit multiplier ``head_scale`` (Hq,) stands in for the next real one (ALiBi), computed by a
NumPy backend; the object is put into the registry as its own module in attnhub/modifiers/ would be.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnhub
from attnhub.backend import Backend
from attnhub.errors import NoBackendError, SpecError
from attnhub.modifiers import ADDED, MODIFIERS, Call, ScoreModifier
from tests.plugged import plugged_in


class HeadScale(ScoreModifier):
    name = "head_scale"
    feature = "head_scale"
    missing = "does not multiply logits per head (head_scale=)"

    def signature(self, value, call: Call):
        shape = tuple(np.shape(value))
        if shape != (call.heads_q,):
            raise SpecError("head_scale.shape", f"({call.heads_q},)", shape)
        return shape

    def key(self, value):
        return (type(value), np.shape(value))

    def operand(self, value, ad, q, sig):
        return np.asarray(value, dtype=np.float64)

    def describe(self, req):
        return "head_scale"


class HeadScaleNumpy(Backend):
    """Dense float64 attention with the modifier: s = scale·q·k · head_scale[h]."""

    name = "t_head_scale"
    priority = -1000
    frameworks = ("numpy",)
    features = frozenset({"1d", "full", "causal", "lse", "head_scale"})

    def __init__(self):
        self.seen = []

    def forward(self, q, k, v, req, mask=None, operands=None):
        self.seen.append((req, operands))
        hs = operands.more["head_scale"]
        s = req.scale * (q @ np.swapaxes(k, -1, -2)) * hs[None, :, None, None]
        if req.rule.describe() == "causal":
            s = np.where(np.tri(req.nq, req.nk, dtype=bool), s, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        z = p.sum(-1, keepdims=True)
        return ((p / z) @ v).astype(q.dtype), (m + np.log(z))[..., 0].astype(np.float32)


@pytest.fixture
def head_scale():
    mod = HeadScale()
    MODIFIERS[mod.name] = ADDED[mod.name] = mod
    try:
        yield mod
    finally:
        del MODIFIERS[mod.name], ADDED[mod.name]


def _inputs(rng):
    return [rng.standard_normal((2, 3, 6, 4)) for _ in range(3)]


def test_a_backend_that_declares_it_computes_it(head_scale):
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng)
    hs = np.array([0.5, 1.0, 2.0])
    be = HeadScaleNumpy()
    with plugged_in(be):
        out = attnhub.attention(q, k, v, mask="causal", head_scale=hs, backend="t_head_scale")
        # the same through the reference: q scaled per head is the same logits
        want = attnhub.attention(q * hs[None, :, None, None], k, v, mask="causal", backend="reference")
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    req, ops = be.seen[-1]
    assert req.more == (("head_scale", (3,)),) and req.modified
    assert "head_scale" in req.describe()


def test_backends_without_the_feature_decline_with_its_reason(head_scale):
    q, k, v = _inputs(np.random.default_rng(1))
    with pytest.raises(NoBackendError) as info:
        attnhub.attention(q, k, v, head_scale=np.ones(3))
    assert "does not multiply logits per head (head_scale=)" in str(info.value.reasons["reference"])


def test_the_modifier_validates_its_argument_and_keys_the_cache(head_scale):
    q, k, v = _inputs(np.random.default_rng(2))
    with plugged_in(HeadScaleNumpy()):
        with pytest.raises(SpecError, match="head_scale.shape"):
            attnhub.attention(q, k, v, head_scale=np.ones(4), backend="t_head_scale")
        a = attnhub.attention(q, k, v, head_scale=np.ones(3), backend="t_head_scale")
        b = attnhub.attention(q, k, v, head_scale=np.full(3, 3.0), backend="t_head_scale")
    assert not np.allclose(a, b)


def test_an_unregistered_keyword_is_a_type_error():
    q, k, v = _inputs(np.random.default_rng(3))
    with pytest.raises(TypeError, match="unexpected keyword argument 'head_scale'"):
        attnhub.attention(q, k, v, head_scale=np.ones(3))
