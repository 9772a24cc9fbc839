"""Benchmark families of what real models send (SPEC §9-§11): padded batches, learned biases,
softcap, sinks, packed sequences and KV-cache decoding, each with its peers.

Every family builds its extra tensors (masks, biases, lengths, cu_seqlens, block tables) once per
case from a fixed seed, inside the runner, so the timed call is the attention call alone. Work is
counted on valid tokens only: FLOPs over attended pairs (FlashAttention's count), bytes of the K
and V rows a decode step must read.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from attnhub.bench.case import Case
from attnhub.bench.support import Unsupported, allow_recompiles
from attnhub.rules import Causal, Full

#: Families of :func:`model_grid`, and the peers each can be compared with.
FAMILIES = ("padding", "bias", "softcap", "sinks", "varlen", "kvcache", "paged", "ragged-decode")
DECODE = ("kvcache", "paged", "ragged-decode")


def model_grid(quick: bool = False, dtype: str = "bfloat16") -> list[Case]:
    """The real-model cases of issues 22-23 (``quick``: one length per family)."""
    cases: list[Case] = []
    train = ("fwd", "bwd")
    for d in train:
        cases.append(Case("padding", 8, 16, 16, 4096, 4096, 128, Causal(), dtype=dtype, direction=d))
        cases.append(Case("varlen", 1, 16, 16, 16384, 16384, 128, Causal(), dtype=dtype, direction=d))
        for n in (4096,) if quick else (4096, 8192, 16384):
            cases.append(Case("softcap", 16384 // n, 16, 16, n, n, 128, Causal(), dtype=dtype, direction=d))
        cases.append(Case("sinks", 2, 16, 16, 8192, 8192, 128, Causal(), dtype=dtype, direction=d))
    for d in ("fwd", "fwdbwd"):
        cases.append(Case("bias", 4, 16, 16, 4096, 4096, 128, Full(), dtype=dtype, direction=d))
    for lk in (8192,) if quick else (8192, 32768):
        cases.append(Case("kvcache", 4, 32, 8, 1, lk, 128, Full(), "none_end", dtype))
    for bs in (16, 64):
        cases.append(Case("paged", 4, 32, 8, 1, 32768, 128, Full(), "none_end", dtype, variant=f"block={bs}"))
    cases.append(Case("ragged-decode", 32, 32, 8, 1, 32768, 128, Full(), "none_end", dtype))
    return cases


# -- the data every runner of a case shares -----------------------------------------------------


def _rng(case: Case) -> np.random.Generator:
    return np.random.default_rng(abs(hash((case.family, case.batch, case.len_q, case.len_k))) % 2**32)


@cache
def lengths(case: Case) -> tuple[int, ...]:
    """Valid lengths: per batch entry (padding: uniform in [L/4, L]; ragged decode: [1k, Lk]) or
    per packed sequence (varlen: 128..4k summing to the total)."""
    rng = np.random.default_rng(7)
    if case.family == "padding":
        return tuple(int(x) for x in rng.integers(case.len_q // 4, case.len_q + 1, case.batch))
    if case.family == "ragged-decode":
        return tuple(int(x) for x in rng.integers(min(1024, case.len_k // 4), case.len_k + 1, case.batch))
    if case.family == "varlen":
        out, left = [], case.len_q
        while left > 0:
            n = min(left, int(rng.integers(128, 4097)))
            out.append(n)
            left -= n
        return tuple(out)
    return (case.len_k,) * case.batch


def work(case: Case) -> tuple[float, float]:
    """(FLOPs, bytes) of one call: FLOPs over valid attended pairs (forward 4·H·pairs·D, backward
    2.5x, causal pairs counted exactly), bytes of the valid K and V rows a decode step reads."""
    mult = {"bwd": 2.5, "fwdbwd": 3.5}.get(case.direction, 1.0)
    if case.family in DECODE:
        itemsize = 4 if case.dtype == "float32" else 2
        rows = sum(lengths(case))
        return 4.0 * case.heads_q * rows * case.dim, 2.0 * rows * case.heads_kv * case.dim * itemsize
    if case.family in ("padding", "varlen"):
        pairs = sum(n * (n + 1) / 2 for n in lengths(case))
    else:
        n = case.len_q
        pairs = case.batch * (n * (n + 1) / 2 if isinstance(case.rule, Causal) else n * case.len_k)
    return 4.0 * case.heads_q * pairs * case.dim * mult, 0.0


# -- inputs ---------------------------------------------------------------------------------------


def make_inputs(case: Case, device: str) -> tuple[Any, Any, Any, Any]:
    """q, k, v, dout; varlen in the packed "thd" layout."""
    import torch

    dt = getattr(torch, case.dtype)
    grad = case.direction in ("bwd", "fwdbwd")
    g = torch.Generator(device=device).manual_seed(0)
    if case.family == "varlen":
        t = case.len_q
        q, k, v, do = (
            torch.randn(t, case.heads_q, case.dim, device=device, dtype=dt, generator=g) for _ in range(4)
        )
        return q.requires_grad_(grad), k.requires_grad_(grad), v.requires_grad_(grad), do

    def rnd(h: int, n: int) -> Any:
        return torch.randn(case.batch, h, n, case.dim, device=device, dtype=dt, generator=g).requires_grad_(
            grad
        )

    q, k, v = rnd(case.heads_q, case.len_q), rnd(case.heads_kv, case.len_k), rnd(case.heads_kv, case.len_k)
    do = torch.randn(case.batch, case.heads_q, case.len_q, case.dim, device=device, dtype=dt, generator=g)
    return q, k, v, do


def _padding_mask(case: Case, device: str) -> Any:
    """(B, 1, L, L) bool: causal within each entry's valid length, padded queries attend nothing."""
    import torch

    n = torch.tensor(lengths(case), device=device)[:, None, None, None]
    i = torch.arange(case.len_q, device=device)[:, None]
    j = torch.arange(case.len_k, device=device)[None, :]
    return (j <= i) & (i < n) & (j < n)


