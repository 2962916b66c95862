"""The session loop for LangChain 1.x agents, as one agent middleware.

The service's loop (DESIGN.md, "Who uses it"): record every message, and before every
model call put the memory block into the system prompt. ``create_agent`` runs the
middleware's hooks around each model call, so:

- ``before_model`` records what came in since the model last spoke: the user's message,
  and the tools' answers to its calls;
- ``wrap_model_call`` asks for the memory block of (agent, user, session) and adds it to
  the system message the model is sent (the agent's state is not changed: the block is
  made afresh for every call, and never lands in the thread's history);
- ``after_model`` records the model's answer (its text and the tool calls it made) and,
  with ``write_blocks``, stores the ``<memory_write>`` blocks it wrote.

A LangGraph thread is a session, its user the run's (``identity.identify``). Messages are
recorded under their LangChain ids, so a hook run again (a retried node, a resumed
thread) records nothing twice. The hooks are written once as plans (``_calls``), run by
the blocking client in ``invoke`` and by the async one in ``ainvoke``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx
from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage

from memory_service.client import AsyncMemoryClient, MemoryApiError, MemoryClient
from memory_service.integrations.langgraph._calls import Plan, arun, call, run
from memory_service.integrations.langgraph.identity import RunIdentity, identify
from memory_service.schemas.context import ContextOut
from memory_service.schemas.records import BatchOut

log = logging.getLogger(__name__)

MAX_HOST_WINDOW = 1_000  # the service's most for host_window
WRITE_BLOCK_MARKS = ("<memory_write", "<shadow_write")


class NotRecorded(Exception):
    """The service refused or could not store some of the messages (``items``: its answer for each)."""

    def __init__(self, answer: BatchOut):
        self.answer = answer
        problems = [f"{item.status} ({item.code}): {item.detail}" for item in answer.items
                    if item.status in ("refused", "failed")]
        super().__init__(f"{len(problems)} message(s) not recorded: " + "; ".join(problems))


class MemoryMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Records an agent's conversation in the memory service and gives the model its memory block.

    ``client`` serves ``invoke``/``stream``, ``async_client`` ``ainvoke``/``astream``.
    ``user_id`` and ``session_id`` are used when the run does not name them (the run's
    ``context={'user_id': ...}`` and its thread win). ``model`` is the model name the block's
    budget is looked up by (default: the chat model's own name). ``context_options`` are
    more arguments of ``client.context`` (``budget``, ``context_type``, ``top_k``...).
    ``record_tools``: record the model's tool calls and the tools' answers too (as the
    service's ``tool`` role). ``write_blocks``: store the write blocks of the model's
    answers into the user's namespace (writes must be on for the agent). ``strict``: a
    failure of the service stops the run; without it, it is logged and the model is
    called without the block (or the message is left unrecorded).
    """

    def __init__(self, agent_id: str, *, client: MemoryClient | None = None,
                 async_client: AsyncMemoryClient | None = None, user_id: str | None = None,
                 session_id: str | None = None, model: str | None = None,
                 context_options: dict[str, Any] | None = None, record_tools: bool = True,
                 write_blocks: bool = False, strict: bool = True) -> None:
        super().__init__()
        if client is None and async_client is None:
            raise ValueError("give client=MemoryClient(...), async_client=AsyncMemoryClient(...) or both")
        if not agent_id:
            raise ValueError("agent_id must not be empty")
        unknown = set(context_options or {}) - {"budget", "context_type", "min_score", "min_similarity", "top_k",
                                                "scope", "as_of", "query"}
        if unknown:
            raise ValueError(f"context_options: unknown {sorted(unknown)}; the others come from the run")
        self.agent_id, self.client, self.async_client = agent_id, client, async_client
        self.user_id, self.session_id, self.model = user_id, session_id, model
        self.context_options = dict(context_options or {})
        self.record_tools, self.write_blocks, self.strict = record_tools, write_blocks, strict
        self.tools = []

    # The hooks -----------------------------------------------------------------------------

    def before_model(self, state: AgentState[Any], runtime: Any) -> dict[str, Any] | None:
        self._sync(self._record(_since_model(state["messages"]), self._who(runtime)), "before_model")
        return None

    async def abefore_model(self, state: AgentState[Any], runtime: Any) -> dict[str, Any] | None:
        await self._async(self._record(_since_model(state["messages"]), self._who(runtime)), "abefore_model")
        return None

    def after_model(self, state: AgentState[Any], runtime: Any) -> dict[str, Any] | None:
        self._sync(self._answered(state["messages"], self._who(runtime)), "after_model")
        return None

    async def aafter_model(self, state: AgentState[Any], runtime: Any) -> dict[str, Any] | None:
        await self._async(self._answered(state["messages"], self._who(runtime)), "aafter_model")
        return None

    def wrap_model_call(self, request: ModelRequest[Any],
                        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]) -> ModelResponse[Any]:
        block = self._sync(self._block(request), "wrap_model_call")
        return handler(_with_block(request, block))

    async def awrap_model_call(self, request: ModelRequest[Any],
                               handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]
                               ) -> ModelResponse[Any]:
        block = await self._async(self._block(request), "awrap_model_call")
        return await handler(_with_block(request, block))

    # The plans -----------------------------------------------------------------------------

    def _record(self, messages: Sequence[AnyMessage], who: RunIdentity) -> Plan[None]:
        items = [{"session_id": who.session_id, "user_id": who.user_id, "role": role, "content": content,
                  "message_id": message.id}
                 for message in messages if (converted := self._converted(message)) is not None
                 for role, content in [converted]]
        if items:
            answer: BatchOut = yield call("record_batch", self.agent_id, items)
            if answer.refused or answer.failed:
                raise NotRecorded(answer)

    def _answered(self, messages: Sequence[AnyMessage], who: RunIdentity) -> Plan[None]:
        answer = messages[-1] if messages else None
        if not isinstance(answer, AIMessage):
            return
        yield from self._record([answer], who)
        text = answer.text
        if self.write_blocks and any(mark in text for mark in WRITE_BLOCK_MARKS):
            yield call("write_blocks", self.agent_id, text, namespace=f"user:{self.agent_id}:{who.user_id}",
                       session_id=who.session_id, message_id=answer.id)

    def _block(self, request: ModelRequest[Any]) -> Plan[str]:
        who = self._who(request.runtime)
        sent = sum(1 for message in request.messages if self._converted(message) is not None)
        answer: ContextOut = yield call("context", agent_id=self.agent_id, user_id=who.user_id,
                                        session_id=who.session_id, model=self.model or _model_name(request.model),
                                        host_window=min(sent, MAX_HOST_WINDOW), **self.context_options)
        return answer.xml if any(answer.sections.values()) else ""  # nothing to show yet: the prompt as it is

    # Running them --------------------------------------------------------------------------

    def _who(self, runtime: Any) -> RunIdentity:
        return identify(runtime, user_id=self.user_id, session_id=self.session_id)

    def _sync[T](self, plan: Plan[T], hook: str) -> T | None:
        try:
            return run(self.client, plan, needed_for=f"MemoryMiddleware.{hook} (agent.invoke/stream)")
        except (MemoryApiError, httpx.HTTPError, NotRecorded) as exc:
            self._failed(exc, hook)
            return None

    async def _async[T](self, plan: Plan[T], hook: str) -> T | None:
        try:
            return await arun(self.async_client, plan, needed_for=f"MemoryMiddleware.{hook} (agent.ainvoke/astream)")
        except (MemoryApiError, httpx.HTTPError, NotRecorded) as exc:
            self._failed(exc, hook)
            return None

    def _failed(self, exc: Exception, hook: str) -> None:
        if self.strict:
            raise exc
        log.warning("memory service: %s went on without it: %s: %s", hook, type(exc).__name__, exc)

    def _converted(self, message: AnyMessage) -> tuple[str, str] | None:
        """(the service's role, the content) of a message the service keeps; None for the others."""
        if isinstance(message, HumanMessage):
            return _kept("user", message.text)
        if isinstance(message, AIMessage):
            calls = [f"[tool call] {c['name']}({json.dumps(c['args'], ensure_ascii=False, sort_keys=True)})"
                     for c in message.tool_calls] if self.record_tools else []
            return _kept("assistant", "\n".join([message.text, *calls]) if message.text else "\n".join(calls))
        if isinstance(message, ToolMessage) and self.record_tools:
            return _kept("tool", f"[{message.name or 'tool'} answered] {message.text}" if message.text else "")
        return None  # system prompts are the host's, not the conversation


def _kept(role: str, content: str) -> tuple[str, str] | None:
    return (role, content) if content.strip() else None


def _since_model(messages: Sequence[AnyMessage]) -> Sequence[AnyMessage]:
    """The messages after the model's last answer: what it has not seen yet (all, in a new thread)."""
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], AIMessage):
            return messages[index + 1:]
    return messages


def _model_name(model: Any) -> str | None:
    for attribute in ("model_name", "model", "model_id"):
        if isinstance(name := getattr(model, attribute, None), str) and name:
            return name
    return None


def _with_block(request: ModelRequest[Any], block: str | None) -> ModelRequest[Any]:
    """The request with the memory block after its system prompt (a system message of its own if none)."""
    if not block:
        return request
    system = request.system_message
    if system is None:
        return request.override(system_message=SystemMessage(content=block))
    if isinstance(system.content, str):
        content: str | list[Any] = f"{system.content}\n\n{block}" if system.content else block
    else:
        content = [*system.content, {"type": "text", "text": block}]
    return request.override(system_message=SystemMessage(content=content))
