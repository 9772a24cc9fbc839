"""``attnhub show-mask``: draw which keys each query attends, as a character grid or a PNG."""

from __future__ import annotations

import click

from attnhub.cli.options import MASKS, SYNCS, parse_mask_option
from attnhub.errors import AttnhubError
from attnhub.shapes import parse_shape
from attnhub.show_mask import ATTEND, SKIP, render_grid, render_png


@click.command(name="show-mask")
@click.option("--q", "q_seq", required=True, help="query sequence shape: L or YxX")
@click.option("--k", "k_seq", required=True, help="key sequence shape: L or YxX")
@click.option("--mask", default="causal", type=MASKS, show_default=True)
@click.option("--window", default=None, help="local window half-size (int, or YxX for 2-d)")
@click.option("--log2-stride", default=0, show_default=True)
@click.option("--sync", default="none_front", type=SYNCS, show_default=True)
@click.option("--query", type=int, default=None, help="only this (flat) query index")
@click.option("--png", default=None, help="write a PNG here instead of printing a grid")
def show_mask(q_seq, k_seq, mask, window, log2_stride, sync, query, png) -> None:
    """Draw which keys each query attends ('#') for a rule, a sync mode and 1-d or 2-d shapes."""
    try:
        seq_q, seq_k = parse_shape(q_seq), parse_shape(k_seq)
        if len(seq_q) != len(seq_k) or len(seq_q) not in (1, 2):
            raise click.BadParameter("--q and --k need the same number (1 or 2) of dimensions")
        rule = parse_mask_option(mask, window, log2_stride)
        if png:
            render_png(rule, seq_q, seq_k, sync, png)
            click.echo(f"wrote {png}")
        else:
            click.echo(f"{rule.describe()}  sync={sync}  ('{ATTEND}' attended, '{SKIP}' not)")
            click.echo(render_grid(rule, seq_q, seq_k, sync, query))
    except AttnhubError as exc:
        raise click.ClickException(str(exc)) from None