def _cu(case: Case, device: str) -> Any:
    import torch

    return torch.tensor(np.cumsum((0, *lengths(case))), dtype=torch.int32, device=device)


# -- runners ----------------------------------------------------------------------------------------


def attnhub_runner(name: str, case: Case, device: str = "cuda") -> Callable:
    """attnhub (backend ``name``) on the case, with the family's arguments."""
    import torch

    from attnhub.api import attention
    from attnhub.ragged import attention_kvcache, attention_varlen

    fam = case.family
    if fam == "padding":
        mask = _padding_mask(case, device)
        return lambda q, k, v: attention(q, k, v, mask=mask, backend=name)
    if fam == "bias":
        bias = _bias(case, device)
        return lambda q, k, v: attention(q, k, v, bias=bias, backend=name)
    if fam == "softcap":
        return lambda q, k, v: attention(q, k, v, mask="causal", softcap=30.0, backend=name)
    if fam == "sinks":
        sinks = torch.linspace(-1.0, 2.0, case.heads_q, device=device)
        return lambda q, k, v: attention(q, k, v, mask="causal", sinks=sinks, backend=name)
    if fam == "varlen":
        cu, longest = _cu(case, device), max(lengths(case))
        return lambda q, k, v: attention_varlen(
            q, k, v, cu, cu, max_seqlen_q=longest, max_seqlen_k=longest, mask="causal", backend=name
        )
    kl = torch.tensor(lengths(case), dtype=torch.int32, device=device)
    step = _Steps()
    if fam == "paged":
        block = int(case.variant.split("=")[1])
        pages: dict[int, tuple] = {}

        def paged(q: Any, k: Any, v: Any) -> Any:
            if id(k) not in pages:  # paged once (the warm-up call), outside the timed region
                pages[id(k)] = _paginate(k, v, block)
            kp, vp, table = pages[id(k)]
            step(kl, table)
            return attention_kvcache(q, kp, vp, kl, block_table=table, mask=None, backend=name)

        return paged

    def kvcache(q: Any, k: Any, v: Any) -> Any:
        step(kl)
        return attention_kvcache(q, k, v, kl, mask=None, backend=name)

    return kvcache


#: Attention calls per decoding step in the decode families (a model's layers).
LAYERS = 32


class _Steps:
    """A serving loop's decoding steps: every layer of a step takes the step's lengths (and block
    table), updated in place once per step. attnhub reads and checks them on the host once per
    update (docs/semantics.md), so the timed calls pay that read once per :data:`LAYERS` calls, as
    a user's would; ``add_(0)`` moves the tensors' versions on and keeps the work the same."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *tensors: Any) -> None:
        self.calls += 1
        if self.calls % LAYERS == 0:
            for t in tensors:
                t.add_(0)


def _bias(case: Case, device: str) -> Any:
    import torch

    g = torch.Generator(device=device).manual_seed(1)
    b = torch.randn(1, case.heads_q, case.len_q, case.len_k, device=device, generator=g)
    return b.to(getattr(torch, case.dtype)).requires_grad_(case.direction != "fwd")


def _paginate(k: Any, v: Any, block: int) -> tuple[Any, Any, Any]:
    """(num_blocks, block, Hkv, D) caches holding k and v in shuffled blocks, and the table."""
    import torch

    b, h, n, d = k.shape
    per = n // block
    perm = torch.randperm(b * per, generator=torch.Generator().manual_seed(3)).to(k.device)
    table = perm.view(b, per).to(torch.int32)

    def pack(x: Any) -> Any:
        blocks = x.view(b, h, per, block, d).permute(0, 2, 3, 1, 4).reshape(b * per, block, h, d)
        out = torch.empty_like(blocks)
        out[perm] = blocks
        return out

    return pack(k), pack(v), table


def peer_runner(name: str, case: Case, device: str = "cuda") -> Callable:
    """A torch peer on the case: SDPA pinned to one kernel with the family's mask or bias,
    FlexAttention (compiled) with the same mask_mod/score_mod, torch's varlen_attn."""

    fam = case.family
    if name == "flex":
        return _flex(case, device)
    if name == "varlen_attn":
        if fam != "varlen":
            raise Unsupported("varlen_attn takes packed sequences only")
        return _varlen_attn(case, device)
    if not name.startswith("sdpa-"):
        raise Unsupported(f"no peer {name!r}")
    if fam in ("softcap", "sinks", "varlen", "paged"):
        raise Unsupported(f"SDPA cannot express the {fam} case")
    return _sdpa(name, case, device)


