"""The service's memory tools (docs/memory-tools.md) as plain async functions bound to one
conversation, for each adapter to wrap as its framework's tools.

Each framework builds a tool's schema from a function's signature and docstring, so the
functions are written once here, with Google-style docstrings all three read. They are bound
to the conversation's user: search looks in the user's memories (their directives and every
session of the agent they spoke in), a write lands in the user's namespace. A model never
names another user or a namespace. Each answers text for the model; a refusal of the service
(an unknown id, writes turned off, bad input) is answered as text saying so, for the model to
act on; an outage (the service unreachable) raises, for the framework to handle as it does
a failing tool.

No ``from __future__ import annotations`` here: LlamaIndex's FunctionTool cannot resolve a
tool function's annotations given as strings (``Literal`` is "not fully defined").
"""

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from memory_service.client import MemoryApiError, MemoryRecord
from memory_service.integrations._conversation import Conversation

WritableKind = Literal["observation", "fact", "directive", "suggestion"]
MAX_TOP_K = 50
ToolFunction = Callable[..., Awaitable[str]]


def refusal(exc: MemoryApiError) -> str:
    return f"memory-service refused ({exc.status} {type(exc).__name__}): {exc.detail}"


def describe(memory: MemoryRecord) -> str:
    """One memory as a model reads it: id, kind, date, title and tags, then the content."""
    extras = [f"title: {memory.title}"] if memory.title else []
    if memory.tags:
        extras.append("tags: " + ", ".join(memory.tags))
    if memory.deleted_at is not None:
        extras.append(f"deleted, purged at {memory.purge_at.isoformat() if memory.purge_at else 'never'}")
    if memory.corrected_by is not None:
        extras.append(f"wrong, corrected by [{memory.corrected_by}]")
    if memory.corrects is not None:
        extras.append(f"corrects [{memory.corrects}]")
    head = f"[{memory.id}] {memory.kind.value}, {memory.valid_at.date().isoformat()}"
    return f"{head} ({'; '.join(extras)}): {memory.content}" if extras else f"{head}: {memory.content}"


def memory_functions(conversation: Conversation, *, writes: bool = True) -> list[ToolFunction]:
    """memory_search and memory_get, and with ``writes`` memory_write, memory_update,
    memory_correct, memory_delete and memory_undelete (the service answers them only for an agent listed in
    its MEMORY_WRITE_AGENTS)."""
    client, agent_id = conversation.client, conversation.agent_id

    async def memory_search(query: str, top_k: int = 5) -> str:
        """Search what you remember about the user: their preferences and instructions, and what was said in their conversations.

        Args:
            query: what to look for, in plain words.
            top_k: how many memories to return, 1 to 50.
        """
        if not 1 <= top_k <= MAX_TOP_K:
            return f"top_k must be 1 to {MAX_TOP_K}, got {top_k}"
        try:
            found = await client.search(agent_id, query, scope="user", user_id=conversation.user_id, top_k=top_k)
        except MemoryApiError as exc:
            return refusal(exc)
        if not found.results:
            return f"No memory matches {query!r}."
        lines = [f"[{hit.id}] {hit.kind.value}, {hit.age}: {hit.content}" for hit in found.results]
        return "\n".join([f"{len(lines)} memories, best first:", *lines])

    async def memory_get(memory_id: str) -> str:
        """Read one memory in full by its id (as memory_search showed it, in brackets).

        Args:
            memory_id: the memory's id.
        """
        try:
            return describe(await client.memory_get(agent_id, memory_id))
        except MemoryApiError as exc:
            return refusal(exc)

    async def memory_write(content: str, kind: WritableKind = "observation", title: str | None = None,
                           tags: list[str] | None = None) -> str:
        """Remember something about the user for later conversations.

        Args:
            content: the memory, in one or a few sentences.
            kind: directive (how the user wants things done), fact, suggestion or observation.
            title: a short title.
            tags: labels to find it by.
        """
        try:
            written = await client.memory_write(agent_id, content=content, namespace=conversation.user_namespace,
                                                kind=kind, title=title, tags=tags)
        except MemoryApiError as exc:
            return refusal(exc)
        return f"Remembered as [{written.id}]."

    async def memory_update(memory_id: str, content: str | None = None, title: str | None = None,
                            tags: list[str] | None = None) -> str:
        """Change a memory because things changed since (it was true until now): the fields given are replaced, the others stay.

        Args:
            memory_id: the memory's id.
            content: its new content.
            title: its new title.
            tags: its new tags.
        """
        given: dict[str, Any] = {name: value for name, value in (("content", content), ("title", title),
                                                                 ("tags", tags)) if value is not None}
        if not given:
            return "Nothing to change: give content, title or tags."
        try:
            return "Updated " + describe(await client.memory_update(agent_id, memory_id, **given))
        except MemoryApiError as exc:
            return refusal(exc)

    async def memory_correct(memory_id: str, content: str) -> str:
        """Correct a memory that was wrong (never true, unlike memory_update's change): the right content replaces it, the wrong one is kept only as history.

        Args:
            memory_id: the wrong memory's id.
            content: the right content.
        """
        try:
            done = await client.memory_correct(agent_id, memory_id, content)
        except MemoryApiError as exc:
            return refusal(exc)
        closed = f"; {len(done.facts_closed)} graph facts closed as wrong" if done.facts_closed else ""
        return f"Corrected [{memory_id}] by {describe(done.correction)}{closed}."

    async def memory_delete(memory_id: str) -> str:
        """Forget a memory that is wrong or no longer wanted (memory_undelete brings it back until it is purged).

        Args:
            memory_id: the memory's id.
        """
        try:
            deleted = await client.memory_delete(agent_id, memory_id)
        except MemoryApiError as exc:
            return refusal(exc)
        purge = f"; purged at {deleted.purge_at.isoformat()}" if deleted.purge_at else ""
        return f"Deleted [{deleted.id}]{purge}."

    async def memory_undelete(memory_id: str) -> str:
        """Bring back a memory deleted before, until its purge date.

        Args:
            memory_id: the memory's id.
        """
        try:
            return "Restored " + describe(await client.memory_undelete(agent_id, memory_id))
        except MemoryApiError as exc:
            return refusal(exc)

    reads: list[ToolFunction] = [memory_search, memory_get]
    return reads + [memory_write, memory_update, memory_correct, memory_delete, memory_undelete] if writes else reads
