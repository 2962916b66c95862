"""Imports run one way: down the layers of memory_service, never up, and never in a circle.

LAYERS lists the subpackages from the bottom up. A module may import its own package and any
package below it; an import of a package above is a violation, unless KNOWN_EXCEPTIONS lists
it (each one is a piece of untangling still to do, named by the import it makes). The client
sits just above the wire schemas, so the rule itself says it stands alone: it can import the
vocabulary and the schemas, and nothing of the server.

The backends' own modules (graph, graph_layout, mongo, mirror) are imported only by the
composition root (runtime, the CLI) and by the backends package: everything else speaks to
memory_service.backends.base, so the core can be read, typed and tested without a driver.

And no module imports itself back through others (no import cycle) anywhere in
memory_service/. Every import counts, wherever it is written: at the top, inside a function
(a deferred import still ties both modules: neither can be read, moved or tested without the
other; deferring only hides the cycle from Python), or under ``if TYPE_CHECKING:`` (the type
checker and the reader follow it all the same).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memory_service",)

# Bottom first. docs/architecture.md draws the same list.
LAYERS = (
    "domain",      # the vocabulary: ids, namespaces, models, errors, limits, text scoring
    "schemas",     # what goes over the wire
    "client",      # the typed HTTP client (vocabulary and schemas only)
    "integrations",  # the framework adapters: the client alone, nothing of the server
    "config",      # Settings
    "state",       # Redis: pools, counters, cursors
    "access",      # keys, principals, reach, audit, pseudonyms
    "events",      # change events: the stream, webhooks and their delivery
    "backends",    # the store interface, the registry, each store
    "embedding",
    "formation",   # windows -> memories
    "ingest",      # recording messages
    "recall",      # search and the memory block
    "curation",    # tools, write blocks, retention, erasure, import, migration
    "service",     # MemoryService, the facade
    "workers",     # the arq worker: jobs and cron schedules
    "runtime",     # wiring from Settings
    "http",        # the FastAPI app and its routers
    "mcp",
    "cli",
)
DRIVERS = {f"memory_service.backends.{name}" for name in ("graph", "graph_layout", "mongo", "mirror")}
COMPOSITION_ROOT = ("memory_service.runtime", "memory_service.cli", "memory_service.backends")

# Imports that still point up: each is removed by the commit that untangles it.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def layer_of(module: str) -> str:
    """The layer of a module of memory_service: its subpackage (or top-level module) under it;
    the package's own __init__ and the models shim belong to the vocabulary."""
    parts = module.split(".")
    return "domain" if len(parts) == 1 or parts[1] == "models" else parts[1]


def violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(module, target) for module, targets in graph.items() for target in targets
            if LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(module))}


def test_every_module_has_a_layer():
    assert {layer_of(module) for module in import_graph()} <= set(LAYERS)


def test_imports_run_down_the_layers():
    found = violations(import_graph())
    assert sorted(found - KNOWN_EXCEPTIONS) == [], "imports that point up a layer"
    assert sorted(KNOWN_EXCEPTIONS - found) == [], "untangled: remove these from KNOWN_EXCEPTIONS"


def test_only_the_composition_root_imports_a_store_driver():
    graph = import_graph()
    offenders = {module: sorted(targets & DRIVERS) for module, targets in graph.items()
                 if targets & DRIVERS and not module.startswith(COMPOSITION_ROOT)}
    assert offenders == {}


def test_the_layer_check_sees_an_import_that_points_up(tmp_path):
    """The check itself can fail: a vocabulary module importing the HTTP app, through a
    deferred relative import, is a violation."""
    package = tmp_path / "memory_service"
    for sub in ("domain", "http"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "http" / "app.py").write_text("from ..domain import text\n")
    (package / "domain" / "text.py").write_text("def f():\n    from ..http.app import create_app\n")
    assert violations(import_graph(tmp_path)) == {("memory_service.domain.text", "memory_service.http.app")}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of PACKAGES -> the modules of PACKAGES it imports (read from the source)."""
    paths = {module_name(p, root): p for package in PACKAGES for p in (root / package).rglob("*.py")
             if "_vendor" not in p.relative_to(root).parts}  # third-party code (memory_service/_vendor), not a layer

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
