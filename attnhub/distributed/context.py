"""``context_parallel_attention``: validation, positions of the shards, and the choice between
the ring, the all-gather and the head-parallel (all-to-all) variants."""

from __future__ import annotations

from typing import Any

from attnhub.errors import SpecError
from attnhub.request import parse_rule, scale_float
from attnhub.rules import Causal, Full, Local

SYNCS = ("none_front", "none_end", "scale_front", "scale_end")
METHODS = ("auto", "ring", "allgather", "heads")
#: method="auto" takes the all-gather variant below this many local query tokens per rank ...
ALLGATHER_MAX_LOCAL = 1024
#: ... or when Hq/Hkv >= this and the gathered K/V stays under ALLGATHER_MAX_BYTES.
ALLGATHER_MIN_GROUP = 8
ALLGATHER_MAX_BYTES = 256 << 20


def heads_fit(hq: int, hkv: int, world: int) -> bool:
    """The head-parallel variant's condition under ``auto``: every rank gets whole K/V heads
    (``Hkv % N == 0``, so no head is repeated) and it moves no more bytes than the ring's forward
    alone, ``(Hq/Hkv + 1)/N <= 1`` (docs/distributed.md: the byte counts)."""
    return world > 1 and hkv % world == 0 and hq % world == 0 and hq // hkv + 1 <= world


def choose_method(
    lq_local: int, hq: int, hkv: int, kv_bytes_global: int, world: int = 1, packed: bool = False
) -> str:
    """The documented rule (docs/distributed.md): all-gather for short local sequences, or for
    many query heads per KV head while the gathered K/V is small (not for packed documents);
    then the head-parallel variant when :func:`heads_fit`; the ring otherwise."""
    if not packed and lq_local < ALLGATHER_MAX_LOCAL:
        return "allgather"
    if not packed and hq // max(hkv, 1) >= ALLGATHER_MIN_GROUP and kv_bytes_global <= ALLGATHER_MAX_BYTES:
        return "allgather"
    if heads_fit(hq, hkv, world):
        return "heads"
    return "ring"


def packed_docs(cu_seqlens: Any, length: int) -> tuple[int, ...]:
    """The global ``cu_seqlens`` as a tuple of ints: 1-d, from 0 to the global length, never
    decreasing."""
    values = cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else list(cu_seqlens)
    if not values or any(isinstance(x, list) for x in values):
        raise SpecError("cu_seqlens", "a 1-d sequence of ints (0, ..., global length)", cu_seqlens)
    docs = tuple(int(x) for x in values)
    if docs[0] != 0 or docs[-1] != length:
        raise SpecError("cu_seqlens", f"first 0 and last the global length {length}", (docs[0], docs[-1]))
    if any(b < a for a, b in zip(docs, docs[1:])):
        raise SpecError("cu_seqlens", "non-decreasing offsets", docs)
    return docs


def _check_packed(q: Any, k: Any, sync: str, method: str) -> None:
    """Packed documents: one batch row of self-attention (queries and keys are the same tokens)."""
    if q.shape[0] != 1 or k.shape[0] != 1:
        raise SpecError("q.shape[0]", "1 with cu_seqlens (documents packed into one sequence)", q.shape[0])
    if q.shape[2] != k.shape[2]:
        raise SpecError("k.shape[2]", f"q's local length {q.shape[2]} with cu_seqlens", k.shape[2])
    if sync != "none_front":
        raise SpecError("sync", "none_front with cu_seqlens (each document from its start)", sync)
    if method == "allgather":
        raise SpecError("method", "'ring', 'heads' or 'auto' with cu_seqlens", method)


def needs_offsets(calls: list) -> bool:
    """True when some call needs SPEC §11 offsets (positions no sync mode expresses)."""
    from attnhub.distributed.block import positions

    return any(positions(c)[1:] != (0, 0) for c in calls)


def offsets_supported(q: Any, k: Any, v: Any, backend: str, softcap: float | None) -> bool:
    """Whether ``backend`` (or auto) runs a call with offsets on tensors like these."""
    from attnhub.errors import AttnhubError
    from attnhub.extras import Extras
    from attnhub.plan import plan_for

    try:
        plan_for(q[:, :, :1], k[:, :, :1], v[:, :, :1], "causal", "none_front", None, "bhsd", True,
              backend, Extras(softcap=softcap, q_offset=1))  # fmt: skip
    except AttnhubError:
        return False
    return True


def _shifts(sync: str, lq: int, lk: int) -> tuple[int, int]:
    """Global position shifts (SPEC §2) of queries and keys on the whole sequence."""
    if sync not in SYNCS:
        raise SpecError("sync", f"one of {SYNCS}", sync)
    m = max(lq, lk)
    if sync == "none_end":
        return m - lq, m - lk
    if sync != "none_front" and lq != lk:
        raise SpecError(
            "sync",
            f"none_front or none_end for a sharded sequence with Lq != Lk ({sync} maps queries onto "
            "a strided grid, which per-block offsets cannot express; reshard or use none_end)",
            sync,
        )
    return 0, 0


