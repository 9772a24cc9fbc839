"""Context parallelism with packed documents (``cu_seqlens``) and the head-parallel variant
(``method="heads"``): the schedule's pieces and skipped steps, the one-process simulation, and
2 and 4 gloo processes, forward and backward, against ``attention_varlen`` / ``attention`` on the
whole sequence in float64 (SPEC §6 tolerances); bitwise determinism of the ring and of heads."""

from __future__ import annotations

import pytest
import torch

import attnhub
from attnhub import Causal, Full, SpecError
from attnhub.distributed import context_parallel_attention, shard, simulate
from attnhub.distributed.context import choose_method
from attnhub.distributed.schedule import Geometry, active_steps, chunk_ids, step_calls
from tests.distributed_cases import TOL, errors, make_inputs, reference

#: Uneven documents of 64 tokens, none longer than a zigzag chunk at N = 4 (8 tokens): rank pairs
#: two chunks apart share no document, so ring step 2 is skipped at N = 4.
SHORT_DOCS = (0, 5, 13, 20, 24, 31, 38, 46, 50, 57, 64)
#: Uneven documents of 64 tokens crossing several chunks (one zero-length document).
LONG_DOCS = (0, 3, 27, 27, 40, 41, 64)


def varlen_reference(q, k, v, do, mask, docs):
    """out, lse, (dq, dk, dv) of attention_varlen in float64 on the whole packed sequence."""
    leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
    cu = torch.tensor(docs, dtype=torch.int32)
    thd = [x[0].transpose(0, 1) for x in leaves]
    out, lse = attnhub.attention_varlen(*thd, cu, cu, mask=mask, backend="reference", return_lse=True)
    out = out.transpose(0, 1).unsqueeze(0)
    grads = torch.autograd.grad(out, leaves, do.double())
    return out.detach(), lse.unsqueeze(0).detach(), grads


def _allowed(rule: object, docs: tuple[int, ...], length: int) -> torch.Tensor:
    """The (query, key) pairs attention_varlen attends: one document, the rule inside it."""
    doc = torch.bucketize(torch.arange(length), torch.tensor(docs[1:]), right=True)
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    same = doc[:, None] == doc[None, :]
    return same & (i >= j) if isinstance(rule, Causal) else same


def _covered(geo: Geometry, rule: object, length: int) -> torch.Tensor:
    """How many calls of the schedule cover each (query, key) pair the call's rule keeps."""
    cover = torch.zeros(length, length, dtype=torch.int64)
    pos = lambda r, c: [cid * c + x for cid in chunk_ids(r, geo.world, "zigzag") for x in range(c)]  # noqa: E731
    for rank in range(geo.world):
        for t in active_steps(geo, rule):
            src = (rank - t) % geo.world
            qp, kp = pos(rank, geo.cq), pos(src, geo.ck)
            for c in step_calls(geo, rule, rank, src):
                rows = torch.tensor(qp[c.q_lo : c.q_hi])[:, None]
                cols = torch.tensor(kp[c.k_lo : c.k_hi])[None, :]
                keep = torch.ones(rows.shape[0], cols.shape[1], dtype=torch.bool)
                if isinstance(c.rule, Causal):
                    keep = rows - rows.min() + c.q_offset >= cols - cols.min() + c.k_offset
                cover[rows, cols] += keep.long()
    return cover


@pytest.mark.parametrize("docs", [SHORT_DOCS, LONG_DOCS])
@pytest.mark.parametrize("rule", [Causal(), Full()])
def test_schedule_computes_exactly_the_document_pairs(docs, rule) -> None:
    """Every pair of one document the rule keeps is computed once; no pair across documents."""
    geo = Geometry(4, "zigzag", 8, 8, 0, 0, docs)
    assert torch.equal(_covered(geo, rule, 64), _allowed(rule, docs, 64).long())


def test_steps_no_rank_needs_are_not_run() -> None:
    """Short documents at N = 4: no rank shares a document with the keys two ranks back."""
    geo = Geometry(4, "zigzag", 8, 8, 0, 0, SHORT_DOCS)
    assert active_steps(geo, Causal()) == (0, 1, 3)
    chunked = Geometry(4, "zigzag", 8, 8, 0, 0, tuple(range(0, 65, 8)))  # one document a chunk
    assert active_steps(chunked, Causal()) == (0,)


@pytest.mark.parametrize(
    "world, mask, docs, hq, hkv",
    [(4, "causal", SHORT_DOCS, 4, 2), (4, None, LONG_DOCS, 2, 2), (2, "causal", LONG_DOCS, 4, 1)],
)
def test_simulated_ring_matches_attention_varlen(world, mask, docs, hq, hkv) -> None:
    """The one-process simulation of N virtual ranks, float64, against attention_varlen."""
    q, k, v, do = make_inputs(7, 1, hq, hkv, 64, 64, 8, torch.float64, "cpu")
    got = simulate.run(q, k, v, do, world, mask=mask, cu_seqlens=docs)
    out, lse, grads = varlen_reference(q, k, v, do, mask, docs)
    for name, ref in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads)):
        assert max(errors(got[name], ref)) <= TOL[torch.float64][name not in ("out", "lse")], name


