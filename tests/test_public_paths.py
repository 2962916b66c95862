"""The public paths the README and the docs promise keep working after the layout: the
settings, the data models (a re-export of memory_service.domain.models), the runtime, the
client and the `memory-service` entry point; and every `from memory_service... import ...`
the README's and docs' examples write names something that exists."""

from __future__ import annotations

import importlib
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMPORT = re.compile(r"^\s*from (memory_service[\w.]*) import ([\w, ]+)$", re.M)


def test_the_promised_modules_hold_the_promised_names():
    from memory_service.client import AsyncMemoryClient, MemoryClient
    from memory_service.config import Settings
    from memory_service.domain import models as domain_models
    from memory_service.models import MessageIn
    from memory_service.runtime import open_service

    assert MessageIn is domain_models.MessageIn  # the shim re-exports, it does not copy
    assert callable(open_service) and Settings and AsyncMemoryClient and MemoryClient


def test_the_entry_point_names_a_callable():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attribute = scripts["memory-service"].partition(":")
    assert callable(getattr(importlib.import_module(module), attribute))


def documented_imports() -> list[tuple[str, str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for module, names in IMPORT.findall(path.read_text()):
            found += [(str(path.relative_to(ROOT)), module, name.strip()) for name in names.split(",") if name.strip()]
    return found


def test_the_docs_show_imports():
    """The check below reads something: the README imports the client, getting started the
    data models."""
    assert ("README.md", "memory_service.client", "MemoryClient") in documented_imports()
    assert ("docs/getting-started.md", "memory_service.models", "MessageIn") in documented_imports()


@pytest.mark.parametrize(("doc", "module", "name"), documented_imports())
def test_every_documented_import_resolves(doc, module, name):
    imported = importlib.import_module(module)
    assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), f"{doc}: from {module} import {name}"
