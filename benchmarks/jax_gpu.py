"""The jax backend on an NVIDIA GPU against cuDNN and against the dense masked XLA attention.

Targets, bfloat16, one run:
- causal L=4096 D=128 B=4 H=16: attnhub forward >= 0.8x ``jax.nn.dot_product_attention(
  implementation="cudnn")`` (ratio = cuDNN time / attnhub time);
- requests cuDNN cannot serve at L=16k (Local with stride 2, a 2-d local window, scale_end
  alignment), B=1 H=16 D=128: attnhub >= 10x faster than the dense masked XLA attention a user
  would write (``jax.nn.dot_product_attention(mask=..., implementation="xla")``).

Usage: ``python benchmarks/jax_gpu.py [--out FILE.json] [--smoke]``. ``--smoke`` only checks the
Pallas path against the reference on small inputs (exit status 1 if it fails to compile or is wrong).
Timing: each variant is jitted, warmed up, then timed as the median over 5 rounds of
(20 back-to-back calls / 20), synchronising once per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

import attnhub
from attnhub import Causal, Local
from attnhub.positions import dense_rule_mask


def timed(fn: Callable, *args: Any, rounds: int = 5, calls: int = 20) -> float:
    """Median milliseconds per call."""
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            r = fn(*args)
        jax.block_until_ready(r)
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def attnhub_fn(rule: Any, sync: str, **env: str) -> Callable:
    """A jitted attnhub call (bshd layout); its path is fixed under ``env`` when it is first traced."""
    fn = jax.jit(lambda q, k, v: attnhub.attention(q, k, v, mask=rule, sync=sync, layout="bshd"))

    def call(q: Any, k: Any, v: Any) -> Any:
        with mock.patch.dict(os.environ, env):
            return fn(q, k, v)

    return call


def path_of(q: Any, k: Any, v: Any, rule: Any, sync: str, **env: str) -> str:
    """``backend:path`` that attnhub.explain reports for the request under ``env``."""
    with mock.patch.dict(os.environ, env):
        exp = attnhub.explain(q, k, v, mask=rule, sync=sync, layout="bshd")
    note = next((x.note for x in exp.verdicts if x.name == exp.chosen), None) or ""
    return f"{exp.chosen}:{note.split(':', 1)[0].removeprefix('path=')}"


def rel_err(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def inputs(b: int, sq: tuple, sk: tuple, h: int, d: int, seed: int = 0) -> list[Any]:
    """bshd bfloat16 N(0, 1) q, k, v on the default device."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    shapes = [(b, *sq, h, d), (b, *sk, h, d), (b, *sk, h, d)]
    return [jax.random.normal(kk, s, jnp.float32).astype(jnp.bfloat16) for kk, s in zip(keys, shapes)]


def flat(x: Any) -> Any:
    """(B, *S, H, D) -> (B, N, H, D) for jax.nn."""
    return x.reshape(x.shape[0], -1, x.shape[-2], x.shape[-1])


def smoke() -> int:
    """Small Pallas-path requests against the float64 reference; 0 when all pass."""
    from attnhub.request import build_request
    from attnhub_backends.reference import kernel

    bad = 0
    for rule, sync, sq, sk in [
        (Local(8, log2_stride=1), "scale_end", (200,), (300,)),
        (Local((3, 2), causal=True), "scale_front", (12, 10), (6, 20)),
        (Causal(), "none_end", (300,), (100,)),
    ]:
        q, k, v = inputs(2, sq, sk, 4, 64, seed=1)
        try:
            path = path_of(q, k, v, rule, sync)
            out = attnhub.attention(q, k, v, mask=rule, sync=sync, layout="bshd")
            xs = [np.moveaxis(np.asarray(x, np.float64), -2, 1) for x in (q, k, v)]
            req, _ = build_request(*xs, rule, sync, None, "bhsd", False)
            c = [x.reshape(x.shape[0], x.shape[1], -1, x.shape[-1]) for x in xs]
            ref, _ = kernel.forward(*c, req)
            got = np.moveaxis(np.asarray(out, np.float64), -2, 1).reshape(ref.shape)
            e = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            ok = e < 1.6e-2 and np.isfinite(got).all()
            print(f"smoke {path} {rule.describe()} {sync} {sq}x{sk}: rel err {e:.2e} {'ok' if ok else 'BAD'}")
            bad += not ok
        except Exception as exc:  # a kernel that does not compile here
            print(f"smoke {rule.describe()} {sync}: {type(exc).__name__}: {str(exc)[:400]}")
            bad += 1
    return 1 if bad else 0


