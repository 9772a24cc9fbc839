"""A NoBackendError for float64 CUDA tensors says what to do (issue 39): each backend's reason
gives half of the answer (triton: not float64; cuda: not this argument; reference: not CUDA)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np

import attnhub
from attnhub.dispatch import _next_step
from attnhub.errors import NoBackendError


def _request(dtype: str, device: str):
    q = np.zeros((1, 2, 4, 8), dtype=dtype)
    req = attnhub.explain(q, q, q, mask="causal").request
    return dataclasses.replace(req, device=device)


def test_float64_on_cuda_gets_a_next_step():
    step = _next_step(_request("float64", "cuda:0"))
    assert "Cast q, k, v to float32" in step and "reference" in step
    err = NoBackendError({"triton": ["supports dtypes float16, bfloat16, float32"]}, step)
    assert str(err).endswith(f"next step: {step}")
    assert err.reasons == {"triton": ["supports dtypes float16, bfloat16, float32"]}
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, NoBackendError) and str(again) == str(err)


def test_other_requests_keep_the_reasons_alone():
    assert _next_step(_request("float32", "cuda:0")) == ""
    assert _next_step(_request("float64", "cpu")) == ""
    assert "next step" not in str(NoBackendError({"x": ["no"]}, ""))
