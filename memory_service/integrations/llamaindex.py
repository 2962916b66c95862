"""memory-service for LlamaIndex (`pip install 'memory-service[llamaindex]'`, llama-index-core
alone): a chat memory that records every message and puts the memory block before the
history, a memory block for LlamaIndex's own ``Memory``, and the memory tools as function
tools. docs/integrations/llamaindex.md.

``MemoryServiceMemory`` is a ``BaseChatStoreMemory``: the chat history stays in a LlamaIndex
chat store (messages whole, with their blocks and kwargs; the in-process SimpleChatStore by
default), and each message put is recorded as the service's message, as role and readable
text, the only shape the service keeps. ``get`` gives the model the memory block as a system
message, then the history. ``MemoryServiceBlock`` is for an application that keeps
LlamaIndex's ``Memory``: the block gives it the service's memory block and records what
``Memory`` flushes to it (messages leave its short-term queue only when it overflows).

LlamaIndex's memory has sync methods beside the async ones: they need the sync client
(``MemoryClient``), whose calls the async methods run in a worker thread; with an
``AsyncMemoryClient`` only the async methods serve (its connections belong to one event loop).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.memory import BaseMemoryBlock
from llama_index.core.memory.types import BaseChatStoreMemory
from llama_index.core.tools import FunctionTool

from memory_service.integrations._conversation import DEFAULT_MAX_CHARS, Conversation, Role, Turn
from memory_service.integrations._tools import memory_functions

ASSISTANT_ROLES = (MessageRole.ASSISTANT, MessageRole.CHATBOT, MessageRole.MODEL)
TOOL_ROLES = (MessageRole.TOOL, MessageRole.FUNCTION)
SYSTEM_ROLES = (MessageRole.SYSTEM, MessageRole.DEVELOPER)


def message_text(message: ChatMessage) -> str:
    """A message's text blocks, and a mark such as [image] for its other blocks (tool calls aside)."""
    parts = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif not isinstance(block, ToolCallBlock):
            parts.append(f"[{block.block_type}]")
    return "\n".join(part for part in parts if part)


def tool_calls(message: ChatMessage) -> list[tuple[str, str, str]]:
    """(call id, tool name, arguments) of the calls a message makes: its ToolCallBlocks, or the
    ``tool_calls`` of its kwargs (a provider's own shape, named as it names them)."""
    calls = [(block.tool_call_id or "", block.tool_name, block.tool_kwargs if isinstance(block.tool_kwargs, str)
              else _json(block.tool_kwargs)) for block in message.blocks if isinstance(block, ToolCallBlock)]
    for call in message.additional_kwargs.get("tool_calls") or ():
        function = getattr(call, "function", None) or (call.get("function") if isinstance(call, dict) else None)
        name = getattr(function, "name", None) or getattr(call, "tool_name", None) or \
            (function.get("name") if isinstance(function, dict) else None)
        arguments = getattr(function, "arguments", None) or getattr(call, "tool_kwargs", None) or \
            (function.get("arguments") if isinstance(function, dict) else None)
        call_id = getattr(call, "id", None) or getattr(call, "tool_id", None) or \
            (call.get("id") if isinstance(call, dict) else None)
        if name:
            calls.append((str(call_id or ""), str(name), arguments if isinstance(arguments, str) else _json(arguments)))
    return calls


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def message_turns(messages: Sequence[ChatMessage], earlier: Sequence[ChatMessage] = ()) -> list[Turn]:
    """What the service records of chat messages, in order: a user's, an assistant's and a
    system message's text; each tool call as ``called name(arguments)``; a tool's result as
    ``name returned: ...`` (the name found from its call, in ``messages`` or ``earlier``)."""
    names = {call_id: name for message in (*earlier, *messages) for call_id, name, _ in tool_calls(message) if call_id}
    turns: list[Turn] = []
    for message in messages:
        text = message_text(message)
        if message.role in TOOL_ROLES:
            call_id = str(message.additional_kwargs.get("tool_call_id") or "")
            name = message.additional_kwargs.get("name") or names.get(call_id) or "tool"
            turns.append(Turn("tool", f"{name} returned: {text}"))
            continue
        role: Role = "assistant" if message.role in ASSISTANT_ROLES else "system" if message.role in SYSTEM_ROLES else "user"
        turns.append(Turn(role, text))
        turns.extend(Turn("tool", f"called {name}({arguments})") for _, name, arguments in tool_calls(message))
    return [turn for turn in turns if turn.content.strip()]


def last_user_text(messages: Sequence[ChatMessage]) -> str | None:
    return next((message_text(m) for m in reversed(messages) if m.role == MessageRole.USER), None)