def causal_4k(rows: list[dict]) -> None:
    b, length, h, d = 4, 4096, 16, 128
    q, k, v = inputs(b, (length,), (length,), h, d)
    flops = 4 * b * h * length * length * d / 2
    cudnn = jax.jit(
        lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    )
    xla = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla"))
    t_cudnn = timed(cudnn, q, k, v)
    variants = {
        "attnhub auto": {},
        "attnhub pallas (cuDNN off)": {"ATTNHUB_JAX_CUDNN": "0"},
        "attnhub xla blockwise": {"ATTNHUB_JAX_CUDNN": "0", "ATTNHUB_JAX_PALLAS": "0"},
    }
    ref = cudnn(q, k, v)
    for name, env in variants.items():
        fn = attnhub_fn(Causal(), "none_front", **env)
        t = timed(fn, q, k, v)
        rows.append(
            dict(
                case="causal L=4096 B=4 H=16 D=128", variant=name, path=path_of(q, k, v, Causal(), "none_front", **env),
                ms=t, tflops=flops / t / 1e9, vs="jax.nn cudnn", vs_ms=t_cudnn, ratio=t_cudnn / t,
                target=">= 0.8x" if name == "attnhub auto" else "", err_vs=rel_err(fn(q, k, v), ref),
            )
        )  # fmt: skip
    t_xla = timed(xla, q, k, v)
    rows.append(
        dict(case="causal L=4096 B=4 H=16 D=128", variant="jax.nn xla (dense)", path="xla", ms=t_xla,
             tflops=flops / t_xla / 1e9, vs="jax.nn cudnn", vs_ms=t_cudnn, ratio=t_cudnn / t_xla, target="", err_vs=0.0)
    )  # fmt: skip
    # bhsd inputs (attnhub's default layout): transposes around the cuDNN call
    qh, kh, vh = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    f_bhsd = jax.jit(lambda q, k, v: attnhub.attention(q, k, v, mask="causal"))
    t = timed(f_bhsd, qh, kh, vh)
    rows.append(
        dict(case="causal L=4096 B=4 H=16 D=128", variant="attnhub auto, bhsd inputs", path="jax:cudnn", ms=t,
             tflops=flops / t / 1e9, vs="jax.nn cudnn", vs_ms=t_cudnn, ratio=t_cudnn / t, target="", err_vs=0.0)
    )  # fmt: skip
    # forward + backward
    g_cudnn = jax.jit(
        jax.grad(lambda q, k, v: jnp.sum(cudnn(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    )
    g_ah = jax.jit(
        jax.grad(
            lambda q, k, v: jnp.sum(
                attnhub.attention(q, k, v, mask="causal", layout="bshd").astype(jnp.float32)
            ),
            argnums=(0, 1, 2),
        )
    )
    tg_c, tg_a = timed(g_cudnn, q, k, v, rounds=3, calls=5), timed(g_ah, q, k, v, rounds=3, calls=5)
    rows.append(
        dict(case="causal L=4096 fwd+bwd", variant="attnhub auto", path="jax:cudnn", ms=tg_a,
             tflops=3.5 * flops / tg_a / 1e9, vs="jax.nn cudnn", vs_ms=tg_c, ratio=tg_c / tg_a, target="", err_vs=0.0)
    )  # fmt: skip


def long_cases(rows: list[dict], small: bool = False, only: str = "") -> None:
    h, d = (2, 64) if small else (16, 128)
    n, side, nq = (1024, 32, 256) if small else (16384, 128, 4096)
    cases = [
        (f"Local(128, stride 2) L={n}", Local(128, log2_stride=1), "none_front", (n,), (n,), True),
        (f"2-d {side}x{side} Local((4,4)) (7x7)", Local((4, 4)), "none_front", (side, side), (side, side), True),
        (f"scale_end Lq={nq} Lk={n} Local(512, causal)", Local(512, causal=True), "scale_end", (nq,), (n,), True),
        (f"2-d {side}x{side} Local((8,8)) (15x15)", Local((8, 8)), "none_front", (side, side), (side, side), False),
        (f"scale_end Lq={nq} Lk={n} Causal", Causal(), "scale_end", (nq,), (n,), False),
    ]  # fmt: skip
    for name, rule, sync, sq, sk, target in cases:
        if only not in name:
            continue
        try:
            one_long_case(rows, name, rule, sync, sq, sk, target, h, d)
        except Exception as exc:  # e.g. the dense XLA attention running out of memory
            print(f"{name} failed: {type(exc).__name__}: {str(exc)[:400]}", file=sys.stderr)


def one_long_case(
    rows: list[dict], name: str, rule: Any, sync: str, sq: tuple, sk: tuple, target: bool, h: int, d: int
) -> None:
    """One long-sequence request: attnhub (auto path and the XLA blockwise path) vs dense masked XLA."""
    q, k, v = inputs(1, sq, sk, h, d)
    keep = jnp.asarray(dense_rule_mask(rule, sq, sk, sync))[None, None]
    dense = jax.jit(lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m, implementation="xla"))
    fq, fk, fv = flat(q), flat(k), flat(v)
    t_dense = timed(dense, fq, fk, fv, keep, rounds=3, calls=3)
    want = dense(fq, fk, fv, keep)
    for variant, env in (("attnhub auto", {}), ("attnhub xla blockwise", {"ATTNHUB_JAX_PALLAS": "0"})):
        fn = attnhub_fn(rule, sync, **env)
        t = timed(fn, q, k, v)
        rows.append(
            dict(
                case=name, variant=variant, path=path_of(q, k, v, rule, sync, **env), ms=t, tflops=0.0,
                vs="dense masked xla", vs_ms=t_dense, ratio=t_dense / t,
                target=">= 10x" if target and variant == "attnhub auto" else "",
                err_vs=rel_err(flat(fn(q, k, v)), want),
            )
        )  # fmt: skip
    del keep, want


def cudnn_window_probe(rows: list[dict]) -> None:
    """Does cuDNN's left sliding window equal Local(w, causal=True)? (informative, not used)."""
    w = 256
    q, k, v = inputs(1, (4096,), (4096,), 16, 128)
    try:
        got = jax.jit(
            lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=True, local_window_size=(w - 1, 0), implementation="cudnn"
            )
        )(q, k, v)
        want = attnhub.attention(q, k, v, mask=Local(w, causal=True), layout="bshd")
        msg = f"rel err vs Local({w}, causal) {rel_err(got, want):.2e}"
    except Exception as exc:
        msg = f"{type(exc).__name__}: {str(exc)[:200]}"
    rows.append(dict(case="probe cuDNN local_window_size=(w-1,0)", variant=msg, path="", ms=0.0, tflops=0.0,
                     vs="", vs_ms=0.0, ratio=0.0, target="", err_vs=0.0))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--small", action="store_true", help="small long-sequence cases (a dry run on the CPU)")
    ap.add_argument("--only", default=None, help="only the long-sequence cases whose name contains this")
    args = ap.parse_args()
    print(f"jax {jax.__version__}, devices {jax.devices()}")
    if args.smoke:
        return smoke()
    rows: list[dict] = []
    parts: tuple = (causal_4k, long_cases, cudnn_window_probe)
    if args.small or args.only is not None:
        parts = (lambda r: long_cases(r, small=args.small, only=args.only or ""),)
    for part in parts:
        try:
            part(rows)
        except Exception as exc:
            print(
                f"{getattr(part, '__name__', 'part')} failed: {type(exc).__name__}: {str(exc)[:600]}",
                file=sys.stderr,
            )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(device=str(jax.devices()[0]), jax=jax.__version__, rows=rows), fh, indent=1)
    print(
        f"\n{'case':<46} {'variant':<28} {'path':<16} {'ms':>8} {'TF/s':>6} {'vs ms':>8} {'ratio':>7} target err"
    )
    for r in rows:
        print(
            f"{r['case']:<46} {r['variant'][:28]:<28} {r['path']:<16} {r['ms']:8.3f} {r['tflops']:6.0f} "
            f"{r['vs_ms']:8.3f} {r['ratio']:7.2f} {r['target']:<7} {r['err_vs']:.1e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
