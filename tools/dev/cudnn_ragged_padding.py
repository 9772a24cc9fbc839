"""Does cuDNN's ragged layout keep a NaN stored in padding out of the valid rows, where its padding
mask alone does not (docs/backends/cudnn.md), and how fast is it on the padded causal batch
(issue 37: backward >= 1.2x FlexAttention)?

    python tools/dev/cudnn_ragged_padding.py [--batch 8 --heads 16 --len 4096 --dim 128]

Per-sequence lengths (``use_padding_mask`` with ``seq_len_q``/``seq_len_kv``), causal top-left,
bf16, forward and backward graphs, in three forms:

- ``mask``: the padding mask on the dense (B, H, L, D) buffers (what certify failed: the control);
- ``ragged-bhsd``: plus ragged offsets b*H*L*D into those same buffers (does cuDNN take them on a
  head-major layout?);
- ``ragged-bshd``: plus ragged offsets b*L*H*D into token-major (B, L, H, D) copies (the layout
  cuDNN's own varlen samples and torch's ragged path use).

Each runs twice on the same valid rows: padding filled with NaN, then with zeros. Printed: whether
cuDNN built the graphs, NaN counts in the valid rows of out, dq, dk, dv, the largest difference
between the two runs there, and do_bench times. Last run: H200, 2026-11-29 00:42 UTC (the table
in docs/backends/cudnn.md: both ragged forms keep the NaN out, 17% faster than the mask alone).
"""

from __future__ import annotations

import argparse
import math

import cudnn
import torch
from triton.testing import do_bench

BF16, F32, I32, I64 = (
    cudnn.data_type.BFLOAT16,
    cudnn.data_type.FLOAT,
    cudnn.data_type.INT32,
    cudnn.data_type.INT64,
)


def strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def logical(form: str, b: int, h: int, n: int, d: int) -> tuple[list[int], list[int]]:
    """cuDNN's (B, H, S, D) dims and the strides of the buffer behind them."""
    if form == "ragged-bshd":
        return [b, h, n, d], [n * h * d, d, h * d, 1]
    return [b, h, n, d], strides((b, h, n, d))


