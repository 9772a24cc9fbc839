"""Draw which keys each query attends, as a character grid or a PNG (``attnhub show-mask``)."""

from __future__ import annotations

import math

import click
import numpy as np

from attnhub.positions import grid_positions, rule_mask
from attnhub.rules import Rule

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