def _sdpa(which: str, case: Case, device: str) -> Callable:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernel = {
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "sdpa-math": SDPBackend.MATH,
    }[which]
    f = torch.nn.functional.scaled_dot_product_attention
    gqa = case.heads_q != case.heads_kv
    mask: Any = None
    if case.family == "padding":
        mask = _padding_mask(case, device)
    elif case.family == "bias":
        mask = _bias(case, device)
    elif case.family == "ragged-decode":
        j = torch.arange(case.len_k, device=device)
        mask = (j[None, :] < torch.tensor(lengths(case), device=device)[:, None])[:, None, None, :]

    def fn(q: Any, k: Any, v: Any) -> Any:
        with sdpa_kernel([kernel]):
            return f(q, k, v, attn_mask=mask, enable_gqa=gqa)

    return fn


def _flex(case: Case, device: str) -> Callable:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    allow_recompiles()
    compiled = torch.compile(flex_attention, dynamic=False)
    fam = case.family
    gqa = case.heads_q != case.heads_kv
    if fam in ("sinks", "paged", "kvcache"):
        raise Unsupported(f"no FlexAttention equivalent for the {fam} case in this bench")

    def causal(b: Any, h: Any, qi: Any, kj: Any) -> Any:
        return kj <= qi

    if fam == "softcap":
        bm = create_block_mask(causal, None, None, case.len_q, case.len_k, device=device)

        def tanh_cap(score: Any, b: Any, h: Any, qi: Any, kj: Any) -> Any:
            return 30.0 * torch.tanh(score / 30.0)

        return lambda q, k, v: compiled(q, k, v, score_mod=tanh_cap, block_mask=bm)
    if fam == "padding":
        n = torch.tensor(lengths(case), device=device)

        def padded(b: Any, h: Any, qi: Any, kj: Any) -> Any:
            return (kj <= qi) & (qi < n[b]) & (kj < n[b])

        bm = create_block_mask(padded, case.batch, None, case.len_q, case.len_k, device=device)
        return lambda q, k, v: compiled(q, k, v, block_mask=bm)
    if fam == "bias":
        bias = _bias(case, device)

        def add_bias(score: Any, b: Any, h: Any, qi: Any, kj: Any) -> Any:
            return score + bias[0, h, qi, kj]

        return lambda q, k, v: compiled(q, k, v, score_mod=add_bias)
    if fam == "varlen":
        doc = torch.repeat_interleave(
            torch.arange(len(lengths(case)), device=device), torch.tensor(lengths(case), device=device)
        )

        def document(b: Any, h: Any, qi: Any, kj: Any) -> Any:
            return (doc[qi] == doc[kj]) & (kj <= qi)

        bm = create_block_mask(document, None, None, case.len_q, case.len_k, device=device)

        def packed(q: Any, k: Any, v: Any) -> Any:
            out = compiled(*(x.transpose(0, 1)[None] for x in (q, k, v)), block_mask=bm)
            return out[0].transpose(0, 1)

        return packed
    if fam == "ragged-decode":
        n = torch.tensor(lengths(case), device=device)

        def valid(b: Any, h: Any, qi: Any, kj: Any) -> Any:
            return kj < n[b]

        bm = create_block_mask(valid, case.batch, None, case.len_q, case.len_k, device=device)
        return lambda q, k, v: compiled(q, k, v, block_mask=bm, enable_gqa=gqa)
    raise Unsupported(f"no FlexAttention runner for {fam}")


def _varlen_attn(case: Case, device: str) -> Callable:

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        raise Unsupported("this torch has no torch.nn.attention.varlen.varlen_attn") from None
    cu, longest = _cu(case, device), max(lengths(case))

    def fn(q: Any, k: Any, v: Any) -> Any:
        try:
            return varlen_attn(q, k, v, cu, cu, longest, longest, window_size=(-1, 0))
        except TypeError:  # an older signature: causal flag
            return varlen_attn(q, k, v, cu, cu, longest, longest, is_causal=True)

    return fn
