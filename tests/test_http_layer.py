"""Routes never reach past the facade: the HTTP layer (and the MCP server) call
MemoryService's methods, never its parts, and never write the audit log themselves.

A route parses its input, authorizes the caller and calls one method of the facade
(memory_service/service.py), which writes the audit entry of the change it makes. This reads
every module of memory_service/http/ and memory_service/mcp/ and fails on

* an attribute of the service that is one of its parts (``service.keys``, ``.audit``,
  ``.agents``, ``.tools``, ``.state``, ...: every attribute MemoryService.__init__ sets but
  ``settings``), however the route got the service (``service``, ``request.app.state.service``,
  a helper returning a MemoryService, a parameter typed ``ServiceDep``);
* a call of ``audit.append`` or ``audit.append_each``, whatever holds the log.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("memory_service/http", "memory_service/mcp")
SERVICE_TYPES = ("MemoryService", "ServiceDep")
ALLOWED = {"settings"}  # configuration, read only: not a part


def parts() -> set[str]:
    """The attributes MemoryService.__init__ sets on ``self``: its parts (and settings)."""
    tree = ast.parse((ROOT / "memory_service" / "service.py").read_text())
    init = next(node for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    return {target.attr for node in ast.walk(init) if isinstance(node, ast.Assign) for target in node.targets
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"}


def _typed_as_service(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(name in ast.unparse(annotation) for name in SERVICE_TYPES)


def past_the_facade(source: str, filename: str = "<source>", forbidden: set[str] | None = None) -> list[str]:
    """Each place in ``source`` that reaches a part of the service or appends to the audit log."""
    forbidden = (parts() if forbidden is None else forbidden) - ALLOWED
    tree = ast.parse(source, filename)
    # What holds the service: names bound to it and helpers that return it.
    names = {"service"}
    helpers = {"get_service"}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if _typed_as_service(node.returns):
                helpers.add(node.name)
            every = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            names |= {arg.arg for arg in every if _typed_as_service(arg.annotation)}

    def is_service(node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.Attribute):
            return node.attr == "service"  # app.state.service, request.app.state.service
        if isinstance(node, ast.Call):
            func = node.func
            return (isinstance(func, ast.Name) and func.id in helpers) or \
                (isinstance(func, ast.Attribute) and func.attr in helpers)
        return False

    changed = True
    while changed:  # names assigned from the service hold it too (``svc = request.app.state.service``)
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and is_service(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id not in names:
                        names.add(target.id)
                        changed = True

    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in forbidden and is_service(node.value):
            found.add((node.lineno, f"{ast.unparse(node)} reaches past the facade"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("append", "append_each"):
            holder = node.func.value
            holder_name = holder.id if isinstance(holder, ast.Name) else getattr(holder, "attr", "")
            if "audit" in holder_name:
                found.add((node.lineno, f"{ast.unparse(node.func)}() writes the audit log"))
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


def test_the_service_has_the_parts_the_check_names():
    assert {"keys", "audit", "agents", "tools", "state", "registry", "sessions", "eraser"} <= parts()


def test_no_route_reaches_past_the_facade():
    found = [problem for folder in CHECKED for path in sorted((ROOT / folder).rglob("*.py"))
             for problem in past_the_facade(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


def test_the_check_sees_a_route_reaching_past_the_facade():
    """The check itself can fail: each way the routes once reached the parts is caught."""
    source = '''
def svc(request) -> MemoryService:
    return request.app.state.service

async def create_key(body, request, principal):
    created = await request.app.state.service.keys.create(body)
    service = request.app.state.service
    await service.audit.append_each(principal.key_id, "key.create", body.agents)

async def put_agent(agent_id, body, request, principal):
    before, agent = await svc(request).agents.replace_agent(agent_id, body)
    log = svc(request).audit
    await log.append(principal.key_id, "agent.put")

async def get_metrics(facade: ServiceDep, request):
    held = facade
    await held.state.metrics()
    request.app.state.access_mode  # the app's state, not the service's
    facade.settings.api_auth  # configuration: allowed
    await facade.put_agent("a", body, actor="k")  # a facade method: allowed
'''
    assert [line.split(": ", 1)[1] for line in past_the_facade(source)] == [
        "request.app.state.service.keys reaches past the facade",
        "service.audit reaches past the facade",
        "service.audit.append_each() writes the audit log",
        "svc(request).agents reaches past the facade",
        "svc(request).audit reaches past the facade",
        "held.state reaches past the facade",
    ]
