"""Shared checks of context-parallel attention against the single-process reference (used by
tests/test_distributed.py on gloo and tests/test_distributed_gpu.py on one GPU)."""

from __future__ import annotations

import torch

import attnhub
from attnhub.distributed import context_parallel_attention, shard, unshard_local

TOL = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (1.6e-2, 4e-2), torch.float64: (1e-10, 1e-9)}


def errors(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    e = (x.double() - ref).abs()
    rel = float(e.norm() / ref.norm().clamp_min(1e-300))
    mx = float(e.max() / ref.abs().max().clamp_min(1e-300))
    return rel, mx


def make_inputs(seed, b, hq, hkv, lq, lk, d, dtype, device, big=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, lq, d, generator=g) * (8.0 if big else 1.0)
    k = torch.randn(b, hkv, lk, d, generator=g)
    v = torch.randn(b, hkv, lk, d, generator=g)
    do = torch.randn(b, hq, lq, d, generator=g)
    return [x.to(dtype).to(device) for x in (q, k, v, do)]


def reference(q, k, v, do, mask, sync, softcap):
    leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
    out, lse = attnhub.attention(
        *leaves, mask=mask, sync=sync, softcap=softcap, backend="reference", return_lse=True
    )
    grads = torch.autograd.grad(out, leaves, do.double())
    return out.detach(), lse.detach(), grads


def check_case(rank, world, group, case, device="cpu", backend="auto", gather=None):
    """Run one case on this rank; return a list of failure strings (empty when it passes)."""
    mask, sync, lq, lk, hq, hkv, dtype, lb, method = (
        case["mask"], case["sync"], case["lq"], case["lk"], case["hq"], case["hkv"], case["dtype"],
        case["lb"], case["method"],
    )  # fmt: skip
    softcap = case.get("softcap")
    q, k, v, do = make_inputs(case["seed"], 1, hq, hkv, lq, lk, 8, dtype, device, case.get("big", False))
    ref_out, ref_lse, ref_grads = reference(q, k, v, do, mask, sync, softcap)
    sh = [shard(x, rank, world, load_balance=lb) for x in (q, k, v, do)]
    leaves = [x.detach().clone().requires_grad_(True) for x in sh[:3]]
    out, lse = context_parallel_attention(
        *leaves, group=group, mask=mask, sync=sync, softcap=softcap, load_balance=lb,
        backend=backend, return_lse=True, method=method,
    )  # fmt: skip
    grads = torch.autograd.grad(out, leaves, sh[3])
    gather = gather or (lambda x: x)
    got = {"out": gather(out), "lse": gather(lse)}
    for name, gr in zip(("dq", "dk", "dv"), grads):
        got[name] = gather(gr)
    want = {"out": ref_out, "lse": ref_lse, "dq": ref_grads[0], "dk": ref_grads[1], "dv": ref_grads[2]}
    fwd_tol, grad_tol = TOL[dtype]
    fails = []
    for name, ref in want.items():
        x = unshard_local(got[name], load_balance=lb) if isinstance(got[name], list) else got[name]
        masked = torch.isneginf(ref)
        if x.shape != ref.shape or not torch.equal(torch.isneginf(x), masked):
            fails.append(f"{case['id']} {name}: shape {tuple(x.shape)} or masked rows differ")
            continue
        x, ref = x[~masked], ref[~masked]
        if not torch.isfinite(x).all():
            fails.append(f"{case['id']} {name}: non-finite values")
            continue
        tol = fwd_tol if name in ("out", "lse") else grad_tol
        rel, mx = errors(x, ref)
        if rel > tol or mx > tol:
            fails.append(f"{case['id']} {name}: rel {rel:.2e} max {mx:.2e} > {tol}")
    return fails


def spawn_gloo(worker, world: int) -> str:
    """Run ``worker(rank, world, init, result)`` in ``world`` processes (gloo through a file
    rendezvous); what rank 0 wrote to ``result``: the failures, one a line ("" when none)."""
    import os
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init, result = f"file://{os.path.join(tmp, 'init')}", os.path.join(tmp, "result")
        mp.spawn(worker, args=(world, init, result), nprocs=world, join=True)
        with open(result) as f:
            return f.read()
