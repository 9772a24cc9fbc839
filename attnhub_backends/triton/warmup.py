"""What ``attnhub warmup`` compiles for the triton backend: the first calls of its common kernel
classes, so that Triton's disk cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``) holds them
for later processes.

A kernel compiles once per shape class, whatever the sequence lengths (docs/backends/triton.md,
"Compile latency"). The classes: forward without gradient, forward and backward, for full, causal
and sliding-window rules (with and without split-KV), and decoding (one query, GQA 32/8, with and
without split-KV). With ``tune`` each class's candidate configs are also timed and the picks
recorded for this GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def _length_shifts() -> tuple[int, ...]:
    """0, and 1 where the kernels specialise Nq or Nk (``kernels.FWD_SEQ_ARGS``/``BWD_SEQ_ARGS``
    emptied): Triton then compiles lengths that are multiples of 16 and the others apart, so each
    call is also made one token shorter."""
    from attnhub_backends.triton import loader

    mod = loader.kernels(interpret=False)
    if {"Nq", "Nk"} <= set(mod.FWD_SEQ_ARGS) and {"Nq", "Nk"} <= set(mod.BWD_SEQ_ARGS):
        return (0,)
    return (0, 1)


def variants(head_dim: int) -> list[tuple[str, dict[str, Any]]]:
    """(label, shape and rule) of each call made per dtype and head dim. The large calls come first:
    under ``tune`` a class is tuned at its first call, which needs enough work to time. Decoding
    runs with split-KV (a long cache) and without (fewer than 16 key tiles)."""
    import attnhub

    heads = max(1, 2048 // head_dim)
    big = dict(b=4, hq=heads, hkv=heads, nq=4096, nk=4096)
    few = dict(b=1, hq=2, hkv=2, nq=1024, nk=4096)  # few query tiles: split-KV
    rules = [("full", None), ("causal", attnhub.Causal()), ("local 256", attnhub.Local(256, causal=True))]
    out = []
    for shift in _length_shifts():
        tag = f" L-{shift}" if shift else ""
        for grad in (False, True):
            for name, rule in rules:
                for shape, kind in ((big, ""), (few, " split-KV")):
                    label = f"{'fwd+bwd' if grad else 'fwd'} {name}{kind}{tag}"
                    spec = dict(shape, nq=shape["nq"] - shift, nk=shape["nk"] - shift)
                    out.append((label, dict(spec, rule=rule, grad=grad)))
        for nk, kind in ((8192, "split-KV"), (1024, "short")):
            spec = dict(b=8, hq=32, hkv=8, nq=1, nk=nk - shift, rule=None, grad=False)
            out.append((f"decode GQA 32/8 {kind}{tag}", spec))
    return out


def compiled() -> int:
    """Kernels the triton backend has compiled in this process."""
    from attnhub_backends.triton import loader

    mod = loader.kernels(interpret=False)
    names = ("fwd_kernel", "combine_kernel", "bwd_prep_kernel", "dkdv_kernel", "dq_kernel")
    return sum(len(c[0]) for n in names for c in getattr(mod, n).device_caches.values())


def _run(dtype: str, d: int, spec: dict[str, Any]) -> None:
    import torch

    import attnhub

    dt = getattr(torch, dtype)
    grad = spec["grad"]
    q = torch.randn(spec["b"], spec["hq"], spec["nq"], d, device="cuda", dtype=dt, requires_grad=grad)
    k = torch.randn(spec["b"], spec["hkv"], spec["nk"], d, device="cuda", dtype=dt, requires_grad=grad)
    v = torch.randn_like(k, requires_grad=grad)
    out = attnhub.attention(q, k, v, mask=spec["rule"], backend="triton")
    if grad:
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()


def warmup(dtypes: list[str], head_dims: list[int], tune: bool, echo: Callable[[str], None]) -> None:
    """Make the first call of every class in :func:`variants` for each dtype and head dim."""
    from attnhub_backends.triton import configs

    total, start = 0, time.perf_counter()
    for dtype in dtypes:
        for d in head_dims:
            for label, spec in variants(d):
                before, t0 = compiled(), time.perf_counter()
                if tune:
                    with configs.tuning():
                        _run(dtype, d, spec)
                else:
                    _run(dtype, d, spec)
                new = compiled() - before
                total += new
                echo(f"  {dtype} D={d} {label}: {new} kernel(s), {time.perf_counter() - t0:.2f} s")
    echo(f"{total} kernel(s) in {time.perf_counter() - start:.1f} s")
    if tune:
        echo(f"picks recorded in {configs.records_path()}")
