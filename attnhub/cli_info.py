"""``attnhub info`` and ``attnhub explain``: what is installed, and why a request goes where it goes."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from attnhub.api import backends
from attnhub.dispatch import explain_request
from attnhub.errors import AttnhubError
from attnhub.registry import REGISTRY
from attnhub.rules import Causal, Full, Local
from attnhub.shapes import parse_shape, request_from_shapes


@click.command()
@click.option("--errors/--no-errors", default=True, help="Show plugin load errors with tracebacks.")
def info(errors: bool) -> None:
    """List every backend: available or why not, version, priority, what it accepts."""
    console = Console()
    table = Table(title="attnhub backends")
    for col in ("backend", "priority", "status", "version"):
        table.add_column(col, overflow="fold")
    records = backends()
    for r in records:
        status = "[green]available[/]" if r.available else f"[red]unavailable[/]: {r.reason}"
        if r.disabled:
            status += " [yellow](disabled by ATTNHUB_DISABLE)[/]"
        table.add_row(r.name, str(r.priority), status, r.version or "-")
    console.print(table)
    for r in records:
        console.print(
            f"[bold]{r.name}[/]: frameworks {', '.join(r.frameworks)}; devices {', '.join(r.device_types)}; "
            f"dtypes {', '.join(r.dtypes)}; features {', '.join(r.features)}",
            highlight=False,
        )
    if REGISTRY.load_errors:
        console.print("[red bold]Plugins that failed to load[/] (every other backend keeps working):")
        for e in REGISTRY.load_errors:
            console.print(f"  [red]{e.plugin}[/]: {e.error}")
            if errors:
                console.print(e.detail, markup=False, highlight=False)


def parse_mask_option(mask: str, window: str | None, log2_stride: int) -> object:
    """The rule named on the command line."""
    if mask == "full":
        return Full()
    if mask == "causal":
        return Causal()
    if window is None:
        raise click.BadParameter("--window is required for local masks", param_hint="--window")
    w = parse_shape(window)
    return Local(w[0] if len(w) == 1 else w, log2_stride=log2_stride, causal=mask == "local-causal")


MASKS = click.Choice(["full", "causal", "local", "local-causal"])
SYNCS = click.Choice(["none_front", "scale_front", "scale_end", "none_end"])


@click.command(name="explain")
@click.option("--q", "q_shape", required=True, help="q shape, e.g. 2,8,1024,64 (layout order)")
@click.option("--k", "k_shape", required=True, help="k shape")
@click.option("--v", "v_shape", default=None, help="v shape (default: k's)")
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--framework", default="torch", show_default=True)
@click.option("--device", default="cuda:0", show_default=True)
@click.option("--mask", default="full", type=MASKS, show_default=True)
@click.option("--window", default=None, help="local window (int, or YxX for 2-d)")
@click.option("--log2-stride", default=0, show_default=True)
@click.option("--sync", default="none_front", type=SYNCS, show_default=True)
@click.option("--layout", default="bhsd", type=click.Choice(["bhsd", "bshd", "bhds"]), show_default=True)
@click.option("--grad", is_flag=True, help="the request needs gradients")
@click.option("--lse", is_flag=True, help="the request returns lse")
@click.option("--backend", default="auto", show_default=True)
def explain_cmd(
    q_shape,
    k_shape,
    v_shape,
    dtype,
    framework,
    device,
    mask,
    window,
    log2_stride,
    sync,
    layout,
    grad,
    lse,
    backend,
) -> None:  # noqa: E501
    """For a request given by shapes: which backend runs it and why the others do not."""
    try:
        req = request_from_shapes(
            parse_shape(q_shape),
            parse_shape(k_shape),
            parse_shape(v_shape or k_shape),
            dtype=dtype,
            framework=framework,
            device=device,
            mask=parse_mask_option(mask, window, log2_stride),
            sync=sync,
            layout=layout,
            needs_grad=grad,
            return_lse=lse,
        )
    except AttnhubError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(explain_request(req, backend)))
