"""`memory-service mcp`: the memory tools over MCP (stdio or streamable HTTP), with the
official SDK's MCPServer. It is a client of the HTTP API (memory_service.client): every
tool call is one API request under an API key, so access control, limits, the
MEMORY_WRITE_AGENTS switch and the audit log are the API's. One server serves one agent.

Two tool profiles: ``memory`` (the default, below: the session loop's record and context,
search and the memory and entity tools) and ``reference`` (reference.py: the official
reference memory server's nine knowledge-graph tools, mapped onto one namespace's graph),
for a host already configured for that server. Every tool carries its hints (hints.py) and
an output schema (the API's own models), so hosts get structured content.

Keys: over stdio, the key given at start (--key or MEMORY_SERVICE_API_KEY). Over HTTP, the
key of each MCP request's ``Authorization: Bearer <key>`` header is passed through, so each
caller acts with its own key; the key given at start only answers requests without one,
and is refused on a non-loopback address (anyone reaching the port would act with it).
See docs/mcp.md.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import AwareDatetime, Field

from memory_service import __version__
from memory_service.access.authorization import is_loopback
from memory_service.client import AsyncMemoryClient, CorrectionOut, DeletedMemory, MemoryRecord, WriteBlocksOut
from memory_service.domain.graph import EntityType
from memory_service.domain.limits import CONTEXT_BUDGET_CEILING, MAX_HOST_WINDOW
from memory_service.domain.models import ContextType, MemoryKind, Role
from memory_service.mcp import reference
from memory_service.mcp.calls import Api
from memory_service.mcp.hints import reads, writes
from memory_service.recall.render import MIN_BUDGET_CHARS
from memory_service.schemas.context import ContextOut
from memory_service.schemas.graph import ENTITY_ID_PATTERN, MAX_ENTITY_PAGE, MAX_FACT_PAGE, EntityDetailOut, EntityPage
from memory_service.schemas.lifecycle import ForgetReport
from memory_service.schemas.records import RecordOut
from memory_service.schemas.search import Scope, SearchResult

Transport = Literal["stdio", "http"]
Profile = Literal["memory", "reference"]
PROFILES: tuple[Profile, ...] = ("memory", "reference")

INSTRUCTIONS = (
    "Long-term memory of agent {agent}. memory_record records a message of a user's session (the conversation "
    "the memories are formed from); memory_context gives the XML memory block of a user's session for the "
    "model's next call (within a character budget); memory_search finds memories (each result explained, best first); "
    "memory_get reads one by id; memory_write, memory_update, memory_correct, memory_delete and memory_undelete curate "
    "them, when the operator has turned memory writes on for the agent. memory_update is for what changed (it was "
    "true until now); memory_correct for what was wrong (never true). A deleted memory can be undeleted until its "
    "purge date. "
    "memory_forget forgets what a user asks to be forgotten, with everything formed from it (undoable unless hard). "
    "entity_search lists the people, places and things the agent knows of; entity_get reads one with its facts "
    "(current ones, or those true at a time, or their history) and the entities they link it to; entity_write "
    "writes entities, observations about them and edges between them (with memory writes on)."
)

MemoryId = Annotated[str, Field(min_length=1, max_length=512, description="the memory's id, as search or write answered it")]
Clearable = Literal["title", "confidence", "tags", "expires_at"]  # the fields a memory may lack (content and kind it may not)
Tags = Annotated[list[str] | None, Field(description="labels; a search with tags finds memories carrying all of them")]


def build_server(client: AsyncMemoryClient, agent_id: str, *, pass_through_keys: bool, profile: Profile = "memory",
                 namespace: str | None = None) -> MCPServer:
    """The MCP server of ``agent_id``'s tools of ``profile``, calling the API through ``client``.

    ``pass_through_keys``: a request's own ``Authorization: Bearer`` key (HTTP) replaces the
    client's for that call. ``namespace``: where the reference profile's graph lives
    (default: the agent's own namespace).
    """
    api = Api(client, pass_through_keys=pass_through_keys)
    if profile == "reference":
        server = MCPServer("memory-service", version=__version__, log_level="WARNING",
                           instructions=reference.INSTRUCTIONS.format(agent=agent_id))
        reference.register(server, api, agent_id, namespace or f"agent:{agent_id}")
        return server
    server = MCPServer("memory-service", version=__version__, instructions=INSTRUCTIONS.format(agent=agent_id),
                       log_level="WARNING")  # stderr: each API request at INFO is noise to a host
    register(server, api, agent_id)
    return server


def register(server: MCPServer, api: Api, agent_id: str) -> None:
    """The memory profile's tools, on ``server``."""
    call = api.call

    @server.tool(annotations=writes("Record a message", destructive=False, idempotent=False))
    async def memory_record(
        ctx: Context,
        user_id: Annotated[str, Field(min_length=1, description="whose session (the user taking part)")],
        session_id: Annotated[str, Field(min_length=1, description="the conversation the message belongs to")],
        role: Annotated[Role, Field(description="who said it: user, assistant, tool or system")],
        content: Annotated[str, Field(min_length=1, description="the message's text, as said")],
        message_id: Annotated[str | None, Field(min_length=1, description=(
            "the message's own id: recording the same id again changes nothing (a safe retry); default: a new one, "
            "so the same call made twice records two messages"))] = None,
        created_at: Annotated[datetime | None, Field(description="when it was said (default: now)")] = None,
        incognito: Annotated[bool, Field(description="keep the session out of long-term memory: nothing is "
                                                     "formed from it")] = False,
    ) -> RecordOut:
        """Record one message of a user's session (POST /v1/sessions/{session}/messages): the conversation the
        agent's memories are formed from, when the session's gate opens. Answers its sequence and whether it
        was a duplicate."""
        return await call(lambda: api.client(ctx).record(
            session_id, agent_id=agent_id, user_id=user_id, role=role.value, content=content, message_id=message_id,
            created_at=created_at, incognito=incognito))

    @server.tool(annotations=reads("Search memories"))
    async def memory_search(
        ctx: Context,
        query: Annotated[str, Field(min_length=1, description="what to look for, in plain words")],
        scope: Annotated[Scope, Field(description="agent (everything), user, session, shard or namespaces")] = Scope.AGENT,
        user_id: Annotated[str | None, Field(description="scope=user: whose memories")] = None,
        session_id: Annotated[str | None, Field(description="scope=session: which session")] = None,
        shard_id: Annotated[str | None, Field(description="scope=shard: which shard")] = None,
        namespaces: Annotated[list[str] | None, Field(description="scope=namespaces: e.g. ['user:agent:alice']")] = None,
        top_k: Annotated[int, Field(ge=1, description="results to return")] = 10,
        min_score: Annotated[float | None, Field(ge=0, le=1, description="results below it come back as candidates")] = None,
        kinds: Annotated[list[MemoryKind] | None, Field(description="only these kinds (default: all)")] = None,
        tags: Tags = None,
        since: Annotated[datetime | None, Field(description="only memories at or after this time")] = None,
        until: Annotated[datetime | None, Field(description="only memories at or before this time")] = None,
        as_of: Annotated[datetime | None, Field(description="follow the facts true at this time (default: now)")] = None,
        include_superseded: Annotated[bool, Field(description="follow every fact, the ones no longer true too")] = False,
    ) -> SearchResult:
        """Search the agent's memories: full-text and vector signals fused, with recency; each result explained."""
        return await call(lambda: api.client(ctx).search(
            agent_id, query, scope=scope.value, user_id=user_id, session_id=session_id, shard_id=shard_id,
            namespaces=namespaces, top_k=top_k, min_score=min_score, kinds=[k.value for k in kinds] if kinds else None,
            tags=tags, since=since, until=until, as_of=as_of, include_superseded=include_superseded))

    @server.tool(annotations=reads("Memory block for the next model call"))
    async def memory_context(
        ctx: Context,
        user_id: Annotated[str, Field(min_length=1, description="whose session")],
        session_id: Annotated[str, Field(min_length=1, description="the session the model call belongs to")],
        query: Annotated[str | None, Field(description="what the model is asked now (default: the session's latest "
                                                       "user message); small talk searches nothing")] = None,
        budget: Annotated[int | None, Field(ge=MIN_BUDGET_CHARS, le=CONTEXT_BUDGET_CEILING,
                                            description="the block's size in characters (default: the server's)")] = None,
        host_window: Annotated[int | None, Field(ge=0, le=MAX_HOST_WINDOW, description=(
            "how many of the session's latest messages (any role) the host already sends the model: left out of "
            "the relevant memories (default: the agent's setting)"))] = None,
        context_type: Annotated[ContextType | None, Field(description="chat (the default), task or document: the "
                                                                      "agent's settings for it apply")] = None,
    ) -> ContextOut:
        """The memory block for the model's next call in a user's session (GET /v1/context): XML within the
        budget, with the memories most relevant to the query; also its size, sections and what was left out."""
        return await call(lambda: api.client(ctx).context(
            agent_id=agent_id, user_id=user_id, session_id=session_id, query=query, budget=budget,
            host_window=host_window, context_type=context_type.value if context_type else None))

    @server.tool(annotations=reads("Read a memory"))
    async def memory_get(ctx: Context, memory_id: MemoryId) -> MemoryRecord:
        """Read one memory by id: content, title, tags, confidence, dates and provenance."""
        return await call(lambda: api.client(ctx).memory_get(agent_id, memory_id))

    @server.tool(annotations=writes("Write a memory", destructive=False, idempotent=False))
    async def memory_write(
        ctx: Context,
        content: Annotated[str, Field(min_length=1, description="the memory, in one or a few sentences")],
        namespace: Annotated[str, Field(min_length=1, description="where it belongs, e.g. 'agent:<agent>' or 'user:<agent>:<user>'")],
        kind: Annotated[str, Field(min_length=1, description="e.g. fact, directive, suggestion, observation")],
        title: Annotated[str | None, Field(description="a short title")] = None,
        tags: Tags = None,
        confidence: Annotated[float | None, Field(ge=0, le=1, description="how sure, 0 to 1")] = None,
        idempotency_key: Annotated[str | None, Field(description="the same key writes one memory and answers "
                                                                 "it again (a safe retry)")] = None,
        expires_at: Annotated[AwareDatetime | None, Field(
            description="when it stops being true or useful (ISO 8601 with a time zone, in the future, e.g. "
                        "'2026-07-01T00:00:00Z'): from then on it is no longer recalled, and it is purged")] = None,
    ) -> MemoryRecord:
        """Write a new memory for the agent."""
        return await call(lambda: api.client(ctx).memory_write(agent_id, content=content, namespace=namespace, kind=kind,
                                                        title=title, tags=tags, confidence=confidence,
                                                        idempotency_key=idempotency_key, expires_at=expires_at))

    @server.tool(annotations=writes("Update a memory", destructive=True, idempotent=True))
    async def memory_update(
        ctx: Context,
        memory_id: MemoryId,
        content: Annotated[str | None, Field(min_length=1, description="new content")] = None,
        title: Annotated[str | None, Field(description="new title")] = None,
        tags: Tags = None,
        confidence: Annotated[float | None, Field(ge=0, le=1, description="new confidence, 0 to 1")] = None,
        kind: Annotated[str | None, Field(min_length=1, description="new kind")] = None,
        expires_at: Annotated[AwareDatetime | None, Field(
            description="a new expiry (ISO 8601 with a time zone, in the future)")] = None,
        clear: Annotated[list[Clearable] | None, Field(
            description="fields to remove from the memory: title, confidence, tags, expires_at (a field given a new "
                        "value cannot be cleared too)")] = None,
    ) -> MemoryRecord:
        """Change the fields given of one memory; the others stay (null or omitted: unchanged). To remove a
        title, confidence or tags, name them in `clear`. A deleted memory cannot be changed."""
        # Null means unchanged (a model often sends null for an option it does not use), so
        # clearing is said explicitly, by name.
        given: dict[str, Any] = {name: value for name, value in (("content", content), ("title", title), ("tags", tags),
                                 ("confidence", confidence), ("kind", kind), ("expires_at", expires_at))
                                 if value is not None}
        both = sorted(set(given) & set(clear or ()))
        if both:
            raise ToolError(f"clear: {', '.join(both)} {'is' if len(both) == 1 else 'are'} both given a new value "
                            "and cleared; do one or the other")
        given.update(dict.fromkeys(clear or (), None))
        return await call(lambda: api.client(ctx).memory_update(agent_id, memory_id, **given))

    @server.tool(annotations=writes("Correct a wrong memory", destructive=True, idempotent=False))
    async def memory_correct(
        ctx: Context,
        memory_id: MemoryId,
        content: Annotated[str, Field(min_length=1, description="the right content")],
    ) -> CorrectionOut:
        """Correct a memory that was wrong (never true; for one that changed since, use memory_update): a new
        memory with the right content replaces it in search and the memory block, the wrong one is kept as history
        only, and the knowledge-graph facts formed from it are closed as wrong."""
        return await call(lambda: api.client(ctx).memory_correct(agent_id, memory_id, content))

    @server.tool(annotations=writes("Delete a memory", destructive=True, idempotent=True))
    async def memory_delete(ctx: Context, memory_id: MemoryId) -> DeletedMemory:
        """Delete a memory: it leaves search at once and is purged at purge_at; undelete brings it back until then."""
        return await call(lambda: api.client(ctx).memory_delete(agent_id, memory_id))

    @server.tool(annotations=writes("Undelete a memory", destructive=False, idempotent=True))
    async def memory_undelete(ctx: Context, memory_id: MemoryId) -> MemoryRecord:
        """Bring back a deleted memory before its purge date."""
        return await call(lambda: api.client(ctx).memory_undelete(agent_id, memory_id))

    @server.tool(annotations=writes("Forget a memory and what was formed from it", destructive=True, idempotent=True))
    async def memory_forget(ctx: Context, memory_id: MemoryId,
                            hard: Annotated[bool, Field(description="gone for good (needs an admin key); default: "
                                                                    "undoable with memory_undelete")] = False) -> ForgetReport:
        """Forget a message or a memory when the user asks you to: it and everything formed from it (the
        conversation's summary re-formed without it, merged memories, graph facts) leave search and the memory
        block at once. Soft by default (memory_undelete brings it all back); hard deletes it for good."""
        return await call(lambda: api.client(ctx).memory_forget(agent_id, memory_id, mode="hard" if hard else "soft"))

    @server.tool(annotations=writes("Write to the knowledge graph", destructive=True, idempotent=True))
    async def entity_write(
        ctx: Context,
        items: Annotated[list[dict[str, Any]], Field(min_length=1, description=(
            "what to write, each with a kind: {kind: 'entity', name, type (person, place, organisation, object, "
            "event, topic), text (a description)}; {kind: 'observation', text, name (the entity it is about), tags, "
            "confidence}; {kind: 'edge', source, target, rel_type (e.g. lives_in, works_at), text}"))],
        namespace: Annotated[str, Field(min_length=1, description="where they live, e.g. 'user:<agent>:<user>' or "
                                                                 "'agent:<agent>' (not a session)")],
    ) -> WriteBlocksOut:
        """Write entities, observations about them and edges between them to the knowledge graph, resolved by
        name in the namespace (a new value of lives_in, works_at... replaces the current one). Writing the same
        items again stores nothing new."""
        block = f"<memory_write>{json.dumps({'items': items}, ensure_ascii=False)}</memory_write>"
        return await call(lambda: api.client(ctx).write_blocks(agent_id, block, namespace=namespace))

    @server.tool(annotations=reads("List entities"))
    async def entity_search(
        ctx: Context,
        name: Annotated[str | None, Field(min_length=1, max_length=200,
                                          description="entities whose name starts with this")] = None,
        type: Annotated[EntityType | None, Field(description="person, place, organisation, object, event or topic")] = None,  # noqa: A002
        user_id: Annotated[str | None, Field(description="only this user's entities")] = None,
        namespace: Annotated[str | None, Field(description="only this namespace's, e.g. 'shard:<agent>:<shard>'")] = None,
        limit: Annotated[int, Field(ge=1, le=MAX_ENTITY_PAGE, description="entities to return")] = 20,
        cursor: Annotated[str | None, Field(description="the `next` of the previous answer, for more")] = None,
    ) -> EntityPage:
        """List the entities (people, places, organisations, things, events, topics) the agent knows, by name."""
        return await call(lambda: api.client(ctx).list_entities(agent_id, namespace=namespace, user_id=user_id,
                                                         type=type.value if type else None, name=name, cursor=cursor,
                                                         limit=limit))

    @server.tool(annotations=reads("Read an entity"))
    async def entity_get(
        ctx: Context,
        entity_id: Annotated[str, Field(pattern=ENTITY_ID_PATTERN, description="the entity's id, as entity_search answered it")],
        as_of: Annotated[datetime | None, Field(description="the facts true at this time (default: now)")] = None,
        include_superseded: Annotated[bool, Field(description="every fact, the ones no longer true too")] = False,
        limit: Annotated[int, Field(ge=1, le=MAX_FACT_PAGE, description="facts to return")] = 20,
        cursor: Annotated[str | None, Field(description="the `next` of the previous answer, for more facts")] = None,
    ) -> EntityDetailOut:
        """Read one entity: a page of its facts (each with valid_at, invalid_at and what superseded it), its
        neighbours through them, and how many facts there are in all."""
        return await call(lambda: api.client(ctx).get_entity(agent_id, entity_id, as_of=as_of,
                                                      include_superseded=include_superseded, cursor=cursor,
                                                      limit=limit))


async def serve(transport: Transport, api_url: str, api_key: str | None, agent_id: str, *, host: str = "127.0.0.1",
                port: int = 8765, path: str = "/mcp", profile: Profile = "memory", namespace: str | None = None) -> None:
    """Serve the tools until stopped (stdio: until the client closes stdin)."""
    if namespace is not None:
        if profile != "reference":
            raise ValueError("--namespace is the reference profile's (--profile reference): the memory profile's "
                             "tools take their namespace, user or session per call")
        reference.check_namespace(namespace, agent_id)
    if transport == "http" and api_key and not is_loopback(host):
        raise ValueError(f"refusing to serve MCP over HTTP on {host} with a fixed API key: anyone reaching the port "
                         "would act with it. Drop --key (and MEMORY_SERVICE_API_KEY) so that each caller sends its own "
                         "key as 'Authorization: Bearer <key>', or listen on loopback")
    async with AsyncMemoryClient(api_url, api_key) as client:
        server = build_server(client, agent_id, pass_through_keys=transport == "http", profile=profile,
                              namespace=namespace)
        if transport == "stdio":
            await server.run_stdio_async()
            return
        import uvicorn

        # Stateless and JSON answers: each request stands alone, so replicas need no shared
        # MCP session state and a load balancer may send any request anywhere.
        app = server.streamable_http_app(streamable_http_path=path, stateless_http=True, json_response=True, host=host)
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()
