"""tools/dev keeps living probes only, each named for what it measures (the brief's rule): no
per-session round scripts or session probes (git keeps those; docs/gpu-runs.md keeps results), and
nothing shipped imports from it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SESSION_NAMES = re.compile(r"^(s\d+_round\d+|round\d+|s\d+_final|final_round|probe_s\d+|\w+_round)\.(sh|py)$")
SHIPPED = ("attnhub", "attnhub_backends", "attnhub_conformance")


def test_no_session_scripts_in_tools_dev():
    found = sorted(p.name for p in (ROOT / "tools" / "dev").iterdir() if SESSION_NAMES.match(p.name))
    assert found == [], f"per-session scripts in tools/dev (name them for the question they answer): {found}"


def test_the_session_name_rule_matches_what_it_forbids():
    assert all(
        SESSION_NAMES.match(n) for n in ("s4_round10.sh", "round7.sh", "probe_s5.py", "final_round.sh")
    )
    assert not any(SESSION_NAMES.match(n) for n in ("host_path_bench.py", "first_use_choice.py", "device.sh"))


def test_shipped_code_imports_nothing_from_tools():
    pattern = re.compile(r"^\s*(from|import)\s+tools\b", re.M)
    offenders = [
        str(p.relative_to(ROOT))
        for root in SHIPPED
        for p in (ROOT / root).rglob("*.py")
        if pattern.search(p.read_text(encoding="utf-8"))
    ]
    assert offenders == []
