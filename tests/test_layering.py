"""Imports flow one way: backends/ and workers/ depend on the core, never the reverse.

Only the composition root (runtime, the CLI and the API) may import them, so the core can
be read, typed and tested without any store's driver.

And no module imports itself back through others (no import cycle) anywhere in
memory_service/, backends/ or workers/. Every import counts, wherever it is written: at the
top, inside a function (a deferred import still ties both modules: neither can be read,
moved or tested without the other; deferring only hides the cycle from Python), or under
``if TYPE_CHECKING:`` (the type checker and the reader follow it all the same).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memory_service", "backends", "workers")
COMPOSITION_ROOT = {"runtime.py", "cli.py", "api.py"}
OUTER_PACKAGES = ("backends", "workers")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_core_never_imports_backends_or_workers():
    offenders = {
        path.name: sorted(m for m in imported_modules(path) if m.split(".")[0] in OUTER_PACKAGES)
        for path in (ROOT / "memory_service").glob("*.py")
        if path.name not in COMPOSITION_ROOT
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_backends_do_not_import_workers_and_workers_do_not_import_backends():
    for package, other in (("backends", "workers"), ("workers", "backends")):
        for path in (ROOT / package).glob("*.py"):
            assert not [m for m in imported_modules(path) if m.split(".")[0] == other], path


def test_the_check_sees_an_import_of_a_backend(tmp_path):
    """The check itself can fail: a core module importing a backend is caught."""
    module = tmp_path / "bad.py"
    module.write_text("from backends.graph import GraphBackend\nimport workers.worker\n")
    assert imported_modules(module) >= {"backends.graph", "workers.worker"}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of PACKAGES -> the modules of PACKAGES it imports (read from the source)."""
    paths = {module_name(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")}

    def known(name: str) -> str | None:  # the module itself, or the package that holds the name
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {known(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                targets |= {known(f"{module}.{alias.name}") for alias in node.names}  # a submodule, or a name in module
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Each group of modules that import each other, as (the shortest cycle from its first
    module, the whole group sorted): ``([a, b, a], [a, b, c])``."""
    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    def shortest_cycle(start: str) -> list[str]:
        paths, queue = {start: [start]}, deque([start])
        while True:
            current = queue.popleft()
            for nxt in sorted(graph[current]):
                if nxt == start:
                    return [*paths[current], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[current], nxt]
                    queue.append(nxt)

    reach = {name: reachable(name) for name in graph}
    groups = {frozenset(m for m in reach[name] if name in reach[m]) for name in graph if name in reach[name]}
    return [(shortest_cycle(min(group)), sorted(group)) for group in sorted(groups, key=min)]


def describe(cycles: list[tuple[list[str], list[str]]]) -> str:
    return "import cycles:\n" + "\n".join(
        " -> ".join(cycle) + ("" if len(group) == len(cycle) - 1 else f" (the group: {', '.join(group)})")
        for cycle, group in cycles)


def test_no_import_cycle_in_the_service():
    cycles = import_cycles(import_graph())
    assert not cycles, describe(cycles)


def test_the_cycle_check_sees_every_kind_of_import(tmp_path):
    """The check itself can fail: a cycle through relative, deferred and TYPE_CHECKING imports
    is found and named, and a graph without one passes."""
    package = tmp_path / "memory_service"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..c import thing\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import memory_service.a\n")
    (package / "d.py").write_text("from memory_service import c\n")
    graph = import_graph(tmp_path)
    assert graph["memory_service.d"] == {"memory_service.c"}
    assert describe(import_cycles(graph)) == (
        "import cycles:\nmemory_service.a -> memory_service.sub.b -> memory_service.c -> memory_service.a")
    (package / "c.py").write_text("")
    assert import_cycles(import_graph(tmp_path)) == []
