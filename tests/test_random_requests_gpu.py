"""Issue 39: random valid SPEC §9-§11 requests with CUDA tensors are served by `auto` on the GPU
and match certify's float64 oracle.

Each request mixes a bias (broadcast shapes, with and without its gradient), a boolean mask,
softcap, sinks, ALiBi, lengths on either padding side (zero-length entries included), packed
sequences, contiguous and paged caches (several new queries), offsets, with every rule and sync
mode, GQA, Dqk != Dv, layouts and the three GPU dtypes. `auto` must pick a GPU backend for each
(no NoBackendError), except the declines SPEC and docs/semantics.md document, which must then
give their reason; the chosen backend's results (out, lse, gradients) are judged by the certify
runner: SPEC §6 tolerances, every element written, inputs untouched.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from attnhub.rules import Causal, Full, Local
from attnhub_conformance.case import SYNCS
from attnhub_conformance.cases import Case
from attnhub_conformance.modifier_cases import RaggedCase, kvcache, varlen

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

from attnhub.dispatch import explain_request  # noqa: E402
from attnhub_conformance.modifier_calls import Call  # noqa: E402
from attnhub_conformance.modifier_data import make_mod_data  # noqa: E402
from attnhub_conformance.runner import CaseFailure, Certifier  # noqa: E402

DTYPES = ("float16", "bfloat16", "float32")
RULES = (Full(), Causal(), Local(7), Local(5, causal=True), Local(3, 1, causal=True))
N = 40


def _lengths(rng, batch: int, n: int) -> tuple[int, ...]:
    lens = rng.integers(0, n + 1, batch)
    lens[rng.integers(batch)] = n if rng.random() < 0.5 else 0
    return tuple(int(x) for x in lens)


def random_case(rng: np.random.Generator) -> Case:
    """One valid request: its entry point, rule, sync and §9-§11 arguments drawn together."""
    dt = str(rng.choice(DTYPES))
    hkv = int(rng.choice([1, 2, 4]))
    hq = hkv * int(rng.choice([1, 2, 4]))
    dqk = int(rng.choice([32, 64, 128]))
    dv = dqk if rng.random() < 0.7 else int(rng.choice([32, 64]))
    shape = dict(heads_q=hq, heads_kv=hkv, dim_qk=dqk, dim_v=dv)
    rule = RULES[rng.integers(len(RULES))]
    mods: dict = {}
    if rng.random() < 0.3:
        mods["softcap"] = float(rng.choice([20.0, 30.0, 50.0]))
    if rng.random() < 0.3:
        mods["sinks"] = True
    if rng.random() < 0.35:
        mods["alibi"] = str(rng.choice(["h", "bh"]))
    entry = rng.choice(["attention", "lengths", "varlen", "kvcache"], p=[0.3, 0.35, 0.15, 0.2])
    if entry == "varlen":
        n = int(rng.integers(1, 5))
        lq = tuple(int(x) for x in rng.integers(0, 160, n))
        lk = tuple(int(x) for x in rng.integers(0, 160, n))
        return varlen(dt, rule, str(rng.choice(SYNCS)), lq, lk, grad=bool(rng.random() < 0.6), lse=True,
                      **shape, **mods)  # fmt: skip
    if entry == "kvcache":
        paged = int(rng.choice([0, 16, 64]))
        cap = int(rng.choice([64, 128, 256]))
        batch = int(rng.integers(1, 4))
        lq = int(rng.choice([1, 1, 3, 17]))
        kl = tuple(int(x) for x in rng.integers(lq, cap + 1, batch))
        return kvcache(dt, rule if not isinstance(rule, Full) or rng.random() < 0.5 else Causal(), lq, cap, kl,
                       paged=paged, lse=True, **shape, **mods)  # fmt: skip
    batch = int(rng.integers(1, 4))
    nq, nk = int(rng.integers(1, 200)), int(rng.integers(1, 200))
    if rng.random() < 0.4:
        nk = nq
    kw: dict = dict(
        batch=batch, grad=bool(rng.random() < 0.6), lse=True, layout=str(rng.choice(["bhsd", "bshd"]))
    )
    if rng.random() < 0.5:
        kw["bias"] = str(rng.choice(["1hqk", "b11k", "full"]))
        kw["bias_grad"] = kw["grad"] and rng.random() < 0.6
        kw["bias_neginf"] = rng.random() < 0.2
    sync = str(rng.choice(SYNCS))
    use_mask = rng.random() < 0.2
    if entry == "lengths":
        kw.update(q_lengths=_lengths(rng, batch, nq) if rng.random() < 0.7 else None,
                  k_lengths=_lengths(rng, batch, nk), padding_side=str(rng.choice(["right", "left"])))  # fmt: skip
    elif rng.random() < 0.3:
        sync = "none_front"
        kw.update(q_offset=int(rng.integers(0, 500)), k_offset=int(rng.integers(0, 500)))
    if use_mask:
        return RaggedCase(dt, (nq,), (nk,), "bool", mask_shape=str(rng.choice(["full", "bcast"])), **kw, **shape,
                          **mods)  # fmt: skip
    return RaggedCase(dt, (nq,), (nk,), rule, sync, **kw, **shape, **mods)


def documented_decline(case: Case) -> str | None:
    """The reason a documented decline must give, or None when `auto` must serve the case."""
    ragged = case.entry != "attention" or case.q_lengths is not None or case.k_lengths is not None
    causal_end = (
        isinstance(case.rule, Causal | Local)
        and getattr(case.rule, "causal", True)
        and case.sync == "none_end"
    )
    if case.alibi and case.dtype == "float32" and ragged and not causal_end:
        return "computes ALiBi in float32"  # docs/semantics.md, ALiBi
    if case.alibi and case.entry == "attention" and not ragged:
        from attnhub.modifiers.alibi import FLOAT32_TERM_GAP

        if _dense_gap(case) > FLOAT32_TERM_GAP[case.dtype]:
            return "computes ALiBi in float32"
    return None


def _dense_gap(case: Case) -> int:
    import attnhub

    q = torch.empty(1, case.heads_q, case.nq, 8, device="cuda")
    k = torch.empty(1, case.heads_q, case.nk, 8, device="cuda")
    rule = None if isinstance(case.rule, str) else case.rule
    req = attnhub.explain(
        q, k, k, mask=rule, sync=case.sync, q_offset=case.q_offset, k_offset=case.k_offset
    ).request
    from attnhub.modifiers.alibi import nearest_key_gap

    return nearest_key_gap(req)


def test_auto_serves_random_requests_on_the_gpu_and_matches_the_oracle() -> None:
    rng = np.random.default_rng(20261129)
    cases = [random_case(rng) for _ in range(N)]
    ops = Certifier("triton", seed=1, device="cuda").ops
    served, declined, problems = 0, 0, []
    for i, case in enumerate(cases):
        call = Call(ops, case, make_mod_data(case, np.random.default_rng(i)))
        ex = explain_request(call.request(), "auto")
        why = documented_decline(case)
        if ex.chosen is None:
            if why is None or why not in str(ex):
                problems.append((case.describe(), "no backend", str(ex)))
            declined += 1
            continue
        if why is not None:
            problems.append((case.describe(), f"documented decline {why!r}, but {ex.chosen} served it"))
        if ex.chosen == "reference":
            problems.append((case.describe(), "served by the CPU reference"))
            continue
        cert = Certifier(ex.chosen, seed=i, device="cuda")
        with contextlib.suppress(CaseFailure):
            cert.run(case)
        res = cert.results[case.id]
        if res.status != "pass":
            problems.append((case.describe(), ex.chosen, res.status, res.message))
        served += 1
    print(f"{served} served and matched, {declined} declined by design, {len(problems)} problems")
    assert not problems, problems
    assert served >= N * 3 // 4
