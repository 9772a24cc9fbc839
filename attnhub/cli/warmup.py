"""``attnhub warmup``: compile the triton backend's common kernels into Triton's disk cache.

A kernel compiles once per shape class, whatever the sequence lengths (docs/backends/triton.md,
"Compile latency"); Triton keeps what it compiled in its disk cache (``TRITON_CACHE_DIR``, default
``~/.triton/cache``), so a later process loads it instead of compiling. This command makes those
first calls for the common classes: forward without gradient, forward and backward, for full,
causal and sliding-window rules (with and without split-KV), and decoding (one query, GQA 32/8,
with and without split-KV).
``--tune`` also times the candidate configs of each class and records the picks for this GPU.
"""

from __future__ import annotations

import time
from typing import Any

import click

BACKENDS = ("triton",)
DTYPES = ("float16", "bfloat16", "float32")


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"comma-separated integers, got {text!r}") from None


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
    under ``--tune`` a class is tuned at its first call, which needs enough work to time. Decoding
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


def _compiled() -> int:
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


@click.command()
@click.option(
    "--dtype", "dtypes", default="bfloat16,float16", show_default=True, help="Comma-separated dtypes."
)
@click.option("--head-dims", default="64,128", show_default=True, help="Comma-separated head dims.")
@click.option("--backends", "names", default="triton", show_default=True, help="Backends to warm up.")
@click.option("--tune", is_flag=True, help="Also time each class's candidate configs and record the picks.")
def warmup(dtypes: str, head_dims: str, names: str, tune: bool) -> None:
    """Precompile the common kernel variants for this GPU (into Triton's disk cache)."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if bad := [n for n in wanted if n not in BACKENDS]:
        raise click.BadParameter(f"{', '.join(bad)}: only {', '.join(BACKENDS)} compiles kernels ahead")
    dts = [x.strip() for x in dtypes.split(",") if x.strip()]
    if bad := [x for x in dts if x not in DTYPES]:
        raise click.BadParameter(f"{', '.join(bad)}: dtypes are {', '.join(DTYPES)}", param_hint="--dtype")
    dims = _ints(head_dims)
    try:
        import torch
    except ImportError:
        raise click.ClickException("warmup needs torch and triton: pip install 'attnhub[triton]'") from None
    if not torch.cuda.is_available():
        raise click.ClickException(
            "warmup compiles for a CUDA GPU and none is visible to torch: nothing done"
        )
    import attnhub
    from attnhub_backends.triton import configs

    rec = next((r for r in attnhub.backends() if r.name == "triton"), None)
    if rec is None or not rec.available:
        raise click.ClickException(
            f"the triton backend is unavailable: {rec.reason if rec else 'not installed'}"
        )
    total, start = 0, time.perf_counter()
    click.echo(f"{torch.cuda.get_device_name()}: {'tuning and ' if tune else ''}compiling")
    for dtype in dts:
        for d in dims:
            for label, spec in variants(d):
                before, t0 = _compiled(), time.perf_counter()
                if tune:
                    with configs.tuning():
                        _run(dtype, d, spec)
                else:
                    _run(dtype, d, spec)
                new = _compiled() - before
                total += new
                click.echo(f"  {dtype} D={d} {label}: {new} kernel(s), {time.perf_counter() - t0:.2f} s")
    click.echo(f"{total} kernel(s) in {time.perf_counter() - start:.1f} s")
    if tune:
        click.echo(f"picks recorded in {configs.records_path()}")
