"""Time the triton backend's ragged kernels (SPEC §10) against their peers on one GPU, bf16.

    python benchmarks/ragged.py [--quick] [--out results.jsonl]

- decode: B=4, Hq=32, Hkv=8, D=128, one query, Lk = 8k and 32k, against SDPA (flash, efficient,
  cuDNN: the best that runs), TB/s of K and V read;
- paged: the same decode from a paged cache (block size 16 and 64) against the contiguous cache;
- ragged decode: B=32, k_lengths uniform in [1k, 32k] against SDPA cuDNN (else efficient) with a
  padding mask, TB/s of the valid K and V;
- packed training: 16k tokens of lengths 128-4k, causal, H=16, D=128, forward and forward+backward
  against ``torch.nn.attention.varlen.varlen_attn`` and FlexAttention with a document mask.

The triton side is timed at the launch layer (``ragged_launch``), the time of its kernels and the
sequence table; all peers run in this process.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import traceback

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from attnhub.operands import Operands
from attnhub.request import Request
from attnhub.rules import Causal
from attnhub_backends.triton import ragged_launch

DT = torch.bfloat16
RESULTS: list[dict] = []


def _ms(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _ms_graph(fn) -> float:
    """Milliseconds of ``fn`` replayed from a CUDA graph (no host launch cost, as servers decode)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _ms(graph.replay)


def _record(**row) -> None:
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def _req(b, hq, hkv, lq, lk, d, **kw) -> Request:
    return Request(
        framework="torch", device="cuda:0", dtype="bfloat16", layout="bhsd", batch=b, heads_q=hq,
        heads_kv=hkv, seq_q=(lq,), seq_k=(lk,), dim_qk=d, dim_v=d, rule=Causal(), sync=kw.pop("sync", "none_end"),
        scale=1 / math.sqrt(d), **kw,
    )  # fmt: skip


