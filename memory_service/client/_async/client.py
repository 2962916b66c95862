"""The client of the memory-service HTTP API.

The source of both clients: memory_service/client/_sync/client.py is generated from this
file by scripts/unasync-client (run it after editing; tests/test_client.py checks the two
agree), so docstrings here speak of neither "async" nor "sync".
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import httpx

from memory_service import __version__
from memory_service.client._common import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_MAX_RETRY_WAIT,
    DEFAULT_TIMEOUT,
    UNSET,
    Unset,
    body,
    failure,
    parse,
    patch,
    query_params,
    retry_delay,
    retryable,
    seg,
)
from memory_service.client.tool_models import CorrectionOut, DeletedMemory, MemoryRecord, UncorrectedOut, WriteBlocksOut
from memory_service.domain.models import Agent, BatchMessageIn, LLMBudget, Shard
from memory_service.domain.redaction import RedactionSettings
from memory_service.schemas.audit import AuditPage
from memory_service.schemas.browse import (
    AgentPage,
    AgentSummary,
    MemoryDetail,
    MemoryPage,
    SessionPage,
    SessionSummary,
    UserPage,
    UserSummary,
)
from memory_service.schemas.context import ContextOut
from memory_service.schemas.erasure import ErasureReport, UserExport
from memory_service.schemas.events import DeadLetterPage, Event, WebhookOut
from memory_service.schemas.formation import FormationSummary
from memory_service.schemas.graph import EntityDetailOut, EntityPage, EntitySplitOut, FactOut
from memory_service.schemas.keys import ApiKey, NewKey
from memory_service.schemas.lifecycle import ForgetReport, ReformReport
from memory_service.schemas.records import BatchOut, RecordOut
from memory_service.schemas.search import SearchResult
from memory_service.schemas.startup import DeletedStartupRecord, StartupBlock, StartupRecord
from memory_service.schemas.usage import AgentUsage


class AsyncMemoryClient:
    """A client of one memory-service API.

    ``api_key`` is sent as ``Authorization: Bearer <key>`` (None: no key, for a keyless
    loopback server). Answers of 429 and 503 are retried up to ``max_retries`` times,
    waiting what their Retry-After asks (at most ``max_retry_wait`` seconds a time): a 429
    on every call (a rate limit refuses a request before it runs), a 503 on every call that
    is safe to repeat, which is all of them but ``create_key``, ``memory_write`` and a
    ``startup_block`` in mode first-run or digest. Other
    errors raise at once (memory_service.client.errors). ``http_client`` shares a
    connection pool (the caller closes it); else the client opens its own.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                 max_retries: int = DEFAULT_MAX_RETRIES, max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT,
                 http_client: httpx.AsyncClient | None = None):
        if max_retries < 0 or max_retry_wait < 0:
            raise ValueError("max_retries and max_retry_wait must be at least 0")
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._timeout = timeout
        self._headers = {"User-Agent": f"memory-service-client/{__version__}"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def with_api_key(self, api_key: str | None) -> AsyncMemoryClient:
        """The same API and connection pool, calling with another key (closing it closes nothing)."""
        return AsyncMemoryClient(self.base_url, api_key, timeout=self._timeout, max_retries=self.max_retries,
                                 max_retry_wait=self.max_retry_wait, http_client=self._http)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _send(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                    json: Any = None, idempotent: bool = True) -> httpx.Response:
        attempt = 0
        while True:
            response = await self._http.request(method, self.base_url + path, params=params, json=json,
                                                headers=self._headers)
            if response.status_code < 400:
                return response
            if attempt >= self.max_retries or not retryable(response, idempotent):
                raise failure(response)
            await asyncio.sleep(retry_delay(response, attempt, self.max_retry_wait))
            attempt += 1

    # The session loop.

    async def record(self, session_id: str, *, agent_id: str, user_id: str, role: str, content: str,
                     message_id: str | None = None, created_at: datetime | None = None,
                     incognito: bool = False) -> RecordOut:
        """Record one message. Without ``message_id`` the client makes one, so that a retried
        request is recognised as the same message (the answer carries it)."""
        message = body(agent_id=agent_id, user_id=user_id, role=role, content=content,
                       message_id=message_id or uuid.uuid4().hex,
                       created_at=created_at.isoformat() if created_at else None, incognito=incognito or None)
        answer = await self._send("POST", f"/v1/sessions/{seg(session_id)}/messages", json=message)
        result: RecordOut = parse(RecordOut, answer)
        return result

    async def record_batch(self, agent_id: str, messages: Iterable[BatchMessageIn | Mapping[str, Any]]) -> BatchOut:
        """Record many messages of the agent's sessions in one request: each a BatchMessageIn,
        or a mapping of its fields (session_id, user_id, role, content, message_id,
        created_at, incognito). A message without ``message_id`` gets one here, so that the
        request sent again (a 503 is retried) is recognised. Each message is answered on its
        own in ``items`` (recorded, duplicate, refused, failed), in the order sent; at most
        the server's MAX_BATCH_MESSAGES and MAX_BATCH_BYTES per call."""
        items = []
        for message in messages:
            item = message.model_dump(mode="json", exclude_defaults=True) if isinstance(message, BatchMessageIn) \
                else {name: value.isoformat() if isinstance(value, datetime) else value
                      for name, value in message.items() if value is not None}
            item.setdefault("message_id", uuid.uuid4().hex)
            items.append(item)
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/messages/batch", json={"messages": items})
        result: BatchOut = parse(BatchOut, answer)
        return result

    async def form(self, session_id: str, *, wait: bool = True) -> FormationSummary:
        """Form the session's pending window now; with ``wait``, answer once it is stored."""
        answer = await self._send("POST", f"/v1/sessions/{seg(session_id)}/form", params=query_params(wait=wait))
        result: FormationSummary = parse(FormationSummary, answer)
        return result

    async def session(self, session_id: str) -> dict[str, Any]:
        """The session's gate, formation cursor and pending job."""
        result: dict[str, Any] = (await self._send("GET", f"/v1/sessions/{seg(session_id)}")).json()
        return result

    async def context(self, *, agent_id: str, user_id: str, session_id: str, model: str | None = None,
                      query: str | None = None, budget: int | None = None,
                      as_of: datetime | None = None, context_type: str | None = None,
                      min_score: float | None = None, min_similarity: float | None = None,
                      top_k: int | None = None, scope: str | None = None,
                      host_window: int | None = None) -> ContextOut:
        """The memory block for one model call (``query``: what the model is asked now; ``as_of``:
        its <KnownFacts> are the facts true then). ``context_type`` (chat, task, document),
        ``min_score``, ``min_similarity``, ``top_k`` and ``scope`` (session, user, shared) pick
        its relevant memories, ``host_window`` (how many of the session's latest messages the
        host sends the model itself) leaves those out of them; unset ones come from the agent's
        settings."""
        params = query_params(agent_id=agent_id, user_id=user_id, session_id=session_id, model=model, query=query,
                              budget=budget, as_of=as_of, context_type=context_type, min_score=min_score,
                              min_similarity=min_similarity, top_k=top_k, scope=scope, host_window=host_window)
        result: ContextOut = parse(ContextOut, await self._send("GET", "/v1/context", params=params))
        return result

    async def search(self, agent_id: str, query: str, *, scope: str = "agent", user_id: str | None = None,
                     session_id: str | None = None, shard_id: str | None = None, namespaces: list[str] | None = None,
                     top_k: int | None = None, min_score: float | None = None, kinds: list[str] | None = None,
                     since: datetime | None = None, until: datetime | None = None,
                     tags: list[str] | None = None, as_of: datetime | None = None,
                     include_superseded: bool = False, centrality_weight: float | None = None,
                     activation_weight: float | None = None) -> SearchResult:
        """Search the agent's memories (memory_search): every result explained. ``as_of``: the
        graph signal follows the facts true then; ``include_superseded``: every fact, history too.
        The weights re-rank by structure (docs/graph.md; default: the server's settings)."""
        request = body(query=query, scope=scope, user_id=user_id, session_id=session_id, shard_id=shard_id,
                       namespaces=namespaces, top_k=top_k, min_score=min_score, kinds=kinds,
                       since=since.isoformat() if since else None, until=until.isoformat() if until else None,
                       tags=tags, as_of=as_of.isoformat() if as_of else None,
                       include_superseded=include_superseded or None, centrality_weight=centrality_weight,
                       activation_weight=activation_weight)
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/search", json=request)
        result: SearchResult = parse(SearchResult, answer)
        return result

    # The memory tools (issue 10): an agent reads and curates its own memories.

    async def write_blocks(self, agent_id: str, text: str, *, namespace: str, session_id: str | None = None,
                           message_id: str | None = None) -> WriteBlocksOut:
        """Store the <memory_write>/<shadow_write> blocks of a model's output: observations as
        memories, entities and edges in the knowledge graph (repeatable for the same message)."""
        request = body(text=text, namespace=namespace, session_id=session_id, message_id=message_id)
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/writes/parse", json=request)
        result: WriteBlocksOut = parse(WriteBlocksOut, answer)
        return result

    async def memory_get(self, agent_id: str, memory_id: str) -> MemoryRecord:
        """One memory (counts an access)."""
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/memories/{seg(memory_id)}")
        result: MemoryRecord = parse(MemoryRecord, answer)
        return result

    async def memory_write(self, agent_id: str, *, content: str, namespace: str, kind: str, title: str | None = None,
                           tags: list[str] | None = None, confidence: float | None = None,
                           idempotency_key: str | None = None, expires_at: datetime | None = None) -> MemoryRecord:
        """Write a new memory. Not retried after a 503 (it might have been stored), unless an
        ``idempotency_key`` is given: the same key writes one memory and answers it again.
        ``expires_at`` (with a time zone, ahead): from then on it is skipped by search, the
        memory block and browse, and the retention job purges it (docs/expiry.md)."""
        request = body(content=content, namespace=namespace, kind=kind, title=title, tags=tags, confidence=confidence,
                       idempotency_key=idempotency_key, expires_at=expires_at.isoformat() if expires_at else None)
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/memories", json=request,
                                  idempotent=idempotency_key is not None)
        result: MemoryRecord = parse(MemoryRecord, answer)
        return result

    async def memory_update(self, agent_id: str, memory_id: str, *, content: str | Unset = UNSET,
                            title: str | None | Unset = UNSET, tags: list[str] | None | Unset = UNSET,
                            confidence: float | None | Unset = UNSET, kind: str | Unset = UNSET,
                            expires_at: datetime | None | Unset = UNSET) -> MemoryRecord:
        """Change the fields given; the others stay. ``title``, ``confidence``, ``tags`` or
        ``expires_at`` None clears it (a memory without ``expires_at`` never expires)."""
        when = expires_at.isoformat() if isinstance(expires_at, datetime) else expires_at
        request = patch(content=content, title=title, tags=tags, confidence=confidence, kind=kind, expires_at=when)
        answer = await self._send("PATCH", f"/v1/agents/{seg(agent_id)}/memories/{seg(memory_id)}", json=request)
        result: MemoryRecord = parse(MemoryRecord, answer)
        return result

    async def memory_delete(self, agent_id: str, memory_id: str) -> DeletedMemory:
        """Soft-delete a memory until its purge date (a second delete answers the same dates)."""
        answer = await self._send("DELETE", f"/v1/agents/{seg(agent_id)}/memories/{seg(memory_id)}")
        result: DeletedMemory = parse(DeletedMemory, answer)
        return result

    async def memory_undelete(self, agent_id: str, memory_id: str) -> MemoryRecord:
        """Bring back a soft-deleted memory before its purge date."""
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/memories/{seg(memory_id)}/undelete")
        result: MemoryRecord = parse(MemoryRecord, answer)
        return result

    async def memory_forget(self, agent_id: str, memory_id: str, *, mode: str = "soft") -> ForgetReport:
        """Forget a message or a memory with everything formed from it (docs/forget.md):
        ``soft`` (undone by ``memory_undelete``) or ``hard`` (for good; needs an admin key).
        Asked again after a failure, it finishes the forget."""
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/memories/{seg(memory_id)}/forget",
                                  json={"mode": mode})
        result: ForgetReport = parse(ForgetReport, answer)
        return result

    async def reform(self, agent_id: str, *, user_id: str | None = None, session_id: str | None = None,
                     since: datetime | None = None, dry_run: bool = False, run_id: str | None = None,
                     limit: int | None = None) -> ReformReport:
        """Re-form the agent's formed windows (a user's, a session's; formed since a time) with
        the extractor configured now (docs/reform.md); the same ``run_id`` resumes a run."""
        request = body(user_id=user_id, session_id=session_id, since=since.isoformat() if since else None,
                       dry_run=dry_run or None, run_id=run_id, limit=limit)
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/reform", json=request)
        result: ReformReport = parse(ReformReport, answer)
        return result

    async def memory_correct(self, agent_id: str, memory_id: str, content: str, *, title: str | None = None,
                             tags: list[str] | None = None) -> CorrectionOut:
        """The memory was wrong (not outdated: that is ``memory_update``): a new memory with
        ``content`` replaces it, the old one is kept as history and its graph facts close as
        wrong. ``title``/``tags``: new ones (left out: the memory's). Undo: ``memory_uncorrect``."""
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/memories/{seg(memory_id)}/correct",
                                  json=body(content=content, title=title, tags=tags))
        result: CorrectionOut = parse(CorrectionOut, answer)
        return result

    async def memory_uncorrect(self, agent_id: str, memory_id: str) -> UncorrectedOut:
        """Undo the correction of ``memory_id`` (the memory corrected): live again, the correction
        soft-deleted, its closed facts current again."""
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/memories/{seg(memory_id)}/uncorrect")
        result: UncorrectedOut = parse(UncorrectedOut, answer)
        return result

    # Browsing what the service holds: agents, users, sessions and memories, page by page.
    # Each list answers a page and its ``next`` cursor; the ``iter_*`` helpers follow it.

    async def list_agents(self, *, cursor: str | None = None, limit: int | None = None) -> AgentPage:
        """One page of the agents this key reaches, by id."""
        answer = await self._send("GET", "/v1/agents", params=query_params(cursor=cursor, limit=limit))
        result: AgentPage = parse(AgentPage, answer)
        return result

    async def list_users(self, agent_id: str, *, cursor: str | None = None, limit: int | None = None) -> UserPage:
        """One page of the agent's users (those this key sees), by id."""
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/users",
                                  params=query_params(cursor=cursor, limit=limit))
        result: UserPage = parse(UserPage, answer)
        return result

    async def list_sessions(self, agent_id: str, *, user_id: str | None = None, cursor: str | None = None,
                            limit: int | None = None) -> SessionPage:
        """One page of the agent's sessions (``user_id``: the user's), newest first, each with its
        formation gate, cursor, pending window and last activity."""
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/sessions",
                                  params=query_params(user_id=user_id, cursor=cursor, limit=limit))
        result: SessionPage = parse(SessionPage, answer)
        return result

    async def list_memories(self, agent_id: str, *, namespace: str | None = None, user_id: str | None = None,
                            session_id: str | None = None, kinds: Sequence[str] = (), tags: Sequence[str] = (),
                            since: datetime | None = None, until: datetime | None = None, state: str | None = None,
                            cursor: str | None = None, limit: int | None = None) -> MemoryPage:
        """One page of the agent's memories, newest first, filtered (``state``: live, deleted,
        evicted or all); pass the page's ``next`` as ``cursor``, with the same filters."""
        params = query_params(namespace=namespace, user_id=user_id, session_id=session_id, kind=list(kinds) or None,
                              tag=list(tags) or None, since=since, until=until, state=state, cursor=cursor,
                              limit=limit)
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/memories", params=params)
        result: MemoryPage = parse(MemoryPage, answer)
        return result

    async def memory_detail(self, agent_id: str, memory_id: str) -> MemoryDetail:
        """One memory with its provenance (messages, window, extractor), access count and history
        (not counted as an access)."""
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/memories/{seg(memory_id)}/detail")
        result: MemoryDetail = parse(MemoryDetail, answer)
        return result

    async def iter_agents(self, *, page_size: int | None = None) -> AsyncIterator[AgentSummary]:
        """Every agent this key reaches, following the pages."""
        cursor: str | None = None
        while True:
            page = await self.list_agents(cursor=cursor, limit=page_size)
            for agent in page.agents:
                yield agent
            if (cursor := page.next) is None:
                return

    async def iter_users(self, agent_id: str, *, page_size: int | None = None) -> AsyncIterator[UserSummary]:
        """Every user of the agent this key sees, following the pages."""
        cursor: str | None = None
        while True:
            page = await self.list_users(agent_id, cursor=cursor, limit=page_size)
            for user in page.users:
                yield user
            if (cursor := page.next) is None:
                return

    async def iter_sessions(self, agent_id: str, *, user_id: str | None = None,
                            page_size: int | None = None) -> AsyncIterator[SessionSummary]:
        """Every session of the agent this key sees (newest first), following the pages."""
        cursor: str | None = None
        while True:
            page = await self.list_sessions(agent_id, user_id=user_id, cursor=cursor, limit=page_size)
            for session in page.sessions:
                yield session
            if (cursor := page.next) is None:
                return

    async def iter_memories(self, agent_id: str, *, namespace: str | None = None, user_id: str | None = None,
                            session_id: str | None = None, kinds: Sequence[str] = (), tags: Sequence[str] = (),
                            since: datetime | None = None, until: datetime | None = None, state: str | None = None,
                            page_size: int | None = None) -> AsyncIterator[MemoryRecord]:
        """Every memory of the agent matching the filters (newest first), following the pages:
        each one once, also while memories are added meanwhile."""
        cursor: str | None = None
        while True:
            page = await self.list_memories(agent_id, namespace=namespace, user_id=user_id, session_id=session_id,
                                            kinds=kinds, tags=tags, since=since, until=until, state=state,
                                            cursor=cursor, limit=page_size)
            for memory in page.memories:
                yield memory
            if (cursor := page.next) is None:
                return

    # The knowledge graph (issue 16): entities, their facts, undoing an invalidation.

    async def list_entities(self, agent_id: str, *, namespace: str | None = None, user_id: str | None = None,
                            type: str | None = None, name: str | None = None, cursor: str | None = None,
                            limit: int | None = None) -> EntityPage:
        """One page of the agent's entities, by name; pass the page's ``next`` as ``cursor`` for the next."""
        params = query_params(namespace=namespace, user_id=user_id, type=type, name=name, cursor=cursor, limit=limit)
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/entities", params=params)
        result: EntityPage = parse(EntityPage, answer)
        return result

    async def get_entity(self, agent_id: str, entity_id: str, *, as_of: datetime | None = None,
                         include_superseded: bool = False, cursor: str | None = None,
                         limit: int | None = None) -> EntityDetailOut:
        """One entity with one page of its current facts (those true ``as_of``; all with
        ``include_superseded``), oldest first, the neighbours they link it to and the totals;
        pass the page's ``next`` as ``cursor`` for the next page (``iter_facts`` walks them)."""
        params = query_params(as_of=as_of, include_superseded=include_superseded or None, cursor=cursor, limit=limit)
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/entities/{seg(entity_id)}", params=params)
        result: EntityDetailOut = parse(EntityDetailOut, answer)
        return result

    async def iter_facts(self, agent_id: str, entity_id: str, *, as_of: datetime | None = None,
                         include_superseded: bool = False, page_size: int | None = None) -> AsyncIterator[FactOut]:
        """Every fact of the entity (oldest first), following the pages: each one once."""
        cursor: str | None = None
        while True:
            page = await self.get_entity(agent_id, entity_id, as_of=as_of, include_superseded=include_superseded,
                                         cursor=cursor, limit=page_size)
            for fact in page.facts:
                yield fact
            if (cursor := page.next) is None:
                return

    async def restore_fact(self, agent_id: str, fact_id: str) -> FactOut:
        """Undo the invalidation of a fact: it is current again (a current fact raises Conflict)."""
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/facts/{seg(fact_id)}/restore")
        result: FactOut = parse(FactOut, answer)
        return result

    async def split_entity(self, agent_id: str, entity_id: str, alias: str) -> EntitySplitOut:
        """Undo a merge: ``alias`` becomes an entity of its own again, with the facts and
        mentions that came through it (a name that is not an alias raises InvalidInput, the
        entity's own name Conflict)."""
        answer = await self._send("POST", f"/v1/agents/{seg(agent_id)}/entities/{seg(entity_id)}/split",
                                  json={"alias": alias})
        result: EntitySplitOut = parse(EntitySplitOut, answer)
        return result

    # Agents and shards.

    async def put_agent(self, agent_id: str, *, memory_backend: str | None = None,
                        agent_extras: dict[str, Any] | None = None,
                        users_join_sessions: bool | None = None,
                        redaction: RedactionSettings | Mapping[str, Any] | None = None,
                        llm_budget: LLMBudget | Mapping[str, Any] | None = None,
                        memory_ttl: dict[str, int | str] | None = None) -> Agent:
        """Create or replace the agent's settings (a setting not given takes its default:
        ``users_join_sessions`` off, keys limited to some users record only into sessions
        their users took part in; ``redaction`` unset, the server's REDACTION_MODE and
        REDACTION_KINDS: secrets redacted, docs/redaction.md; no ``llm_budget`` of its own;
        no ``memory_ttl``). ``llm_budget``: tokens per UTC day and month and ``when_spent``
        (docs/llm-budgets.md). ``memory_ttl``: a time to live per memory kind, seconds or a
        text like ``"90d"`` (docs/expiry.md)."""
        if isinstance(redaction, RedactionSettings):
            redaction = redaction.model_dump(mode="json", exclude_none=True)
        budget = llm_budget.model_dump() if isinstance(llm_budget, LLMBudget) else \
            dict(llm_budget) if llm_budget is not None else None
        request = body(memory_backend=memory_backend, agent_extras=agent_extras,
                       users_join_sessions=users_join_sessions, redaction=redaction, llm_budget=budget,
                       memory_ttl=memory_ttl)
        result: Agent = parse(Agent, await self._send("PUT", f"/v1/agents/{seg(agent_id)}", json=request))
        return result

    async def get_agent(self, agent_id: str) -> Agent:
        result: Agent = parse(Agent, await self._send("GET", f"/v1/agents/{seg(agent_id)}"))
        return result

    async def usage(self, agent_id: str) -> AgentUsage:
        """The agent's LLM usage today and this month (UTC) against its budgets and the
        deployment's caps (docs/llm-budgets.md). Needs ``read`` for all the agent's users."""
        result: AgentUsage = parse(AgentUsage, await self._send("GET", f"/v1/agents/{seg(agent_id)}/usage"))
        return result

    async def put_shard(self, agent_id: str, shard_id: str, *, name: str, extraction_focus: str | None = None,
                        active: bool | None = None, memory_ttl: int | str | None = None) -> Shard:
        """Create or replace a shard (a topic the agent keeps facts and suggestions on);
        ``memory_ttl``: how long its memories live, seconds or a text like ``"12h"`` (docs/expiry.md)."""
        request = body(name=name, extraction_focus=extraction_focus, active=active, memory_ttl=memory_ttl)
        answer = await self._send("PUT", f"/v1/agents/{seg(agent_id)}/shards/{seg(shard_id)}", json=request)
        result: Shard = parse(Shard, answer)
        return result

    async def list_shards(self, agent_id: str) -> list[Shard]:
        result: list[Shard] = parse(list[Shard], await self._send("GET", f"/v1/agents/{seg(agent_id)}/shards"))
        return result

    # Startup records (docs/startup-records.md).

    async def put_startup_record(self, agent_id: str, record_id: str, *, priority: str, title: str,
                                 content: str) -> StartupRecord:
        """Create or replace a startup record (``priority`` P0 identity, P1 operating rules, P2
        behaviour, P3 reference). The same record again changes nothing, so it is retried."""
        request = body(priority=priority, title=title, content=content)
        answer = await self._send("PUT", f"/v1/agents/{seg(agent_id)}/startup/{seg(record_id)}", json=request)
        result: StartupRecord = parse(StartupRecord, answer)
        return result

    async def list_startup_records(self, agent_id: str) -> list[StartupRecord]:
        """The agent's startup records, by priority then id."""
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/startup")
        result: list[StartupRecord] = parse(list[StartupRecord], answer)
        return result

    async def delete_startup_record(self, agent_id: str, record_id: str) -> DeletedStartupRecord:
        """Delete a startup record; ``deleted`` says whether there was one (a second delete: False)."""
        answer = await self._send("DELETE", f"/v1/agents/{seg(agent_id)}/startup/{seg(record_id)}")
        result: DeletedStartupRecord = parse(DeletedStartupRecord, answer)
        return result

    async def startup_block(self, agent_id: str, *, model: str | None = None, session_id: str | None = None,
                            mode: str | None = None) -> StartupBlock:
        """The startup records for one model call, within ``model``'s budget. ``mode``: always (the
        default), first-run or digest (both need ``session_id``; ``sent`` says whether the session
        gets the records now). In those two modes the call remembers what it sent, so it is not
        retried after a 503: a repeat could answer ``sent: false`` for records the model never got."""
        params = query_params(model=model, session_id=session_id, mode=mode)
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/startup/block", params=params,
                                  idempotent=mode in (None, "always"))
        result: StartupBlock = parse(StartupBlock, answer)
        return result

    # Keys, audit, users.

    async def create_key(self, *, name: str, role: Literal["read", "write", "admin"], agents: list[str] | None = None,
                         users: list[str] | None = None, requests_per_minute: int | None = None,
                         tokens_per_minute: int | None = None) -> NewKey:
        """Make a key (the answer holds it, this once). Not retried after a 503: it might have been made."""
        request = body(name=name, role=role, agents=agents, users=users, requests_per_minute=requests_per_minute,
                       tokens_per_minute=tokens_per_minute)
        result: NewKey = parse(NewKey, await self._send("POST", "/v1/keys", json=request, idempotent=False))
        return result

    async def list_keys(self) -> list[ApiKey]:
        result: list[ApiKey] = parse(list[ApiKey], await self._send("GET", "/v1/keys"))
        return result

    async def revoke_key(self, key_id: str) -> ApiKey:
        result: ApiKey = parse(ApiKey, await self._send("DELETE", f"/v1/keys/{seg(key_id)}"))
        return result

    async def audit(self, *, agent_id: str | None = None, action: str | None = None, key_id: str | None = None,
                    user_id: str | None = None, since: datetime | None = None, until: datetime | None = None,
                    before: str | None = None, limit: int | None = None) -> AuditPage:
        """A page of the audit log, newest first; pass the page's ``next`` as ``before`` for older ones.
        ``user_id`` (with ``agent_id``): the entries naming that user (the log keeps a keyed digest)."""
        params = query_params(agent_id=agent_id, action=action, key_id=key_id, user_id=user_id, since=since,
                              until=until, before=before, limit=limit)
        result: AuditPage = parse(AuditPage, await self._send("GET", "/v1/audit", params=params))
        return result

    async def erase_user(self, agent_id: str, user_id: str) -> ErasureReport:
        """Erase everything of the user with the agent (a second call reports zeros)."""
        answer = await self._send("DELETE", f"/v1/agents/{seg(agent_id)}/users/{seg(user_id)}")
        result: ErasureReport = parse(ErasureReport, answer)
        return result

    async def export_user(self, agent_id: str, user_id: str) -> UserExport:
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/users/{seg(user_id)}/export")
        result: UserExport = parse(UserExport, answer)
        return result

    # Change events (docs/events.md): the agent's stream, and webhooks.

    async def events(self, agent_id: str, *, after: str | None = None,
                     timeout: float | None = None) -> AsyncIterator[Event]:
        """The agent's change events as they happen, until the server ends the stream (after
        EVENTS_SSE_MAX_SECONDS, or ``timeout``); resume with ``after`` = the last event's id.
        ``after`` omitted: from now on; "0-0": every event the stream still holds."""
        async with self._http.stream("GET", f"{self.base_url}/v1/agents/{seg(agent_id)}/events",
                                     params=query_params(after=after, timeout=timeout), headers=self._headers,
                                     timeout=httpx.Timeout(self._timeout, read=None)) as response:
            if response.status_code >= 400:
                await response.aread()
                raise failure(response)
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    yield Event.model_validate_json(line[len("data: "):])

    async def put_webhook(self, agent_id: str, webhook_id: str, *, url: str, secret: str) -> WebhookOut:
        """Create or replace a webhook (an admin key for all users); its secret signs each delivery."""
        answer = await self._send("PUT", f"/v1/agents/{seg(agent_id)}/webhooks/{seg(webhook_id)}",
                                  json={"url": url, "secret": secret})
        result: WebhookOut = parse(WebhookOut, answer)
        return result

    async def get_webhook(self, agent_id: str, webhook_id: str) -> WebhookOut:
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/webhooks/{seg(webhook_id)}")
        result: WebhookOut = parse(WebhookOut, answer)
        return result

    async def list_webhooks(self, agent_id: str) -> list[WebhookOut]:
        result: list[WebhookOut] = parse(list[WebhookOut], await self._send("GET", f"/v1/agents/{seg(agent_id)}/webhooks"))
        return result

    async def delete_webhook(self, agent_id: str, webhook_id: str) -> None:
        await self._send("DELETE", f"/v1/agents/{seg(agent_id)}/webhooks/{seg(webhook_id)}")

    async def webhook_dead_letters(self, agent_id: str, webhook_id: str) -> DeadLetterPage:
        """The events the worker gave up delivering to the webhook, oldest first."""
        answer = await self._send("GET", f"/v1/agents/{seg(agent_id)}/webhooks/{seg(webhook_id)}/dead-letters")
        result: DeadLetterPage = parse(DeadLetterPage, answer)
        return result

    async def replay_dead_letter(self, agent_id: str, webhook_id: str, event_id: str) -> None:
        """Have the worker deliver the dead letter once more."""
        await self._send("POST", f"/v1/agents/{seg(agent_id)}/webhooks/{seg(webhook_id)}/dead-letters/"
                                 f"{seg(event_id)}/replay")

    async def drop_dead_letter(self, agent_id: str, webhook_id: str, event_id: str) -> None:
        await self._send("DELETE", f"/v1/agents/{seg(agent_id)}/webhooks/{seg(webhook_id)}/dead-letters/{seg(event_id)}")

    # Operations.

    async def health(self, *, detail: bool = False) -> dict[str, Any]:
        """Readiness (``detail``: each dependency, an operator key). A 503 raises ServiceUnavailable."""
        answer = await self._send("GET", "/health", params=query_params(detail=detail or None))
        result: dict[str, Any] = answer.json()
        return result

    async def metrics(self) -> str:
        """The Prometheus counters (an operator key)."""
        return (await self._send("GET", "/metrics")).text
