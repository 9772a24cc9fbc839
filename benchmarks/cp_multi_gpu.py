"""Context-parallel attention on N GPUs over NCCL: correctness and scaling (one process a GPU).

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --nproc-per-node=2 benchmarks/cp_multi_gpu.py --json cp.json
    torchrun --nproc-per-node=2 benchmarks/cp_multi_gpu.py --smoke      # CPU, gloo, tiny sizes

**Correctness**: every rank builds the same global q, k, v, dO, runs
``context_parallel_attention`` on its shard (forward and backward) and compares its shard of out,
lse, dq, dk, dv with a float64 dense formula written here (SPEC §6 tolerances) and with one
``attnhub.attention`` call on the whole sequence on one GPU (the single-GPU result).

**Scaling** (causal, bf16): time per training step (forward + backward) of the ring on N GPUs,
``T_N``, against one GPU on the whole sequence, ``T_1`` (parallel efficiency ``T_1 / (N·T_N)``),
and one GPU at ``L/N``; the head-parallel variant (``method="heads"``, all-to-all) side by side
where ``Hq % N == 0``. The share of communication hidden by compute is
``(T_comp + T_comm − T_N) / T_comm``, with ``T_comp`` this rank's schedule run without messages
and ``T_comm`` the ring's messages sent without compute (maxima over ranks).

**Packed documents** (causal, bf16): documents of lengths drawn in ``--doc-lengths`` (fixed seed)
packed into ``--doc-tokens`` tokens; ring and heads with ``cu_seqlens`` against
``attnhub.attention_varlen`` on one GPU on the same sequence.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: NVLink multicast stays off in every process (the device machine's rule; see docs/distributed.md).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ.update(MULTICAST_OFF)

import random  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import attnhub  # noqa: E402
from attnhub.distributed import comm, context_parallel_attention, shard, simulate  # noqa: E402
from attnhub.rules import Local  # noqa: E402

TOL = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (1.6e-2, 4e-2)}  # SPEC §6 (forward, gradients)


def log(*a) -> None:
    if dist.get_rank() == 0:
        print(*a, flush=True)


def packed(total: int, lo: int, hi: int, seed: int) -> list[int]:
    """cu_seqlens of documents with lengths drawn uniformly in [lo, hi] (fixed seed) packed into
    ``total`` tokens (the last one cut to fit)."""
    rng, cu = random.Random(seed), [0]
    while cu[-1] < total:
        cu.append(min(total, cu[-1] + rng.randint(lo, hi)))
    return cu


def dense_f64(q, k, v, do, mask, sync, docs=None):
    """out, lse, dq, dk, dv in float64 from the definition (SPEC §2–§5), one kv head at a time;
    ``docs``: packed documents (cu_seqlens), each attending only itself."""
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    m = max(lq, lk)
    i = torch.arange(lq, device=q.device)[:, None] + (m - lq if sync == "none_end" else 0)
    j = torch.arange(lk, device=q.device)[None, :] + (m - lk if sync == "none_end" else 0)
    if mask is None:
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    elif mask == "causal":
        allowed = i >= j
    else:  # Local(w, causal=True), stride 1
        allowed = ((i - j).abs() < mask.window) & ((i >= j) if mask.causal else True)
    if docs is not None:
        bounds = torch.tensor(docs[1:], device=q.device)
        doc = torch.bucketize(torch.arange(lq, device=q.device), bounds, right=True)
        allowed = allowed & (doc[:, None] == doc[None, :])
    outs, lses, dqs, dks, dvs = [], [], [], [], []
    g = hq // hkv
    for h in range(hkv):
        qh = q[:, h * g : (h + 1) * g].double().requires_grad_(True)
        kh = k[:, h : h + 1].double().requires_grad_(True)
        vh = v[:, h : h + 1].double().requires_grad_(True)
        s = (qh @ kh.transpose(-1, -2)) / d**0.5
        s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.exp(s - lse[..., None]).nan_to_num(0.0) @ vh
        gq, gk, gv = torch.autograd.grad(o, (qh, kh, vh), do[:, h * g : (h + 1) * g].double())
        outs.append(o.detach()), lses.append(lse.detach()), dqs.append(gq), dks.append(gk), dvs.append(gv)
        del s, o
    cat = lambda xs: torch.cat(xs, 1)  # noqa: E731
    return {"out": cat(outs), "lse": cat(lses), "dq": cat(dqs), "dk": cat(dks), "dv": cat(dvs)}


def errors(x, ref) -> tuple[float, float]:
    x, ref = x.detach(), ref.detach()
    e = (x.double() - ref.double()).abs()
    finite = torch.isfinite(ref)
    if not bool(torch.equal(torch.isfinite(x), finite)):
        return float("inf"), float("inf")
    e, r = e[finite], ref.double()[finite]
    return float(e.norm() / r.norm().clamp_min(1e-300)), float(e.max() / r.abs().max().clamp_min(1e-300))


def inputs(seed, hq, hkv, lq, lk, d, dtype, device, big=False):
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(1, hq, lq, d, generator=g, device=device) * (8.0 if big else 1.0)
    k = torch.randn(1, hkv, lk, d, generator=g, device=device)
    v = torch.randn(1, hkv, lk, d, generator=g, device=device)
    do = torch.randn(1, hq, lq, d, generator=g, device=device)
    return [x.to(dtype) for x in (q, k, v, do)]


def run_cp(q, k, v, do, mask, sync, lb, method, backend, docs=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    sh = [shard(x, rank, world, load_balance=lb) for x in (q, k, v, do)]
    leaves = [x.detach().clone().requires_grad_(True) for x in sh[:3]]
    out, lse = context_parallel_attention(*leaves, mask=mask, sync=sync, load_balance=lb, backend=backend,
                                          return_lse=True, method=method, cu_seqlens=docs)  # fmt: skip
    grads = torch.autograd.grad(out, leaves, sh[3])
    return {"out": out, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}


def varlen(q, k, v, mask, backend, docs, return_lse=False):
    """attention_varlen on (1, H, L, D) tensors: out (1, H, L, D) (and lse (1, H, L))."""
    cu = torch.tensor(docs, dtype=torch.int32, device=q.device)
    thd = [x[0].transpose(0, 1) for x in (q, k, v)]
    res = attnhub.attention_varlen(*thd, cu, cu, mask=mask, backend=backend, return_lse=return_lse)
    out, lse = res if return_lse else (res, None)
    out = out.transpose(0, 1).unsqueeze(0)
    return (out, lse.unsqueeze(0)) if return_lse else out


def run_single(q, k, v, do, mask, sync, backend, docs=None):
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    if docs is None:
        out, lse = attnhub.attention(*leaves, mask=mask, sync=sync, backend=backend, return_lse=True)
    else:
        out, lse = varlen(*leaves, mask, backend, docs, return_lse=True)
    grads = torch.autograd.grad(out, leaves, do)
    return {"out": out, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}


def correctness(a, device, dtype) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    L, d = a.check_seq, a.dim
    win = Local(max(L // 16, 1), causal=True)
    cases = [
        # (name, mask, sync, Lq, Lk, Hq, Hkv, load_balance, method, big logits)
        ("causal zigzag ring", "causal", "none_front", L, L, 8, 2, "zigzag", "ring", False),
        ("causal zigzag ring, large logits", "causal", "none_front", L, L, 8, 8, "zigzag", "ring", True),
        ("causal zigzag allgather", "causal", "none_front", L, L, 8, 2, "zigzag", "allgather", False),
        ("causal contiguous ring", "causal", "none_front", L, L, 8, 2, "none", "ring", False),
        ("local zigzag ring", win, "none_front", L, L, 8, 2, "zigzag", "ring", False),
        ("local contiguous ring", win, "none_front", L, L, 8, 2, "none", "ring", False),
        ("local zigzag allgather", win, "none_front", L, L, 8, 2, "zigzag", "allgather", False),
        ("full zigzag ring", None, "none_front", L, L, 8, 2, "zigzag", "ring", False),
        ("causal none_end Lq=Lk/2 ring", "causal", "none_end", L // 2, L, 8, 2, "zigzag", "ring", False),
        ("causal packed docs ring", "causal", "none_front", L, L, 8, 2, "zigzag", "ring", "docs"),
        ("full packed docs ring", None, "none_front", L, L, 8, 2, "zigzag", "ring", "docs"),
        ("causal heads", "causal", "none_front", L, L, 8, 8, "zigzag", "heads", False),
        ("causal heads GQA (K/V repeated)", "causal", "none_front", L, L, 8, 2, "zigzag", "heads", False),
        ("causal packed docs heads", "causal", "none_front", L, L, 8, 8, "zigzag", "heads", "docs"),
    ]
    fwd_tol, grad_tol = TOL[dtype]
    rows = []
    # Packed documents of L/64 to L/4 tokens (at L = 4096: 64 to 1024), fixed seed.
    check_docs = packed(L, max(L // 64, 1), max(L // 4, 1), 40)
    for n, (name, mask, sync, lq, lk, hq, hkv, lb, method, big) in enumerate(cases):
        docs = check_docs if big == "docs" else None
        big = big is True
        q, k, v, do = inputs(100 + n, hq, hkv, lq, lk, d, dtype, device, big)
        ref = dense_f64(q, k, v, do, mask, sync, docs)
        single = run_single(q, k, v, do, mask, sync, a.backend, docs)
        got = run_cp(q, k, v, do, mask, sync, lb, method, a.backend, docs)
        again = run_cp(q, k, v, do, mask, sync, lb, method, a.backend, docs)
        deterministic = all(torch.equal(got[key], again[key]) for key in got)
        worst = {"cp_vs_f64": 0.0, "single_vs_f64": 0.0, "cp_vs_single": 0.0}
        ok = deterministic
        for key in ("out", "lse", "dq", "dk", "dv"):
            tol = fwd_tol if key in ("out", "lse") else grad_tol
            want = shard(ref[key], rank, world, load_balance=lb)
            mine = shard(single[key], rank, world, load_balance=lb)
            e_cp = max(errors(got[key], want))
            e_single = max(errors(mine, want))
            e_pair = max(errors(got[key], mine.double()))
            ok &= e_cp <= tol
            worst["cp_vs_f64"] = max(worst["cp_vs_f64"], e_cp / tol)
            worst["single_vs_f64"] = max(worst["single_vs_f64"], e_single / tol)
            worst["cp_vs_single"] = max(worst["cp_vs_single"], e_pair)
        flags = torch.tensor([float(ok), worst["cp_vs_f64"], worst["single_vs_f64"], worst["cp_vs_single"]],
                             device=device)  # fmt: skip
        everyone = [torch.zeros_like(flags) for _ in range(world)]
        dist.all_gather(everyone, flags)
        allf = torch.stack(everyone).cpu()
        row = {
            "case": name, "Lq": lq, "Lk": lk, "Hq": hq, "Hkv": hkv, "D": d, "load_balance": lb, "method": method,
            "documents": None if docs is None else len(docs) - 1,
            "pass": bool(allf[:, 0].min() == 1), "deterministic": deterministic,
            "cp_err_over_tol": float(allf[:, 1].max()), "single_err_over_tol": float(allf[:, 2].max()),
            "cp_vs_single_max": float(allf[:, 3].max()),
        }  # fmt: skip
        rows.append(row)
        log(f"{'PASS' if row['pass'] else 'FAIL'} {name:34s} err/tol cp {row['cp_err_over_tol']:.3f} "
            f"single {row['single_err_over_tol']:.3f}  cp vs single {row['cp_vs_single_max']:.2e}")  # fmt: skip
        del ref, single, got, again
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def _median_s(fn, warmup: int, repeat: int, device: str, together: bool) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after ``warmup`` (``together``: every rank
    starts each run at a barrier)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        if together:
            dist.barrier()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed(fn, warmup: int, repeat: int, device: str) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs, every rank started together; the max over ranks."""
    t = torch.tensor([_median_s(fn, warmup, repeat, device, True)], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def on_rank0(fn, warmup, repeat, device) -> float:
    """Median seconds of ``fn()`` on rank 0 alone (one GPU), broadcast to every rank."""
    t = torch.zeros(1, device=device, dtype=torch.float64)
    if dist.get_rank() == 0:
        t[0] = _median_s(fn, warmup, repeat, device, False)
    dist.broadcast(t, 0)
    return float(t)


def comm_only(k_loc, v_loc, steps: int):
    """The ring's messages of one training step, without compute: forward K/V blocks; backward
    K/V blocks plus float32 dK/dV blocks; the dK/dV sent home."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    kv = comm.pack(k_loc, v_loc)
    acc = torch.zeros(k_loc.numel() + v_loc.numel(), dtype=torch.float32, device=k_loc.device).view(
        torch.uint8
    )

    def step() -> None:
        for _ in range(2):  # forward ring, then the backward's K/V ring
            cur = kv
            for _ in range(steps - 1):
                buf = torch.empty_like(cur)
                comm.wait(comm.exchange(cur, nxt, buf, prev, None))
                cur = buf
        dcur = acc
        for _ in range(steps - 1):
            buf = torch.empty_like(dcur)
            comm.wait(comm.exchange(dcur, nxt, buf, prev, None))
            dcur = buf
        back = steps - 1
        if back % world:
            home = torch.empty_like(dcur)
            comm.wait(comm.exchange(dcur, (rank - back) % world, home, (rank + back) % world, None))

    return step


def scaling(a, device, dtype) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = a.backend
    rows = []
    for L in a.seqs:
        for hq, hkv in a.heads:
            q, k, v, do = inputs(7, hq, hkv, L, L, a.dim, dtype, device)
            flops_fwd = 4 * hq * L * L * a.dim / 2  # FlashAttention's count, causal

            def single_step(q=q, k=k, v=v, do=do):
                leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
                out = attnhub.attention(*leaves, mask="causal", backend=backend)
                torch.autograd.grad(out, leaves, do)

            def single_fwd(q=q, k=k, v=v):
                attnhub.attention(q, k, v, mask="causal", backend=backend)

            sh = [shard(x, rank, world) for x in (q, k, v, do)]

            def cp_step(sh=sh):
                leaves = [x.detach().requires_grad_(True) for x in sh[:3]]
                out = context_parallel_attention(*leaves, mask="causal", backend=backend, method="ring")
                torch.autograd.grad(out, leaves, sh[3])

            def cp_fwd(sh=sh):
                context_parallel_attention(*sh[:3], mask="causal", backend=backend, method="ring")

            def heads_step(sh=sh):
                leaves = [x.detach().requires_grad_(True) for x in sh[:3]]
                out = context_parallel_attention(*leaves, mask="causal", backend=backend, method="heads")
                torch.autograd.grad(out, leaves, sh[3])

            sets = simulate.setups(q, k, world, mask="causal", backend=backend)
            ks, vs = simulate.shards(k, world, "zigzag"), simulate.shards(v, world, "zigzag")

            def compute_only(sets=sets, ks=ks, vs=vs, sh=sh):
                fwd = simulate.forward([sh[0]], ks, vs, [sets[rank]])
                simulate.backward([sh[0]], ks, vs, fwd, [sh[3]], [sets[rank]])

            qn, kn, vn, don = (x[:, :, : L // world] for x in (q, k, v, do))

            def single_part(qn=qn, kn=kn, vn=vn, don=don):
                leaves = [x.detach().requires_grad_(True) for x in (qn, kn, vn)]
                out = attnhub.attention(*leaves, mask="causal", backend=backend)
                torch.autograd.grad(out, leaves, don)

            w, r = a.warmup, a.repeat
            t1 = on_rank0(single_step, w, r, device)
            t1_fwd = on_rank0(single_fwd, w, r, device)
            t1_part = on_rank0(single_part, w, r, device)
            tn = timed(cp_step, w, r, device)
            tn_fwd = timed(cp_fwd, w, r, device)
            tcomp = timed(compute_only, w, r, device)
            tcomm = timed(comm_only(sh[1], sh[2], sets[rank].steps), w, r, device)
            hidden = min(max((tcomp + tcomm - tn) / tcomm, 0.0), 1.0) if tcomm > 0 else 1.0
            th = timed(heads_step, w, r, device) if hq % world == 0 else float("nan")
            row = {
                "L": L, "Hq": hq, "Hkv": hkv, "D": a.dim, "world": world,
                "t1_step_ms": t1 * 1e3, "t1_fwd_ms": t1_fwd * 1e3, "t1_at_L_over_N_step_ms": t1_part * 1e3,
                "tN_step_ms": tn * 1e3, "tN_fwd_ms": tn_fwd * 1e3, "compute_only_ms": tcomp * 1e3,
                "comm_only_ms": tcomm * 1e3, "efficiency_step": t1 / (world * tn),
                "efficiency_fwd": t1_fwd / (world * tn_fwd), "comm_hidden": hidden,
                "tflops_step_per_gpu": 3.5 * flops_fwd / tn / world / 1e12,
                "tN_heads_step_ms": th * 1e3, "efficiency_heads_step": t1 / (world * th),
            }  # fmt: skip
            rows.append(row)
            log(f"L={L:6d} Hq={hq:2d} Hkv={hkv:2d}: 1 GPU {t1 * 1e3:8.1f} ms  {world} GPUs {tn * 1e3:8.1f} ms  "
                f"efficiency fwd+bwd {row['efficiency_step']:.3f} (fwd {row['efficiency_fwd']:.3f})  "
                f"compute-only {tcomp * 1e3:.1f} ms  comm-only {tcomm * 1e3:.2f} ms  hidden {hidden:.2f}  "
                f"1 GPU at L/N {t1_part * 1e3:.1f} ms  heads {th * 1e3:.1f} ms "
                f"(efficiency {row['efficiency_heads_step']:.3f})")  # fmt: skip
            del q, k, v, do, sh, ks, vs, qn, kn, vn, don
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def packed_scaling(a, device, dtype) -> list[dict]:
    """Causal training steps on packed documents: one GPU (attention_varlen) against the ring and
    the head-parallel variant with cu_seqlens on N GPUs."""
    rank, world = dist.get_rank(), dist.get_world_size()
    L, backend, rows = a.doc_tokens, a.backend, []
    docs = packed(L, a.doc_lengths[0], a.doc_lengths[1], 40)
    for hq, hkv in a.heads:
        q, k, v, do = inputs(9, hq, hkv, L, L, a.dim, dtype, device)

        def single_step(q=q, k=k, v=v, do=do):
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
            torch.autograd.grad(varlen(*leaves, "causal", backend, docs), leaves, do)

        sh = [shard(x, rank, world) for x in (q, k, v, do)]

        def cp_step(method, sh=sh):
            leaves = [x.detach().requires_grad_(True) for x in sh[:3]]
            out = context_parallel_attention(*leaves, mask="causal", backend=backend, method=method,
                                             cu_seqlens=docs)  # fmt: skip
            torch.autograd.grad(out, leaves, sh[3])

        w, r = a.warmup, a.repeat
        t1 = on_rank0(single_step, w, r, device)
        tn = timed(lambda: cp_step("ring"), w, r, device)
        th = timed(lambda: cp_step("heads"), w, r, device) if hq % world == 0 else float("nan")
        ring = simulate.setups(q, k, world, mask="causal", cu_seqlens=docs)[0].ring
        row = {
            "L": L, "documents": len(docs) - 1, "doc_lengths": list(a.doc_lengths), "Hq": hq, "Hkv": hkv,
            "D": a.dim, "world": world, "ring_steps_run": len(ring), "t1_varlen_step_ms": t1 * 1e3,
            "tN_ring_step_ms": tn * 1e3, "efficiency_ring": t1 / (world * tn),
            "tN_heads_step_ms": th * 1e3, "efficiency_heads": t1 / (world * th),
        }  # fmt: skip
        rows.append(row)
        log(f"packed L={L} docs={row['documents']} Hq={hq:2d} Hkv={hkv:2d}: 1 GPU varlen {t1 * 1e3:8.1f} ms  "
            f"ring {tn * 1e3:8.1f} ms (efficiency {row['efficiency_ring']:.3f}, {len(ring)}/{world} steps)  "
            f"heads {th * 1e3:8.1f} ms (efficiency {row['efficiency_heads']:.3f})")  # fmt: skip
        del q, k, v, do, sh
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU with gloo)")
    ap.add_argument("--check-seq", type=int, default=8192)
    ap.add_argument("--seqs", type=int, nargs="+", default=[65536, 131072])
    ap.add_argument("--heads", type=lambda s: tuple(int(x) for x in s.split(":")), nargs="+",
                    default=[(16, 16), (32, 8)], help="Hq:Hkv pairs")  # fmt: skip
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--skip-packed", action="store_true", help="no packed-documents timing")
    ap.add_argument("--doc-tokens", type=int, default=262144, help="packed-documents timing: total tokens")
    ap.add_argument("--doc-lengths", type=int, nargs=2, default=[1024, 32768], help="document lengths lo hi")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    gpu = torch.cuda.is_available() and not a.smoke
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if gpu else "gloo")
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    if a.smoke:
        a.check_seq, a.seqs, a.heads, a.dim, a.backend, a.repeat, a.warmup = (
            64,
            [256],
            [(4, 2)],
            16,
            "auto",
            2,
            1,
        )
        a.doc_tokens, a.doc_lengths = 256, [8, 64]
    world = dist.get_world_size()
    info = {"world": world, "torch": torch.__version__, "device": torch.cuda.get_device_name() if gpu else "cpu",
            "backend": a.backend, "dtype": str(dtype), "env": {k: os.environ.get(k) for k in MULTICAST_OFF}}  # fmt: skip
    log(json.dumps(info))
    result = {"info": info}
    if not a.skip_check:
        result["correctness"] = correctness(a, device, dtype)
    if not a.skip_scaling:
        result["scaling"] = scaling(a, device, dtype)
        if not a.skip_packed:
            result["packed"] = packed_scaling(a, device, dtype)
    if a.json and dist.get_rank() == 0:
        Path(a.json).write_text(json.dumps(result, indent=1))
    failed = any(not r["pass"] for r in result.get("correctness", []))
    dist.destroy_process_group()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
