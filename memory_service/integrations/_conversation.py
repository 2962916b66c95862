"""What every framework adapter does with the service, said once: the ids a conversation is
recorded under, the memory block for its next model call, recording its messages.

The frameworks hold a conversation in shapes of their own (the Agents SDK's input items,
Pydantic AI's model messages, LlamaIndex's chat messages). Each adapter turns its shape into
``Turn``s, a role the service knows and readable text, and hands them here: the service keeps
text (its formation, search and memory block read a message's content), so what a framework
keeps beside the text (ids, tool-call arguments as JSON, images) stays in the framework's own
history, never in the service. Imports only the public client.

Either client serves: the async one is awaited in the caller's event loop; the sync one runs
in a worker thread for the async methods (its httpx client is thread-safe), and is called
directly by the sync methods, which a framework with a sync interface (LlamaIndex's memory)
needs. An AsyncMemoryClient cannot serve those: its connections belong to the event loop that
opened them, and a sync method would have to run it in another.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import httpx

from memory_service.client import AsyncMemoryClient, MemoryClient
from memory_service.client.errors import error_for
from memory_service.domain.limits import MAX_HOST_WINDOW
from memory_service.schemas.context import ContextOut
from memory_service.schemas.records import BatchOut

Role = Literal["user", "assistant", "tool", "system"]
ROLES: tuple[Role, ...] = ("user", "assistant", "tool", "system")
Client = AsyncMemoryClient | MemoryClient

# The service's default MAX_MESSAGE_CHARS: a longer text is cut to it (with an ellipsis) before
# it is sent, since the service refuses a longer message whole. The framework's history keeps it whole.
DEFAULT_MAX_CHARS = 32_000
BATCH_SIZE = 100  # messages per batch request, far below the service's MAX_BATCH_MESSAGES (1,000)
EMPTY_BLOCK = "<MemoryContext/>"


@dataclass(frozen=True)
class Turn:
    """One message to record: a role the service knows and the text it reads."""

    role: Role
    content: str


def _check_id(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


class _Threaded:
    """A MemoryClient with the AsyncMemoryClient's face: each method call runs in a worker thread."""

    def __init__(self, client: MemoryClient):
        self._client = client
        self.base_url = client.base_url

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call


class Conversation:
    """One user's conversation with one agent, as the service records it: ``session_id`` is
    the service's session, ``user_id`` the person speaking in it, ``agent_id`` the agent whose
    memory it feeds. ``model`` and ``budget`` size the memory block (the service's defaults
    when None); ``max_chars`` is the longest text recorded for a message."""

    def __init__(self, client: Client, *, agent_id: str, user_id: str, session_id: str,
                 model: str | None = None, budget: int | None = None, max_chars: int = DEFAULT_MAX_CHARS):
        if isinstance(client, AsyncMemoryClient):
            self.client, self.sync_client = client, None
        elif isinstance(client, MemoryClient):
            self.client, self.sync_client = cast(AsyncMemoryClient, _Threaded(client)), client
        else:
            raise TypeError("client must be a memory_service.client.AsyncMemoryClient or MemoryClient, "
                            f"got {type(client).__name__}")
        if max_chars < 2:
            raise ValueError("max_chars must be at least 2")
        self.agent_id = _check_id("agent_id", agent_id)
        self.user_id = _check_id("user_id", user_id)
        self.session_id = _check_id("session_id", session_id)
        self.model = model
        self.budget = budget
        self.max_chars = max_chars

    @property
    def user_namespace(self) -> str:
        """Where the memory tools write: the user's own namespace with the agent."""
        return f"user:{self.agent_id}:{self.user_id}"

    def _sync(self) -> MemoryClient:
        if self.sync_client is None:
            raise TypeError("the sync methods need a memory_service.client.MemoryClient (this one is async: its "
                            "connections belong to its event loop); use the async methods, or give a MemoryClient")
        return self.sync_client

    def _context_args(self, query: str | None, host_window: int | None) -> dict[str, Any]:
        window = None if host_window is None else max(0, min(host_window, MAX_HOST_WINDOW))
        return {"agent_id": self.agent_id, "user_id": self.user_id, "session_id": self.session_id, "model": self.model,
                "budget": self.budget, "query": query or None, "host_window": window}

    @staticmethod
    def _xml(out: ContextOut) -> str:
        return "" if out.xml.strip() == EMPTY_BLOCK else out.xml

    async def block(self, *, query: str | None = None, host_window: int | None = None) -> str:
        """The memory block (XML) for the next model call, or "" when it holds nothing.
        ``query``: what the model is asked now (None: the session's latest user message);
        ``host_window``: how many of the session's latest messages the model is sent anyway
        (left out of the relevant memories; capped at the service's maximum)."""
        return self._xml(await self.client.context(**self._context_args(query, host_window)))

    def block_sync(self, *, query: str | None = None, host_window: int | None = None) -> str:
        """``block`` with the sync client."""
        return self._xml(self._sync().context(**self._context_args(query, host_window)))

    async def instructions(self, base: str | None, *, query: str | None = None, host_window: int | None = None) -> str:
        """``base`` followed by the memory block (``base`` alone when the block is empty)."""
        block = await self.block(query=query, host_window=host_window)
        return "\n\n".join(part for part in (base, block) if part)

    def clip(self, text: str) -> str:
        return text if len(text) <= self.max_chars else text[:self.max_chars - 1] + "…"

    def _batches(self, turns: Sequence[Turn]) -> list[list[dict[str, str]]]:
        """The turns with text, as batches of messages to record (the service refuses a blank one)."""
        pending: list[dict[str, str]] = []
        for turn in turns:
            if turn.role not in ROLES:
                raise ValueError(f"role must be one of {', '.join(ROLES)}, got {turn.role!r}")
            if turn.content.strip():
                pending.append({"session_id": self.session_id, "user_id": self.user_id, "role": turn.role,
                                "content": self.clip(turn.content), "message_id": uuid.uuid4().hex})
        return [pending[start:start + BATCH_SIZE] for start in range(0, len(pending), BATCH_SIZE)]

    def _check(self, answer: BatchOut, offset: int) -> None:
        """Raise a refused or failed item as the single-message route's answer would be."""
        for item in answer.items:
            if item.status in ("refused", "failed"):
                code = item.code or (422 if item.status == "refused" else 503)
                detail = f"message {offset + item.index}: {item.detail}"
                path = f"{self.client.base_url}/v1/agents/{self.agent_id}/messages/batch"
                raise error_for(httpx.Response(code, json={"detail": detail}, request=httpx.Request("POST", path)))

    async def record(self, turns: Sequence[Turn]) -> None:
        """Record the turns in order, in as few requests as fit (a turn with no text is not
        recorded). A message the service refuses raises the error the single-message route
        would answer (InvalidRequest, ConflictError...), one it could not store
        ServiceUnavailable; the messages before it are recorded."""
        offset = 0
        for batch in self._batches(turns):
            self._check(await self.client.record_batch(self.agent_id, batch), offset)
            offset += len(batch)

    def record_sync(self, turns: Sequence[Turn]) -> None:
        """``record`` with the sync client."""
        client, offset = self._sync(), 0
        for batch in self._batches(turns):
            self._check(client.record_batch(self.agent_id, batch), offset)
            offset += len(batch)
