"""Query rows torch's fused CPU kernel gets wrong on non-finite inputs, found after it and redone.

The kernel takes a row whose running maximum stays -inf for a fully masked row and writes
out = 0, lse = 0 for it. A row whose logits are all NaN (a NaN in its q, NaN in every key it
attends, some Inf inputs) stays at -inf too, since the kernel's scalar max drops NaN: so NaN
became 0, against SPEC §4. With an attn_mask the kernel's max keeps NaN instead, and then a fully
masked row whose q holds a NaN gives NaN where SPEC §4 wants 0.

Both show in the kernel's lse (0 or NaN), which is cheap to scan: :func:`suspect_rows`. Those
rows are then sorted (:func:`empty_rows`: rows the mask leaves without keys) and redone: the
kernel runs again with their q rows zeroed and NaN in k zeroed (every row that attends such a key
is among them: its logit is NaN), so that its forward and backward stay finite there (a NaN row in
its backward would reach every key's dk through 0 x NaN), and the rows that attend keys are
recomputed exactly in plain torch ops (:func:`exact_rows`, a chunk of one (b, h) block's rows at
a time), differentiably, so that their NaN reaches the gradients of what they attend, as the
reference's does, and nothing else.
"""

from __future__ import annotations

from typing import Any


def suspect_rows(lse: Any, out: Any = None) -> Any:
    """(B, H, Nq) bool: rows whose lse (if given) is 0 or not finite, and, given ``out``, rows of ``out``
    holding a NaN (SDPA's math kernel, which returns no lse, gives NaN on a masked row's NaN)."""
    import torch

    rows = None if lse is None else (lse == 0) | ~torch.isfinite(lse)
    if out is not None:
        nan = torch.isnan(out.detach()).any(dim=-1)
        rows = nan if rows is None else rows | nan
    return rows


def empty_rows(attn_mask: Any, causal: bool, shape: tuple[int, int, int], q_valid: Any = None) -> Any:
    """(B, H, Nq) bool: rows that attend no key under the additive ``attn_mask`` (-inf excludes;
    None: every key), SDPA's top-left ``is_causal`` and the valid query rows ``q_valid``
    ((B, 1, Nq, 1), None: all valid)."""
    import torch

    b, h, nq = shape
    if attn_mask is None:
        empty = torch.zeros(1, 1, nq, dtype=torch.bool)
    else:
        nk = attn_mask.shape[-1]
        seen = torch.isneginf(attn_mask.detach()).expand(*attn_mask.shape[:-2], nq, nk)
        if causal:
            seen = seen | torch.ones(nq, nk, dtype=torch.bool, device=seen.device).triu(1)
        empty = seen.all(dim=-1)
    if q_valid is not None:
        empty = empty | ~q_valid[..., 0]
    return empty.expand(b, h, nq)


def rows_reading(keys: Any, attn_mask: Any, causal: bool, shape: tuple[int, int, int]) -> Any:
    """(B, Hq, Nq) bool: rows that attend one of ``keys`` ((B, Hkv, Nk) bool) under the additive
    ``attn_mask`` and top-left ``is_causal`` (query head h reads kv head h // (Hq // Hkv))."""
    import torch

    b, h, nq = shape
    keys = keys.repeat_interleave(h // keys.shape[1], dim=1)[:, :, None, :]  # (B, Hq, 1, Nk)
    nk = keys.shape[-1]
    reads = keys.expand(b, h, nq, nk)
    if attn_mask is not None:
        reads = reads & ~torch.isneginf(attn_mask.detach())
    if causal:
        reads = reads & torch.ones(nq, nk, dtype=torch.bool, device=keys.device).tril()
    return reads.any(dim=-1)


#: Most elements of one chunk's (rows, Nk, D) products in :func:`exact_rows`.
CHUNK_ELEMENTS = 1 << 22


def exact_rows(
    q: Any, k: Any, v: Any, rows: Any, attn_mask: Any, causal: bool, scale: float
) -> tuple[Any, Any]:
    """(out (n, Dv), lse (n,)) of the n rows where ``rows`` (B, Hq, Nq) is True, in row-major order,
    in the accumulation dtype (float64 for float64, else float32): softmax of
    ``scale·q·k + attn_mask`` (-inf and top-left causal exclude a pair) times v, as SPEC §4 and the
    reference form it. Differentiable; excluded pairs give exactly zero gradients."""
    import torch

    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    batch, heads, nq = rows.shape
    group = heads // k.shape[1]
    nk = k.shape[2]
    mask = None if attn_mask is None else attn_mask.expand(batch, heads, nq, nk)
    where = rows.nonzero()
    blocks = where[:, 0] * heads + where[:, 1]
    chunk = max(1, CHUNK_ELEMENTS // max(1, nk * max(k.shape[-1], v.shape[-1])))
    outs, lses = [], []
    for block in blocks.unique().tolist():  # unique() sorts: the order of ``where``
        b, h = divmod(block, heads)
        kb, vb = k[b, h // group].to(acc), v[b, h // group].to(acc)
        found = where[blocks == block, 2]
        for i in found.split(chunk):
            bias = None if mask is None else mask[b, h, i].to(acc)
            keep = _kept(bias, causal, i, nk)
            out, lse = _attend(q[b, h, i].to(acc), kb, vb, keep, bias, scale)
            outs.append(out)
            lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _kept(bias: Any, causal: bool, i: Any, nk: int) -> Any:
    """(rows, Nk) bool: the pairs attended (bias not -inf; j <= i under top-left causal)."""
    import torch

    keep = torch.ones(len(i), nk, dtype=torch.bool, device=i.device)
    if bias is not None:
        keep &= ~torch.isneginf(bias)
    if causal:
        keep &= torch.arange(nk, device=i.device) <= i[:, None]
    return keep


def _attend(q: Any, k: Any, v: Any, keep: Any, bias: Any, scale: float) -> tuple[Any, Any]:
    """(out, lse) of rows q (r, D) over keys k, v (Nk, D) where ``keep`` (r, Nk) allows, as the
    reference forms them: shifted by the row max (NaN when a logit is NaN, or where +inf meets
    +inf), out = 0 and lse = -inf on rows of no key. Each row reads its keys through
    ``where(keep, ...)``, so an excluded pair passes back an exact 0 (a product with a NaN q row
    would give NaN)."""
    import torch

    kk = torch.where(keep[..., None], k, 0.0)
    s = (q[:, None, :] * kk).sum(dim=-1) * scale
    if bias is not None:
        s = s + torch.where(keep, bias, 0.0)
    s = s.masked_fill(~keep, float("-inf"))
    m = s.detach().amax(dim=-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    none = total == 0
    pv = (p[..., None] * torch.where(keep[..., None], v, 0.0)).sum(dim=-2)
    out = torch.where(none, 0.0, pv / total)
    lse = torch.where(none, float("-inf"), m + torch.log(total))
    return out, lse[..., 0]
