"""Imports flow one way: backends/ and workers/ depend on the core, never the reverse.

Only the composition root (runtime, the CLI and the API) may import them, so the core can
be read, typed and tested without any store's driver.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
