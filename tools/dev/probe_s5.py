"""Session-5 probe (H100): softcap tanh formulations and tiles, decode split fill per cache length,
the bias gradient's batch sum.

    python tools/dev/probe_s5.py --part softcap --tanh newton [--fwd-cfgs ...]
    python tools/dev/probe_s5.py --part decode
    python tools/dev/probe_s5.py --part bias

softcap: causal, H 16, D 128, bf16, B = 16k / L at L 4k / 8k / 16k (the bench family's cases);
forward and backward (autograd.grad only) times of backend="triton" with the dense kernels' ``_rcp``
(the softcap tanh's reciprocal) replaced by the ``--tanh`` variant (base: rcp.approx, as shipped;
newton: an FMA-only reciprocal, one special function per score off the MUFU pipe), each forward config given by
``--fwd-cfgs`` (``ATTNHUB_TRITON_FWD_CFG`` values) and each backward pair by ``--bwd-cfgs``; the
maximum error of each variant's output and gradients against a float64 formula at L 1k.
decode: CUDA-graph times of ``ragged_launch.forward`` for decode tile configs x split fill at
Lk 8k, 16k, 32k (B 4, Hq 32, Hkv 8, D 128), SDPA cuDNN in the same graphs.
bias: the (4, 16, 4k, 4k) bf16 dS batch sum: float32 sum then cast against the 16-bit sum.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch
from triton.testing import do_bench

#: Compiled-mode ``_rcp`` variants (kernels.py; the softcap tanh's reciprocal). Until e974cb1 this
#: probe patched ``_tanh`` itself (variants newton and tanh.approx.f32; see docs/benchmarks.md).
TANH = {
    "base": None,
    "newton": """
    @triton.jit
    def _rcp(x):
        x = tl.minimum(x, 1.8e19, propagate_nan=tl.PropagateNan.ALL)
        r = (0x7EF311C3 - x.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
        r = r * (2.0 - x * r)
        r = r * (2.0 - x * r)
        r = r * (2.0 - x * r)
        return r
""",
}


def _patch_tanh(variant: str) -> None:
    """Load kernels.py with the compiled-mode ``_rcp`` replaced, as the loader would."""
    body = TANH[variant]
    if body is None:
        return
    from attnhub_backends.triton import loader

    src_path = Path(loader.__file__).with_name("kernels.py")
    src = src_path.read_text()
    start = src.index("else:\n\n    @triton.jit\n    def _rcp(x):")
    end = src.index("@triton.jit\ndef _tanh(x):")
    src = src[:start] + "else:\n" + body + "\n\n" + src[end:]
    tmp = Path(tempfile.mkdtemp()) / "kernels.py"
    tmp.write_text(src)
    name = "attnhub_backends.triton._kernels_compiled"
    spec = importlib.util.spec_from_file_location(name, tmp)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    os.environ["TRITON_INTERPRET"] = "0"
    spec.loader.exec_module(mod)
    loader._LOADED[("kernels.py", False)] = mod


def _ms(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def _softcap_ref(q, k, v, cap):
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = cap * torch.tanh(s / cap)
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.double()


def part_softcap(
    variant: str, fwd_cfgs: list[str], bwd_cfgs: list[str], lengths: tuple = (4096, 8192, 16384)
) -> None:
    import attnhub

    _patch_tanh(variant)
    cap = 50.0
    # accuracy at L 1k, large logits (x4 scale) so the tanh saturates on some rows
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (
        torch.randn(1, 4, 1024, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)
    )
    q = (q * 4).requires_grad_()
    k, v = k.requires_grad_(), v.requires_grad_()
    out = attnhub.attention(q, k, v, mask="causal", softcap=cap, backend="triton")
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _softcap_ref(qd, kd, vd, cap)
    rgrads = torch.autograd.grad(ref, (qd, kd, vd), do.double())
    errs = {"out": (out.double() - ref).abs().max().item() / ref.abs().max().item()}
    for n, a, b in zip("qkv", grads, rgrads):
        errs[f"d{n}"] = (a.double() - b).abs().max().item() / b.abs().max().item()
    print(json.dumps({"part": "softcap_err", "tanh": variant, **{k2: f"{x:.2e}" for k2, x in errs.items()}}))
    for n in lengths:
        _softcap_len(variant, n, cap, fwd_cfgs, bwd_cfgs, g)
        torch.cuda.empty_cache()


def _softcap_len(variant: str, n: int, cap: float, fwd_cfgs: list[str], bwd_cfgs: list[str], g) -> None:
    import attnhub

    b = 16384 // n
    q, k, v = (torch.randn(b, 16, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    flops = 4 * b * 16 * n * n * 128 / 2
    for cfg in fwd_cfgs:
        os.environ["ATTNHUB_TRITON_FWD_CFG"] = cfg
        with torch.no_grad():
            t = _ms(lambda: attnhub.attention(q, k, v, mask="causal", softcap=cap, backend="triton"))
        print(json.dumps({"part": "softcap_fwd", "tanh": variant, "L": n, "cfg": cfg, "ms": round(t, 4),
                          "tflops": round(flops / t / 1e9, 1)}), flush=True)  # fmt: skip
    os.environ.pop("ATTNHUB_TRITON_FWD_CFG", None)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    for pair in bwd_cfgs:
        dkdv, dq = pair.split("/")
        os.environ["ATTNHUB_TRITON_DKDV_CFG"] = dkdv
        os.environ["ATTNHUB_TRITON_DQ_CFG"] = dq
        out = attnhub.attention(qg, kg, vg, mask="causal", softcap=cap, backend="triton")
        do = torch.randn_like(out)
        try:
            t = _ms(lambda out=out, do=do: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True))
        except Exception as e:  # noqa: BLE001 - a config that does not fit
            print(
                json.dumps({"part": "softcap_bwd", "L": n, "cfg": pair, "error": str(e)[-100:]}), flush=True
            )
            continue
        print(json.dumps({"part": "softcap_bwd", "tanh": variant, "L": n, "cfg": pair, "ms": round(t, 4),
                          "tflops": round(2.5 * flops / t / 1e9, 1)}), flush=True)  # fmt: skip
    for key in ("ATTNHUB_TRITON_DKDV_CFG", "ATTNHUB_TRITON_DQ_CFG"):
        os.environ.pop(key, None)


def _ms_graph(fn) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return _ms(graph.replay) / 20


def part_decode(
    cfgs: list[tuple[int, int, int]], fills: list[int], splits: list[int], shapes: list[str]
) -> None:
    """``shapes``: ``B:Lk`` (uniform lengths) or ``rB:Lk`` (lengths uniform in [1k, Lk], seed 7, as
    the ragged-decode bench family); each with every config x fill, then x forced split count."""
    import numpy as np

    for shape in shapes:
        ragged = shape.startswith("r")
        b, lk = (int(x) for x in shape.lstrip("r").split(":"))
        low = min(1024, lk // 4) if ragged else lk
        lens = np.random.default_rng(7).integers(low, lk + 1, b)
        _decode_shape(shape, b, lk, [int(x) for x in lens], cfgs, fills, splits)
        torch.cuda.empty_cache()


def _decode_shape(shape, b, lk, lens, cfgs, fills, splits) -> None:
    import torch.nn.functional as F

    from attnhub.operands import Operands
    from attnhub.request import Request
    from attnhub.rules import Full
    from attnhub_backends.triton import ragged_launch

    hq, hkv, d = 32, 8, 128
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, lk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    nbytes = 4 * sum(lens) * hkv * d
    req = Request(
        framework="torch", device="cuda:0", dtype="bfloat16", layout="bhsd", batch=b, heads_q=hq,
        heads_kv=hkv, seq_q=(1,), seq_k=(lk,), dim_qk=d, dim_v=d, rule=Full(), sync="none_end",
        scale=1 / math.sqrt(d), k_lengths=True,
    )  # fmt: skip
    ops = Operands(k_lengths=torch.tensor(lens, dtype=torch.int32, device="cuda"))
    if len(set(lens)) == 1:
        ts = _ms_graph(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    else:
        mask = (torch.arange(lk, device="cuda")[None, :] < ops.k_lengths[:, None])[:, None, None, :]
        kk, vv = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        ts = _ms_graph(lambda: F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask))
    print(json.dumps({"part": "decode", "shape": shape, "who": "sdpa", "us": round(ts * 1e3, 1),
                      "tbps": round(nbytes / ts / 1e9, 3)}), flush=True)  # fmt: skip
    runs = [(f, None) for f in fills] + [(4, n) for n in splits]
    tma = os.environ.get("ATTNHUB_TRITON_TMA", "")
    for cfg in cfgs:
        for fill, forced in runs:
            ragged_launch.TUNE.update(decode=tuple(cfg), decode_tma=tuple(cfg), fill=fill)
            if forced:
                os.environ["ATTNHUB_TRITON_SPLITS"] = str(forced)
            try:
                t = _ms_graph(lambda: ragged_launch.forward(q, k, v, req, ops, need_lse=False))
            except Exception as e:  # noqa: BLE001
                print(f"decode {cfg} fill {fill}: {type(e).__name__}: {str(e)[:160]}")
                continue
            finally:
                os.environ.pop("ATTNHUB_TRITON_SPLITS", None)
            plan = next(reversed(ragged_launch._PLANS.values()))
            print(json.dumps({"part": "decode", "shape": shape, "tma": tma, "cfg": list(cfg), "fill": fill, "forced": forced,
                              "splits": plan.splits, "us": round(t * 1e3, 1),
                              "tbps": round(nbytes / t / 1e9, 3), "vs_sdpa": round(ts / t, 3)}), flush=True)  # fmt: skip


def part_bias() -> None:
    x = torch.randn(4, 16, 4096, 4096, device="cuda", dtype=torch.bfloat16)
    t_old = _ms(lambda: x.sum(dim=0, keepdim=True, dtype=torch.float32).to(torch.bfloat16))
    t_new = _ms(lambda: x.sum(dim=0, keepdim=True))
    old = x.sum(dim=0, keepdim=True, dtype=torch.float32).to(torch.bfloat16)
    new = x.sum(dim=0, keepdim=True)
    exact = x.double().sum(dim=0, keepdim=True)
    print(json.dumps({"part": "bias_sum", "old_ms": round(t_old, 3), "new_ms": round(t_new, 3),
                      "old_err": (old.double() - exact).abs().max().item(),
                      "new_err": (new.double() - exact).abs().max().item(),
                      "differ": (old != new).sum().item()}), flush=True)  # fmt: skip


def part_biascfg(fwd_cfgs: list[str], tmas: list[str]) -> None:
    """The bias family's case (B 4, H 16, L 4k, D 128, full, a (1, H, L, L) bf16 bias): forward per
    forced config and TMA setting; forward + backward (dbias included) at the defaults."""
    import attnhub

    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (
        torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)
    )
    bias = torch.randn(1, 16, 4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    for tma in tmas:
        for cfg in fwd_cfgs:
            os.environ["ATTNHUB_TRITON_FWD_CFG"] = cfg
            os.environ["ATTNHUB_TRITON_TMA"] = tma
            try:
                with torch.no_grad():
                    t = _ms(lambda: attnhub.attention(q, k, v, bias=bias, backend="triton"))
            except Exception as e:  # noqa: BLE001 - a config that does not fit
                print(json.dumps({"part": "bias_fwd", "tma": tma, "cfg": cfg, "error": str(e)[-120:]}))
                continue
            print(json.dumps({"part": "bias_fwd", "tma": tma, "cfg": cfg, "ms": round(t, 4)}), flush=True)
    os.environ.pop("ATTNHUB_TRITON_FWD_CFG", None)
    os.environ.pop("ATTNHUB_TRITON_TMA", None)
    qg, kg, vg, bg = (t.clone().requires_grad_() for t in (q, k, v, bias))

    def fwdbwd():
        out = attnhub.attention(qg, kg, vg, bias=bg, backend="triton")
        out.backward(do)

    do = torch.randn_like(q)
    t = _ms(fwdbwd)
    print(json.dumps({"part": "bias_fwdbwd", "ms": round(t, 4)}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", required=True)
    ap.add_argument("--tanh", default="base", choices=sorted(TANH))
    ap.add_argument("--fwd-cfgs", default="128,128,8,3,0,1")
    ap.add_argument("--bwd-cfgs", default="64,128,8,2/64,64,4,2")
    ap.add_argument("--decode-cfgs", default="128,4,3;128,4,2;64,4,3;64,2,3;64,4,4")
    ap.add_argument("--fills", default="1,2,3,4,6,8")
    ap.add_argument("--splits", default="")
    ap.add_argument("--tmas", default="")
    ap.add_argument("--lengths", default="4096,8192,16384")
    ap.add_argument("--shapes", default="4:8192,4:16384,4:32768")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for part in a.part.split(","):
        if part == "softcap":
            lengths = tuple(int(x) for x in a.lengths.split(","))
            part_softcap(a.tanh, a.fwd_cfgs.split(";"), a.bwd_cfgs.split(";"), lengths)
        elif part == "decode":
            cfgs = [tuple(int(x) for x in c.split(",")) for c in a.decode_cfgs.split(";")]
            splits = [int(x) for x in a.splits.split(",") if x]
            part_decode(cfgs, [int(x) for x in a.fills.split(",")], splits, a.shapes.split(","))
        elif part == "bias":
            part_bias()
        elif part == "biascfg":
            part_biascfg(a.fwd_cfgs.split(";"), a.tmas.split(","))


if __name__ == "__main__":
    main()