def build(form: str, b: int, h: int, n: int, d: int, scale: float) -> tuple:
    """(forward graph, backward graph, their tensors by name) or a refusal message."""
    dims, st = logical(form, b, h, n, d)
    handle = cudnn.create_handle()
    graphs, tensors = [], {}
    for kind in ("fwd", "bwd"):
        g = cudnn.pygraph(io_data_type=BF16, intermediate_data_type=F32, compute_data_type=F32, handle=handle)
        t = {name: g.tensor(name=name, dim=dims, stride=st, data_type=BF16) for name in ("q", "k", "v")}
        t["sq"] = g.tensor(name="sq", dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=I32)
        t["sk"] = g.tensor(name="sk", dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=I32)
        ragged = form.startswith("ragged")
        if ragged:
            t["ro"] = g.tensor(name="ro", dim=[b + 1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=I64)
            for name in ("q", "k", "v"):
                t[name].set_ragged_offset(t["ro"])
        common = dict(
            attn_scale=scale, use_padding_mask=True, seq_len_q=t["sq"], seq_len_kv=t["sk"],
            diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0,
        )  # fmt: skip
        if kind == "fwd":
            o, stats = g.sdpa(t["q"], t["k"], t["v"], name="sdpa", generate_stats=True, **common)
            o.set_output(True).set_dim(dims).set_stride(st).set_data_type(BF16)
            stats.set_output(True).set_dim([b, h, n, 1]).set_stride(strides((b, h, n, 1))).set_data_type(F32)
            if ragged:
                o.set_ragged_offset(t["ro"])
            t["o"], t["stats"] = o, stats
        else:
            t["o"] = g.tensor(name="o", dim=dims, stride=st, data_type=BF16)
            t["dO"] = g.tensor(name="dO", dim=dims, stride=st, data_type=BF16)
            t["stats"] = g.tensor(name="stats", dim=[b, h, n, 1], stride=strides((b, h, n, 1)), data_type=F32)
            if ragged:
                t["o"].set_ragged_offset(t["ro"])
                t["dO"].set_ragged_offset(t["ro"])
            dq, dk, dv = g.sdpa_backward(
                t["q"], t["k"], t["v"], t["o"], t["dO"], t["stats"], name="sdpa_backward", **common
            )
            for name, x in (("dQ", dq), ("dK", dk), ("dV", dv)):
                x.set_output(True).set_dim(dims).set_stride(st).set_data_type(BF16)
                if ragged:
                    x.set_ragged_offset(t["ro"])
                t[name] = x
        try:
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
        except Exception as exc:  # noqa: BLE001 - the answer to "does cuDNN take it?"
            return f"{kind}: {type(exc).__name__}: {str(exc)[:300]}"
        graphs.append(g)
        tensors[kind] = t
    return graphs[0], graphs[1], tensors, handle


def run(form: str, built: tuple, bufs: dict) -> None:
    """Forward then backward into ``bufs`` (out, stats, dq, dk, dv filled in place)."""
    fwd, bwd, t, handle = built
    for g, kind, names in (
        (fwd, "fwd", ("q", "k", "v", "o", "stats")),
        (bwd, "bwd", ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV")),
    ):
        pack = {t[kind][n]: bufs[n] for n in names}
        pack[t[kind]["sq"]], pack[t[kind]["sk"]] = bufs["sq"], bufs["sk"]
        if form.startswith("ragged"):
            pack[t[kind]["ro"]] = bufs["ro"]
        ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
        g.execute(pack, ws, handle=handle)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--len", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    a = ap.parse_args()
    b, h, n, d = a.batch, a.heads, a.len, a.dim
    scale = 1.0 / math.sqrt(d)
    g = torch.Generator(device="cuda").manual_seed(20261128)
    lens = torch.randint(n // 4, n + 1, (b,), generator=g, device="cuda", dtype=torch.int32)
    valid = torch.arange(n, device="cuda")[None, :] < lens[:, None].long()  # (B, L)
    base = {
        x: torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)
        for x in ("q", "k", "v", "dO")
    }
    print(f"cuDNN {cudnn.backend_version()}, B {b} H {h} L {n} D {d}, lengths {lens.tolist()}")
    for form in ("mask", "ragged-bhsd", "ragged-bshd"):
        built = build(form, b, h, n, d, scale)
        if isinstance(built, str):
            print(f"{form:12s} refused: {built}")
            continue
        results = {}
        for fill in (float("nan"), 0.0):
            bufs = {}
            for x, val in base.items():
                y = val.masked_fill(~valid[:, None, :, None], fill)
                bufs[x] = y.transpose(1, 2).contiguous() if form == "ragged-bshd" else y
            for x in ("o", "dQ", "dK", "dV"):
                bufs[x] = torch.full_like(bufs["q"], 7.0)  # every element must be written
            bufs["stats"] = torch.empty(b, h, n, 1, device="cuda", dtype=torch.float32)
            bufs["sq"] = lens.view(b, 1, 1, 1).clone()
            bufs["sk"] = lens.view(b, 1, 1, 1).clone()
            step = n * h * d
            bufs["ro"] = (torch.arange(b + 1, device="cuda", dtype=torch.int64) * step).view(b + 1, 1, 1, 1)
            run(form, built, bufs)
            torch.cuda.synchronize()
            outs = {}
            for x in ("o", "dQ", "dK", "dV"):
                y = bufs[x].transpose(1, 2) if form == "ragged-bshd" else bufs[x]
                outs[x] = y.float().masked_select(valid[:, None, :, None].expand_as(y))
            results[fill == 0.0] = outs
            if fill == 0.0:
                ms = do_bench(lambda: run(form, built, bufs), warmup=25, rep=100)  # noqa: B023
        nan = {x: int(results[False][x].isnan().sum()) for x in results[False]}
        diff = {
            x: float((results[False][x] - results[True][x]).abs().nan_to_num(float("inf")).max()) for x in nan
        }
        print(
            f"{form:12s} NaN in valid rows {nan}; max |NaN-padding - zero-padding| {diff}; fwd+bwd {ms:.3f} ms"
        )


if __name__ == "__main__":
    main()