def context_parallel_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    group: Any = None,
    mask: Any = None,
    sync: str = "none_front",
    scale: float | None = None,
    softcap: float | None = None,
    layout: str = "bhsd",
    load_balance: str = "zigzag",
    backend: str = "auto",
    return_lse: bool = False,
    method: str = "auto",
    cu_seqlens: Any = None,
) -> Any:
    """Attention of a 1-d sequence sharded over the ranks of ``group`` (torch.distributed).

    Each rank passes its shard of q, k and v (from :func:`attnhub.distributed.shard`, same
    ``load_balance``) and gets its shard of the output (and lse, float32, without gradient), equal
    to the matching rows of ``attnhub.attention`` on the whole sequence. ``mask``: None/"full",
    "causal", Full(), Causal() or Local(...) evaluated on global positions; ``sync`` on the
    global lengths (``none_end`` aligns the last query with the last key). ``method``: "ring",
    "allgather", "heads" (all-to-all to head shards) or "auto" (see :func:`choose_method`).
    ``cu_seqlens``: documents packed into the sequence, as for ``attnhub.attention_varlen``: the
    global offsets (0, ..., L) of the whole packed sequence (a tensor or list, the same on every
    rank; B = 1, Lq = Lk, sync none_front); each document attends only itself, with ``mask``
    from its start. Differentiable in q, k and v.
    """
    import torch
    import torch.distributed as dist

    from attnhub.distributed import allgather, heads, ring
    from attnhub.distributed.schedule import LOAD_BALANCES, Geometry, chunks_per_rank, step_calls

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise SpecError(name, "a torch.Tensor (context parallelism runs on torch.distributed)", type(x))
        if x.dim() != 4:
            raise SpecError(f"{name}.ndim", "4 (a 1-d sequence: B, H, L, D)", x.dim())
    if layout not in ("bhsd", "bshd"):
        raise SpecError("layout", '"bhsd" or "bshd"', layout)
    if load_balance not in LOAD_BALANCES:
        raise SpecError("load_balance", f"one of {LOAD_BALANCES}", load_balance)
    if method not in METHODS:
        raise SpecError("method", f"one of {METHODS}", method)
    rule = parse_rule(mask)
    if rule is None or not isinstance(rule, (Full, Causal, Local)):
        raise SpecError("mask", "a rule (None, 'causal', Full(), Causal(), Local(...)); explicit mask arrays "
                        "are not sharded: express the mask as a rule", type(mask))  # fmt: skip
    if isinstance(rule, Local) and isinstance(rule.window, tuple) and len(rule.window) != 1:
        raise SpecError("mask.window", "one window (a 1-d sequence)", rule.window)
    if not dist.is_available() or not dist.is_initialized():
        raise SpecError("group", "an initialised torch.distributed process group", "none initialised")
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    q, k, v = (x.contiguous() for x in (q, k, v))
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    per = chunks_per_rank(load_balance)
    lq_loc, lk_loc = q.shape[2], k.shape[2]
    if lq_loc % per or lk_loc % per:
        raise SpecError("local sequence length", f"a multiple of {per} (load_balance={load_balance!r})",
                        (lq_loc, lk_loc))  # fmt: skip
    if k.shape[2] != v.shape[2]:
        raise SpecError("v.shape[2]", f"k's local length {k.shape[2]}", v.shape[2])
    lq, lk = lq_loc * world, lk_loc * world
    shift_q, shift_k = _shifts(sync, lq, lk)
    docs = ()
    if cu_seqlens is not None:
        _check_packed(q, k, sync, method)
        docs = packed_docs(cu_seqlens, lq)
    scale = 1.0 / float(q.shape[-1]) ** 0.5 if scale is None else scale_float(scale)
    geo = Geometry(world, load_balance, lq_loc // per, lk_loc // per, shift_q, shift_k, docs)
    setup = ring.Setup(group, rank, world, geo, rule, scale, softcap, backend)
    if method == "auto":
        kv_bytes = (k.numel() + v.numel()) * k.element_size() * world
        method = choose_method(lq_loc, q.shape[1], k.shape[1], kv_bytes, world, bool(docs))
        # A block the ring can only compute with offsets, on a backend without them: the all-gather
        # variant puts causal windows at the end of their keys (sync none_end). Decided from every
        # rank's schedule, so that all ranks take the same method.
        every = [step_calls(geo, rule, r, (r - t) % world) for r in range(world) for t in range(world)]
        if (
            method == "ring" and needs_offsets([c for cs in every for c in cs])
            and not offsets_supported(q, k, v, backend, softcap)
        ):  # fmt: skip
            method = "allgather" if not docs else "heads" if q.shape[1] % world == 0 else "ring"
    if method == "heads":
        heads.check_heads(q.shape[1], world)
        hs = heads.Heads(group, rank, world, load_balance, rule, sync, scale, softcap, backend, docs)
        out, lse = heads.heads_attention(q, k, v, hs)
    else:
        fn = allgather.AllGatherAttention if method == "allgather" else ring.RingAttention
        out, lse = fn.apply(q, k, v, setup)
    if layout == "bshd":
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out
