"""How far half-precision gradients of each CUDA backend are from float64, against SPEC §6's bounds.

For each case (large logits, random, peaked rows, a window of one key) and each backend that accepts
it, prints the relative and max errors of dq, dk, dv (cancellation floor applied, as certify does),
those of the tensor-core formula (attnhub_conformance.rounded) and of the formula computed op by op
in the input dtype (torch eager), and the verdict under SPEC §6: the table alone, and the table or
twice the tensor-core formula's errors. Needs a CUDA GPU. Usage:
``python tools/dev/half_grad_error.py [--json OUT.json]``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import attnhub
from attnhub.rules import Causal, Full, Local
from attnhub_conformance import oracle
from attnhub_conformance.rounded import ROUNDED_FACTOR, rounded_backward
from attnhub_conformance.runner import TOLERANCES, errors

BACKENDS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "triton", "cuda")


def case_arrays(name: str, dtype: torch.dtype, rng: np.random.Generator):
    """(q, k, v, dout) float64 arrays of values representable in ``dtype``, and the rule."""
    b, h, n, d = 2, 8, 1024, 64
    q, k, v, dout = (rng.standard_normal((b, h, n, d)) for _ in range(4))
    rule = Causal()
    if name == "large logits":
        q = q * 8
    elif name == "peaked rows":  # ~98 % of every row's probability on key 0
        q = np.zeros_like(q)
        q[..., 0] = 8.0
        k = rng.normal(0.0, 0.3, k.shape)
        k[:, :, 0, 0] = 4.0
        rule = Full()
    elif name == "window 1":
        rule = Local(1)
    rounded = [torch.from_numpy(x).to(dtype).double().numpy() for x in (q, k, v, dout)]
    return (*rounded, rule)


def keep_of(rule, n: int) -> np.ndarray:
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if isinstance(rule, Causal):
        return (i >= j)[None, None]
    if isinstance(rule, Local):
        w = rule.window if isinstance(rule.window, int) else rule.window[0]
        return (np.abs(i - j) < w)[None, None]
    return np.ones((1, 1, n, n), dtype=bool)


def eager_grads(q, k, v, dout, keep, dtype):
    """The formula op by op in ``dtype`` (torch on the GPU, as SDPA's math kernel runs it)."""
    t = [torch.from_numpy(x).to(dtype).cuda().requires_grad_(True) for x in (q, k, v)]
    s = (t[0] @ t[1].transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~torch.from_numpy(keep).cuda(), float("-inf"))
    out = torch.softmax(s, dim=-1) @ t[2]
    return [
        g.double().cpu().numpy() for g in torch.autograd.grad(out, t, torch.from_numpy(dout).to(dtype).cuda())
    ]


def backend_grads(name, q, k, v, dout, rule, dtype):
    t = [torch.from_numpy(x).to(dtype).cuda().requires_grad_(True) for x in (q, k, v)]
    try:
        out = attnhub.attention(*t, mask=rule, backend=name)
    except attnhub.BackendUnsupported as e:
        return None, "; ".join(e.reasons)[:120]
    except Exception as e:  # noqa: BLE001 - a backend missing here is reported, not fatal
        return None, f"{type(e).__name__}: {e}"[:120]
    g = torch.autograd.grad(out, t, torch.from_numpy(dout).to(dtype).cuda())
    return [x.double().cpu().numpy() for x in g], ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for dname, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        tol = TOLERANCES[dname][1]
        for case in ("large logits", "random", "peaked rows", "window 1"):
            q, k, v, dout, rule = case_arrays(case, dtype, np.random.default_rng(0))
            p = oracle.Problem(q, k, v, keep_of(rule, q.shape[2]), q.shape[-1] ** -0.5)
            ref, mag = oracle.backward(p, dout)
            tc = rounded_backward(p, dout, dname)
            eager = eager_grads(q, k, v, dout, p.keep, dtype)
            bounds = {}
            for i, key in enumerate(("dq", "dk", "dv")):
                tce = errors(getattr(tc, key), getattr(ref, key), getattr(mag, key))
                bounds[key] = tce
                rows.append(dict(dtype=dname, case=case, who="tensor-core formula", grad=key, err=tce))
                rows.append(
                    dict(dtype=dname, case=case, who="eager formula", grad=key,
                         err=errors(eager[i], getattr(ref, key), getattr(mag, key)))
                )  # fmt: skip
            for name in BACKENDS:
                grads, why = backend_grads(name, q, k, v, dout, rule, dtype)
                if grads is None:
                    rows.append(dict(dtype=dname, case=case, who=name, declined=why))
                    continue
                for i, key in enumerate(("dq", "dk", "dv")):
                    rel, mx = errors(grads[i], getattr(ref, key), getattr(mag, key))
                    brel, bmx = bounds[key]
                    table = rel <= tol and mx <= tol
                    rule_ok = rel <= max(tol, ROUNDED_FACTOR * brel) and mx <= max(tol, ROUNDED_FACTOR * bmx)
                    rows.append(
                        dict(
                            dtype=dname,
                            case=case,
                            who=name,
                            grad=key,
                            err=(rel, mx),
                            table=table,
                            rule=rule_ok,
                        )
                    )
    for r in rows:
        if "declined" in r:
            print(f"{r['dtype']:9} {r['case']:13} {r['who']:20} declined: {r['declined']}")
        else:
            verdict = (
                ""
                if "table" not in r
                else f" table={'pass' if r['table'] else 'FAIL'} rule={'pass' if r['rule'] else 'FAIL'}"
            )
            print(
                f"{r['dtype']:9} {r['case']:13} {r['who']:20} {r['grad']} rel {r['err'][0]:.3g} max {r['err'][1]:.3g}{verdict}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
