"""`memory-service mcp`: serve an agent's memory tools over MCP (memory_service/mcp/server.py)."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated, Literal

import typer

from memory_service.domain.errors import InvalidInput
from memory_service.domain.namespaces import validate_id


def mcp_command(
    agent: Annotated[str, typer.Option("--agent", help="The agent whose memories the tools reach")],
    api: Annotated[str, typer.Option("--api", help="The memory-service API, e.g. http://127.0.0.1:8080")] = "http://127.0.0.1:8080",
    key: Annotated[str | None, typer.Option("--key", envvar="MEMORY_SERVICE_API_KEY", show_envvar=True,
                                            help="API key the tools call with (over HTTP: only for requests that "
                                                 "carry no Authorization header of their own)")] = None,
    transport: Annotated[str, typer.Option("--transport", help="stdio (a host launches this process) or http "
                                                                "(streamable HTTP)")] = "stdio",
    host: Annotated[str, typer.Option(help="http: interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="http: port to listen on", min=1, max=65535)] = 8765,
    path: Annotated[str, typer.Option(help="http: the MCP endpoint's path")] = "/mcp",
    profile: Annotated[str, typer.Option("--profile", help=(
        "memory (the service's tools: memory_record, memory_context, memory_search, ...) or reference (the "
        "reference memory server's knowledge-graph tools: create_entities, read_graph, ...)"))] = "memory",
    namespace: Annotated[str | None, typer.Option("--namespace", help=(
        "reference profile: the namespace its graph lives in, 'user:<agent>:<user>', 'shard:<agent>:<shard>' "
        "or 'agent:<agent>' (the default)"))] = None,
) -> None:
    """Serve the memory tools (memory_record, memory_context, memory_search, memory_get,
    memory_write, ..., or with --profile reference the reference memory server's) over MCP,
    as a client of the HTTP API: its API key decides what they may do. See docs/mcp.md."""
    from memory_service.mcp.server import PROFILES, serve

    # stdout is the protocol's channel on stdio: every message goes to stderr.
    def fail(message: str) -> typer.Exit:
        print(f"memory-service mcp: {message}", file=sys.stderr)
        return typer.Exit(2)

    if transport not in ("stdio", "http"):
        raise fail(f"--transport must be stdio or http, not {transport!r}")
    try:
        validate_id(agent, "agent_id")
    except InvalidInput as exc:
        raise fail(str(exc)) from None
    if not api.startswith(("http://", "https://")):
        raise fail(f"--api must be an http:// or https:// URL, not {api!r}")
    if profile not in PROFILES:
        raise fail(f"--profile must be {' or '.join(PROFILES)}, not {profile!r}")
    chosen: Literal["stdio", "http"] = "http" if transport == "http" else "stdio"
    try:
        asyncio.run(serve(chosen, api, key or None, agent, host=host, port=port, path=path,
                          profile="reference" if profile == "reference" else "memory", namespace=namespace))
    except ValueError as exc:
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        pass
