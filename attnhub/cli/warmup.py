"""``attnhub warmup``: compile the common kernels of the backends that compile ahead (those whose
``Backend.warmup`` does something: the triton backend's, into Triton's disk cache), so that a later
process loads them instead of compiling. ``--tune`` also times the candidate configs of each class
and records the picks for this GPU."""

from __future__ import annotations

import click

DTYPES = ("float16", "bfloat16", "float32")


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"comma-separated integers, got {text!r}") from None


@click.command()
@click.option(
    "--dtype", "dtypes", default="bfloat16,float16", show_default=True, help="Comma-separated dtypes."
)
@click.option("--head-dims", default="64,128", show_default=True, help="Comma-separated head dims.")
@click.option("--backends", "names", default="triton", show_default=True, help="Backends to warm up.")
@click.option("--tune", is_flag=True, help="Also time each class's candidate configs and record the picks.")
def warmup(dtypes: str, head_dims: str, names: str, tune: bool) -> None:
    """Precompile the common kernel variants for this GPU."""
    from attnhub.registry import REGISTRY

    table = REGISTRY.backends()
    ahead = sorted(n for n, b in table.items() if b.compiles_ahead)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if bad := [n for n in wanted if n not in ahead]:
        raise click.BadParameter(
            f"{', '.join(bad)}: only {', '.join(ahead) or 'no backend'} compiles kernels ahead"
        )
    dts = [x.strip() for x in dtypes.split(",") if x.strip()]
    if bad := [x for x in dts if x not in DTYPES]:
        raise click.BadParameter(f"{', '.join(bad)}: dtypes are {', '.join(DTYPES)}", param_hint="--dtype")
    dims = _ints(head_dims)
    try:
        import torch
    except ImportError:
        raise click.ClickException("warmup needs torch: pip install 'attnhub[triton]'") from None
    if not torch.cuda.is_available():
        raise click.ClickException(
            "warmup compiles for a CUDA GPU and none is visible to torch: nothing done"
        )
    for name in wanted:
        backend = table[name]
        why = backend.availability()
        if why:
            raise click.ClickException(f"the {name} backend is unavailable: {why}")
        click.echo(f"{torch.cuda.get_device_name()}: {name}: {'tuning and ' if tune else ''}compiling")
        backend.warmup(dts, dims, tune, click.echo)
