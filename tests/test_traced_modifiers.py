"""Certify runs SPEC §9-§11 cases through the frameworks' tracers too (every array traced:
lengths, cu_seqlens, the bias, sinks): a backend wrong only under jax.jit fails them, and the
entry points serve such calls (before 2026-11-29 the modifier cases ran eagerly only; a jitted
``attention_varlen`` with ``max_seqlen`` raised SpecError; ``attention_varlen`` under
torch.compile traced into the backends' launches)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import attnhub
from attnhub_conformance.modifier_cases import traced_modifier_cases
from attnhub_conformance.runner import Certifier
from tests.plugged import plugged_in, run_all
from tests.test_conformance_traced import JaxJitGradWrong


def test_the_traced_cases_carry_modifiers():
    cases = traced_modifier_cases("float32")
    assert all(c.traced and c.modified for c in cases)
    assert any(c.entry == "varlen" and c.grad for c in cases) and any(c.q_lengths and c.grad for c in cases)
    assert any(c.entry == "kvcache" and c.paged for c in cases)
    assert any(c.bias and c.bias_grad and c.sinks for c in cases)


def test_a_backend_wrong_only_under_jit_fails_the_traced_modifier_cases():
    pytest.importorskip("jax")
    cases = traced_modifier_cases("float32")
    eager = [dataclasses.replace(c, traced=False) for c in cases]
    with plugged_in(JaxJitGradWrong()):
        traced = run_all(Certifier("t_traced_jax_bad", seed=4, framework="jax"), cases)
        plain = run_all(Certifier("t_traced_jax_bad", seed=4, framework="jax"), eager)
    assert {r.status for r in plain} == {"pass"}, [(r.id, r.status, r.message) for r in plain]
    by_id = {r.id: r.status for r in traced}
    # its forward is right: only the cases that differentiate show it
    assert [by_id[c.id] for c in cases if c.grad] == ["FAIL"] * sum(c.grad for c in cases), by_id
    assert [by_id[c.id] for c in cases if not c.grad] == ["pass"] * sum(not c.grad for c in cases), by_id


def test_jitted_varlen_with_a_max_seqlen_hint_matches_eager():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(0)
    cu = jnp.asarray([0, 13, 13, 34], dtype=jnp.int32)
    q, k, v = (jnp.asarray(rng.standard_normal((34, 2, 16)), dtype=jnp.float32) for _ in range(3))

    def call(q, k, v, cu):
        return attnhub.attention_varlen(q, k, v, cu, cu, max_seqlen_q=21, max_seqlen_k=21, mask="causal")

    want = call(q, k, v, cu)
    got = jax.jit(call)(q, k, v, cu)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-6)


def test_varlen_under_torch_compile_runs_eagerly_and_matches():
    """Correctness under torch.compile (sdpa-cpu passed this before the graph break too; the
    failure it fixed, Dynamo tracing into the Triton interpreter's launch, is the traced varlen
    case of CI's ``certify triton --quick`` under the interpreter)."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 5, 17], dtype=torch.int32)
    q, k, v = (torch.randn(17, 2, 16, generator=g, requires_grad=True) for _ in range(3))

    def call(q, k, v):
        return attnhub.attention_varlen(q, k, v, cu, cu, mask="causal")

    want = call(q, k, v)
    torch._dynamo.reset()
    got = torch.compile(call, backend="aot_eager")(q, k, v)
    torch.testing.assert_close(got, want)
    (dq,) = torch.autograd.grad(got.sum(), [q])
    (dq_want,) = torch.autograd.grad(want.sum(), [q])
    torch.testing.assert_close(dq, dq_want)