class MemoryServiceMemory(BaseChatStoreMemory):
    """A chat memory recorded in memory-service: for ``SimpleChatEngine.from_defaults(memory=...)``,
    ``FunctionAgent.run(..., memory=...)`` and whatever else takes a ``BaseMemory``.

    ``client`` calls the service (a ``MemoryClient`` for the sync methods, either for the async
    ones); ``agent_id`` is the agent whose memory it is, ``user_id`` the person the
    conversation is with, ``session_id`` the service's session (and the chat store's key).
    ``chat_store`` keeps the history (SimpleChatStore, in process, by default);
    ``history_limit`` is how many of its latest messages ``get`` gives (None: all). ``model``
    and ``budget`` size the memory block; ``max_chars`` is the longest text recorded for one
    message.
    """

    client: Any = Field(exclude=True, description="a memory_service.client MemoryClient or AsyncMemoryClient")
    agent_id: str
    user_id: str
    session_id: str
    history_limit: int | None = Field(default=None, ge=0)
    model: str | None = None
    budget: int | None = None
    max_chars: int = DEFAULT_MAX_CHARS
    _conversation: Conversation = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._conversation = Conversation(self.client, agent_id=self.agent_id, user_id=self.user_id,
                                          session_id=self.session_id, model=self.model, budget=self.budget,
                                          max_chars=self.max_chars)
        if "chat_store_key" not in self.model_fields_set:
            self.chat_store_key = self.session_id

    @classmethod
    def class_name(cls) -> str:
        return "MemoryServiceMemory"

    @classmethod
    def from_defaults(cls, chat_history: list[ChatMessage] | None = None, llm: Any = None,
                      **kwargs: Any) -> MemoryServiceMemory:
        """``MemoryServiceMemory(**kwargs)``, its history set to ``chat_history`` (not recorded)."""
        memory = cls(**kwargs)
        if chat_history:
            memory.set(chat_history)
        return memory

    @property
    def conversation(self) -> Conversation:
        return self._conversation

    def _latest(self, history: list[ChatMessage]) -> list[ChatMessage]:
        return history if self.history_limit is None else history[max(0, len(history) - self.history_limit):]

    def _with_block(self, block: str, history: list[ChatMessage]) -> list[ChatMessage]:
        return ([ChatMessage(role=MessageRole.SYSTEM, content=block)] if block else []) + history

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """The memory block as a system message (none when it is empty), then the latest
        ``history_limit`` messages. The block's query is ``input`` (else the history's latest
        user message); the history's messages are left out of its relevant memories."""
        history = self._latest(self.chat_store.get_messages(self.chat_store_key))
        block = self._conversation.block_sync(query=input or last_user_text(history),
                                              host_window=len(message_turns(history)))
        return self._with_block(block, history)

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        history = self._latest(await self.chat_store.aget_messages(self.chat_store_key))
        block = await self._conversation.block(query=input or last_user_text(history),
                                               host_window=len(message_turns(history)))
        return self._with_block(block, history)

    def put(self, message: ChatMessage) -> None:
        """Record the message, then add it to the history (when the service refuses it or is
        down, the error raises and the history is unchanged)."""
        self.put_messages([message])

    async def aput(self, message: ChatMessage) -> None:
        await self.aput_messages([message])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Record the messages in one request, then add them to the history."""
        history = self.chat_store.get_messages(self.chat_store_key)
        self._conversation.record_sync(message_turns(messages, history))
        for message in messages:
            self.chat_store.add_message(self.chat_store_key, message)

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        history = await self.chat_store.aget_messages(self.chat_store_key)
        await self._conversation.record(message_turns(messages, history))
        for message in messages:
            await self.chat_store.async_add_message(self.chat_store_key, message)

    # get_all, set and reset (and their async twins) are BaseChatStoreMemory's: they read or
    # replace the history and record nothing. The service keeps what it recorded.


class MemoryServiceBlock(BaseMemoryBlock[str]):
    """A memory block for LlamaIndex's ``Memory`` (``Memory.from_defaults(memory_blocks=[...])``):
    it gives the service's memory block, for the latest user message of the chat, and records
    the messages ``Memory`` flushes to it. ``client``, ``agent_id``, ``user_id``,
    ``session_id``, ``model``, ``budget`` and ``max_chars`` as for MemoryServiceMemory."""

    name: str = "memory_service"
    client: Any = Field(exclude=True, description="a memory_service.client MemoryClient or AsyncMemoryClient")
    agent_id: str
    user_id: str
    session_id: str
    model: str | None = None
    budget: int | None = None
    max_chars: int = DEFAULT_MAX_CHARS
    _conversation: Conversation = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._conversation = Conversation(self.client, agent_id=self.agent_id, user_id=self.user_id,
                                          session_id=self.session_id, model=self.model, budget=self.budget,
                                          max_chars=self.max_chars)

    @property
    def conversation(self) -> Conversation:
        return self._conversation

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        # The service holds the flushed messages only, none of which the short-term chat
        # shows: nothing to leave out of the relevant memories.
        return await self._conversation.block(query=last_user_text(messages or []), host_window=0)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        await self._conversation.record(message_turns(messages))


def memory_tools(memory: MemoryServiceMemory | MemoryServiceBlock, *, writes: bool = True) -> list[FunctionTool]:
    """The memory tools as LlamaIndex function tools, bound to the memory's user:
    memory_search and memory_get, and with ``writes`` memory_write, memory_update,
    memory_delete and memory_undelete (answered only for an agent in the service's
    MEMORY_WRITE_AGENTS)."""
    return [FunctionTool.from_defaults(async_fn=function)
            for function in memory_functions(memory.conversation, writes=writes)]
