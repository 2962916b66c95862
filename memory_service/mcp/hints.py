"""The MCP tool annotations (hints) of `memory-service mcp`'s tools, in one place so that
every tool of every profile says the same things the same way. A host reads them to decide
what needs the user's confirmation, so each says what its tool really does; docs/mcp.md
tabulates them.

openWorldHint is false on all of them: a tool reaches the agent's own memory in
memory-service, a closed domain, never the web or a third party.
"""

from __future__ import annotations

from mcp.types import ToolAnnotations


def reads(title: str) -> ToolAnnotations:
    """A tool that changes nothing the model could notice (the same call answers the same)."""
    return ToolAnnotations(title=title, read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                           open_world_hint=False)


def writes(title: str, *, destructive: bool, idempotent: bool) -> ToolAnnotations:
    """A tool that changes the memory: ``destructive`` when it may change or remove what is
    stored (not only add to it), ``idempotent`` when the same call again changes nothing more."""
    return ToolAnnotations(title=title, read_only_hint=False, destructive_hint=destructive, idempotent_hint=idempotent,
                           open_world_hint=False)