def _sdpa_best(q, k, v, mask=None, only=None) -> tuple[float, float, str]:
    """(eager ms, CUDA-graph ms, name) of the fastest SDPA backend that runs (GQA via enable_gqa,
    else heads repeated before timing)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kinds = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION}  # fmt: skip
    best = (float("inf"), float("inf"), "none")
    group = q.shape[1] // k.shape[1]
    for name, kind in kinds.items():
        if only and name not in only:
            continue
        for gqa in (True, False):
            kk, vv = (k, v) if gqa else (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
            try:
                with sdpa_kernel([kind]):
                    fn = lambda kk=kk, vv=vv, gqa=gqa: F.scaled_dot_product_attention(  # noqa: E731
                        q, kk, vv, attn_mask=mask, enable_gqa=gqa
                    )
                    fn()
                    t = _ms(fn)
                    try:
                        tg = _ms_graph(fn)
                    except RuntimeError:
                        tg = float("inf")
            except RuntimeError as e:
                print(f"  sdpa {name} gqa={gqa}: {str(e).splitlines()[0][:100]}")
                continue
            print(f"  sdpa {name} gqa={gqa}: {t:.4f} ms, graph {tg:.4f} ms", flush=True)
            if min(t, tg) < min(best[0], best[1]):
                best = (t, tg, f"{name}{'' if gqa else '+repeat'}")
            break
    return best


def decode(quick: bool) -> None:
    if not quick:
        _sweep_decode()
    for lk in (8192, 32768):
        _decode_one(lk)
        torch.cuda.empty_cache()


def _sweep_decode() -> None:
    """Pick the packed forward's (BN, warps, stages) and split fill at Lk = 32k (kept in TUNE, for
    the pointer and the TMA load paths alike: the sweep times whichever this GPU takes)."""
    b, hq, hkv, d, lk = 4, 32, 8, 128, 32768
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=DT)
    k = torch.randn(b, hkv, lk, d, device="cuda", dtype=DT)
    v = torch.randn_like(k)
    req = _req(b, hq, hkv, 1, lk, d, k_lengths=True)
    ops = Operands(k_lengths=torch.full((b,), lk, dtype=torch.int32, device="cuda"))
    times = {}
    for cfg in ((64, 4, 2), (64, 4, 3), (64, 4, 4), (32, 4, 4), (128, 4, 3), (128, 8, 3), (64, 8, 3)):
        for fill in (4, 8):
            ragged_launch.TUNE.update(decode=cfg, decode_tma=cfg, fill=fill)
            try:
                times[(cfg, fill)] = _ms_graph(lambda: ragged_launch.forward(q, k, v, req, ops))
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                print(f"  decode cfg {cfg} fill {fill}: {type(e).__name__}: {str(e)[:200]}")
    (cfg, fill), t = min(times.items(), key=lambda kv: kv[1])
    ragged_launch.TUNE.update(decode=cfg, decode_tma=cfg, fill=fill)
    nbytes = 4 * k.numel()
    _record(bench="decode_sweep", best=[cfg, fill], best_tbps=nbytes / t / 1e9,
            all={f"{c}/{f}": round(nbytes / x / 1e9, 3) for (c, f), x in times.items()})  # fmt: skip


def _decode_one(lk: int) -> None:
    b, hq, hkv, d = 4, 32, 8, 128
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=DT)
    k = torch.randn(b, hkv, lk, d, device="cuda", dtype=DT)
    v = torch.randn_like(k)
    lens = torch.full((b,), lk, dtype=torch.int32, device="cuda")
    req = _req(b, hq, hkv, 1, lk, d, k_lengths=True)
    ops = Operands(k_lengths=lens)
    t = _ms(lambda: ragged_launch.forward(q, k, v, req, ops))
    tg = _ms_graph(lambda: ragged_launch.forward(q, k, v, req, ops))
    nbytes = 2 * k.numel() * k.element_size()
    ts, tsg, which = _sdpa_best(q, k, v)
    _record(bench="decode", lk=lk, triton_ms=t, triton_graph_ms=tg, tbps=nbytes / t / 1e9,
            tbps_graph=nbytes / tg / 1e9, sdpa=which, sdpa_ms=ts, sdpa_graph_ms=tsg,
            sdpa_tbps_best=nbytes / min(ts, tsg) / 1e9, speedup=ts / t, speedup_graph=tsg / tg)  # fmt: skip
    for block in (16, 64):
        nblk = b * lk // block
        perm = torch.randperm(nblk, device="cuda").to(torch.int32)
        table = perm.reshape(b, lk // block)
        kc = torch.empty(nblk, block, hkv, d, device="cuda", dtype=DT)
        vc = torch.empty_like(kc)
        kc[table.long()] = k.reshape(b, hkv, lk // block, block, d).permute(0, 2, 3, 1, 4)
        vc[table.long()] = v.reshape(b, hkv, lk // block, block, d).permute(0, 2, 3, 1, 4)
        preq = _req(b, hq, hkv, 1, lk, d, k_lengths=True, paged=block)
        pops = Operands(k_lengths=lens, block_table=table)
        out_p, _ = ragged_launch.forward(q, kc, vc, preq, pops)
        out_c, _ = ragged_launch.forward(q, k, v, req, ops)
        err = (out_p.float() - out_c.float()).abs().max().item()
        tp = _ms(lambda preq=preq, pops=pops, kc=kc, vc=vc: ragged_launch.forward(q, kc, vc, preq, pops))
        _record(bench="paged", lk=lk, block=block, triton_ms=tp, contiguous_ms=t, ratio=tp / t,
                tbps=nbytes / tp / 1e9, max_diff_vs_contiguous=err)  # fmt: skip


def ragged_decode(quick: bool) -> None:
    b, hq, hkv, d, lmax = 32, 32, 8, 128, 32768
    g = torch.Generator().manual_seed(0)
    lens_cpu = torch.randint(1024, lmax + 1, (b,), generator=g, dtype=torch.int32)
    lens = lens_cpu.cuda()
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=DT)
    k = torch.randn(b, hkv, lmax, d, device="cuda", dtype=DT)
    v = torch.randn_like(k)
    req = _req(b, hq, hkv, 1, lmax, d, k_lengths=True)
    ops = Operands(k_lengths=lens)
    t = _ms(lambda: ragged_launch.forward(q, k, v, req, ops))
    tg = _ms_graph(lambda: ragged_launch.forward(q, k, v, req, ops))
    valid = 2 * int(lens_cpu.sum()) * hkv * d * k.element_size()
    mask = (torch.arange(lmax, device="cuda")[None, :] < lens[:, None])[:, None, None, :]
    out, _ = ragged_launch.forward(q, k, v, req, ops)
    n = 4  # float32 SDPA of the first entries: a check that both sides compute the same thing
    ref = F.scaled_dot_product_attention(
        q[:n].float(), k[:n].float(), v[:n].float(), attn_mask=mask[:n], enable_gqa=True
    )
    err = (out[:n].float() - ref).abs().max().item()
    del ref
    ts, tsg, which = _sdpa_best(q, k, v, mask=mask, only=("cudnn",))
    if which == "none":
        ts, tsg, which = _sdpa_best(q, k, v, mask=mask)
    _record(bench="ragged_decode", triton_ms=t, triton_graph_ms=tg, tbps=valid / t / 1e9,
            tbps_graph=valid / tg / 1e9, sdpa=which, sdpa_ms=ts, sdpa_graph_ms=tsg, speedup=ts / t,
            speedup_graph=tsg / tg, max_err_vs_sdpa_fp32=err)  # fmt: skip


def packed(quick: bool) -> None:
    h, d, total = 16, 128, 16384
    g = torch.Generator().manual_seed(1)
    lens = []
    while sum(lens) < total:
        lens.append(int(torch.randint(128, 4097, (1,), generator=g)))
    lens[-1] -= sum(lens) - total
    if lens[-1] < 128:
        lens[-2] += lens.pop()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    mx = max(lens)
    q = torch.randn(total, h, d, device="cuda", dtype=DT)
    k = torch.randn_like(q)
    v = torch.randn_like(q)
    dout = torch.randn_like(q)
    # ours: canonical (1, H, T, D)
    qc, kc, vc, doc = (x.transpose(0, 1)[None] for x in (q, k, v, dout))
    req = Request(
        framework="torch", device="cuda:0", dtype="bfloat16", layout="bhsd", batch=1, heads_q=h, heads_kv=h,
        seq_q=(total,), seq_k=(total,), dim_qk=d, dim_v=d, rule=Causal(), sync="none_front",
        scale=1 / math.sqrt(d), varlen=True, needs_grad=True,
    )  # fmt: skip
    ops = Operands(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx)
    fwd = lambda: ragged_launch.forward(qc, kc, vc, req, ops)  # noqa: E731

    def fwd_bwd():
        out, lse, saved = ragged_launch.forward_for_grad(qc, kc, vc, req, ops)
        ragged_launch.backward(qc, kc, vc, saved, lse, doc, req, ops)

    flops = sum(4 * h * n * n * d / 2 for n in lens)
    if not quick:  # pick the forward and backward tile configs (kept in TUNE)
        sweep = {}
        for cfg in ((128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 3)):
            ragged_launch.TUNE["fwd"] = cfg
            try:
                sweep[cfg] = _ms(fwd)
            except Exception as e:  # noqa: BLE001
                print(f"  fwd cfg {cfg}: {type(e).__name__}: {str(e)[:200]}")
        ragged_launch.TUNE["fwd"] = min(sweep, key=sweep.get)
        bsweep = {}
        for pair in (((64, 128, 8, 2), (128, 64, 8, 2)), ((64, 64, 4, 2), (64, 64, 4, 2)),
                     ((32, 128, 8, 2), (128, 32, 8, 2)), ((64, 128, 8, 3), (128, 64, 8, 3))):  # fmt: skip
            ragged_launch.TUNE.update(dkdv=pair[0], dq=pair[1])
            try:
                bsweep[pair] = _ms(fwd_bwd)
            except Exception as e:  # noqa: BLE001
                print(f"  bwd cfg {pair}: {type(e).__name__}: {str(e)[:200]}")
        best = min(bsweep, key=bsweep.get)
        ragged_launch.TUNE.update(dkdv=best[0], dq=best[1])
        _record(bench="packed_sweep", fwd={str(c): round(flops / t / 1e9, 1) for c, t in sweep.items()},
                fwdbwd={str(c): round(3.5 * flops / t / 1e9, 1) for c, t in bsweep.items()},
                best_fwd=ragged_launch.TUNE["fwd"], best_bwd=best)  # fmt: skip
    t_f, t_fb = _ms(fwd), _ms(fwd_bwd)
    row = dict(bench="packed", seqs=len(lens), triton_fwd_ms=t_f, triton_fwdbwd_ms=t_fb,
               triton_fwd_tflops=flops / t_f / 1e9, triton_fwdbwd_tflops=3.5 * flops / t_fb / 1e9)  # fmt: skip
    try:
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
        kw = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
        qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        vfwd = lambda: varlen_attn(q, k, v, cu, cu, mx, mx, **kw)  # noqa: E731

        def vfb():
            varlen_attn(qg, kg, vg, cu, cu, mx, mx, **kw).backward(dout)

        ref = vfwd()
        ours = fwd()[0][0].transpose(0, 1)
        row.update(varlen_fwd_ms=_ms(vfwd), varlen_fwdbwd_ms=_ms(vfb),
                   max_diff_vs_varlen=(ref.float() - ours.float()).abs().max().item())  # fmt: skip
        row.update(speedup_fwd_vs_varlen=row["varlen_fwd_ms"] / t_f,
                   speedup_fwdbwd_vs_varlen=row["varlen_fwdbwd_ms"] / t_fb)  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
        row["varlen_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    _record(**row)  # before FlexAttention, whose compilation is slow
    row = dict(bench="packed_flex")
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc_id = torch.repeat_interleave(
            torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda")
        )

        def mask_mod(b, hh, qi, ki):
            return (doc_id[qi] == doc_id[ki]) & (qi >= ki)

        bm = create_block_mask(mask_mod, 1, 1, total, total, device="cuda")
        flex = torch.compile(flex_attention)
        qx, kx, vx, dox = (x.contiguous() for x in (qc, kc, vc, doc))
        qf, kf, vf = (x.detach().clone().requires_grad_(True) for x in (qx, kx, vx))
        ffwd = lambda: flex(qx, kx, vx, block_mask=bm)  # noqa: E731

        def ffb():
            flex(qf, kf, vf, block_mask=bm).backward(dox)

        ffwd()
        ffb()
        row.update(flex_fwd_ms=_ms(ffwd), flex_fwdbwd_ms=_ms(ffb))
        row.update(
            speedup_fwd_vs_flex=row["flex_fwd_ms"] / t_f, speedup_fwdbwd_vs_flex=row["flex_fwdbwd_ms"] / t_fb
        )
    except Exception as e:  # noqa: BLE001
        row["flex_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    _record(**row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default="decode,ragged_decode,packed")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for name in args.only.split(","):
        try:
            globals()[name](args.quick)
        except Exception as e:  # noqa: BLE001 - one failing section must not hide the others
            traceback.print_exc()
            _record(bench=name, error=f"{type(e).__name__}: {str(e)[:300]}")
        torch.cuda.empty_cache()
        if args.out:  # after each section: a later timeout keeps what was measured
            with open(args.out, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in RESULTS)


if __name__ == "__main__":
    main()
