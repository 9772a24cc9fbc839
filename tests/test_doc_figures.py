"""Certification tallies quoted in the docs are those of the reports in docs/reports/ (issue 36).

A tally ("N pass, N FAIL") must be written in the cited form
``[NAME.json](…/reports/NAME.json) (YYYY-MM-DD): N cases, N pass, N FAIL, N declined``, and its
figures and date must be those of that report: re-running a certification and committing its report
then fails this test until every quote of it is updated, so no figure goes stale silently.

Not checked: docs/reports/ itself, docs/support-matrix.md (generated from the reports by
attnhub_conformance/matrix.py) and docs/gpu-runs.md (a dated log of past runs, each figure true of its run).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.test_doc_links import ROOT, files

REPORTS = ROOT / "docs" / "reports"
NOT_CHECKED = {"docs/support-matrix.md", "docs/gpu-runs.md"}
#: Docs still quoting tallies in the old, uncited form; owned by another change of issue 36.
PENDING: set[str] = set()

TALLY = re.compile(r"\d+ pass(?:ed)?, \d+ FAIL")
CITED = re.compile(
    r"reports/([\w.-]+)\.json\) \((\d{4}-\d\d-\d\d)\): (\d+) cases, (\d+) pass, (\d+) FAIL, (\d+) declined"
)


def checked_docs() -> list[Path]:
    skipped = NOT_CHECKED | PENDING
    return [
        p
        for p in files(ROOT, (".md",))
        if not p.is_relative_to(REPORTS) and p.relative_to(ROOT).as_posix() not in skipped
    ]


def flat_text(path: Path) -> str:
    """The document with every run of white space as one space (a citation may wrap)."""
    return " ".join(path.read_text(encoding="utf-8").split())


@pytest.mark.parametrize("path", checked_docs(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_certification_tallies_cite_their_report_and_match_it(path):
    text = flat_text(path)
    cited_spans = []
    for m in CITED.finditer(text):
        name, date, *figures = m.groups()
        report_path = REPORTS / f"{name}.json"
        assert report_path.exists(), f"{path.name} cites {report_path.name}, which is not in docs/reports"
        report = json.loads(report_path.read_text(encoding="utf-8"))
        s = report["summary"]
        expected = [s["cases"], s["passed"], s["failed"], s["declined"]]
        assert [int(x) for x in figures] == expected, (
            f"{path.name}: {m.group(0)!r}; the report says {expected}"
        )
        assert date == report["date"][:10], f"{path.name}: {name}.json is dated {report['date']}, not {date}"
        cited_spans.append(m.span())
    for m in TALLY.finditer(text):
        assert any(a <= m.start() < b for a, b in cited_spans), (
            f"{path.name}: {text[max(0, m.start() - 80) : m.end() + 20]!r} quotes a certification tally "
            "without citing its report as [NAME.json](.../reports/NAME.json) (DATE): N cases, N pass, N FAIL, N declined"
        )


def test_the_check_catches_a_stale_and_an_uncited_tally(tmp_path):
    """The check itself: a figure that differs from the report, and a tally with no citation, fail."""
    good = "[cuda-h100-full.json](../reports/cuda-h100-full.json) (2026-11-24): 1438 cases, 1115 pass, 0 FAIL, 323 declined"
    stale = good.replace("1115 pass", "1027 pass")
    for text, ok in ((good, True), (stale, False), ("certified (982 pass, 0 FAIL, 120 declined)", False)):
        doc = tmp_path / "doc.md"
        doc.write_text(text, encoding="utf-8")
        try:
            test_certification_tallies_cite_their_report_and_match_it(doc)
            passed = True
        except AssertionError:
            passed = False
        assert passed == ok, text
