"""The triton forward's and backward's shape: the config candidates and the class a config is chosen
(and tuned) for, the forward's tile, split-KV and load-path choice (``fwd_shape``: one function), and
the walk's switches that follow from them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from attnhub import settings
from attnhub.request import Request
from attnhub.rules import ExplicitMask, Local
from attnhub_backends.triton import configs, device, plan
from attnhub_backends.triton.loader import interpret_mode
from attnhub_backends.triton.modifiers import LOG2E, plan_rule, uses_alibi


def candidates(kernel: str, req: Request, x: torch.Tensor) -> list[configs.Cfg]:
    forced = configs.forced(kernel)
    if forced is not None:
        return [forced]
    if interpret_mode() or not device.on_gpu(x.device):
        return [configs.INTERPRET[kernel]]
    d = max(device.pad(req.dim_qk), device.pad(req.dim_v))
    if kernel == "fwd" and req.nq <= 16:
        return configs.small_q_candidates(d, x.element_size())
    if kernel == "fwd" and isinstance(req.rule, ExplicitMask):
        found = configs.mask_candidates(d, x.element_size(), device.capability(x.device))
        if found is not None:
            return found
    if kernel == "fwd" and isinstance(req.rule, Local) and x.element_size() == 2 and d <= 128:
        return configs.local_candidates(d, device.capability(x.device))
    if kernel == "fwd" and req.softcap is not None:
        found = configs.softcap_candidates(d, x.element_size(), device.capability(x.device))
        if found is not None:
            return found
    if kernel != "fwd" and uses_alibi(req):
        found = configs.alibi_backward_candidates(kernel, d, x.element_size(), device.capability(x.device))
        if found is not None:
            return found
    return configs.candidates(kernel, d, x.element_size(), device.capability(x.device))


#: Fewest key tiles per program worth splitting: below it a program's loop lasts a few µs, less
#: than the combine launch and the two partial buffers cost the host (small decode steps).
MIN_SPLIT_VISITS = 16


def split_count(programs: int, visits: int, dev: torch.device) -> int:
    """Split-KV factor: >1 when too few (query tile, head) programs would fill the GPU and each
    has a long enough key loop."""
    forced = settings.raw("ATTNHUB_TRITON_SPLITS")
    if forced:
        return max(1, min(int(forced), max(1, visits)))
    if not device.on_gpu(dev) or programs >= 2 * device.sm_count(dev) or visits < MIN_SPLIT_VISITS:
        return 1
    return max(1, min(triton_cdiv(4 * device.sm_count(dev), programs), visits // 4, 32))


def config_key(kernel: str, req: Request, x: torch.Tensor) -> tuple:
    """The shape class a config is chosen (and tuned) for. No lengths: a call that differs only in
    its lengths gets the same config, hence the same compiled kernel. Forwards of at most 16 query
    rows (decoding) have their own candidates (``candidates``), so their own class."""
    rule = req.rule
    return (
        kernel, str(x.device), device.capability(x.device), req.dtype, device.pad(req.dim_qk), device.pad(req.dim_v),
        type(rule).__name__, getattr(rule, "causal", False), req.ndim, kernel == "fwd" and req.nq <= 16,
        interpret_mode(), _window_key(rule, req.ndim),
        settings.raw("ATTNHUB_TRITON_TMA"), settings.raw(configs.CFG_SETTING[kernel]),
        req.softcap is not None, req.bias is not None, req.sinks, req.bias_grad, uses_alibi(req),
    )  # fmt: skip


def _window_key(rule: Any, ndim: int) -> tuple:
    """Local windows tune apart by power-of-two bucket of each window, and by stride."""
    if not isinstance(rule, Local):
        return ()
    return (tuple(configs.bucket(w) for w in rule.windows(ndim)), rule.log2_stride)


def persist(x: torch.Tensor) -> bool:
    """Compiled GPU calls use (and tuning records) picks on disk; the interpreter does not."""
    return device.on_gpu(x.device) and not interpret_mode()


def work(req: Request) -> int:
    return req.batch * req.heads_q * req.nq * req.nk * (req.dim_qk + req.dim_v)


@dataclass(frozen=True)
class FwdShape:
    """The forward's tiling for one config: GQA packing and the query tile, the plan's rows, the
    grid, the split-KV factor, the K/V load path and the walk."""

    pack: bool  # GQA rows packed into one tile (few queries)
    bm: int  # query tile (rows)
    rows: torch.Tensor  # the plan rows the kernel walks: band lists where ``band``, else index lists
    splits: int  # split-KV factor
    tma: int  # K/V load path: POINTERS or device.DESCRIPTORS
    band: bool  # one loop over a band of key tiles
    grid: tuple[int, int, int]
    swap: bool  # grid (tiles, batch, heads): SWAP_HB


def offsets(req: Request) -> tuple[int, int]:
    return (req.q_offset, req.k_offset)


def fwd_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, req: Request, cfg: configs.Cfg) -> FwdShape:
    """The tile, split-KV and load-path choice of a forward with config ``cfg``."""
    b, hq, nq, _ = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    has_mask = isinstance(req.rule, ExplicitMask)
    # GQA packing: with few queries, one tile holds every (query head of a group, query) row
    # (not with a boolean mask: its plan rows are per head).
    pack = group > 1 and nq * group <= 64 and not has_mask
    bm = max(16, 1 << math.ceil(math.log2(nq * group))) if pack else cfg.bm
    pl = plan.plan(
        plan_rule(req), req.seq_q, req.seq_k, req.sync, nq if pack else bm, cfg.bn, q.device,
        offsets=offsets(req),
    )  # fmt: skip
    tiles = 1 if pack else triton_cdiv(nq, bm)
    heads = hkv if pack else hq
    splits = split_count(tiles * heads * b, pl.max_visits, q.device)
    tma = device.tma_mode(q, k, v, packed=pack, bias=req.bias is not None)
    # The band walk needs contiguous visits (pl.band) and a positive scale (its -inf masking).
    band = cfg.band and not pack and pl.band is not None and req.scale > 0 and not has_mask
    swap = not pack and swap_heads_batch(req)
    grid = (tiles * splits, b, heads) if swap else (tiles * splits, heads, b)
    return FwdShape(pack, bm, pl.band if band else pl.rows, splits, tma, band, grid, swap)


#: Largest softcap·log2(e) for which the forward takes the bound as every row's max (``cap_max``).
CAP_MAX_LOG2 = 60.0


def cap_max(req: Request, q: torch.Tensor) -> bool:
    """Whether the forward uses softcap's bound as the running max of every row (no max taken, no
    rescaling; ``kernels._softcap_probs``). Exact: any reference at or above a row's max gives the
    same softmax. Its exponentials reach down to 2^(-2·softcap·log2 e), which must stay normal in
    P's dtype: bfloat16 (float32's exponent range) and float32 only, softcap·log2 e ≤ 60 (softcap
    up to about 41; Grok's 30 yes, Gemma 2's 50 no); no bias (it moves the bound), positive scale."""
    return (
        req.softcap is not None and req.bias is None and not uses_alibi(req) and req.scale > 0
        and q.dtype in (torch.bfloat16, torch.float32) and req.softcap * LOG2E <= CAP_MAX_LOG2
    )  # fmt: skip


def swap_heads_batch(req: Request) -> bool:
    """Grid axes (tiles, batch, heads) for a bias shared across batch entries (T5's position bias,
    ALiBi-style slopes made into a (1, H, L, L) tensor): the programs of one head for every batch
    entry then run at once and read the head's bias rows from L2, not once per batch entry from
    DRAM (kernels._head_batch)."""
    return req.bias is not None and req.bias[0] == 1 and req.batch > 1


def round16(n: int) -> int:
    return -(-n // 16) * 16


def even_k(band: bool, tma: int, nk: int, bn: int) -> bool:
    """The band walk's "no bounds masks on K/V loads" switch. TMA loads ignore it (descriptors
    zero-fill past the end), so there it is always False: one compiled kernel for every key count.
    Pointer loads keep it (a kernel for key counts that are a multiple of the key tile, one for the
    others): the masks cost time on every visited tile."""
    return band and tma != device.DESCRIPTORS and nk % bn == 0


#: Split-KV factors up to this many are merged by one compiled combine kernel.
COMBINE_SPLITS = 32


def combine_bs(splits: int) -> int:
    """combine_kernel's split tile: fixed (not the split count's power of two, which follows the key
    count) so that a new length compiles no new combine kernel; larger only for forced factors."""
    return max(COMBINE_SPLITS, 1 << math.ceil(math.log2(splits)))


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
