"""A float64 dense formula of SPEC §10-§11 (lengths, packed sequences, paged caches, offsets, with
§9's softcap and sinks) and a checker of the triton backend's ragged kernels against it; shared by
tests/test_triton_ragged.py (interpreter) and tests/test_triton_ragged_gpu.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnhub.operands import Operands
from attnhub.positions import axis_affine
from attnhub.request import Request
from attnhub.rules import Causal, Local, Rule

#: SPEC §6: (forward, gradients) tolerance per dtype.
TOL = {"float32": (2e-5, 1e-4), "float16": (2e-3, 8e-3), "bfloat16": (1.6e-2, 4e-2)}


def case_request(
    dtype: str, b: int, hq: int, hkv: int, lq: int, lk: int, dqk: int, dv: int, rule: Rule, sync: str,
    device: str = "cpu", **extra: Any,
) -> Request:  # fmt: skip
    """A canonical 1-d torch request with §9-§11 fields from ``extra``."""
    return Request(
        framework="torch", device=device, dtype=dtype, layout="bhsd", batch=b, heads_q=hq, heads_kv=hkv,
        seq_q=(lq,), seq_k=(lk,), dim_qk=dqk, dim_v=dv, rule=rule, sync=sync, scale=1 / math.sqrt(dqk),
        **extra,
    )  # fmt: skip


def attended(rule: Rule, sync: str, lq: int, lk: int, q_offset: int = 0, k_offset: int = 0) -> np.ndarray:
    """(lq, lk) bool: SPEC §2-§3 on one valid segment, positions shifted by the offsets (§11)."""
    aq, bq, ak, bk = axis_affine(lq, lk, sync) if lq and lk else (1, 0, 1, 0)
    pq = np.arange(lq)[:, None] * aq + bq + q_offset
    pk = np.arange(lk)[None, :] * ak + bk + k_offset
    keep = np.ones((lq, lk), dtype=bool)
    causal = isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal)
    if causal:
        keep &= pq >= pk
    if isinstance(rule, Local):
        d = np.abs(pq - pk)
        s = 1 << rule.log2_stride
        keep &= (d % s == 0) & (d // s < rule.windows(1)[0])
    return keep


def dense_segment(torch, q, k, v, keep, scale, softcap, sinks):
    """out (hq, lq, dv), lse (hq, lq) of one segment in float64 (differentiable)."""
    group = q.shape[0] // k.shape[0]
    kk = k.repeat_interleave(group, 0)
    vv = v.repeat_interleave(group, 0)
    s = scale * q @ kk.transpose(-1, -2)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~torch.as_tensor(keep, device=s.device)[None], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks[:, None, None].expand(-1, s.shape[1], 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe[..., None])[..., : k.shape[1]]
    return p @ vv, lse


def _rounded(torch, rng, shape, dtype, device, boost=1.0):
    x = torch.from_numpy(rng.standard_normal(shape) * boost).to(getattr(torch, dtype)).to(device)
    return x, x.double().requires_grad_(True)


def _err(torch, name, got, ref, tol):
    got = got.double().cpu()
    ref = ref.detach().double().cpu()
    assert not torch.isnan(got).any(), f"{name}: NaN (an element not written?)"
    inf_ref = torch.isinf(ref)
    assert torch.equal(torch.isinf(got), inf_ref), f"{name}: -inf pattern differs"
    assert torch.equal(got[inf_ref], ref[inf_ref]), f"{name}: infinite values differ"
    g, r = got[~inf_ref], ref[~inf_ref]
    if r.numel() == 0 or r.abs().max() == 0:
        assert g.abs().max() == 0 if g.numel() else True, f"{name}: expected zeros"
        return
    rel = (g - r).norm() / r.norm()
    mx = (g - r).abs().max() / r.abs().max()
    assert rel < tol and mx < tol, f"{name}: rel {rel:.3g} max {mx:.3g} tol {tol:g}"


def check_case(
    torch, *, dtype: str, b: int, hq: int, hkv: int, lq: int, lk: int, dqk: int, dv: int,
    q_lengths=None, k_lengths=None, side: str = "right", rule: Rule, sync: str, grad: bool,
    seed: int = 0, logit_boost: float = 1.0, softcap: float | None = None, sinks: bool = False,
    q_offset: int = 0, k_offset: int = 0, paged: int = 0, varlen=None, device: str = "cpu",
    nan_padding: bool = False,
) -> None:  # fmt: skip
    """Run the ragged kernels on fresh N(0, 1) inputs and compare out, lse (and dq, dk, dv, dsinks
    when ``grad``) with the dense float64 formula; uninitialised memory is NaN-filled so that an
    unwritten element fails. ``nan_padding`` (forward only, per-entry lengths): the keys and values
    past each entry's length hold NaN in the kernels' inputs, which must not reach any result."""
    from attnhub_backends.triton import ragged_launch

    rng = np.random.default_rng(1000 + seed)
    if varlen is not None:
        lens_q, lens_k = varlen
        cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
        cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
        lq, lk, nb = int(cu_q[-1]), int(cu_k[-1]), 1
        segs = [
            (0, int(cu_q[n]), lens_q[n], int(cu_k[n]), lens_k[n]) for n in range(len(lens_q))
        ]  # (batch, q start, q len, k start, k len)
    else:
        nb = b
        ql = q_lengths if q_lengths is not None else [lq] * b
        kl = k_lengths if k_lengths is not None else [lk] * b
        left = side == "left"
        segs = [(n, lq - ql[n] if left else 0, ql[n], lk - kl[n] if left else 0, kl[n]) for n in range(b)]
    q, q64 = _rounded(torch, rng, (nb, hq, lq, dqk), dtype, device, logit_boost)
    k, k64 = _rounded(torch, rng, (nb, hkv, lk, dqk), dtype, device)
    v, v64 = _rounded(torch, rng, (nb, hkv, lk, dv), dtype, device)
    dout, dout64 = _rounded(torch, rng, (nb, hq, lq, dv), dtype, device)
    if nan_padding:
        assert varlen is None and not paged and not grad
        for bi, _, _, ks, kn in segs:
            for x in (k, v):
                x[bi, :, :ks] = float("nan")
                x[bi, :, ks + kn :] = float("nan")
    sk = sk64 = None
    if sinks:
        sk, sk64 = _rounded(torch, rng, (hq,), "float32", device)
    scale = 1 / math.sqrt(dqk)

    out_ref = torch.zeros((nb, hq, lq, dv), dtype=torch.float64, device=device)
    lse_ref = torch.full((nb, hq, lq), float("-inf"), dtype=torch.float64, device=device)
    for bi, qs, qn, ks, kn in segs:
        keep = attended(rule, sync, qn, kn, q_offset, k_offset)
        o, lse_s = dense_segment(
            torch, q64[bi, :, qs : qs + qn], k64[bi, :, ks : ks + kn], v64[bi, :, ks : ks + kn], keep,
            scale, softcap, sk64,
        )  # fmt: skip
        out_ref[bi, :, qs : qs + qn] = o
        lse_ref[bi, :, qs : qs + qn] = lse_s

    extra: dict[str, Any] = dict(softcap=softcap, sinks=sinks, sinks_grad=sinks and grad)
    i32 = dict(dtype=torch.int32, device=device)
    if varlen is not None:
        extra.update(varlen=True)
        ops = Operands(
            cu_seqlens_q=torch.tensor(cu_q, **i32), cu_seqlens_k=torch.tensor(cu_k, **i32),
            max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), sinks=sk,
        )  # fmt: skip
    else:
        extra.update(q_lengths=q_lengths is not None, k_lengths=k_lengths is not None, padding_side=side)
        ops = Operands(
            q_lengths=None if q_lengths is None else torch.tensor(q_lengths, **i32),
            k_lengths=None if k_lengths is None else torch.tensor(k_lengths, **i32), sinks=sk,
        )  # fmt: skip
    extra.update(q_offset=q_offset, k_offset=k_offset, needs_grad=grad)
    kk, vv = k, v
    if paged:
        assert k_lengths is not None and side == "right" and lk % paged == 0
        per = lk // paged
        perm = torch.from_numpy(rng.permutation(b * per + 3)).to(torch.int32)  # 3 blocks unused
        table = perm[: b * per].reshape(b, per).to(device)
        tl_ = table.long().cpu()
        kk = torch.empty((b * per + 3, paged, hkv, dqk), dtype=k.dtype, device=device).normal_()
        vv = torch.empty((b * per + 3, paged, hkv, dv), dtype=v.dtype, device=device).normal_()
        for bi in range(b):
            for blk in range(per):
                rows = slice(blk * paged, (blk + 1) * paged)
                kk[tl_[bi, blk]] = k[bi, :, rows].transpose(0, 1)
                vv[tl_[bi, blk]] = v[bi, :, rows].transpose(0, 1)
        extra.update(paged=paged)
        ops = Operands(k_lengths=ops.k_lengths, block_table=table, sinks=sk)
    req = case_request(dtype, nb, hq, hkv, lq, lk, dqk, dv, rule, sync, device=device, **extra)
    fwd_tol, grad_tol = TOL[dtype]

    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # torch.empty fills NaN: unwritten elements show
    try:
        if grad:
            out, lse, saved_out = ragged_launch.forward_for_grad(q, kk, vv, req, ops)
        else:
            out, lse = ragged_launch.forward(q, kk, vv, req, ops)
        _err(torch, "out", out, out_ref, fwd_tol)
        _err(torch, "lse", lse, lse_ref, fwd_tol)
        assert out.dtype == q.dtype and lse.dtype == torch.float32
        if not grad:
            # A forward that wants no lse (a decode step): the same out, every element written.
            out2, none = ragged_launch.forward(q, kk, vv, req, ops, need_lse=False)
            assert none is None
            _err(torch, "out (no lse)", out2, out_ref, fwd_tol)
            return
        grads = ragged_launch.backward(q, kk, vv, saved_out, lse, dout, req, ops)
    finally:
        torch.use_deterministic_algorithms(saved)
    inputs = [q64, k64, v64] + ([sk64] if sinks else [])
    ref = torch.autograd.grad((out_ref * dout64).sum(), inputs, allow_unused=True)
    for name, got, want in zip(("dq", "dk", "dv"), grads[:3], ref[:3], strict=True):
        _err(
            torch,
            name,
            got,
            want if want is not None else torch.zeros_like(got, dtype=torch.float64),
            grad_tol,
        )
    if sinks:
        assert len(grads) == 5 and grads[3] is None
        _err(torch, "dsinks", grads[4], ref[3], grad_tol)
