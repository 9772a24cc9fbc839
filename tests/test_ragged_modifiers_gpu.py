"""Issue 39 on the GPU: ALiBi in the triton kernels, and a bias (with dbias) composed with lengths,
at realistic sizes in every dtype, judged by certify's float64
oracle and SPEC §6's tolerances (the runner poisons outputs with NaN first); and `auto` serving them.
"""

from __future__ import annotations

import pytest

from attnhub.rules import Causal, Full, Local
from attnhub_conformance.cases import Case
from attnhub_conformance.modifier_cases import RaggedCase, kvcache, varlen

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

from attnhub_conformance.runner import Certifier  # noqa: E402
from tests.plugged import run_all  # noqa: E402

DTYPES = ["bfloat16", "float16", "float32"]
H = dict(heads_q=4, heads_kv=2, dim_qk=64, dim_v=64)


def _cases(dt: str) -> list[Case]:
    return [
        # ALiBi, dense: training (Lq = Lk, causal), chunked prefill (none_end), per-batch slopes
        Case(dt, (640,), (640,), Causal(), alibi="h", grad=True, lse=True, batch=2, **H),
        Case(dt, (300,), (900,), Causal(), "none_end", alibi="bh", grad=True, lse=True, batch=2, **H),
        Case(dt, (513,), (513,), Full(), alibi="h", bias="1hqk", bias_grad=True, grad=True, batch=2, **H),
        Case(dt, (640,), (640,), Local(128, causal=True), alibi="h", softcap=30.0, grad=True, batch=1, **H),
        # ALiBi with padding (BLOOM's left-padded batches), packing, a paged cache (decode)
        RaggedCase(dt, (500,), (500,), Causal(), q_lengths=(500, 311), k_lengths=(500, 311), padding_side="left",
                   alibi="bh", grad=True, lse=True, batch=2, nan_padding=True, **H),
        varlen(dt, Causal(), "none_front", (300, 0, 417), (300, 0, 417), alibi="h", grad=True, lse=True, **H),
        kvcache(dt, Causal(), 1, 1024, (1024, 377), paged=64, alibi="bh", lse=True, **H),
        # a bias with dbias and padding (T5, relative-position biases), both padding sides
        RaggedCase(dt, (640,), (640,), Full(), q_lengths=(640, 413), k_lengths=(640, 413), bias="1hqk",
                   bias_grad=True, grad=True, lse=True, batch=2, nan_padding=True, **H),
        RaggedCase(dt, (600,), (600,), Causal(), "none_end", q_lengths=(400, 600), k_lengths=(400, 600),
                   padding_side="left", bias="full", bias_grad=True, sinks=True, grad=True, lse=True, batch=2, **H),
        Case(dt, (512,), (700,), Local(64), q_lengths=(512, 0), k_lengths=(17, 700), bias="b11k", bias_neginf=True,
             bias_grad=True, softcap=30.0, grad=True, lse=True, batch=2, **H),
        # a bias with ALiBi and offsets (a chunk of a longer sequence)
        Case(dt, (256,), (512,), Causal(), q_offset=256, bias="1hqk", alibi="h", bias_grad=True, grad=True, lse=True,
             batch=2, **H),
    ]  # fmt: skip


def _declined_by_design(case: Case) -> bool:
    """float32 ALiBi with lengths or packing, outside a causal none_end request: per-entry lengths
    could put a query far from every key, where the kernels' float32 term is not exact, so triton
    declines (attnhub/modifiers/alibi.py: nearest_key_gap) and points to bias=."""
    ragged = case.entry != "attention" or case.q_lengths is not None or case.k_lengths is not None
    causal_end = isinstance(case.rule, Causal) and case.sync == "none_end"
    return case.dtype == "float32" and bool(case.alibi) and ragged and not causal_end


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_computes_alibi_and_biases_with_ragged_sequences(dtype) -> None:
    cases = _cases(dtype)
    cert = Certifier("triton", seed=39, device="cuda")
    results = {r.id: r for r in run_all(cert, cases)}
    want = {c.id: "declined" if _declined_by_design(c) else "pass" for c in cases}
    bad = [(i, r.status, r.message) for i, r in results.items() if r.status != want[i]]
    assert not bad, bad


@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_serves_them_on_the_gpu(dtype) -> None:
    """No NoBackendError for any of them: `auto` picks a GPU backend (the explanation names it)."""
    import numpy as np

    from attnhub.dispatch import explain_request
    from attnhub_conformance.modifier_calls import Call
    from attnhub_conformance.modifier_data import make_mod_data

    cert = Certifier("triton", seed=39, device="cuda")
    for case in _cases(dtype):
        if _declined_by_design(case):
            continue
        call = Call(cert.ops, case, make_mod_data(case, np.random.default_rng(0)))
        ex = explain_request(call.request(), "auto")
        assert ex.chosen in ("triton", "cuda", "cudnn"), (case.id, str(ex))
