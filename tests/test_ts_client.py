"""The TypeScript client (clients/typescript) is generated from the committed OpenAPI schema,
so that schema must be the API's: a route or a wire model changed without `make ts-client`
fails here (the Node tests, `make test-ts`, check the generated types against the schema)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from memory_service.config import Settings
from memory_service.http.app import create_app

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "clients" / "typescript" / "openapi.json"


def test_the_committed_schema_is_the_apis():
    """scripts/openapi-schema --check: the file is what create_app().openapi() makes now."""
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "openapi-schema"), "--check"],
                           capture_output=True, text=True, cwd=REPO)
    assert check.returncode == 0, check.stderr


def test_the_routes_that_differ_are_named():
    """The same comparison in process, saying which paths changed (what to look at before
    regenerating)."""
    committed = json.loads(SCHEMA.read_text())
    live = create_app(Settings(_env_file=None)).openapi()  # type: ignore[call-arg]
    changed = sorted(path for path in committed["paths"].keys() | live["paths"].keys()
                     if committed["paths"].get(path) != live["paths"].get(path))
    assert changed == [], f"run `make ts-client`: these paths changed: {changed}"
    assert committed == live, "run `make ts-client`: the wire models changed"


def test_every_operation_has_a_readable_id():
    """The client's method names come from the operationIds: snake_case handler names."""
    ids = [op["operationId"] for methods in json.loads(SCHEMA.read_text())["paths"].values() for op in methods.values()]
    assert len(ids) == len(set(ids)) and all(i.isidentifier() and i.islower() for i in ids), ids
