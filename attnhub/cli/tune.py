"""``attnhub tune``: time the candidate backends on this device and store the profile auto follows."""

from __future__ import annotations

import contextlib

import click

from attnhub.bench.timing import CPU_MIN_CALLS, CPU_WARMUP_CALLS
from attnhub.tuner import DTYPES, FAMILIES, TIMING, grid_summary


def _backend_tuning() -> contextlib.ExitStack:
    """Every backend's tuning context (``Backend.tuning``): a backend that picks among kernel
    configs (triton) times them for a shape class met for the first time and records its pick,
    while the tuner's timings run; calls outside never tune. A backend whose tuning cannot be
    imported (its package missing) has none."""
    from attnhub.registry import REGISTRY

    stack = contextlib.ExitStack()
    for b in REGISTRY.backends().values():
        with contextlib.suppress(ImportError):
            stack.enter_context(b.tuning())
    return stack


def _split(value: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in value.split(",") if x.strip())


@click.command(name="tune")
@click.option(
    "--device",
    default="cuda",
    show_default=True,
    help=f"cuda (or cuda:N): torch CUDA tensors, grid {grid_summary('cuda', False)}. "
    f"cpu: torch CPU tensors, grid {grid_summary('cpu', False)}.",
)
@click.option(
    "--quick",
    is_flag=True,
    help=f"A short grid. cuda: {grid_summary('cuda', True)}; cpu: {grid_summary('cpu', True)}.",
)
@click.option(
    "--dtype",
    "dtypes",
    default=None,
    help=f"dtypes, comma-separated (default: {','.join(DTYPES)} on cuda, float32 on cpu).",
)
@click.option(
    "--family",
    default=",".join(FAMILIES),
    show_default=True,
    help="Case families of the cuda grid (the cpu grid has one).",
)
@click.option(
    "--backends", default="", help="Time only these backends, comma-separated (default: all candidates)."
)
@click.option(
    "--out",
    type=click.Path(),
    help="Write the profile to this file, or to this directory under the device's name "
    "(attnhub/profiles: the profile shipped for this device), instead of the user's cache dir.",
)
@click.option(
    "--warmup",
    type=int,
    default=None,
    help=f"Warm-up per timing (ms; default {TIMING['cuda'][0]} on cuda, {TIMING['cpu'][0]} on cpu, "
    f"where at least {CPU_WARMUP_CALLS} calls also warm up).",
)
@click.option(
    "--rep",
    type=int,
    default=None,
    help=f"Repetitions per timing (ms; default {TIMING['cuda'][1]} on cuda, {TIMING['cpu'][1]} on cpu, "
    f"where at least {CPU_MIN_CALLS} calls are timed).",
)
def tune(
    device: str,
    quick: bool,
    dtypes: str | None,
    family: str,
    backends: str,
    out: str | None,
    warmup: int | None,
    rep: int | None,
) -> None:
    """Time every backend that can run each request class of a grid, on this device, and store the
    profile that backend="auto" follows (see docs/dispatch.md). A class where a backend times faster
    than the highest-priority one is timed again; unless the re-timing confirms it, the priority
    order stands. The profile records how each figure was measured."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(f"attnhub tune needs torch: {exc}") from exc
    from attnhub.tuner import tune as run_tune

    try:
        with _backend_tuning():
            result = run_tune(
                device,
                quick=quick,
                dtypes=_split(dtypes) if dtypes else None,
                families=_split(family),
                backends=list(_split(backends)) or None,
                out=out,
                warmup=warmup,
                rep=rep,
                progress=lambda line: click.echo(line, err=True),
            )
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"device: {result.device}")
    click.echo(f"{len(result.classes)} request classes measured")
    click.echo(f"wrote {result.path}")
