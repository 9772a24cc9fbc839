"""Kernel signatures stay short (issue 38): no ``@triton.jit`` function under attnhub_backends/ takes
more than ``MAX_PARAMS`` parameters, and no CUDA ``__global__`` kernel either.

Long signatures are where arguments get swapped unnoticed (a positional launch of 80 arguments
checks nothing but their count) and where every launch pays Triton's per-argument binding. The
Triton kernels pass each tensor's strides as one tuple and their compile-time switches as a few
named tuples (``attnhub_backends/triton/args.py``). Parsed with ``ast`` and a regular expression:
nothing is imported, so the check runs without triton or a CUDA toolkit.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "attnhub_backends"
MAX_PARAMS = 40


def _is_triton_jit(decorator: ast.expr) -> bool:
    """``@triton.jit``, ``@triton.jit(...)``, ``@jit`` or ``@jit(...)`` (any module alias ending in jit)."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute):
        return target.attr == "jit" and isinstance(target.value, ast.Name) and "triton" in target.value.id
    return isinstance(target, ast.Name) and target.id == "jit"


def _param_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    return (
        len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    )


def triton_signatures(root: Path = ROOT) -> list[tuple[str, int, str, int]]:
    """(file, line, name, parameter count) of every triton-jitted function under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                _is_triton_jit(d) for d in node.decorator_list
            ):
                found.append((str(path.relative_to(root.parent)), node.lineno, node.name, _param_count(node)))
    return found


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?[ \t]*(.*)$", re.M)
_GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


def _macros(texts: list[str]) -> dict[str, tuple[list[str] | None, str]]:
    """``#define NAME body`` and ``#define NAME(a, b) body`` macros (continuation lines joined) as
    (parameter names or None, body). A macro defined more than once (under ``#if`` branches) keeps
    its longest body: the count is then the largest any build sees."""
    out: dict[str, tuple[list[str] | None, str]] = {}
    for text in texts:
        for m in _DEFINE.finditer(text.replace("\\\n", " ")):
            args = [a.strip() for a in m.group(2)[1:-1].split(",")] if m.group(2) else None
            body = m.group(3).strip()
            if m.group(1) not in out or len(body) > len(out[m.group(1)][1]):
                out[m.group(1)] = (args, body)
    return out


def _expand(text: str, macros: dict[str, tuple[list[str] | None, str]]) -> str:
    """``text`` with its macros expanded, a few levels deep (``##`` pastes tokens)."""

    def one(m: re.Match) -> str:
        name, call = m.group(1), m.group(2)
        if name not in macros:
            return m.group(0)
        params, body = macros[name]
        if params is None:
            return body + (call or "")
        if call is None:
            return m.group(0)
        values = [v.strip() for v in call[1:-1].split(",")]
        for p, v in zip(params, values, strict=False):
            body = re.sub(rf"\b{p}\b", v, body)
        return body.replace(" ## ", "").replace("##", "")

    for _ in range(8):
        new = re.sub(r"\b(\w+)\b(\([^()]*\))?", one, text)
        if new == text:
            break
        text = new
    return text


def _split_top(params: str) -> list[str]:
    """Comma-separated parameters at nesting depth 0 (template arguments and calls kept whole)."""
    parts, depth, cur = [], 0, []
    for ch in params:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (x.strip() for x in parts) if p and p != "void"]


def cuda_signatures(root: Path = ROOT) -> list[tuple[str, int, str, int]]:
    """(file, line, name, parameter count) of every ``__global__`` kernel in the CUDA sources,
    object-like macros in its parameter list expanded (a macro defined empty adds nothing)."""
    sources = sorted([*root.rglob("*.cu"), *root.rglob("*.cuh")])
    texts = {p: p.read_text(encoding="utf-8") for p in sources}
    macros = _macros(list(texts.values()))
    found = []
    for path, text in texts.items():
        for m in _GLOBAL.finditer(text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            params = _split_top(_expand(text[m.end() : i - 1], macros))
            line = text.count("\n", 0, m.start()) + 1
            found.append((str(path.relative_to(root.parent)), line, m.group(1), len(params)))
    return found


def _offenders(found: list[tuple[str, int, str, int]]) -> list[str]:
    return [f"{f}:{line} {name}: {n} parameters" for f, line, name, n in found if n > MAX_PARAMS]


def test_the_parsers_find_the_kernels() -> None:
    """The scan sees the triton kernels (and their helpers) it is meant to bound."""
    names = {(Path(f).name, name) for f, _, name, _ in triton_signatures()}
    for kernel in ("fwd_kernel", "dkdv_kernel", "dq_kernel"):
        assert ("kernels.py", kernel) in names
        assert ("ragged_kernels.py", kernel) in names
    assert ("kernels.py", "_keep") in names  # helpers too


def test_parameter_count_of_a_sample() -> None:
    tree = ast.parse(
        "import triton\n@triton.jit(do_not_specialize=['n'])\ndef k(a, b, n, *rest, C: 'tl.constexpr' = 1):\n"
        "    pass\n@jit\ndef h(x):\n    pass\ndef plain(a, b, c):\n    pass\n"
    )
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [(f.name, _param_count(f), any(_is_triton_jit(d) for d in f.decorator_list)) for f in fns] == [
        ("k", 5, True),
        ("h", 1, True),
        ("plain", 3, False),
    ]
    macros = _macros(
        [
            "#define TWO int a, \\\n  int b\n#define NONE\n#define NONE , int c\n"
            "#define PAIR(t) int x##t, int y##t\n"
        ]
    )
    assert _split_top(_expand("TWO, const T* __restrict__ p NONE, Pair<int, int> q, PAIR(0)", macros)) == [
        "int a",
        "int b",
        "const T* __restrict__ p",
        "int c",
        "Pair<int, int> q",
        "int x0",
        "int y0",
    ]


def test_triton_kernels_take_at_most_40_parameters() -> None:
    bad = _offenders(triton_signatures())
    assert not bad, f"@triton.jit functions over {MAX_PARAMS} parameters:\n" + "\n".join(bad)


# The CUDA kernels' rule travels as 8 int64 parameters (MASK_PARAMS: two int32 fields each, see
# common.cuh), their modifiers as MOD_PARAMS; the macros are expanded before counting.
def test_cuda_kernels_take_at_most_40_parameters() -> None:
    found = cuda_signatures()
    if not found:
        return  # no CUDA sources in this checkout
    bad = _offenders(found)
    assert not bad, f"__global__ kernels over {MAX_PARAMS} parameters (macros expanded):\n" + "\n".join(bad)


def test_do_not_specialize_names_parameters() -> None:
    """Every name in a kernel's ``do_not_specialize`` is one of its parameters: Triton ignores a name
    it does not find (a length moved into a tuple argument would be specialised again, silently:
    Triton specialises every member of a tuple argument)."""
    pytest.importorskip("triton")
    from attnhub_backends.triton import loader

    checked = 0
    for filename in ("kernels.py", "ragged_kernels.py"):
        module = loader.load(filename, interpret=False)
        for name in dir(module):
            fn = getattr(module, name)
            names = getattr(fn, "do_not_specialize", None)
            if not names or not hasattr(fn, "arg_names"):
                continue
            missing = [n for n in names if not (isinstance(n, int) or n in fn.arg_names)]
            assert not missing, f"{filename}:{name} do_not_specialize names no parameter {missing}"
            checked += 1
    assert checked >= 6
