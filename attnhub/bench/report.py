"""The benchmark's outputs: a table with ratios to each peer, JSON, and a TFLOP/s-versus-L plot."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from attnhub.bench.grid import Case
from attnhub.bench.timing import Result


def _by_case(results: list[Result]) -> dict[Case, dict[str, Result]]:
    table: dict[Case, dict[str, Result]] = defaultdict(dict)
    for r in results:
        table[r.case][r.name] = r
    return table


def table_text(results: list[Result], backends: list[str], peers: list[str]) -> str:
    """Plain-text table: per case the time and TFLOP/s of every runner, then backend/peer speedups."""
    names = backends + peers
    lines = []
    head = f"{'case':<58}" + "".join(f"{n:>17}" for n in names)
    ratio_cols = [(b, p) for b in backends for p in peers]
    head += "".join(f"{(b[:6] + '/' + p.replace('sdpa-', ''))[:16]:>17}" for b, p in ratio_cols)
    lines.append(head)
    for case, row in _by_case(results).items():
        short = (
            f"{case.family[:5]} {case.direction} B{case.batch} H{case.heads_q}/{case.heads_kv} "
            f"L{case.len_q}/{case.len_k} D{case.dim} {case.rule.describe()} {case.variant}"
        )
        cells = []
        for n in names:
            r = row.get(n)
            if r is None or r.ms is None:
                cells.append(f"{'n/a':>17}")
            elif r.tbps:
                cells.append(f"{f'{r.ms * 1e3:.1f}us {r.tbps:.2f}TB/s':>17}")
            else:
                cells.append(f"{f'{r.ms:.3f}ms {r.tflops:.0f}T':>17}")
        ratios = []
        for b, p in ratio_cols:
            rb, rp = row.get(b), row.get(p)
            ok = rb and rp and rb.ms and rp.ms
            ratios.append(f"{f'{rp.ms / rb.ms:.2f}x' if ok else '-':>17}")  # type: ignore[union-attr]
        lines.append(f"{short[:58]:<58}" + "".join(cells) + "".join(ratios))
    lines.append("ratios: peer time / backend time (above 1: the backend is faster)")
    return "\n".join(lines)


def write_json(results: list[Result], path: Path, meta: dict) -> None:
    path.write_text(json.dumps({"meta": meta, "results": [r.to_json() for r in results]}, indent=1))


def write_plot(results: list[Result], path: Path) -> bool:
    """TFLOP/s versus L per runner, one panel per (direction, D, causal) of the dense family."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    dense = [r for r in results if r.case.family == "dense" and r.tflops]
    panels = sorted({(r.case.direction, r.case.dim, r.case.causal) for r in dense})
    if not panels:
        return False
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, (direction, dim, causal) in zip(axes.flat, panels, strict=False):
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in dense:
            if (r.case.direction, r.case.dim, r.case.causal) == (direction, dim, causal):
                series[r.name].append((r.case.len_q, r.tflops or 0.0))
        for name, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{direction} D={dim} {'causal' if causal else 'full'}", fontsize=9)
        ax.set_xlabel("L")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
