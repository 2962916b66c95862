"""The memory tools as LangChain tools: an agent searches, reads, writes, updates and
deletes its own memories (docs/memory-tools.md) through the client.

The tools take no agent, user or session from the model: the agent is the one they were
made for, and the user and session are the run's (``identity.identify``, from the
``ToolRuntime`` LangChain injects), so a model can reach no other agent's or user's
memories by naming them. Where a memory goes is a word (``user``, ``session``, ``agent``)
the tool turns into the service's namespace. A write is idempotent by the tool call's id:
a tool call run again stores one memory.

Each tool is one plan (``_calls``) run by the blocking client in ``invoke`` and by the
async one in ``ainvoke``. The service's refusals (a 4xx: a bad field, an unknown memory,
writes off) come back to the model as the tool's answer, naming the field, so it can
correct its call; an outage raises.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from langchain.tools import ToolRuntime
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import Field

from memory_service.client import (
    AsyncMemoryClient,
    CorrectionOut,
    DeletedMemory,
    MemoryApiError,
    MemoryClient,
    MemoryRecord,
    ServerError,
)
from memory_service.integrations.langgraph._calls import Plan, arun, call, run
from memory_service.integrations.langgraph.identity import RunIdentity, identify
from memory_service.schemas.search import SearchResult

Where = Literal["user", "session", "agent"]
Kind = Literal["observation", "fact", "directive", "suggestion"]
Cleared = Literal["title", "confidence", "tags"]
MemoryId = Annotated[str, Field(min_length=1, description="the memory's id, as search or write answered it")]
READ_TOOLS = ("memory_search", "memory_get")


class MemoryTools:
    """The plans behind the tools, for one agent (see ``memory_tools``)."""

    def __init__(self, agent_id: str, *, user_id: str | None = None, session_id: str | None = None):
        self.agent_id, self.user_id, self.session_id = agent_id, user_id, session_id

    def memory_search(
        self,
        query: Annotated[str, Field(min_length=1, description="what to look for, in plain words")],
        runtime: ToolRuntime[Any, Any],
        scope: Annotated[Where, Field(description="user: this user's memories and conversations (the default); "
                                                  "session: this conversation; agent: everything you know")] = "user",
        top_k: Annotated[int, Field(ge=1, le=50, description="how many results")] = 5,
        tags: Annotated[list[str] | None, Field(description="only memories carrying all these tags")] = None,
    ) -> Plan[str]:
        """Search your long-term memory: the best matches, each with its id, content and score."""
        who = self._who(runtime)
        where: dict[str, Any] = {"user": {"user_id": who.user_id}, "session": {"session_id": who.session_id},
                                 "agent": {}}[scope]
        found: SearchResult = yield call("search", self.agent_id, query, scope=scope, top_k=top_k, tags=tags, **where)
        return _json({"results": [{"id": hit.id, "kind": hit.kind, "namespace": hit.namespace, "content": hit.content,
                                   "title": hit.title, "tags": hit.tags, "age": hit.age,
                                   "score": round(hit.score, 4)} for hit in found.results]})

    def memory_get(self, memory_id: MemoryId) -> Plan[str]:
        """Read one memory in full, by its id."""
        record: MemoryRecord = yield call("memory_get", self.agent_id, memory_id)
        return _record(record)

    def memory_write(
        self,
        content: Annotated[str, Field(min_length=1, description="the memory, in one or a few sentences")],
        runtime: ToolRuntime[Any, Any],
        namespace: Annotated[Where, Field(description="user: about this user, kept for their next conversations (the "
                                                      "default); session: this conversation only; agent: for "
                                                      "everyone")] = "user",
        kind: Annotated[Kind, Field(description="directive: a rule or preference to follow; fact: something true; "
                                                "suggestion: an idea with its rationale; observation: anything "
                                                "else")] = "observation",
        title: Annotated[str | None, Field(max_length=200, description="a short title")] = None,
        tags: Annotated[list[str] | None, Field(description="labels to find it by")] = None,
        confidence: Annotated[float | None, Field(ge=0, le=1, description="how sure you are, 0 to 1")] = None,
    ) -> Plan[str]:
        """Remember something for later: a new memory. Answers it with its id."""
        who = self._who(runtime)
        target = {"user": f"user:{self.agent_id}:{who.user_id}", "session": f"session:{who.session_id}",
                  "agent": f"agent:{self.agent_id}"}[namespace]
        record: MemoryRecord = yield call(
            "memory_write", self.agent_id, content=content, namespace=target, kind=kind, title=title, tags=tags,
            confidence=confidence,
            idempotency_key=f"langchain-tool-call:{runtime.tool_call_id}" if runtime.tool_call_id else None)
        return _record(record)

    def memory_update(
        self,
        memory_id: MemoryId,
        content: Annotated[str | None, Field(min_length=1, description="new content")] = None,
        title: Annotated[str | None, Field(max_length=200, description="new title")] = None,
        tags: Annotated[list[str] | None, Field(description="new tags (replacing the old)")] = None,
        confidence: Annotated[float | None, Field(ge=0, le=1, description="new confidence, 0 to 1")] = None,
        kind: Annotated[Kind | None, Field(description="new kind")] = None,
        clear: Annotated[list[Cleared] | None, Field(description="fields to remove: title, confidence, tags")] = None,
    ) -> Plan[str]:
        """Change a memory because it changed since (it was true until now): the fields given; those left out (or
        null) stay as they are."""
        changes: dict[str, Any] = {name: value for name, value in
                                   (("content", content), ("title", title), ("tags", tags), ("confidence", confidence),
                                    ("kind", kind)) if value is not None}
        for name in clear or []:
            if name in changes:
                raise ToolException(f"clear: {name!r} is also given a new value; do one or the other")
            changes[name] = None
        if not changes:
            raise ToolException("nothing to change: give content, title, tags, confidence or kind, or clear")
        record: MemoryRecord = yield call("memory_update", self.agent_id, memory_id, **changes)
        return _record(record)

    def memory_correct(
        self,
        memory_id: MemoryId,
        content: Annotated[str, Field(min_length=1, description="the right content")],
    ) -> Plan[str]:
        """Correct a memory that was wrong (never true; for one that changed since, use memory_update): the right
        content replaces it, the wrong one is kept as history only."""
        done: CorrectionOut = yield call("memory_correct", self.agent_id, memory_id, content)
        return _json({"correction": json.loads(_record(done.correction)), "facts_closed": done.facts_closed})

    def memory_delete(self, memory_id: MemoryId) -> Plan[str]:
        """Forget a memory (it can be brought back until it is purged)."""
        deleted: DeletedMemory = yield call("memory_delete", self.agent_id, memory_id)
        return _json(deleted.model_dump(mode="json"))

    def _who(self, runtime: ToolRuntime[Any, Any]) -> RunIdentity:
        return identify(runtime, user_id=self.user_id, session_id=self.session_id)


def memory_tools(agent_id: str, *, client: MemoryClient | None = None, async_client: AsyncMemoryClient | None = None,
                 user_id: str | None = None, session_id: str | None = None,
                 read_only: bool = False) -> list[BaseTool]:
    """LangChain tools over ``agent_id``'s memories: memory_search and memory_get, and unless
    ``read_only`` memory_write, memory_update, memory_correct and memory_delete (writes need the agent in the
    operator's MEMORY_WRITE_AGENTS). ``client`` runs them in ``invoke``, ``async_client`` in
    ``ainvoke``. ``user_id`` and ``session_id`` are used when the run does not name them."""
    if client is None and async_client is None:
        raise ValueError("give client=MemoryClient(...), async_client=AsyncMemoryClient(...) or both")
    plans = MemoryTools(agent_id, user_id=user_id, session_id=session_id)
    names = READ_TOOLS if read_only else (*READ_TOOLS, "memory_write", "memory_update", "memory_correct",
                                          "memory_delete")
    return [_tool(getattr(plans, name), client, async_client) for name in names]


def _tool(plan: Callable[..., Plan[str]], client: MemoryClient | None,
          async_client: AsyncMemoryClient | None) -> BaseTool:
    name = plan.__name__

    @functools.wraps(plan)
    def func(*args: Any, **kwargs: Any) -> str:
        return _answered(lambda: run(client, plan(*args, **kwargs), needed_for=f"the {name} tool (invoke)"))

    @functools.wraps(plan)
    async def coroutine(*args: Any, **kwargs: Any) -> str:
        try:
            return await arun(async_client, plan(*args, **kwargs), needed_for=f"the {name} tool (ainvoke)")
        except MemoryApiError as exc:
            raise _refusal(exc) from None

    return StructuredTool.from_function(func=func, coroutine=coroutine, name=name, handle_tool_error=True)


def _answered(run_it: Callable[[], str]) -> str:
    try:
        return run_it()
    except MemoryApiError as exc:
        raise _refusal(exc) from None


def _refusal(exc: MemoryApiError) -> Exception:
    """A refusal for the model to read (its input was wrong); an outage is raised as it is."""
    if isinstance(exc, ServerError) or exc.status in (401, 429):
        return exc
    return ToolException(f"{type(exc).__name__} ({exc.status}): {exc.detail}")


def _record(record: MemoryRecord) -> str:
    return _json(record.model_dump(mode="json", include={"id", "kind", "namespace", "content", "title", "tags",
                                                         "confidence", "created_at", "updated_at", "deleted_at"}))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
