"""Time the triton backend's SPEC §9 modifiers against their peers, in one process; prints a table and
JSON lines.

    python benchmarks/modifiers.py [--cases dense,mask,bias,softcap,sinks] [--quick] [--out f.jsonl]

- dense: causal D=128 bfloat16 (B·L = 16384, H = 16) forward and backward, no modifier: the
  figures of record in docs/benchmarks.md, to see that the modifiers' constexprs cost nothing.
- mask: padded causal batch as a boolean mask (B=8, H=16, L=4096, D=128, lengths uniform in
  [L/4, L], seeded; padded queries attend nothing): triton vs FlexAttention (compiled,
  ``create_block_mask`` with the same mask_mod) vs SDPA efficient / cuDNN with the bool mask, and
  the same batch given as ``q_lengths``/``k_lengths`` to triton and (where installed) cudnn.
- bias: B=4, H=16, L=4096, D=128, a (1, H, L, L) bias requiring grad: triton vs SDPA efficient /
  cuDNN (forward, and forward+backward with dbias).
- softcap: causal, L = 4k, 8k, 16k, D = 128: triton vs FlexAttention's tanh score_mod.
- sinks: causal 8k with sinks against the same call without.
- bias-padded: issue 39's T5 case, B=4, H=16, L=4096, D=128, 60% of the tokens valid (lengths
  0.9/0.7/0.5/0.3·L), a (1, H, L, L) bias requiring grad: attnhub with ``q_lengths``/``k_lengths``
  (triton's ragged kernels, padded tiles skipped) vs SDPA efficient given the same bias with the
  padding as -inf ((B, H, L, L)), forward and forward+backward with dbias.
- alibi: causal L=8192, B=2, H=16, D=128: ALiBi in the kernel (``alibi_slopes=``) vs attnhub's
  triton with the term as an explicit (1, H, L, L) bias vs FlexAttention with an ALiBi
  ``score_mod`` and a causal block mask; and the same triton call without ALiBi (the floor).

The triton calls go through the backend's ``forward_for_grad``/``backward`` in a small autograd
function (the core's arguments for bias/softcap/sinks may not be on this tree yet). bfloat16
throughout; median milliseconds (``triton.testing.do_bench``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

import torch
import torch.nn.functional as F

from attnhub.operands import Operands
from attnhub.request import build_request
from attnhub_backends.triton.backend import TritonBackend

DT = torch.bfloat16
BE = TritonBackend()


def _ms(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


class _Triton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, sinks, req, mask):  # type: ignore[override]
        ops = Operands(bias=bias, sinks=sinks)
        out, lse, saved = BE.forward_for_grad(q, k, v, req, mask, operands=ops)
        ctx.save_for_backward(q, k, v, saved, lse)
        ctx.req, ctx.mask, ctx.ops = req, mask, ops
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        g = BE.backward(q, k, v, out, lse, dout.contiguous(), ctx.req, ctx.mask, operands=ctx.ops)
        dbias, dsinks = (g[3], g[4]) if len(g) == 5 else (None, None)
        return g[0], g[1], g[2], dbias, dsinks, None, None


def triton_call(q, k, v, *, rule="causal", mask=None, bias=None, softcap=None, sinks=None):
    """A callable running the triton backend with the §9 arguments (autograd through _Triton)."""
    req, _ = build_request(q, k, v, mask if mask is not None else rule, "none_front", None, "bhsd", False)
    req = dataclasses.replace(
        req, needs_grad=q.requires_grad, bias=None if bias is None else tuple(bias.shape),
        bias_grad=bias is not None and bias.requires_grad, softcap=softcap, sinks=sinks is not None,
        sinks_grad=sinks is not None and sinks.requires_grad,
    )  # fmt: skip
    assert BE.check(req) == [], BE.check(req)
    m = mask.reshape(req.rule.shape) if mask is not None else None
    return lambda: _Triton.apply(q, k, v, bias, sinks, req, m)


def _sdpa(backend_name, q, k, v, attn_mask):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend_name]

    def run():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)

    return run


def _flex(q, k, v, block_mask=None, score_mod=None):
    from torch.nn.attention.flex_attention import flex_attention

    fa = _flex.compiled = getattr(_flex, "compiled", None) or torch.compile(flex_attention, dynamic=False)
    return lambda: fa(q, k, v, score_mod=score_mod, block_mask=block_mask)


def timings(fns: dict, grad: bool, inputs: list) -> dict:
    """{name: (fwd ms, fwd+bwd ms)} for each callable (None where it fails)."""
    res = {}
    for name, fn in fns.items():
        try:
            f = _ms(lambda fn=fn: fn())
            fb = None
            if grad:
                out = fn()
                dout = torch.randn_like(out)

                def step(fn=fn, dout=dout):
                    for x in inputs:
                        x.grad = None
                    fn().backward(dout)

                fb = _ms(step)
            res[name] = (f, fb)
        except Exception as exc:  # noqa: BLE001 - a peer that does not run this case is reported
            res[name] = (None, None)
            print(f"  {name}: {type(exc).__name__}: {str(exc)[:160]}")
    return res


def _row(case: str, res: dict, flops: float, out) -> None:
    for name, (f, fb) in res.items():
        rec = {"case": case, "impl": name, "fwd_ms": f, "fwdbwd_ms": fb}
        if f:
            rec["fwd_tflops"] = flops / f / 1e9
        if fb:
            rec["bwd_ms"] = fb - f
            rec["bwd_tflops"] = 2.5 * flops / (fb - f) / 1e9
        line = json.dumps(rec)
        print(line)
        if out:
            out.write(line + "\n")
    t = res.get("triton", (None, None))
    for name, (f, fb) in res.items():
        if name == "triton" or not t[0]:
            continue
        sf = f"{f / t[0]:.2f}x" if f else "n/a"
        sb = f"{fb / t[1]:.2f}x" if fb and t[1] else "n/a"
        print(f"  {case}: {name}/triton fwd {sf}, fwd+bwd {sb}")


def case_dense(out, quick: bool) -> None:
    """No modifier, through ``attnhub.attention``: the forward timed on inputs without grad (as the
    figures of record), the backward from a separate forward+backward."""
    import attnhub

    for n in (4096, 8192) if quick else (4096, 8192, 16384):
        b, h, d = 16384 // n, 16, 128
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=DT) for _ in range(3))
        fwd = timings(
            {"triton": lambda q=q, k=k, v=v: attnhub.attention(q, k, v, mask="causal", backend="triton")},
            False,
            [],
        )
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        both = timings(
            {
                "triton": lambda qg=qg, kg=kg, vg=vg: attnhub.attention(
                    qg, kg, vg, mask="causal", backend="triton"
                )
            },
            True,
            [qg, kg, vg],
        )
        res = {"triton": (fwd["triton"][0], both["triton"][1])}
        _row(f"dense causal D=128 L={n} B={b}", res, 2 * b * h * n * n * d, out)


def case_mask(out, quick: bool) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    b, h, n, d = 8, 16, 4096, 128
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(n // 4, n + 1, (b,), generator=gen).cuda()
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=DT, requires_grad=True) for _ in range(3))
    i = torch.arange(n, device="cuda")
    valid = i[None, :] < lens[:, None]
    mask = (valid[:, :, None] & valid[:, None, :] & (i[:, None] >= i[None, :]))[:, None]

    def mask_mod(bb, hh, qi, ki):
        return (qi >= ki) & (qi < lens[bb]) & (ki < lens[bb])

    bm = create_block_mask(mask_mod, b, None, n, n, device="cuda")
    fns = {
        "triton": triton_call(q, k, v, mask=mask),
        "flex": _flex(q, k, v, block_mask=bm),
        "sdpa-efficient": _sdpa("efficient", q, k, v, mask),
        "sdpa-cudnn": _sdpa("cudnn", q, k, v, mask),
    }
    # The same batch as per-entry lengths (SPEC §10): padded tiles are skipped, no L x L mask.
    import attnhub

    lens32 = lens.to(torch.int32)
    for name in ("triton", "cudnn"):
        if attnhub.explain(q, k, v, mask="causal", q_lengths=lens32, k_lengths=lens32, backend=name).chosen:
            fns[f"{name}-lengths"] = lambda name=name: attnhub.attention(
                q, k, v, mask="causal", q_lengths=lens32, k_lengths=lens32, backend=name
            )
    work = float((lens.double() ** 2 / 2).sum()) * h * d * 4
    _row(f"bool padded causal B={b} H={h} L={n}", timings(fns, True, [q, k, v]), work, out)


def case_bias(out, quick: bool) -> None:
    b, h, n, d = 4, 16, 4096, 128
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=DT, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, h, n, n, device="cuda", dtype=DT, requires_grad=True)
    fns = {
        "triton": triton_call(q, k, v, rule="full", bias=bias),
        "sdpa-efficient": _sdpa("efficient", q, k, v, bias),
        "sdpa-cudnn": _sdpa("cudnn", q, k, v, bias),
    }
    _row(f"bias (1,H,L,L) B={b} H={h} L={n}", timings(fns, True, [q, k, v, bias]), 4 * b * h * n * n * d, out)


def case_softcap(out, quick: bool) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    cap = 30.0

    def score_mod(score, bb, hh, qi, ki):
        return cap * torch.tanh(score / cap)

    def causal(bb, hh, qi, ki):
        return qi >= ki

    for n in (4096, 8192, 16384):
        b, h, d = 16384 // n, 16, 128
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=DT, requires_grad=True) for _ in range(3))
        bm = create_block_mask(causal, None, None, n, n, device="cuda")
        fns = {
            "triton": triton_call(q, k, v, softcap=cap),
            "flex": _flex(q, k, v, block_mask=bm, score_mod=score_mod),
        }
        _row(f"softcap causal L={n} B={b}", timings(fns, True, [q, k, v]), 2 * b * h * n * n * d, out)


def case_sinks(out, quick: bool) -> None:
    b, h, n, d = 2, 16, 8192, 128
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=DT, requires_grad=True) for _ in range(3))
    sinks = torch.randn(h, device="cuda", dtype=torch.float32, requires_grad=True)
    fns = {"triton": triton_call(q, k, v, sinks=sinks), "triton-no-sinks": triton_call(q, k, v)}
    _row(f"sinks causal L={n} B={b}", timings(fns, True, [q, k, v, sinks]), 2 * b * h * n * n * d, out)


def case_bias_padded(out, quick: bool) -> None:
    import attnhub

    b, h, n, d = 4, 16, 4096, 128
    lens = torch.tensor([int(f * n) for f in (0.9, 0.7, 0.5, 0.3)], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=DT, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, h, n, n, device="cuda", dtype=DT, requires_grad=True)
    i = torch.arange(n, device="cuda")
    valid = i[None, :] < lens[:, None]
    pair = (valid[:, :, None] & valid[:, None, :])[:, None]  # (B, 1, L, L)

    def sdpa_padded():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            m = torch.where(pair, bias, float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    fns = {
        "triton": lambda: attnhub.attention(
            q, k, v, bias=bias, q_lengths=lens, k_lengths=lens, backend="triton"
        ),
        "sdpa-efficient": sdpa_padded,
    }
    work = float((lens.double() ** 2).sum()) * h * d * 4
    _row(f"bias (1,H,L,L) padded 60% B={b} H={h} L={n}", timings(fns, True, [q, k, v, bias]), work, out)


def case_alibi(out, quick: bool) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    import attnhub
    from attnhub.modifiers.alibi import alibi_slopes

    b, h, n, d = 2, 16, 8192, 128
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=DT, requires_grad=True) for _ in range(3))
    slopes = torch.tensor(alibi_slopes(h), device="cuda", dtype=torch.float32)
    i = torch.arange(n, device="cuda")
    term = (-slopes[:, None, None] * (i[:, None] - i[None, :]).abs()).to(DT)[None]  # (1, H, L, L)

    def score_mod(score, bb, hh, qi, ki):
        return score - slopes[hh] * (qi - ki).abs()

    def causal(bb, hh, qi, ki):
        return qi >= ki

    bm = create_block_mask(causal, None, None, n, n, device="cuda")
    fns = {
        "triton": lambda: attnhub.attention(q, k, v, mask="causal", alibi_slopes=slopes, backend="triton"),
        "triton-bias": lambda: attnhub.attention(q, k, v, mask="causal", bias=term, backend="triton"),
        "flex": _flex(q, k, v, block_mask=bm, score_mod=score_mod),
        # The floor: the same kernel with no modifier (ALiBi in the kernel cannot be faster).
        "triton-no-alibi": lambda: attnhub.attention(q, k, v, mask="causal", backend="triton"),
    }
    _row(f"alibi causal L={n} B={b} H={h}", timings(fns, True, [q, k, v]), 2 * b * h * n * n * d, out)


CASES = {
    "dense": case_dense,
    "mask": case_mask,
    "bias": case_bias,
    "softcap": case_softcap,
    "sinks": case_sinks,
    "bias-padded": case_bias_padded,
    "alibi": case_alibi,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    out = open(args.out, "w") if args.out else None  # noqa: SIM115
    print(torch.cuda.get_device_name(), torch.__version__)
    for name in args.cases.split(","):
        print(f"== {name}")
        CASES[name](out, args.quick)
        torch.cuda.empty_cache()
    if out:
        out.close()


if __name__ == "__main__":
    assert math.isfinite(1.0)
    main()