def test_auto_rule() -> None:
    """Heads when every rank gets whole K/V heads and it moves no more bytes than the ring's
    forward ((Hq/Hkv + 1)/N <= 1); all-gather stays first for short shards (not for documents)."""
    assert choose_method(4096, 16, 16, 1 << 30, world=4) == "heads"
    assert choose_method(4096, 32, 8, 1 << 40, world=4) == "ring"  # (4 + 1)/4 > 1
    assert choose_method(4096, 16, 2, 1 << 40, world=4) == "ring"  # Hkv % N != 0
    assert choose_method(512, 16, 16, 1 << 30, world=4) == "allgather"
    assert choose_method(512, 16, 16, 1 << 30, world=4, packed=True) == "heads"
    assert choose_method(512, 8, 1, 1 << 20, world=2, packed=True) == "ring"


def _cases(world: int) -> list[dict]:
    """(id, method, mask, docs, hq, hkv, dtype); L = 64 tokens."""
    bf16 = torch.bfloat16
    return [
        {"id": "ring-docs-causal-gqa", "method": "ring", "mask": "causal", "docs": SHORT_DOCS, "hq": 4, "hkv": 2},
        {"id": "ring-docs-full", "method": "ring", "mask": None, "docs": LONG_DOCS, "hq": 2, "hkv": 2},
        {"id": "ring-docs-causal-bf16", "method": "ring", "mask": "causal", "docs": LONG_DOCS, "hq": 4, "hkv": 1,
         "dtype": bf16},
        {"id": "heads-causal", "method": "heads", "mask": "causal", "docs": None, "hq": 4, "hkv": 4},
        {"id": "heads-causal-batch2", "method": "heads", "mask": "causal", "docs": None, "hq": 4, "hkv": 4, "b": 2},
        {"id": "heads-gqa-repeat", "method": "heads", "mask": "causal", "docs": None, "hq": 4 * world // 2,
         "hkv": 1},
        {"id": "heads-docs-causal", "method": "heads", "mask": "causal", "docs": LONG_DOCS, "hq": 4, "hkv": 4},
        {"id": "heads-docs-full-bf16", "method": "heads", "mask": None, "docs": SHORT_DOCS, "hq": 8, "hkv": 4,
         "dtype": bf16},
    ]  # fmt: skip


def _run(case: dict, sh: list, group=None):
    leaves = [x.detach().clone().requires_grad_(True) for x in sh[:3]]
    out, lse = context_parallel_attention(
        *leaves,
        group=group,
        mask=case["mask"],
        method=case["method"],
        cu_seqlens=case["docs"],
        return_lse=True,
    )
    return [out, lse, *torch.autograd.grad(out, leaves, sh[3])]


def _check(rank: int, world: int, n: int, case: dict) -> list[str]:
    dtype = case.get("dtype", torch.float32)
    q, k, v, do = make_inputs(500 + n, case.get("b", 1), case["hq"], case["hkv"], 64, 64, 8, dtype, "cpu")
    if case["docs"] is None:
        out, lse, grads = reference(q, k, v, do, case["mask"], "none_front", None)
    else:
        out, lse, grads = varlen_reference(q, k, v, do, case["mask"], case["docs"])
    sh = [shard(x, rank, world) for x in (q, k, v, do)]
    got, again = _run(case, sh), _run(case, sh)
    fails = [] if all(torch.equal(a, b) for a, b in zip(got, again)) else [f"{case['id']}: not deterministic"]
    for i, (name, ref) in enumerate(zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads))):
        tol = TOL[dtype][i >= 2]
        err = max(errors(got[i], shard(ref, rank, world)))
        if not err <= tol:
            fails.append(f"{case['id']} rank {rank} {name}: {err:.2e} > {tol}")
    return fails


def _bad_calls(rank: int, world: int) -> list[str]:
    """Bad arguments raise SpecError naming the argument."""
    q = shard(torch.randn(1, 2, 64, 8), rank, world)
    bad = [
        ("cu_seqlens", {"cu_seqlens": (0, 10, 63)}),
        ("cu_seqlens", {"cu_seqlens": (0, 40, 30, 64)}),
        ("method", {"cu_seqlens": (0, 64), "method": "allgather"}),
        ("q.shape[1]", {"method": "heads"} if world > 2 else {"method": "heads", "_hq": 3}),
    ]
    fails = []
    for name, kw in bad:
        hq = kw.pop("_hq", 2 if world > 2 else None)
        qq = q if hq is None else shard(torch.randn(1, hq, 64, 8), rank, world)
        try:
            context_parallel_attention(qq, q, q, mask="causal", **kw)
            fails.append(f"{kw}: no SpecError")
        except SpecError as exc:
            if name not in str(exc):
                fails.append(f"{kw}: SpecError without {name!r}: {exc}")
    return fails


def _worker(rank: int, world: int, init: str, result: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    fails = []
    for n, case in enumerate(_cases(world)):
        try:
            fails += _check(rank, world, n, case)
        except Exception as exc:  # reported, never swallowed
            fails.append(f"{case['id']}: {type(exc).__name__}: {exc}")
    fails += _bad_calls(rank, world)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, fails)
    if rank == 0:
        with open(result, "w") as f:
            f.write("\n".join(x for fs in everyone for x in fs))
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_packed_documents_and_heads(world: int) -> None:
    from tests.distributed_cases import spawn_gloo

    fails = spawn_gloo(_worker, world)
    assert fails == "", fails
