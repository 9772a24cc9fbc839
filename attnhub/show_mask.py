"""``attnhub show-mask``: draw which keys each query attends, as a character grid or a PNG."""

from __future__ import annotations

import math

import click
import numpy as np

from attnhub.cli_info import MASKS, SYNCS, parse_mask_option
from attnhub.errors import AttnhubError
from attnhub.positions import grid_positions, rule_mask
from attnhub.rules import Rule
from attnhub.shapes import parse_shape

ATTEND, SKIP = "#", "."


def render_grid(
    rule: Rule, seq_q: tuple[int, ...], seq_k: tuple[int, ...], sync: str, query: int | None = None
) -> str:
    """Character grid of the rule: 1-d, one row per query over the keys; 2-d, one key grid per query."""
    pq, pk, fq, fk = grid_positions(seq_q, seq_k, sync)
    keep = rule_mask(rule, pq, pk, fq, fk)
    lines: list[str] = []
    if len(seq_q) == 1:
        width = len(str(max(seq_q[0] - 1, 0)))
        lines.append(" " * (width + 8) + "keys 0.." + str(seq_k[0] - 1) + f" at {pk[0].tolist()}")
        rows = range(seq_q[0]) if query is None else [query]
        for i in rows:
            cells = "".join(ATTEND if x else SKIP for x in keep[i])
            lines.append(f"q{i:<{width}} @{int(pq[0][i]):<4} {cells}")
        return "\n".join(lines)
    xk = seq_k[1]
    rows = range(math.prod(seq_q)) if query is None else [query]
    for i in rows:
        y, x = divmod(i, seq_q[1])
        lines.append(f"q({y},{x}) at ({int(pq[0][i])},{int(pq[1][i])}):")
        grid = keep[i].reshape(seq_k)
        for yy in range(seq_k[0]):
            lines.append("  " + "".join(ATTEND if grid[yy, xx] else SKIP for xx in range(xk)))
    return "\n".join(lines)


def render_png(rule: Rule, seq_q: tuple[int, ...], seq_k: tuple[int, ...], sync: str, path: str) -> None:
    """The same picture as an image (needs the ``viz`` extra: matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise click.ClickException("--png needs matplotlib: pip install 'attnhub[viz]'") from exc
    pq, pk, fq, fk = grid_positions(seq_q, seq_k, sync)
    keep = rule_mask(rule, pq, pk, fq, fk)
    title = f"{rule.describe()}  sync={sync}  q={seq_q} k={seq_k}"
    if len(seq_q) == 1:
        fig, ax = plt.subplots(figsize=(max(4, seq_k[0] / 4), max(3, seq_q[0] / 4)))
        ax.imshow(keep, cmap="Blues", interpolation="nearest", vmin=0, vmax=1)
        ax.set_xlabel("key index")
        ax.set_ylabel("query index")
    else:
        n = math.prod(seq_q)
        cols = seq_q[1]
        fig, axes = plt.subplots(seq_q[0], cols, figsize=(2 * cols, 2 * seq_q[0]), squeeze=False)
        for i in range(n):
            ax = axes[i // cols][i % cols]
            ax.imshow(keep[i].reshape(seq_k), cmap="Blues", interpolation="nearest", vmin=0, vmax=1)
            ax.set_title(f"q{np.unravel_index(i, seq_q)}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


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
