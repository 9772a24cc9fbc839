"""``attnhub tune``: time the candidate backends on this device and store the profile auto follows."""

from __future__ import annotations

import contextlib

import click

from attnhub.tuner import DTYPES, FAMILIES


def _triton_tuning() -> contextlib.AbstractContextManager:
    """The triton backend's config tuning, on while its timings run: a shape class met for the
    first time times its candidate configs and records the pick (calls outside never tune)."""
    try:
        from attnhub_backends.triton import configs
    except ImportError:  # triton not installed: nothing to tune
        return contextlib.nullcontext()
    return configs.tuning()


def _split(value: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in value.split(",") if x.strip())


@click.command(name="tune")
@click.option(
    "--device",
    default="cuda",
    show_default=True,
    help="cuda (or cuda:N): the tune grid on torch CUDA tensors; cpu: a small grid on torch CPU tensors.",
)
@click.option("--quick", is_flag=True, help="A short grid (D=128, L in 1k/4k, one window, one decode).")
@click.option(
    "--dtype",
    "dtypes",
    default=None,
    help=f"dtypes, comma-separated (default: {','.join(DTYPES)} on cuda, float32 on cpu).",
)
@click.option("--family", default=",".join(FAMILIES), show_default=True, help="Case families (cuda grid).")
@click.option(
    "--backends", default="", help="Time only these backends, comma-separated (default: all candidates)."
)
@click.option(
    "--out",
    type=click.Path(),
    help="Write the profile to this file, or to this directory under the device's name "
    "(attnhub/profiles: the profile shipped for this device), instead of the user's cache dir.",
)
@click.option("--warmup", type=int, default=None, help="Warm-up per timing (ms).")
@click.option("--rep", type=int, default=None, help="Repetitions per timing (ms).")
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
    profile that backend="auto" follows (see docs/dispatch.md)."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(f"attnhub tune needs torch: {exc}") from exc
    from attnhub.tuner import tune as run_tune

    try:
        with _triton_tuning():
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
