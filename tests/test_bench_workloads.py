"""The real-model bench families (attnhub/bench/workloads.py) on the CPU at small sizes: each
family's attnhub call runs (forward and, where timed, backward) and agrees with SDPA's math kernel
given the same mask or bias, where SDPA can express the case."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from attnhub.bench import workloads  # noqa: E402
from attnhub.bench.runners import Unsupported  # noqa: E402


def _small(case):
    return dataclasses.replace(
        case, batch=min(case.batch, 2), heads_q=max(1, case.heads_q // 8), heads_kv=max(1, case.heads_kv // 8),
        len_q=min(case.len_q, 64), len_k=64, dim=8, dtype="float64",
    )  # fmt: skip


CASES = {(c.family, c.direction): c for c in workloads.model_grid(quick=True)}


@pytest.mark.parametrize("key", sorted(CASES), ids=lambda k: "-".join(k))
def test_family_runs_and_agrees_with_sdpa_math(key):
    case = _small(CASES[key])
    workloads.lengths.cache_clear()
    q, k, v, do = workloads.make_inputs(case, "cpu")
    out = workloads.attnhub_runner("reference", case, "cpu")(q, k, v)
    assert torch.isfinite(out).all()
    if case.direction != "fwd":
        out.backward(do)
        assert all(x.grad is not None for x in (q, k, v))
    try:
        peer = workloads.peer_runner("sdpa-math", case, "cpu")
    except Unsupported:
        return
    want = peer(q, k, v)
    # Padded query rows: attnhub gives 0 (SPEC), SDPA's math kernel NaN; compare the valid rows.
    valid = torch.isfinite(want)
    assert torch.allclose(out[valid], want[valid], atol=1e-10)


def test_work_counts_valid_pairs_only():
    case = next(c for c in workloads.model_grid() if c.family == "padding")
    lens = workloads.lengths(case)
    assert all(case.len_q // 4 <= n <= case.len_q for n in lens)
    flops, _ = workloads.work(case)
    assert flops == pytest.approx(4 * case.heads_q * case.dim * sum(n * (n + 1) / 2 for n in lens))
    dec = next(c for c in workloads.model_grid() if c.family == "ragged-decode")
    _, nbytes = workloads.work(dec)
    assert nbytes == 2 * sum(workloads.lengths(dec)) * dec.heads_kv * dec.dim * 2
