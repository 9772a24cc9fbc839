"""attnhub/ imports one way (docs/architecture.md): no two of its modules import each other in a
circle, counting the imports inside functions too (they hide circles, they do not remove them), and
the contract and the dispatcher stay below the glue and the tuner."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "attnhub"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` names: itself, else its nearest enclosing package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the attnhub modules it imports anywhere in its body (``from attnhub import x``
    counts as importing ``attnhub.x`` where that is a module, else the package)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                if t.split(".")[0] == "attnhub":
                    found = _resolve(t, modules)
                    if found and found != mod:
                        graph[mod].add(found)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_core():
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_contract_and_the_dispatcher_import_no_glue_tuner_or_entry_point():
    graph = import_graph()
    above = {
        "attnhub.glue",
        "attnhub.tuner",
        "attnhub.first_use",
        "attnhub.api",
        "attnhub.plan",
        "attnhub.bench",
    }
    for low in (
        "attnhub.backend",
        "attnhub.dispatch",
        "attnhub.registry",
        "attnhub.errors",
        "attnhub.request",
    ):
        reached = {m for m in graph[low] if any(m == a or m.startswith(a + ".") for a in above)}
        assert reached == set(), f"{low} imports {reached}"
