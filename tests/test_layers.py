"""The import graph of the product packages points only down (`docs/architecture` in
STYLE terms: `infra -> handlers, scheduler -> core`), and has no cycle.

Parsed with `ast`, not imported, so a module that is imported lazily inside a function
counts too: a late import is still an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "handlers", "scheduler", "infra")
# (importer's package, imported package): arrows that must never exist.
FORBIDDEN = {
    ("core", "handlers"), ("core", "scheduler"), ("core", "infra"),
    ("handlers", "scheduler"), ("scheduler", "handlers"),
    ("handlers", "infra"), ("scheduler", "infra"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path
            for package in PACKAGES for path in (ROOT / package).rglob("*.py")
            if "migrations" not in path.parts}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The product modules `name` imports (a `from package import module` names the
    module when there is one, else the package)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _top(name: str) -> str:
    return name.split(".")[0]


def test_no_import_points_up_or_across() -> None:
    arrows = sorted(f"{importer} -> {imported}" for importer, targets in _graph().items()
                    for imported in targets if (_top(importer), _top(imported)) in FORBIDDEN)
    assert arrows == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that starts and ends at the same module, or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph[start])))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return path[path.index(child):] + [child]
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
                on_path.add(child)
    return None


def test_import_graph_has_no_cycle() -> None:
    assert _cycle(_graph()) is None


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
])
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]],
                                       expected: list[str] | None) -> None:
    assert _cycle(graph) == expected
