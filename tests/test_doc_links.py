"""Every relative link in the repository's Markdown resolves, and nothing points outside the repository.

A reader who clones the repository gets only what is in it: a link to a missing file, or to a path
above the repository root (such as the spec in a ``shared`` directory beside it), leaves them with
nothing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".venv", ".git", "build", "node_modules", ".pytest_cache", ".ruff_cache", "__pycache__"}
OUTSIDE = "../" + "shared/"  # spelled in two parts so that this file does not match itself

# [text](target) and ![alt](target), target up to the first space or closing parenthesis
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target (reference-style definitions)
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
FENCE = re.compile(r"^\s*(```|~~~).*?^\s*\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def files(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Files under ``root`` ending in one of ``suffixes``, outside hidden folders (virtualenvs, VCS, local scratch) and build output."""
    found = []
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
        )
        found += [Path(top) / n for n in names if n.endswith(suffixes)]
    return sorted(found)


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code blocks and code spans."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE.findall(text) + REFERENCE.findall(text)


def broken_links(root: Path) -> list[str]:
    """``file: target`` for every relative link of a ``*.md`` under ``root`` that resolves to nothing."""
    bad = []
    for md in files(root, (".md",)):
        for target in links(md.read_text(encoding="utf-8")):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                continue  # http(s), mailto, ... and anchors within the page
            path = target.split("#", 1)[0].split("?", 1)[0]
            if not path:
                continue
            resolved = (root / path.lstrip("/")) if path.startswith("/") else (md.parent / path)
            resolved = resolved.resolve()
            if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
                bad.append(f"{md.relative_to(root)}: {target}")
    return bad


def outside_references(root: Path) -> list[str]:
    """``file:line`` of every ``*.md`` or ``*.py`` line that references the ``shared`` directory above."""
    hits = []
    for f in files(root, (".md", ".py")):
        for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE in line:
                hits.append(f"{f.relative_to(root)}:{n}")
    return hits


def test_every_relative_markdown_link_resolves():
    assert broken_links(ROOT) == []


def test_nothing_references_the_shared_directory_outside_the_repository():
    assert outside_references(ROOT) == []


def test_the_spec_is_in_the_repository():
    assert (ROOT / "SPEC.md").is_file()
    assert "[SPEC.md](SPEC.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "page.md").write_text("# page\n")
    (tmp_path / "docs" / "sub" / "a.txt").write_text("a\n")
    return tmp_path


def test_the_checks_find_what_they_look_for(tree: Path):
    (tree / "README.md").write_text(
        "[ok](docs/page.md#section) [dir](docs/sub/) ![img](docs/sub/a.txt) [web](https://example.com/x.md)\n"
        "[mail](mailto:a@b.c) [here](#top) `[code](missing-in-span.md)`\n"
        "```\n[fenced](missing-in-fence.md)\n```\n"
        f"[gone](docs/missing.md) [out]({OUTSIDE}SPEC.md)\n"
        "[ref]: docs/also-missing.md\n"
    )
    (tree / "docs" / "page.md").write_text("[up](../README.md) [sibling](sub/a.txt) [bad](sub/b.txt)\n")
    (tree / ".venv").mkdir()
    (tree / ".venv" / "x.md").write_text("[ignored](nowhere.md)\n")
    (tree / "pkg.egg-info").mkdir()
    (tree / "pkg.egg-info" / "x.md").write_text("[ignored](nowhere.md)\n")
    assert broken_links(tree) == [
        "README.md: docs/missing.md",
        f"README.md: {OUTSIDE}SPEC.md",
        "README.md: docs/also-missing.md",
        "docs/page.md: sub/b.txt",
    ]
    (tree / "mod.py").write_text(f'"""See {OUTSIDE}SPEC.md."""\n')
    assert outside_references(tree) == ["README.md:6", "mod.py:1"]
