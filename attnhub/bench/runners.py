"""Callables to time: attnhub backends by name and torch peers (SDPA backends, FlexAttention)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnhub.bench.case import Case
from attnhub.bench.support import Unsupported, allow_recompiles
from attnhub.rules import Causal, Full, Local

PEERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex", "varlen_attn")
#: Peers run only when named: torch's unfused SDPA (the float32 baseline; it holds L x L scores).
EXTRA_PEERS = ("sdpa-math",)


def make_inputs(case: Case, device: str = "cuda") -> tuple[Any, Any, Any, Any]:
    import torch

    dt = getattr(torch, case.dtype)
    grad = case.direction in ("bwd", "fwdbwd")
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(h: int, n: int) -> Any:
        x = torch.randn(case.batch, h, n, case.dim, device=device, dtype=dt, generator=g)
        return x.requires_grad_(grad)

    q, k, v = rnd(case.heads_q, case.len_q), rnd(case.heads_kv, case.len_k), rnd(case.heads_kv, case.len_k)
    do = torch.randn(case.batch, case.heads_q, case.len_q, case.dim, device=device, dtype=dt, generator=g)
    return q, k, v, do


def attnhub_forward(name: str, case: Case) -> Callable[[Any, Any, Any], Any]:
    from attnhub.api import attention

    def fn(q: Any, k: Any, v: Any) -> Any:
        return attention(q, k, v, mask=case.rule, sync=case.sync, backend=name)

    return fn


def _sdpa(which: str, case: Case) -> Callable[[Any, Any, Any], Any]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "sdpa-math": SDPBackend.MATH,
    }[which]
    if isinstance(case.rule, Local):
        raise Unsupported("SDPA has no sliding-window rule without a dense mask")
    causal = isinstance(case.rule, Causal)
    if causal and case.len_q != case.len_k:
        raise Unsupported("SDPA's is_causal is top-left aligned; the case differs")
    gqa = case.heads_q != case.heads_kv
    f = torch.nn.functional.scaled_dot_product_attention

    def fn(q: Any, k: Any, v: Any) -> Any:
        with sdpa_kernel([backend]):
            return f(q, k, v, is_causal=causal, enable_gqa=gqa)

    return fn


def _flex(case: Case) -> Callable[[Any, Any, Any], Any]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    m = max(case.len_q, case.len_k)
    off_q = m - case.len_q if case.sync == "none_end" else 0
    off_k = m - case.len_k if case.sync == "none_end" else 0
    if case.sync not in ("none_front", "none_end"):
        raise Unsupported("bench's FlexAttention masks cover none_front/none_end only")
    rule = case.rule
    allow_recompiles()
    compiled = torch.compile(flex_attention, dynamic=False)
    gqa = case.heads_q != case.heads_kv
    if isinstance(rule, Full):

        def fn(q: Any, k: Any, v: Any) -> Any:
            return compiled(q, k, v, enable_gqa=gqa)

        return fn

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        d = (q_idx + off_q) - (kv_idx + off_k)
        if isinstance(rule, Causal):
            return d >= 0
        (w,) = rule.windows(1)
        s = rule.stride
        ad = d.abs()
        keep = (ad % s == 0) & (ad // s < w)
        return keep & (d >= 0) if rule.causal else keep

    bm = create_block_mask(mask_mod, None, None, case.len_q, case.len_k, device="cuda")

    def fn(q: Any, k: Any, v: Any) -> Any:
        return compiled(q, k, v, block_mask=bm, enable_gqa=gqa)

    return fn


def runner(name: str, case: Case) -> Callable[[Any, Any, Any], Any]:
    """A forward callable for an attnhub backend name or a peer name."""
    from attnhub.bench import workloads

    if case.family in workloads.FAMILIES:
        if name in PEERS + EXTRA_PEERS:
            return workloads.peer_runner(name, case)
        return workloads.attnhub_runner(name, case)
    if name == "varlen_attn":
        raise Unsupported("varlen_attn takes packed sequences only")
    if name.startswith("sdpa-"):
        return _sdpa(name, case)
    if name == "flex":
        return _flex(case)
    return attnhub_forward(name, case)
