"""memory-service for Pydantic AI (`pip install 'memory-service[pydantic-ai]'`): one capability
that gives an agent's runs the memory block as instructions, the memory tools as a toolset,
and records each run's exchange as the service's messages. docs/integrations/pydantic-ai.md.

Pydantic AI hands the conversation's history to each run (``message_history``) and leaves
keeping it to the application, so the capability keeps no history: it records what a run
added (``result.new_messages()``) once the run is over, as role and readable text, the only
shape the service keeps (its formation, search and memory block read a message's text). The
capability is bound to one user's session: build one per conversation and pass it to
``agent.run(..., capabilities=[...])`` (it overrides an agent-level one of the same id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    NativeToolCallPart,
    NativeToolReturnPart,
    TextContent,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.run import AgentRunResult
from pydantic_ai.toolsets import FunctionToolset

from memory_service.integrations._conversation import DEFAULT_MAX_CHARS, Client, Conversation, Turn
from memory_service.integrations._tools import memory_functions


def prompt_text(content: str | Sequence[Any]) -> str:
    """A user prompt as text: its text items, a mark such as [image-url] for the others."""
    if isinstance(content, str):
        return content
    parts = []
    for item in content:
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, TextContent):
            parts.append(item.content)
        elif (kind := getattr(item, "kind", None)) is not None:
            parts.append(f"[{kind}]")
    return "\n".join(parts)


def message_turns(messages: Sequence[ModelMessage]) -> list[Turn]:
    """What the service records of model messages, in order: the user's prompts, the model's
    text, the calls of tools and what they returned. Not recorded: system prompts and
    instructions (the agent's configuration, and the memory block itself), thinking, retry
    prompts (the framework's own validation errors), files the model made."""
    turns: list[Turn] = []
    for message in messages:
        for part in message.parts:
            if isinstance(message, ModelRequest) and isinstance(part, UserPromptPart):
                turns.append(Turn("user", prompt_text(part.content)))
            elif isinstance(part, (ToolReturnPart, NativeToolReturnPart)):
                turns.append(Turn("tool", f"{part.tool_name} returned: {part.model_response_str()}"))
            elif isinstance(message, ModelResponse) and isinstance(part, TextPart):
                turns.append(Turn("assistant", part.content))
            elif isinstance(part, (ToolCallPart, NativeToolCallPart)):
                turns.append(Turn("tool", f"called {part.tool_name}({part.args_as_json_str()})"))
    return [turn for turn in turns if turn.content.strip()]


@dataclass
class MemoryCapability(AbstractCapability[Any]):
    """Long-term memory for an agent's runs in one user's session.

    ``client`` calls the service; ``agent_id`` is the agent whose memory it is, ``user_id`` the
    person the conversation is with, ``session_id`` the service's session the runs are
    recorded in. ``writes``: whether the toolset has the writing tools (memory_write,
    memory_update, memory_delete, memory_undelete; the service answers them only for an agent
    in its MEMORY_WRITE_AGENTS). ``model`` and ``budget`` size the memory block, ``max_chars``
    is the longest text recorded for one message.

    - instructions: the memory block before every model request, for the run's prompt;
    - toolset: memory_search, memory_get (and the writing tools);
    - after the run: its new messages recorded in the session, in one request.
    """

    client: Client
    agent_id: str
    user_id: str
    session_id: str
    writes: bool = True
    model: str | None = None
    budget: int | None = None
    max_chars: int = DEFAULT_MAX_CHARS
    _: KW_ONLY
    id: str | None = "memory_service"
    conversation: Conversation = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.conversation = Conversation(self.client, agent_id=self.agent_id, user_id=self.user_id,
                                         session_id=self.session_id, model=self.model, budget=self.budget,
                                         max_chars=self.max_chars)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # not for agent specs: it holds a client

    def get_instructions(self) -> Any:
        """The memory block, fetched before each model request. Its query is the run's prompt;
        the recorded messages of the history the run was given (sent to the model anyway)
        are left out of its relevant memories. A failure of the service raises: the model
        does not run without its memory."""

        async def memory_block(ctx: RunContext[Any]) -> str:
            history = [m for m in ctx.messages if ctx.run_id is None or m.run_id != ctx.run_id]
            query = prompt_text(ctx.prompt) if ctx.prompt is not None else None
            return await self.conversation.block(query=query, host_window=len(message_turns(history)))

        return memory_block

    def get_toolset(self) -> FunctionToolset[Any]:
        return FunctionToolset(memory_functions(self.conversation, writes=self.writes))

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        """Record the run's new messages (its prompt, the model's answers, tool calls and
        returns). A refusal or an outage of the service raises, and the result is not
        returned: the exchange would otherwise be missing from the memory unseen."""
        await self.conversation.record(message_turns(result.new_messages()))
        return result
