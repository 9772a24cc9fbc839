"""``attnhub explain``: for a request given by shapes, which backend runs it and why the others do not."""

from __future__ import annotations

import click

from attnhub.cli.options import MASKS, SYNCS, parse_mask_option
from attnhub.dispatch import explain_request
from attnhub.errors import AttnhubError
from attnhub.shapes import parse_shape, request_from_shapes


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
