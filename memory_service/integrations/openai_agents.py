"""memory-service for the OpenAI Agents SDK (`pip install 'memory-service[openai-agents]'`):
a Session whose items are recorded as the service's messages, instructions that carry the
memory block, and the memory tools as function tools. docs/integrations/openai-agents.md.

The SDK's session gives the model its history back item by item, exactly as added (the
Runner matches items by their JSON when it rewinds), and an item may be a tool call, its
output or a reasoning item as well as a message. The service keeps a message's role and
text only, and its formation, search and memory block read that text: JSON in it would reach
the model as memory. So each item is kept twice, for two readers: whole, in the SDK's own
SQLiteSession (in memory, or a file given by ``db_path``), which ``get_items`` reads; and as
readable text, recorded as a message of the service's session, which the memory is formed
from. Popping and clearing change the history only: the service's record of a session is
append-only (it forms each message exactly once; what was formed from a message is not
taken back by deleting it).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from agents import Agent, FunctionTool, RunContextWrapper, SQLiteSession, function_tool
from agents.items import TResponseInputItem
from agents.memory import SessionSettings

from memory_service.integrations._conversation import DEFAULT_MAX_CHARS, Client, Conversation, Role, Turn
from memory_service.integrations._tools import memory_functions

# Items with nothing readable for memory: kept in the history only.
UNRECORDED_TYPES = frozenset({"reasoning", "item_reference", "compaction"})
ROLE_OF = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def content_text(content: object) -> str:
    """A message's or a tool output's content as text: its text parts, a mark for the others."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else str(content)
    parts = []
    for part in content:
        if not isinstance(part, Mapping):
            parts.append(str(part))
        elif isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif isinstance(part.get("refusal"), str):
            parts.append(f"[refused] {part['refusal']}")
        elif part.get("type") == "input_file":
            parts.append(f"[file {part.get('filename') or part.get('file_id') or ''}]".replace(" ]", "]"))
        else:
            parts.append(f"[{str(part.get('type', 'part')).removeprefix('input_')}]")
    return "\n".join(parts)


def item_turn(item: Mapping[str, Any], tool_names: Mapping[str, str]) -> Turn | None:
    """What the service records of an item: a message as its role and text, a function call
    and its output as tool messages naming the function, another tool's call as its type and
    JSON, and nothing for a reasoning item or a reference (None). ``tool_names``: function
    names by call id, for outputs."""
    kind, role = item.get("type"), item.get("role")
    if kind in UNRECORDED_TYPES:
        return None
    if kind in (None, "message") and role in ROLE_OF:
        return Turn(cast(Role, ROLE_OF[role]), content_text(item.get("content")))
    if kind == "function_call":
        return Turn("tool", f"called {item.get('name')}({item.get('arguments') or ''})")
    if kind == "function_call_output":
        name = tool_names.get(str(item.get("call_id")), f"call {item.get('call_id')}")
        return Turn("tool", f"{name} returned: {content_text(item.get('output'))}")
    details = {k: v for k, v in item.items() if k not in ("type", "id", "status")}
    return Turn("tool", f"{kind}: {json.dumps(details, ensure_ascii=False, default=str)}")


def item_turns(items: Sequence[Mapping[str, Any]]) -> list[Turn | None]:
    """What the service records of each item (None: nothing), outputs named after their calls."""
    names = {str(item.get("call_id")): str(item.get("name")) for item in items if item.get("type") == "function_call"}
    return [item_turn(item, names) for item in items]


class MemorySession:
    """A session of the Agents SDK (the ``agents.memory.Session`` protocol) recorded in
    memory-service: pass it as ``Runner.run(..., session=...)``.

    ``session_id`` is both the SDK's session and the service's; ``user_id`` the person the
    conversation is with; ``agent_id`` the agent whose memory it feeds. ``db_path``: where the
    SDK's SQLiteSession keeps the items whole (":memory:" by default: the history lasts as
    long as this object, the recorded messages as long as the service keeps them).
    ``model`` and ``budget`` size the memory block; ``max_chars`` is the longest text
    recorded for one item.
    """

    def __init__(self, session_id: str, client: Client, *, agent_id: str, user_id: str,
                 db_path: str | Path = ":memory:", session_settings: SessionSettings | None = None, model: str | None = None,
                 budget: int | None = None, max_chars: int = DEFAULT_MAX_CHARS):
        self.conversation = Conversation(client, agent_id=agent_id, user_id=user_id, session_id=session_id,
                                         model=model, budget=budget, max_chars=max_chars)
        self.session_id = session_id
        self.session_settings = session_settings
        self._history = SQLiteSession(session_id, db_path, session_settings=session_settings)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The items in order, as they were added (the latest ``limit`` of them)."""
        return await self._history.get_items(limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Record the items' text as the service's messages, in one request, then keep them
        whole in the history. When the service refuses or fails, nothing is kept in the history
        (the error raises; the messages recorded before it stay recorded)."""
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise TypeError(f"items[{index}] must be an input item (a dict), got {type(item).__name__}")
        turns = item_turns(cast(list[Mapping[str, Any]], items))
        await self.conversation.record([turn for turn in turns if turn is not None])
        await self._history.add_items(items)

    async def pop_item(self) -> TResponseInputItem | None:
        """Take the latest item off the history and return it (None when it is empty). Its
        recorded message stays in the service (docs/integrations/openai-agents.md, "Pop")."""
        return await self._history.pop_item()

    async def clear_session(self) -> None:
        """Empty the history. The service's session keeps its recorded messages: they are what
        was said, and the agent's memory is formed from them (exactly once); the next items
        are recorded after them."""
        await self._history.clear_session()

    async def recorded_count(self) -> int:
        """How many of the history's items (within ``session_settings.limit``) have a recorded
        message: the service's messages the model is sent anyway."""
        items = cast(list[Mapping[str, Any]], await self._history.get_items())
        return sum(1 for turn in item_turns(items) if turn is not None and turn.content.strip())

    def close(self) -> None:
        """Close the history's database connections (the client is the caller's to close)."""
        self._history.close()


def memory_instructions(session: MemorySession, base: str | None = None
                        ) -> Callable[[RunContextWrapper[Any], Agent[Any]], Awaitable[str]]:
    """Instructions for ``Agent(instructions=...)``: ``base`` followed by the session's memory
    block, fetched before every model call. Its query is the session's latest user message
    (the Runner records the input before the first call); the messages the session sends the
    model anyway are left out of its relevant memories. A failure of the service raises (the
    run stops) rather than running the model without its memory."""

    async def instructions(context: RunContextWrapper[Any], agent: Agent[Any]) -> str:
        return await session.conversation.instructions(base, host_window=await session.recorded_count())

    return instructions


def memory_tools(session: MemorySession, *, writes: bool = True) -> list[FunctionTool]:
    """The memory tools as function tools, bound to the session's user: memory_search and
    memory_get, and with ``writes`` memory_write, memory_update, memory_delete and
    memory_undelete (answered only for an agent in the service's MEMORY_WRITE_AGENTS)."""
    return [function_tool(function) for function in memory_functions(session.conversation, writes=writes)]
