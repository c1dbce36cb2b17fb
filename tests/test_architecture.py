"""The architecture, checked: module and function sizes, import directions, no import circles.

Read with ``ast`` (nothing is imported): every ``.py`` under ``cachebuild/`` and
``loaders/``. The rules (README "Development", docs/DECISIONS.md "The house"):

* no module over 400 lines, no function (or method) over 60 lines;
* nothing in ``cachebuild`` imports ``loaders``, except the CLI (``cachebuild/cli/``,
  which imports it lazily inside ``cachebuild bench``);
* ``loaders`` imports of cachebuild only the format, its errors and checks (never the
  builder or a generator; ``tests/test_loader_import_boundary.py`` checks what importing runs);
* no import circle among the modules of the two packages: neither through
  module-level imports nor through imports inside functions, except the few
  run-time edges named in :data:`KNOWN_LAZY_EDGES` with the reason each is there.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cachebuild", "loaders")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

KNOWN_LAZY_EDGES: dict[tuple[str, str], str] = {}
"""(importer, imported) edges of imports inside functions that close a circle, allowed for now."""


@lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the two packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


@lru_cache(maxsize=None)
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:``: imports for annotations only, never run (no circle at run time)."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imported(name: str, path: Path, top_level_only: bool) -> set[str]:
    """Modules of the two packages that module ``name`` imports (``from a import b`` -> ``a.b`` when that is a module)."""
    mods = modules()
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    typing_only = {id(n) for node in ast.walk(tree(path)) if _is_type_checking(node) for n in ast.walk(node)}
    nodes = [n for n in (tree(path).body if top_level_only else ast.walk(tree(path))) if id(n) not in typing_only]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                found.add(full if full in mods else base)
    return {m for m in found if m in mods and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_checker_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_size(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{modules()[name].relative_to(REPO)}: {lines} lines > {MAX_MODULE_LINES}: split it"


def test_function_sizes():
    long = []
    for name, path in modules().items():
        for node in ast.walk(tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_cachebuild_never_imports_loaders_outside_the_cli():
    wrong = [
        f"{name} imports {dep}"
        for name, path in modules().items()
        if name.startswith("cachebuild") and not name.startswith("cachebuild.cli")
        for dep in imported(name, path, top_level_only=False)
        if dep.split(".")[0] == "loaders"
    ]
    assert not wrong, "the builder must not depend on the loader:\n" + "\n".join(wrong)


LOADER_MAY_IMPORT = ("cachebuild.format", "cachebuild.errors", "cachebuild.checks", "cachebuild._version")
"""What of cachebuild the loader may import (DESIGN: the loader reads the manifest, never the generator's code)."""

LOADER_KNOWN_IMPORTS = {("loaders.mel_eval", "cachebuild.mel.voting"): "the deprecated alias of the mel voting, which moved there"}


def test_the_loader_imports_only_the_format_of_cachebuild():
    wrong = [
        f"{name} imports {dep}"
        for name, path in modules().items()
        if name.startswith("loaders")
        for dep in imported(name, path, top_level_only=False)
        if dep.split(".")[0] == "cachebuild" and not dep.startswith(LOADER_MAY_IMPORT) and (name, dep) not in LOADER_KNOWN_IMPORTS
    ]
    assert not wrong, "the loader must not depend on the builder or the generators:\n" + "\n".join(wrong)


def test_the_cli_imports_loaders_only_inside_commands():
    wrong = [
        f"{name} imports {dep} at module level"
        for name, path in modules().items()
        if name.startswith("cachebuild.cli")
        for dep in imported(name, path, top_level_only=True)
        if dep.split(".")[0] == "loaders"
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_circle_at_module_level():
    graph = {m: imported(m, p, top_level_only=True) for m, p in modules().items()}
    assert cycles(graph) == []


def test_no_import_circle_through_imports_in_functions():
    graph = {m: imported(m, p, top_level_only=False) for m, p in modules().items()}
    for a, b in KNOWN_LAZY_EDGES:
        assert b in graph[a], f"known edge {a} -> {b} is gone: drop it from KNOWN_LAZY_EDGES"
        graph[a].discard(b)
    assert cycles(graph) == []


def test_no_import_circle_inside_the_format_even_through_functions():
    fmt = {m: {d for d in imported(m, p, top_level_only=False) if d.startswith("cachebuild.format")} for m, p in modules().items() if m.startswith("cachebuild.format")}
    assert cycles(fmt) == []


def test_the_reading_side_never_imports_the_writer():
    mods = modules()
    readers = [m for m in mods if m.startswith(("loaders", "cachebuild.tools"))]
    readers += [f"cachebuild.format.{n}" for n in ("reader", "decode", "records", "index_check", "limits", "manifest", "names")]
    wrong = sorted(m for m in readers if m in mods and "cachebuild.format.shard_writer" in imported(m, mods[m], top_level_only=False))
    assert not wrong


def test_only_the_format_reader_maps_shards():
    mapping = sorted(m for m, p in modules().items() if any(isinstance(n, ast.Attribute) and n.attr == "mmap" for n in ast.walk(tree(p))))
    assert mapping == ["cachebuild.format.reader"]
