"""Support matrix from case results: aggregation, the JSON and Markdown reports, the rich table.

The JSON report keeps what the support matrix needs, not every case: run metadata (seed, device,
versions, command), the totals, each feature x dtype cell (status and counts), the likely culprits,
how often each decline reason occurred, and the full result of every failing case. Passing and
declined cases are only counted. (Schema ``/1`` reports also listed every case under ``results``;
the matrix reads both forms.)

A cell (feature x dtype) is ``FAIL`` when an accepted case with that feature failed, ``pass`` when
accepted cases passed (with the count of declined ones, if any), ``declined (reason)`` when the
backend declined every case, and ``-`` when no case of the grid has that combination.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import sys
from collections import Counter
from typing import Any

from attnhub_conformance.cases import DTYPES, FEATURE_ROWS
from attnhub_conformance.runner import Result

SCHEMA = "attnhub-certify-report/2"
#: Report schemas the matrix reader accepts (``/1`` carried every case result as well).
READABLE_SCHEMAS = ("attnhub-certify-report/1", SCHEMA)


def results_from(payload: dict[str, Any]) -> list[Result]:
    return [Result(**r) for r in payload["results"]]


def aggregate(results: list[Result]) -> dict[str, dict[str, dict[str, Any]]]:
    """``matrix[feature][dtype]`` = {status, passed, failed, declined, reason, failing (ids)}."""
    cells: dict[str, dict[str, dict[str, Any]]] = {
        f: {
            d: {"passed": 0, "failed": 0, "declined": 0, "reasons": Counter(), "first": {}, "failing": []}
            for d in DTYPES
        }
        for f in FEATURE_ROWS
    }
    for r in results:
        if r.dtype not in DTYPES:
            continue
        if r.status == "FAIL":
            for f in r.failed_features():
                if f in cells:
                    cells[f][r.dtype]["failed"] += 1
                    cells[f][r.dtype]["failing"].append(r.id)
        for f in r.passed_features() if r.status == "FAIL" else r.features:
            if f not in cells:
                continue
            c = cells[f][r.dtype]
            if r.status in ("pass", "FAIL"):  # a FAIL's passed_features() (see above)
                c["passed"] += 1
            else:
                c["declined"] += 1
                # every reason of the case counts: the cell shows the one most of its declined
                # cases share (a sinks row says "does not take attention sinks", not the bias
                # reason that a bias + sinks case happens to give first)
                for pos, why in enumerate(dict.fromkeys(r.reasons or ["declined"])):
                    c["reasons"][why] += 1
                    c["first"][why] = min(pos, c["first"].get(why, pos))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for f, row in cells.items():
        out[f] = {}
        for d, c in row.items():
            reason = _shown_reason(c["reasons"], c["first"])
            if c["failed"]:
                status = "FAIL"
            elif c["passed"]:
                status = "pass"
            elif c["declined"]:
                status = "declined"
            else:
                status = "untested"
            out[f][d] = {
                "status": status,
                "passed": c["passed"],
                "failed": c["failed"],
                "declined": c["declined"],
                "reason": reason,
                "failing": c["failing"][:5],
            }
    return out


def _shown_reason(counts: Counter, first: dict[str, int]) -> str:
    """The reason a declined cell shows: the one most of its cases give; ties by the earliest place
    a case gives it, then by text (so that a sharded --jobs run, merged in another order, agrees)."""
    if not counts:
        return ""
    return min(counts.items(), key=lambda kv: (-kv[1], first[kv[0]], kv[0]))[0]


def _score(accepted: list[Result], f: str) -> dict[str, Any] | None:
    """How much more often the cases with row ``f`` fail than those without it (None: none fail on it)."""
    with_f = [r for r in accepted if f in r.features]
    without = [r for r in accepted if f not in r.features]
    fail_with = sum(r.status == "FAIL" and f in r.failed_features() for r in with_f)
    if not with_f or not fail_with:
        return None
    failed_without = sum(r.status == "FAIL" for r in without)
    rate_without = failed_without / len(without) if without else 0.0
    return {
        "feature": f,
        "score": round(fail_with / len(with_f) - rate_without, 3),
        "failed": fail_with,
        "accepted": len(with_f),
        "failed_without": failed_without,
        "accepted_without": len(without),
    }


def suspects(results: list[Result], threshold: float = 0.5) -> list[dict[str, Any]]:
    """Features whose cases fail far more often than the cases without them: the likely culprits.

    ``score = fail rate with the feature - fail rate without it`` over accepted cases; features
    scoring at least ``threshold`` are returned, best first. When a row's failures all have one
    dtype, the same score within that dtype's cases is used if higher (the entry then has
    ``dtype``): a bug of one dtype's path (bfloat16 with large logits) stands out there.
    """
    accepted = [r for r in results if r.status in ("pass", "FAIL")]
    if not any(r.status == "FAIL" for r in accepted):
        return []
    found = []
    for f in FEATURE_ROWS:
        best = _score(accepted, f)
        if best is None:
            continue
        failing_dtypes = {r.dtype for r in accepted if r.status == "FAIL" and f in r.failed_features()}
        if len(failing_dtypes) == 1 and len({r.dtype for r in accepted if f in r.features}) > 1:
            (dt,) = failing_dtypes
            cell = _score([r for r in accepted if r.dtype == dt], f)
            if cell is not None and cell["score"] > best["score"]:
                best = {**cell, "dtype": dt}
        if best["score"] >= threshold:
            found.append(best)
    return sorted(found, key=lambda d: -d["score"])


def suspect_text(s: dict[str, Any]) -> str:
    where = f" {s['dtype']}" if s.get("dtype") else ""
    return (
        f"{s['feature']}{f' ({where.strip()})' if where else ''}: {s['failed']}/{s['accepted']} accepted"
        f"{where} cases with it fail, {s['failed_without']}/{s['accepted_without']} without it"
    )


def attribution(report: dict[str, Any]) -> list[str]:
    """The "most likely broken" block, printed whenever a case failed: the suspects, or when no
    row reaches the threshold, the failing rows (most failures first)."""
    if not report["failures"]:
        return []
    head = "Most likely broken (fail rate with the feature minus without it):"
    if report.get("suspects"):
        return [head, *(f"- {suspect_text(x)}" for x in report["suspects"])]
    rows = []
    for f in report["features"]:
        failing = {d: c["failed"] for d, c in report["matrix"][f].items() if c["status"] == "FAIL"}
        if failing:
            rows.append((sum(failing.values()), f, failing))
    rows.sort(key=lambda x: -x[0])
    listed = "; ".join(f"{f} ({', '.join(f'{d} {n}' for d, n in by.items())})" for _, f, by in rows)
    return [head, f"- no single row stands out; failing rows: {listed or 'none (see the failures)'}"]


def cell_text(cell: dict[str, Any], short: bool = False) -> str:
    s = cell["status"]
    if s == "FAIL":
        return f"FAIL ({cell['failed']})"
    if s == "pass":
        return "pass" + (f" ({cell['declined']} declined)" if cell["declined"] and not short else "")
    if s == "declined":
        reason = cell["reason"]
        if short and len(reason) > 48:
            reason = reason[:45] + "..."
        return f"declined ({reason})"
    return "-"


def device_description(framework: str, device: str) -> str:
    """A human description of where the run happened (CPU model or GPU name)."""
    if device.startswith("cuda"):
        try:
            import torch

            return f"GPU: {torch.cuda.get_device_name(0)}"
        except Exception:
            return "GPU (cuda)"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU: {model}, {os.cpu_count()} logical cores"


def _version_of(backend: Any) -> str | None:
    """What the backend runs on (e.g. ``cpu-emulation (torch 2.13)``), as ``attnhub info`` shows it."""
    try:
        return backend.version()
    except Exception as exc:  # a report must not fail on a version probe
        return f"version() raised {type(exc).__name__}"


def declined_reasons(results: list[Result]) -> dict[str, int]:
    """How many cases were declined for each reason (a case's first reason), most frequent first."""
    counts = Counter((r.reasons[0] if r.reasons else "declined") for r in results if r.status == "declined")
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def failures(results: list[Result]) -> list[dict[str, Any]]:
    """Every failing case in full (id, dtype, features, check, message, request, repro)."""
    return [dataclasses.asdict(r) for r in results if r.status == "FAIL"]


def build_report(payload: dict[str, Any], elapsed_s: float, command: str) -> dict[str, Any]:
    """The JSON report: run metadata, a summary, the matrix and the failing cases in full."""
    import attnhub
    from attnhub.registry import REGISTRY

    results = results_from(payload)
    b = REGISTRY.backends()[payload["backend"]]
    failed = [r for r in results if r.status == "FAIL"]
    summary = Counter(r.status for r in results)
    return {
        "schema": SCHEMA,
        "backend": payload["backend"],
        "backend_info": {
            "priority": b.priority,
            "frameworks": list(b.frameworks),
            "device_types": list(b.device_types),
            "dtypes": list(b.dtypes),
            "features": sorted(b.features),
            "max_head_dim": b.max_head_dim,
            "version": _version_of(b),
        },
        "mode": payload["mode"],
        "seed": payload["seed"],
        "framework": payload["framework"],
        "frameworks_run": payload.get("frameworks_run", [payload["framework"]]),
        "frameworks_not_run": payload.get("frameworks_not_run", {}),
        "device": payload["device"],
        "device_description": device_description(payload["framework"], payload["device"]),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "attnhub_version": attnhub.__version__,
        "python": sys.version.split()[0],
        "command": command,
        "elapsed_s": round(elapsed_s, 1),
        "random_examples": payload.get("random_examples", 0),
        "summary": {
            "cases": len(results),
            "passed": summary.get("pass", 0),
            "failed": summary.get("FAIL", 0),
            "declined": summary.get("declined", 0),
            "certified": not failed and summary.get("pass", 0) > 0,
        },
        "features": list(FEATURE_ROWS),
        "dtypes": list(DTYPES),
        "matrix": aggregate(results),
        "suspects": suspects(results),
        "declined_reasons": declined_reasons(results),
        "failures": failures(results),
    }


def verdict(report: dict[str, Any]) -> str:
    s = report["summary"]
    if s["failed"]:
        return f"FAILED: {s['failed']} accepted case(s) fail"
    if not s["passed"]:
        return "certifies nothing: every case was declined"
    return "certified"


def markdown(report: dict[str, Any], heading: str = "#") -> str:
    """The report as Markdown: metadata, the support matrix, and each failure with its command."""
    s = report["summary"]
    lines = [
        f"{heading} attnhub certify {report['backend']} ({report['mode']} mode): {verdict(report)}",
        "",
        f"- device: {report['device_description']} (inputs: {report['framework']} on {report['device']})",
        f"- backend runs on: {report['backend_info'].get('version') or 'unknown'}",
        f"- {frameworks_text(report)}",
        f"- date: {report['date']}; attnhub {report['attnhub_version']}; Python {report['python']}",
        f"- command: `{report['command']}` (seed {report['seed']}, {report['elapsed_s']} s)",
        f"- cases: {s['cases']} ({s['passed']} pass, {s['failed']} FAIL, {s['declined']} declined)"
        + (f", including {report['random_examples']} randomised" if report.get("random_examples") else ""),
        "",
        matrix_table(report),
    ]
    if report["failures"]:
        head, *items = attribution(report)
        lines += ["", head, "", *items]
        lines += ["", f"{heading}# Failures", ""]
        for f in report["failures"]:
            lines.append(f"- `{f['id']}`: {f['message']}  \n  reproduce: `{f['repro']}`")
    return "\n".join(lines) + "\n"


def frameworks_text(report: dict[str, Any]) -> str:
    """Which of the backend's declared frameworks were certified, and which were not (and why)."""
    run = report.get("frameworks_run") or [report["framework"]]
    text = f"frameworks run: {', '.join(run)}"
    not_run = report.get("frameworks_not_run") or {}
    if not_run:
        text += "; NOT run: " + "; ".join(f"{fw} ({why})" for fw, why in not_run.items())
    return text


def matrix_table(report: dict[str, Any]) -> str:
    dtypes = report["dtypes"]
    rows = ["| feature | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
    for f in report["features"]:
        cells = [cell_text(report["matrix"][f][d]) for d in dtypes]
        rows.append(f"| {f} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def rich_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"attnhub certify {report['backend']} ({report['mode']}): {verdict(report)}")
    t.add_column("feature")
    for d in report["dtypes"]:
        t.add_column(d)
    style = {"FAIL": "bold red", "pass": "green", "declined": "yellow", "untested": "dim"}
    for f in report["features"]:
        cells = []
        for d in report["dtypes"]:
            c = report["matrix"][f][d]
            cells.append(f"[{style[c['status']]}]{_escape(cell_text(c, short=True))}[/]")
        t.add_row(f, *cells)
    return t


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
