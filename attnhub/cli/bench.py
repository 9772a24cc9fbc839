"""``attnhub bench``: time attnhub backends and torch peers side by side on the default grid."""

from __future__ import annotations

import datetime
import json
import platform
import sys
from pathlib import Path

import click

from attnhub.bench.grid import default_grid
from attnhub.bench.report import table_text, write_json, write_plot
from attnhub.bench.runners import EXTRA_PEERS, PEERS, runner
from attnhub.bench.timing import Result, time_case
from attnhub.bench.workloads import FAMILIES, model_grid


def _split(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


@click.command(name="bench")
@click.option("--backends", default="triton", show_default=True, help="attnhub backends, comma-separated.")
@click.option(
    "--peers",
    default=",".join(PEERS),
    show_default=True,
    help=f"torch peers (or 'none'), comma-separated; also {', '.join(EXTRA_PEERS)} (SDPA pinned to MATH).",
)
@click.option("--quick", is_flag=True, help="A short grid (D=128, L in 1k/4k, one window, one decode).")
@click.option(
    "--dtype", default="bfloat16", show_default=True, type=click.Choice(["bfloat16", "float16", "float32"])
)
@click.option(
    "--family",
    default="dense,local,decode",
    show_default=True,
    help="Case families to run: dense, local, decode, and the real-model ones: " + ", ".join(FAMILIES) + ".",
)
@click.option(
    "--direction", default="fwd,bwd,fwdbwd", show_default=True, help="fwd, bwd, fwdbwd (forward+backward)."
)
@click.option("--lengths", default="", help="Keep only cases with these query lengths, comma-separated.")
@click.option("--out", "out_dir", default="bench-results", show_default=True, type=click.Path())
@click.option("--warmup", default=25, show_default=True, help="do_bench warm-up (ms).")
@click.option("--rep", default=100, show_default=True, help="do_bench repetitions (ms).")
def bench(
    backends: str,
    peers: str,
    quick: bool,
    dtype: str,
    family: str,
    direction: str,
    lengths: str,
    out_dir: str,
    warmup: int,
    rep: int,
) -> None:
    """Time attnhub backends and torch peers (SDPA flash/cuDNN/efficient, FlexAttention) on one GPU.

    Writes bench.json and bench.png to --out and prints a table with peer/backend time ratios.
    """
    names = _split(backends)
    peer_names = [] if peers.strip() == "none" else _split(peers)
    unknown = [p for p in peer_names if p not in PEERS + EXTRA_PEERS]
    if unknown:
        raise click.ClickException(f"unknown peers {unknown}; choose from {', '.join(PEERS + EXTRA_PEERS)}")
    fams, dirs = set(_split(family)), set(_split(direction))
    try:
        lens = {int(x) for x in _split(lengths)}
    except ValueError:
        raise click.ClickException(f"--lengths takes comma-separated integers, got {lengths!r}") from None
    try:
        import torch
    except ImportError as exc:
        raise click.ClickException(f"attnhub bench needs torch: {exc}") from exc
    if not torch.cuda.is_available():
        raise click.ClickException("attnhub bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    cases = [
        c
        for c in default_grid(quick, dtype) + model_grid(quick, dtype)
        if c.family in fams and c.direction in dirs and (not lens or c.len_q in lens)
    ]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(["attnhub", "bench", *sys.argv[2:]]) if len(sys.argv) > 1 else "attnhub bench",
        "backends": names,
        "peers": peer_names,
        # float32 peers (sdpa-math's matmuls) use TF32 only when this is true
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    results: list[Result] = []
    total = len(cases) * (len(names) + len(peer_names))
    done = 0
    for case in cases:
        for name in names + peer_names:
            r = time_case(name, case, runner, warmup, rep)
            results.append(r)
            done += 1
            cell = f"{r.ms:.3f} ms {r.tflops:.0f} TFLOP/s" if r.ms is not None else f"n/a ({r.error})"
            click.echo(f"[{done}/{total}] {name:<15} {case.label()}: {cell}", err=True)
            sys.stderr.flush()
        meta["tuned"] = _tuned_configs(names)
        write_json(results, out / "bench.json", meta)  # after every case: a cut-off run keeps its results
    plotted = write_plot(results, out / "bench.png")
    click.echo(table_text(results, names, peer_names))
    click.echo(json.dumps({k: meta[k] for k in ("date", "device", "torch")}))
    click.echo(f"wrote {out / 'bench.json'}" + (f" and {out / 'bench.png'}" if plotted else ""))


def _tuned_configs(names: list[str]) -> dict[str, str]:
    """Configs the named backends' tuners picked (where they ran), for the JSON report."""
    from attnhub.registry import REGISTRY

    table = REGISTRY.backends()
    return {k: v for n in names if n in table for k, v in table[n].tuned_configs().items()}
