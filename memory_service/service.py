"""MemoryService: the one entry point. The HTTP API, the CLI and the worker call it.

A thin facade over the parts, each readable alone:

- ``backends.registry.BackendRegistry``: named backend factories, each built once;
- ``stores.agents.AgentDirectory``: agents' and shards' settings, and which backend serves an agent;
- ``ingest.sessions.SessionLedger``: recording messages;
- ``formation.schedule.FormationSchedule``: the gates, claiming windows and enqueueing their formation;
- ``formation.pipeline.FormationPipeline``: the worker's jobs (forming, consolidating, sweeping, embedding);
- ``recall.assembler.ContextAssembler``: the memory block of one model call;
- ``recall.search.Retriever``: search;
- ``access.keys.KeyStore`` and ``access.audit.AuditLog``: API keys and the log of changes;
- ``curation.tools.MemoryTools`` and ``curation.retention.Retention``: the agent's memory tools, the daily purge;
- ``curation.erasure.Eraser``: erasing and exporting a user.

The HTTP routes reach the service through these methods only, never through the parts
(tests/test_http_layer.py checks; the MCP server is a client of the API): a route
authenticates and authorizes the caller, then calls one method. A change made for an API
key names the key as ``actor``, and the facade writes its audit entry; callers inside the
process (the CLI, the worker, tests) pass no actor and write none, as the parts alone
never did.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import Any

from memory_service.access.agent_limits import AgentLimits
from memory_service.access.audit import AuditLog, audited_fact
from memory_service.access.authorization import authorize_session
from memory_service.access.cursors import Cursors, position_field
from memory_service.access.keys import KeyStore, Principal
from memory_service.access.pseudonyms import Pseudonyms
from memory_service.access.reach import Reach
from memory_service.backends import readiness
from memory_service.backends.agents import AgentDirectory
from memory_service.backends.base import MemoryBackend, MemoryState
from memory_service.backends.registry import BackendFactory, BackendRegistry
from memory_service.config import Settings
from memory_service.curation.browse import BROWSE_INDEX_VERSION, Browser
from memory_service.curation.corrections import Corrections, MemoryCorrection
from memory_service.curation.erasure import Eraser
from memory_service.curation.forget import Forgetter
from memory_service.curation.legacy_import import ImportPlan, ImportReport, Progress, apply_import, plan_import
from memory_service.curation.migration import MigrationReport, migrate_agent
from memory_service.curation.reform import WindowReformer
from memory_service.curation.reformation import Reformation, ReformProgress
from memory_service.curation.removal import Removal
from memory_service.curation.retention import PurgeReport, Retention, RetentionIndex
from memory_service.curation.tools import MemoryTools, MemoryUpdate, MemoryWrite, NamespaceGuard
from memory_service.curation.write_blocks import WRITE_BLOCKS_ACTOR, store_write_blocks
from memory_service.domain.errors import Conflict, Forbidden, InvalidInput, NotFound
from memory_service.domain.graph import EntityType
from memory_service.domain.models import (
    Agent,
    AgentSettings,
    BatchMessageIn,
    ContextType,
    Memory,
    MemoryKind,
    MessageIn,
    Recall,
    RefusedItem,
    Shard,
    ShardIn,
)
from memory_service.domain.namespaces import Namespace, NamespaceKind, checks_ids
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.fresh import FreshVectors
from memory_service.embedding.reembed import Reembedder, ReembedProgress, ReembedReport
from memory_service.events.delivery import Delivery
from memory_service.events.log import Cause, Changed, EventLog, Visibility
from memory_service.events.sse import EventStreams
from memory_service.events.webhooks import Webhooks
from memory_service.formation.budgets import UsageLedger
from memory_service.formation.consolidation import Consolidator, RuleBasedConsolidator
from memory_service.formation.extractor import Extractor
from memory_service.formation.gates import CHARS_PER_TOKEN
from memory_service.formation.jobs import QUEUE_NAME, JobQueue
from memory_service.formation.pipeline import FormationPipeline
from memory_service.formation.schedule import FormationSchedule
from memory_service.ingest.batch import BatchLedger, BatchProgress
from memory_service.ingest.sessions import RecordResult, SessionLedger
from memory_service.recall.assembler import ContextAssembler
from memory_service.recall.render import RenderedContext
from memory_service.recall.rerank import Reranker
from memory_service.recall.search import Retriever, SearchRequest
from memory_service.schemas.audit import AuditPage
from memory_service.schemas.browse import AgentPage, MemoryDetail, MemoryPage, SessionPage, UserPage
from memory_service.schemas.erasure import ErasureReport, UserExport
from memory_service.schemas.events import DeadLetterPage, Event, EventType, WebhookIn, WebhookOut
from memory_service.schemas.formation import FormationSummary, GateStatus
from memory_service.schemas.graph import (
    DEFAULT_FACT_PAGE,
    MAX_FACT_PAGE,
    EntityDetailOut,
    EntityOut,
    EntityPage,
    EntitySplitOut,
    FactOut,
)
from memory_service.schemas.keys import ApiKey, KeyIn, NewKey, Role
from memory_service.schemas.lifecycle import ForgetMode, ForgetReport, ReformIn, ReformReport
from memory_service.schemas.memories import CorrectionOut, DeletedOut, MemoryRecord, UncorrectedOut, WriteBlocksOut
from memory_service.schemas.records import BatchOut
from memory_service.schemas.search import SearchResult
from memory_service.schemas.startup import StartupBlock, StartupMode, StartupRecord, StartupRecordIn
from memory_service.schemas.usage import AgentUsage
from memory_service.state import keyspace, metrics, tracing
from memory_service.state.store import StateStore

__all__ = ["MemoryService", "RecordResult"]


@checks_ids  # ids enter here in process: every method checks its id arguments, the parts take them checked
class MemoryService:
    def __init__(self, settings: Settings, state: StateStore, extractor: Extractor, queue: JobQueue,
                 consolidator: Consolidator | None = None, embedder: Embedder | None = None,
                 reranker: Reranker | None = None):
        self.settings = settings
        self.state = state
        self.extractor = extractor
        self.queue = queue
        self.consolidator = consolidator or RuleBasedConsolidator()
        self.embedder = embedder
        self.registry = BackendRegistry(settings)
        self.reranker = reranker
        self.retriever = Retriever(settings, state, embedder, reranker)
        self.agents = AgentDirectory(settings, state, self.registry)
        self.formation = FormationSchedule(settings, state, queue, extractor.name)
        # A live session's user message is embedded as it is recorded, for its block (embedding/fresh.py).
        self.fresh = FreshVectors(embedder, settings.context_embed_on_record, state)
        self.sessions = SessionLedger(settings, state, queue, self.agents, embedder, self.formation, self.fresh)
        self.batches = BatchLedger(self.sessions)
        self.assembler = ContextAssembler(settings, state, self.agents, self.retriever, self.fresh)
        operator_key = settings.operator_api_key.get_secret_value() if settings.operator_api_key else None
        self.keys = KeyStore(state.redis, settings.rate_limit_requests_per_minute, settings.rate_limit_tokens_per_minute,
                             operator_key)
        self.agent_limits = AgentLimits(state.redis, settings.agent_requests_per_minute,
                                        settings.agent_tokens_per_minute)
        digest_key = settings.user_digest_key.get_secret_value() if settings.user_digest_key else None
        self.pseudonyms = Pseudonyms(state.redis, digest_key)
        self.audit = AuditLog(state.redis, self.pseudonyms)
        # Change events (memory_service/events/): appended where memories change, delivered to webhooks.
        self.events = EventLog(state.redis, settings.events_stream_maxlen)
        self.webhooks = Webhooks(state.redis, settings.webhook_allow_private, settings.webhook_max_per_agent)
        self.delivery = Delivery(settings, state.redis, self.events, self.webhooks)
        self.event_streams = EventStreams(settings, self.events)
        # The worker's formation logs the facts it closes (``fact.invalidate``) in the same log.
        # LLM usage per agent and period, and the budgets' reservations (memory_service/formation/budgets.py).
        self.usage_ledger = UsageLedger(state.redis, tokens_per_day=settings.llm_tokens_per_day,
                                        tokens_per_month=settings.llm_tokens_per_month)
        self.pipeline = FormationPipeline(settings, state, queue, self.registry, self.agents, self.formation,
                                          extractor, self.consolidator, embedder, self.audit, self.usage_ledger,
                                          self.events)
        self.eraser = Eraser(state, queue, self.registry, self.agents, self.keys, self.audit, self.events,
                             self.webhooks)
        self.startup = self.assembler.startup  # startup records (memory_service/recall/startup.py)
        self.retention_index = RetentionIndex(state)
        self.tools = MemoryTools(settings, state, self.agents, self.retention_index, embedder)
        self.corrections = Corrections(self.tools)
        self.retention = Retention(settings, state, self.agents, self.retention_index, self.eraser.redis_side,
                                   self.audit, self.events, self.webhooks)
        # Forgetting with everything formed from it, and re-forming windows (curation/forget.py, reform.py).
        self.reformer = WindowReformer(state, Removal(state, self.eraser.redis_side), self.retention_index, self.audit,
                                       self.events, embedder)
        self.forgetter = Forgetter(state, self.agents, self.tools, self.retention_index, self.eraser.redis_side,
                                   self.pipeline.extractor, self.audit, self.events, self.webhooks, self.reformer)
        self.reformation = Reformation(state, self.agents, self.reformer, self.pipeline.extractor, self.audit)
        self.cursors = Cursors(self.pseudonyms)
        self.browser = Browser(settings, state, self.agents, self.tools, self.retention_index, self.audit,
                               self.cursors)

    def register_backend(self, name: str, factory: BackendFactory) -> None:
        self.registry.register(name, factory)

    async def close(self) -> None:
        await self.event_streams.close()
        await self.assembler.close()
        await self.fresh.close()
        await self.registry.close()
        await self.queue.close()
        await self.state.close()
        for llm_user in (self.extractor, self.consolidator, self.embedder, self.reranker):
            if aclose := getattr(llm_user, "aclose", None):
                await aclose()

    # Access: who calls, what it may see, its API keys, the audit log (memory_service/access/)
    async def authenticate(self, token: str) -> Principal | str:
        """The principal of an API key, counting one request against its rate limit; else why not."""
        return await self.keys.authenticate(token)

    async def any_key(self) -> bool:
        """Whether any API key (or OPERATOR_API_KEY) exists to call with."""
        return await self.keys.any_key()

    async def charge_tokens(self, principal: Principal, text: str, agent_id: str | None = None) -> None:
        """Count the tokens of ``text`` (estimated from its length) against ``agent_id``'s limit
        (memory_service/access/agent_limits.py), then the key's; RateLimited when spent."""
        tokens = math.ceil(len(text) / CHARS_PER_TOKEN)
        if agent_id is not None:
            await self.agent_limits.charge_tokens(agent_id, tokens)
        await self.keys.charge_tokens(principal, tokens)

    @property
    def counts_agent_requests(self) -> bool:
        """Whether agents' requests per minute are limited (AGENT_REQUESTS_PER_MINUTE)."""
        return self.agent_limits.counts_requests

    async def charge_request(self, agent_id: str) -> None:
        """Count one request against ``agent_id``'s requests per minute (every key, every
        replica); RateLimited when spent."""
        await self.agent_limits.charge_request(agent_id)

    def reach(self, principal: Principal, agent_id: str) -> Reach:
        """What ``principal`` may see of ``agent_id``'s memory (memory_service/access/reach.py): the rule
        every route applies once ``authorize`` let the key reach the agent."""
        return Reach.of(self.state, agent_id, principal.users)

    async def authorize_session(self, principal: Principal, session_id: str, role: Role) -> None:
        """``principal`` may act as ``role`` on the session, by the agent that owns it; else 404 or 403
        (memory_service/access/authorization.py)."""
        await authorize_session(self.state, principal, session_id, role)

    async def create_key(self, spec: KeyIn, actor: str) -> NewKey:
        """A new API key (the answer holds its secret, shown this once); audited as ``key.create``."""
        created = await self.keys.create(spec, created_by=actor)
        record = ApiKey.model_validate(created.model_dump(exclude={"key"}))
        await self.audit.append_each(actor, "key.create", spec.agents, created.key_id, after=record.model_dump(mode="json"))
        return created

    async def list_keys(self, principal: Principal) -> list[ApiKey]:
        """The keys within ``principal``'s scope, newest first (never their secrets)."""
        return await self.keys.list(principal)

    async def revoke_key(self, key_id: str, principal: Principal) -> ApiKey:
        """Revoke a key within ``principal``'s scope (idempotent; audited as ``key.revoke`` when it
        changed). A key out of its reach is answered as an unknown one."""
        try:
            key = await self.keys.get(key_id)
        except NotFound:
            raise NotFound(f"no key {key_id[:40]!r}") from None
        if not principal.covers(key):
            raise NotFound(f"no key {key_id[:40]!r}")
        revoked, changed = await self.keys.revoke(key_id)
        if changed:
            await self.audit.append_each(principal.key_id, "key.revoke", key.agents, key_id,
                                         before=key.model_dump(mode="json"), after=revoked.model_dump(mode="json"))
        return revoked

    async def audit_page(self, agent_id: str | None, *, action: str | None = None, key_id: str | None = None,
                         user_id: str | None = None, since: datetime | None = None, until: datetime | None = None,
                         before: str | None = None, limit: int = 100) -> AuditPage:
        """One page of the audit log, newest first (``AuditLog.read``; ``agent_id`` None: the system's)."""
        return await self.audit.read(agent_id, action=action, key_id=key_id, user_id=user_id, since=since,
                                     until=until, before=before, limit=limit)

    # Agents and shards
    async def put_agent(self, agent_id: str, settings: AgentSettings, actor: str | None = None) -> Agent:
        before, agent = await self.agents.replace_agent(agent_id, settings)
        if actor is not None:
            await self.audit.append(actor, "agent.put", agent_id, agent_id,
                                    before=before.model_dump(mode="json") if before else None,
                                    after=agent.model_dump(mode="json"))
        return agent

    async def get_agent(self, agent_id: str) -> Agent:
        return await self.agents.get_agent(agent_id)

    async def agent_usage(self, agent_id: str) -> AgentUsage:
        """The agent's LLM usage today and this month against its budgets (any agent id: an
        agent without settings or usage has none)."""
        return await self.usage_ledger.usage(agent_id, await self.pipeline.llm_budget(agent_id))

    async def put_shard(self, agent_id: str, shard_id: str, shard: ShardIn, actor: str | None = None) -> tuple[Shard, bool]:
        """Create or replace a shard: (the shard now, whether it was created)."""
        before, stored = await self.agents.replace_shard(agent_id, shard_id, shard)
        if actor is not None:
            await self.audit.append(actor, "shard.put", agent_id, shard_id,
                                    before=before.model_dump(mode="json") if before else None,
                                    after=stored.model_dump(mode="json"))
        return stored, before is None

    async def list_shards(self, agent_id: str) -> list[Shard]:
        return await self.agents.list_shards(agent_id)

    async def migrate_agent(self, agent_id: str, to: str, *, dry_run: bool = False,
                            on_namespace: Callable[[Namespace, int], None] | None = None,
                            on_copied: Callable[[int], None] | None = None, actor: str | None = None) -> MigrationReport:
        """Copy the agent's memories to backend ``to``, verify, and switch it (memory_service/curation/migration.py);
        audited as ``agent.migrate`` for ``actor``."""
        report = await migrate_agent(self.agents, agent_id, to, dry_run=dry_run, on_namespace=on_namespace,
                                     on_copied=on_copied)
        if actor is not None and not dry_run:
            await self.audit.append(actor, "agent.migrate", agent_id, agent_id, before={"backend": report.source},
                                    after={"backend": report.target, "memories": report.total, "copied": report.copied})
        return report

    # Sessions
    async def record_message(self, session_id: str, message: MessageIn, reach: Reach | None = None) -> RecordResult:
        with metrics.timed("record"), tracing.span("memory_service.record"):
            return await self.sessions.record_message(session_id, message, reach)

    async def record_batch(self, agent_id: str, messages: Sequence[BatchMessageIn | RefusedItem],
                           principal: Principal | None = None, progress: BatchProgress | None = None) -> BatchOut:
        """Record many messages of ``agent_id``'s sessions at once, each as ``record_message``
        would, each answered on its own (memory_service/ingest/batch.py). For ``principal``
        the batch's tokens are charged first (RateLimited: nothing is recorded) and its
        ``Reach`` applies to each session; its role and users are the caller's to check
        (``authorize_users``), and the messages it refused come in as RefusedItem. ``progress``
        holds the answers as they are given (for an answer cut short)."""
        if principal is not None:
            tokens = sum(math.ceil(len(m.content) / CHARS_PER_TOKEN) for m in messages if isinstance(m, BatchMessageIn))
            await self.agent_limits.charge_tokens(agent_id, tokens)
            await self.keys.charge_tokens(principal, tokens)
        reach = self.reach(principal, agent_id) if principal is not None else None
        return await self.batches.record_batch(agent_id, messages, reach, progress)

    async def session_gate(self, session_id: str) -> GateStatus:
        return await self.formation.session_gate(session_id)

    async def maybe_form_memories(self, session_id: str) -> str | None:
        return await self.formation.maybe_form_memories(session_id)

    async def form_memories(self, session_id: str, wait: bool = True) -> FormationSummary:
        return await self.formation.form_memories(session_id, wait)

    async def session_status(self, session_id: str) -> dict[str, Any]:
        return await self.formation.session_status(session_id)

    # The worker's jobs
    async def recover_windows(self) -> list[str]:
        return await self.pipeline.recover_windows()

    async def run_formation(self, session_id: str, window: int) -> FormationSummary:
        return await self.pipeline.run_formation(session_id, window)

    async def run_consolidation(self, namespace: str, version: int, count: int) -> dict[str, Any]:
        return await self.pipeline.run_consolidation(namespace, version, count)

    async def sweep_cold_sessions(self) -> list[str]:
        return await self.pipeline.sweep_cold_sessions()

    async def recover_in_flight(self) -> dict[str, int]:
        """Settle records a crash left between their store write and their commit (docs/ingest.md)."""
        return await self.sessions.recover_in_flight()

    async def embed_pending(self, agent_id: str) -> dict[str, int]:
        return await self.pipeline.embed_pending(agent_id)

    async def backfill_embeddings(self, batch: int = 64, limit: int | None = None,
                                  on_progress: Callable[[str, int], None] | None = None) -> dict[str, int]:
        return await self.pipeline.backfill_embeddings(batch, limit, on_progress)

    async def reembed(self, agent_id: str | None = None, *, batch: int = 64, budget: int | None = None,
                      on_progress: ReembedProgress | None = None) -> ReembedReport:
        """Give every memory of ``agent_id`` (of every agent when None) a vector of the
        configured embedder, staged beside the searched one, and switch each agent when all
        of its memories have one (memory_service/embedding/reembed.py). Online and resumable;
        ``budget`` stops after that many vectors. An unknown agent is NotFound; nothing is
        written for it."""
        if self.embedder is None:
            raise InvalidInput("no embedder is configured: set EMBEDDER (and EMBEDDING_MODEL) to the new model")
        held: dict[str, MemoryBackend] = {}
        for backend in await self.registry.live():
            for known in await backend.agents():
                held.setdefault(known, backend)
        if agent_id is not None and agent_id not in held:
            raise NotFound(f"unknown agent {agent_id}: no store holds memories of it")
        chosen = [agent_id] if agent_id is not None else sorted(held)
        agents = [(a, (await self.agents.backend_for(a))[1]) for a in chosen]
        return await Reembedder(self.state, self.embedder, batch).run(agents, budget=budget, on_progress=on_progress,
                                                                      all_agents=sorted(held))

    # Reading memory
    async def search(self, agent_id: str, query: str | SearchRequest, reach: Reach | None = None,
                     **options: Any) -> SearchResult:
        """Memories of ``agent_id`` relevant to ``query``, best first, each explained.

        ``options`` are the fields of ``SearchRequest``: ``scope`` (agent, user, session,
        shard, namespaces), ``user_id``/``session_id``/``shard_id``/``namespaces``, ``top_k``,
        ``min_score``, ``kinds``, ``since``, ``until``. A scope never reaches another agent's
        namespaces, nor, with a ``reach`` limited to some users, what they may not see.
        """
        request = query if isinstance(query, SearchRequest) else SearchRequest(query=query, **options)
        with metrics.timed("search"), tracing.span("memory_service.search", scope=str(request.scope)):
            _, backend = await self.agents.backend_for(agent_id)
            return await self.retriever.search(agent_id, backend, request, reach=reach)

    async def assemble_memory_context(self, agent_id: str, user_id: str, session_id: str, model: str | None = None,
                                      query: str | None = None, budget: int | None = None,
                                      reach: Reach | None = None, as_of: datetime | None = None,
                                      context_type: ContextType = ContextType.CHAT,
                                      recall: Recall | None = None) -> RenderedContext:
        """The XML memory block for one model call; it fits the budget (see ContextAssembler.assemble).
        ``as_of``: its known facts are those true then. ``recall``: this call's recall settings,
        over the agent's for ``context_type``."""
        with metrics.timed("context"), tracing.span("memory_service.context") as span:
            block = await self.assembler.assemble(agent_id, user_id, session_id, model, query, budget, reach, as_of,
                                                  context_type, recall)
            span.set_attribute("memory_service.context.source", block.source)
            return block

    # The knowledge graph (issue 16; docs/graph.md): entities, their facts, undoing an invalidation.
    # A caller limited to some users (``reach``) sees the entities and facts of the namespaces
    # its users may see; an entity of any other namespace is answered as an unknown one.
    async def list_entities(self, agent_id: str, *, namespace: str | None = None, user_id: str | None = None,
                            entity_type: EntityType | None = None, name_prefix: str | None = None,
                            cursor: str | None = None, limit: int = 50, reach: Reach | None = None) -> EntityPage:
        """One page of the agent's entities ordered by name (``namespace`` or ``user_id``'s
        namespace, type, name prefix if given); pass the page's ``next`` as ``cursor``."""
        if namespace is not None and user_id is not None:
            raise InvalidInput("give namespace or user_id, not both (user_id names the namespace 'user:<agent>:<user>')")
        chosen = Namespace.user(agent_id, user_id) if user_id is not None else \
            Namespace.parse(namespace) if namespace is not None else None
        within: list[Namespace] | None = None
        if reach is not None and reach.confined:
            ours = chosen is not None and (chosen.kind is NamespaceKind.SESSION or chosen.fields[0] == agent_id)
            if chosen is not None and ours and not await reach.sees_namespace(chosen):
                return EntityPage(entities=[], next=None)  # answered as an empty namespace
            within = await self._visible_namespaces(agent_id, reach)
        # The store's own position (its cursor) travels sealed, for this list, filters and reach.
        scope = reach.view if reach is not None else None
        listed = "entities|" + json.dumps([agent_id, str(chosen) if chosen else None, entity_type, name_prefix])
        inner = None
        if cursor is not None:
            inner = position_field(await self.cursors.open(cursor, listed, scope), "c", str)
        _, backend = await self.agents.backend_for(agent_id)
        entities, after = await backend.list_entities(agent_id, chosen, entity_type, name_prefix, inner, limit,
                                                      within=within)
        next_cursor = await self.cursors.seal(listed, scope, {"c": after}) if after is not None else None
        return EntityPage(entities=[EntityOut.of(e) for e in entities], next=next_cursor)

    async def get_entity(self, agent_id: str, entity_id: str, *, as_of: datetime | None = None,
                         include_superseded: bool = False, reach: Reach | None = None, cursor: str | None = None,
                         limit: int = DEFAULT_FACT_PAGE) -> EntityDetailOut:
        """One entity with one page of its facts (current ones; those true at ``as_of``; or,
        with ``include_superseded``, all of them), oldest first, the entities that page's facts
        link it to, and the totals; pass the page's ``next`` as ``cursor`` for the next one.
        A caller limited to some users reads the facts and neighbours of what it may see, in
        the store's query (``within``), so a page is never cut after the read."""
        if not 1 <= limit <= MAX_FACT_PAGE:
            raise InvalidInput(f"limit: between 1 and {MAX_FACT_PAGE}, got {limit}")
        within = await self._visible_namespaces(agent_id, reach) if reach is not None and reach.confined else None
        scope = reach.view if reach is not None else None
        listed = f"facts|{agent_id}|{entity_id}|{as_of.isoformat() if as_of else ''}|{int(include_superseded)}"
        after = None
        if cursor is not None:
            body = await self.cursors.open(cursor, listed, scope)
            after = (position_field(body, "t", int), position_field(body, "i", str))
        _, backend = await self.agents.backend_for(agent_id)
        detail = await backend.get_entity(agent_id, entity_id, as_of, include_superseded, within=within, after=after,
                                          limit=limit)
        next_cursor = None
        if detail.after is not None:
            next_cursor = await self.cursors.seal(listed, scope, {"t": detail.after[0], "i": detail.after[1]})
        return EntityDetailOut(entity=EntityOut.of(detail.entity), facts=[FactOut.of(f) for f in detail.facts],
                               neighbours=[EntityOut.of(n) for n in detail.neighbours], facts_total=detail.facts_total,
                               neighbours_total=detail.neighbours_total, next=next_cursor)

    async def restore_fact(self, agent_id: str, fact_id: str, reach: Reach | None = None,
                           actor: str | None = None) -> FactOut:
        """Undo an invalidation: the fact is current again (its ``invalid_at``, ``expired_at`` and
        ``superseded_by`` cleared); nothing else changes, the fact that replaced it stays current.
        A current fact is a Conflict; audited as ``fact.restore`` for ``actor``."""
        _, backend = await self.agents.backend_for(agent_id)
        before = await backend.get_fact(agent_id, fact_id)
        await _may_change_graph(reach, before.namespace, f"agent {agent_id!r} has no fact {fact_id!r}",
                                f"fact {fact_id!r}", "restoring it")
        if before.current_at():
            raise Conflict(f"fact {fact_id!r} is current: there is no invalidation to undo")
        after = await backend.restore_fact(agent_id, fact_id)
        if actor is not None:
            await self.audit.append(actor, "fact.restore", agent_id, fact_id, before=audited_fact(before),
                                    after=audited_fact(after))
        return FactOut.of(after)

    async def split_entity(self, agent_id: str, entity_id: str, alias: str, reach: Reach | None = None,
                           actor: str | None = None) -> EntitySplitOut:
        """Undo a merge: ``alias`` becomes an entity of its own again, with the facts and
        mentions that came through that name (docs/graph.md, "Merges and splits"). Audited
        as ``entity.split`` for ``actor``: ids and counts, never the name."""
        _, backend = await self.agents.backend_for(agent_id)
        if reach is not None and reach.confined:
            for entity in await backend.entities_by_id(agent_id, [entity_id]):
                await _may_change_graph(reach, entity.namespace, f"agent {agent_id!r} has no entity {entity_id!r}",
                                        f"entity {entity_id!r}", "splitting it")
        split = await backend.split_entity(agent_id, entity_id, alias)
        if actor is not None:
            await self.audit.append(actor, "entity.split", agent_id, entity_id,
                                    after={"namespace": split.entity.namespace, "split_off": split.split_off.id,
                                           "facts": split.facts, "mentions": split.mentions})
        return EntitySplitOut.of(split)

    async def _visible_namespaces(self, agent_id: str, reach: Reach) -> list[Namespace]:
        """The namespaces of the agent's graph a caller limited to some users may see: theirs,
        the shards' and the agent's (entities live in no session's)."""
        users = sorted(reach.users or ())
        shards = await self.agents.list_shards(agent_id)
        return [*(Namespace.user(agent_id, u) for u in users), *(Namespace.shard(agent_id, s.shard_id) for s in shards),
                Namespace.agent(agent_id)]

    # Browsing (memory_service/curation/browse.py): agents, users, sessions, memories, page by page.
    # Reading only; a caller limited to some users (``reach``) sees what its users may see.
    async def index_for_browsing(self) -> bool:
        """Index for browsing what an older release stored (once; at start-up). True if it ran."""
        return await self.state.index_stored_data(BROWSE_INDEX_VERSION)

    async def list_agents(self, principal: Principal, cursor: str | None = None, limit: int = 50) -> AgentPage:
        """The agents ``principal`` reaches, by id, with the counts of what it reaches."""
        return await self.browser.agents_page(principal.agents, cursor, limit, principal.users)

    async def list_users(self, agent_id: str, reach: Reach, cursor: str | None = None, limit: int = 50) -> UserPage:
        """The agent's users (those ``reach`` sees), by id."""
        return await self.browser.users_page(agent_id, reach, cursor, limit)

    async def list_sessions(self, agent_id: str, reach: Reach, user_id: str | None = None, cursor: str | None = None,
                            limit: int = 50) -> SessionPage:
        """The agent's sessions (those ``reach`` sees; ``user_id``: the user's), newest first."""
        return await self.browser.sessions_page(agent_id, reach, user_id, cursor, limit)

    async def list_memories(self, agent_id: str, reach: Reach, *, namespace: str | None = None,
                            user_id: str | None = None, session_id: str | None = None,
                            kinds: list[MemoryKind] | None = None, tags: list[str] | None = None,
                            since: datetime | None = None, until: datetime | None = None,
                            state: MemoryState = MemoryState.LIVE, cursor: str | None = None,
                            limit: int = 50) -> MemoryPage:
        """A page of the agent's memories, newest first, filtered; pass its ``next`` as ``cursor``."""
        return await self.browser.memories_page(agent_id, reach, namespace=namespace, user_id=user_id,
                                                session_id=session_id, kinds=kinds or (), tags=tags or (),
                                                since=since, until=until, state=state, cursor=cursor, limit=limit)

    async def memory_detail(self, agent_id: str, memory_id: str, reach: Reach | None = None) -> MemoryDetail:
        """One memory with its provenance (messages, window, extractor), access count and history."""
        return await self.browser.memory_detail(agent_id, memory_id, reach)

    # Startup records (memory_service/recall/startup.py; `memory-service import`: curation/legacy_import.py)
    async def put_startup_record(self, agent_id: str, record_id: str, body: StartupRecordIn,
                                 actor: str | None = None) -> tuple[StartupRecord, StartupRecord | None, bool]:
        """(the record now, the record replaced, whether anything changed). Its title and
        content are redacted first, as the agent's redaction policy says (docs/redaction.md)."""
        redactor = self.agents.redactor(agent_id)
        body = body.model_copy(update={"title": await redactor.text(body.title, "title"),
                                       "content": await redactor.text(body.content, "content")})
        record, before, changed = await self.startup.put(agent_id, record_id, body)
        if changed and actor is not None:
            await self.audit.append(actor, "startup.put", agent_id, record_id,
                                    before=before.model_dump(mode="json") if before else None,
                                    after=record.model_dump(mode="json"))
        return record, before, changed

    async def list_startup_records(self, agent_id: str) -> list[StartupRecord]:
        return await self.startup.list(agent_id)

    async def delete_startup_record(self, agent_id: str, record_id: str, actor: str | None = None) -> StartupRecord | None:
        """The record deleted, None if there was none."""
        before = await self.startup.delete(agent_id, record_id)
        if before is not None and actor is not None:
            await self.audit.append(actor, "startup.delete", agent_id, record_id, before=before.model_dump(mode="json"))
        return before

    async def startup_block(self, agent_id: str, model: str | None = None, session_id: str | None = None,
                            mode: StartupMode = StartupMode.ALWAYS, reach: Reach | None = None) -> StartupBlock:
        return await self.startup.block(agent_id, model, session_id, mode, reach)

    async def import_legacy(self, plan: ImportPlan, key_id: str = "cli", on_progress: Progress | None = None) -> ImportReport:
        """Bring the agent in step with a planned import (``legacy_import.plan_import``): records and
        memories added, replaced and removed, audited under ``key_id``. A plan made with another
        redaction policy than the agent's is made again with the agent's (docs/redaction.md)."""
        policy = await self.agents.redaction_policy(plan.agent_id)
        if policy != plan.policy:
            plan = await asyncio.to_thread(plan_import, plan.path, plan.agent_id, plan.user_id, self.settings,
                                           plan.prune, policy)
        metrics.redacted(plan.redacted)
        return await apply_import(plan, self.startup, self.tools, self.audit, key_id, on_progress)
    # The memory tools (memory_service/curation/tools.py; search is ``search`` with ``tags``) and retention
    async def memory_get(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> MemoryRecord:
        return await self.tools.get(agent_id, memory_id, guard)

    async def memory_write(self, agent_id: str, body: MemoryWrite, guard: NamespaceGuard = None,
                           actor: str | None = None) -> MemoryRecord:
        return (await self.memory_write_answer(agent_id, body, guard, actor))[0]

    async def memory_write_answer(self, agent_id: str, body: MemoryWrite, guard: NamespaceGuard = None,
                                  actor: str | None = None) -> tuple[MemoryRecord, bool]:
        """(the memory, whether it was already stored: its idempotency key used before; then
        nothing changed and nothing is audited)."""
        record, already = await self.tools.write(agent_id, body, guard)
        if not already:
            await self._emit_records(agent_id, EventType.WRITTEN, [record], actor)
        if actor is not None and not already:
            await self.audit.append(actor, "memory.write", agent_id, record.id, after=_audited(record))
        return record, already

    async def memory_update(self, agent_id: str, memory_id: str, body: MemoryUpdate,
                            guard: NamespaceGuard = None, actor: str | None = None) -> MemoryRecord:
        before, after = await self.tools.update(agent_id, memory_id, body, guard)
        await self._emit_records(agent_id, EventType.UPDATED, [after], actor)
        if actor is not None:
            changed = sorted(f for f in ("content", "title", "tags", "confidence", "kind")
                             if getattr(before, f) != getattr(after, f))
            await self.audit.append(actor, "memory.update", agent_id, memory_id,
                                    before=_audited(before), after={**_audited(after), "changed": changed,
                                                                    "reason": "update"})
        return after

    async def memory_correct(self, agent_id: str, memory_id: str, body: MemoryCorrection,
                             guard: NamespaceGuard = None, actor: str | None = None) -> CorrectionOut:
        """Replace a memory found wrong by the right one (memory_service/curation/corrections.py).
        Audited: ``memory.correct`` on the old memory, ``memory.write`` (reason correction) on
        the new one, ``fact.invalidate`` (reason correction) per fact closed; one ``corrected``
        event for the two memories, one for the facts."""
        done = await self.corrections.correct(agent_id, memory_id, body, guard)
        old, new = self.tools.record(done.old), self.tools.record(done.new)
        if guard is not None:
            shown = await guard.shown([done.old, done.new])
            old, new = self.tools.record(shown[0]), self.tools.record(shown[1])
        facts = [f.id for f in done.facts]
        cause = Cause(key_id=actor)
        await self.events.emit(agent_id, EventType.CORRECTED,
                               [Changed(done.old.namespace, done.old.kind.value, (done.old.id, done.new.id))], cause)
        if done.facts:
            by_namespace: dict[str, list[str]] = {}
            for fact in done.facts:
                by_namespace.setdefault(fact.namespace, []).append(fact.id)
            await self.events.emit(agent_id, EventType.CORRECTED,
                                   [Changed(ns, "graph_fact", tuple(ids)) for ns, ids in by_namespace.items()], cause)
        if actor is not None:
            await self.audit.append(actor, "memory.correct", agent_id, old.id,
                                    after={**_audited(old), "reason": "correction", "corrected_by": new.id,
                                           "corrected_at": old.corrected_at.isoformat() if old.corrected_at else None,
                                           "facts_closed": facts})
            await self.audit.append(actor, "memory.write", agent_id, new.id,
                                    after={**_audited(new), "reason": "correction", "corrects": old.id})
            for fact in done.facts:
                await self.audit.append(actor, "fact.invalidate", agent_id, fact.id,
                                        before=audited_fact(fact.model_copy(update={
                                            "invalid_at": None, "expired_at": None, "corrected_by": None})),
                                        after={**audited_fact(fact), "reason": "correction"})
        return CorrectionOut(corrected=old, correction=new, facts_closed=facts, redacted=done.redacted or None)

    async def memory_uncorrect(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None,
                               actor: str | None = None) -> UncorrectedOut:
        """Undo a correction: the memory live again, the correction soft-deleted, its facts restored."""
        done = await self.corrections.undo(agent_id, memory_id, guard)
        shown = [done.old] + ([done.new] if done.new is not None else [])
        if guard is not None:
            shown = await guard.shown(shown)
        records = [self.tools.record(m) for m in shown]
        old, new = records[0], (records[1] if len(records) > 1 else None)
        restored = [f.id for f in done.facts]
        await self.events.emit(agent_id, EventType.UNCORRECTED,
                               [Changed(old.namespace, old.kind.value, tuple(r.id for r in records))], Cause(key_id=actor))
        if actor is not None:
            await self.audit.append(actor, "memory.uncorrect", agent_id, old.id,
                                    after={**_audited(old), "correction": new.id if new else None,
                                           "facts_restored": restored})
            if new is not None and done.new_deleted_now:
                await self.audit.append(actor, "memory.delete", agent_id, new.id,
                                        after={**_audited(new), "reason": "correction undone"})
            for fact in done.facts:
                await self.audit.append(actor, "fact.restore", agent_id, fact.id, after=audited_fact(fact))
        return UncorrectedOut(memory=old, correction=new, facts_restored=restored)

    async def memory_delete(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None,
                            actor: str | None = None) -> DeletedOut:
        """A soft delete that follows provenance: a soft forget (docs/forget.md), announced as
        ``deleted`` for the memory itself and ``forgotten`` for what was formed from it."""
        self.tools.require_writes(agent_id)
        _, memory = await self.tools.changeable(agent_id, memory_id, guard)
        if memory.deleted_at is not None:  # deleted already: the same answer
            return (await self.tools.delete(agent_id, memory_id, guard))[0]
        report = await self.forgetter.forget(agent_id, memory_id, ForgetMode.SOFT, guard, actor,
                                             target_event=EventType.DELETED)
        deleted, _ = await self.tools.delete(agent_id, memory_id, guard)  # answers the forget's dates
        if actor is not None:  # with what went along (ids and counts: memory_service/curation/forget.py)
            derived = [i for i in report.memory_ids if i != memory_id]
            await self.audit.append(actor, "memory.delete", agent_id, memory_id, after={
                **deleted.model_dump(mode="json"), **({"forgotten": derived, "reformed": len(report.reformed)}
                                                      if derived else {})})
        return deleted

    async def memory_forget(self, agent_id: str, memory_id: str, mode: ForgetMode = ForgetMode.SOFT,
                            guard: NamespaceGuard = None, actor: str | None = None) -> ForgetReport:
        """Forget a message or a memory with everything formed from it (memory_service/curation/forget.py):
        ``soft`` undoable by ``memory_undelete``, ``hard`` for good. Audited as ``memory.forget``
        (ids and counts), announced as ``forgotten``. Finishes a forget a crash left."""
        return await self.forgetter.forget(agent_id, memory_id, mode, guard, actor)

    async def reform(self, agent_id: str, ask: ReformIn, on_progress: ReformProgress | None = None,
                     actor: str | None = None) -> ReformReport:
        """Re-form the agent's formed windows (of a user, a session; since a date) with the
        extractor configured now (memory_service/curation/reformation.py): each window's
        memories replaced in one step, exactly once per run id, resumable; ``dry_run`` counts.
        Audited as ``memory.reform``."""
        return await self.reformation.run(agent_id, ask, on_progress, actor)

    async def resume_forgets(self, agent_id: str) -> list[ForgetReport]:
        """Finish the agent's forgets a crash left (the CLI's ``forget --resume``)."""
        return await self.forgetter.resume(agent_id)

    async def memory_undelete(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None,
                              actor: str | None = None) -> MemoryRecord:
        if await self.forgetter.soft_forgotten(agent_id, memory_id):  # undo the forget, whole
            memory = await self.forgetter.undo(agent_id, memory_id, guard, actor)
            if actor is not None:
                await self.audit.append(actor, "memory.undelete", agent_id, memory_id)
            access = await self.retention_index.access(agent_id, memory_id)
            return self.tools.record(memory, access.count, access.last)
        record, changed = await self.tools.undelete(agent_id, memory_id, guard)
        if changed:
            await self._emit_records(agent_id, EventType.UNDELETED, [record], actor)
        if changed and actor is not None:
            await self.audit.append(actor, "memory.undelete", agent_id, memory_id, after=_audited(record))
        return record

    async def parse_writes(self, agent_id: str, text: str, namespace: str, session_id: str | None = None,
                           message_id: str | None = None, guard: NamespaceGuard = None,
                           actor: str | None = None) -> WriteBlocksOut:
        """Store the <memory_write>/<shadow_write> blocks of ``text`` (memory_service/curation/write_blocks.py):
        memories, and entities and facts in the knowledge graph. Idempotent per message: what a
        repeated parse finds already stored is not audited again. Audited as ``memory.write_blocks``
        (ids only: the memories' audited fields, the new entities' and facts' ids); each fact a
        block closes as ``fact.invalidate``."""
        done = await store_write_blocks(self.tools, agent_id, text, namespace, session_id, message_id, guard,
                                        audit=self.audit, actor=actor or WRITE_BLOCKS_ACTOR,
                                        events=self.events, cause=Cause(key_id=actor, session_id=session_id))
        memories = done.new_memories
        await self._emit_records(agent_id, EventType.WRITTEN,
                                 [r for r in done.memories.records if r.id in set(memories)], actor, session_id)
        entities, facts = done.new([e.id for e in done.entities]), done.new([f.id for f in done.facts])
        if (memories or entities or facts) and actor is not None:
            await self.audit.append(actor, "memory.write_blocks", agent_id, message_id, after={
                "blocks": done.blocks, "memories": [_audited(r) for r in done.memories.records if r.id in set(memories)],
                "entities": entities, "facts": facts})
        return WriteBlocksOut(blocks=done.blocks, written=done.memories.records,
                              entities=[EntityOut.of(e) for e in done.entities], facts=[FactOut.of(f) for f in done.facts],
                              superseded=done.superseded, already_stored=done.already_stored, redacted=done.redacted)

    async def _emit_records(self, agent_id: str, type_: EventType, records: Sequence[MemoryRecord | Memory],
                            actor: str | None, session_id: str | None = None) -> None:
        groups: dict[tuple[str, str], list[str]] = {}
        for r in records:
            groups.setdefault((r.namespace, r.kind.value), []).append(r.id)
        await self.events.emit(agent_id, type_, [Changed(ns, kind, tuple(ids)) for (ns, kind), ids in groups.items()],
                               Cause(key_id=actor, session_id=session_id))

    # Change events and webhooks (memory_service/events/, docs/events.md)
    async def read_events(self, agent_id: str, after: str, count: int, reach: Reach | None, *,
                          client: Any = None, block_ms: int | None = None,
                          visibility: Visibility | None = None) -> tuple[list[Event], str]:
        """(the events after ``after`` the caller may see, the id to resume after: the last
        read, seen or not). ``client``/``block_ms``: wait on that connection for one."""
        events = await self.events.read(agent_id, after, count, client, block_ms)
        shown = await (visibility or Visibility(reach)).shown(events)
        return shown, events[-1].id if events else after

    async def latest_event_id(self, agent_id: str) -> str:
        """The id of the agent's newest event ("0-0" when it has none): a stream from now on starts after it."""
        newest = await self.events.redis.xrevrange(keyspace.event_stream(agent_id), count=1)
        return str(newest[0][0]) if newest else "0-0"

    def event_stream(self, agent_id: str, after: str, reach: Reach | None, seconds: float | None = None) -> AsyncIterator[str]:
        """The agent's events after ``after`` as server-sent events, for ``seconds`` at most
        (memory_service/events/sse.py); BackendUnavailable when the process serves its most streams."""
        return self.event_streams.open(agent_id, after, reach, seconds)

    async def put_webhook(self, agent_id: str, hook_id: str, body: WebhookIn, actor: str | None = None) -> tuple[WebhookOut, bool]:
        hook, created = await self.webhooks.put(agent_id, hook_id, body)
        if actor is not None:
            await self.audit.append(actor, "webhook.put", agent_id, hook_id, after={"url": hook.url})
        return hook, created

    async def webhook(self, agent_id: str, hook_id: str) -> WebhookOut:
        return await self.webhooks.get(agent_id, hook_id)

    async def list_webhooks(self, agent_id: str) -> list[WebhookOut]:
        return await self.webhooks.list(agent_id)

    async def delete_webhook(self, agent_id: str, hook_id: str, actor: str | None = None) -> None:
        await self.webhooks.delete(agent_id, hook_id)
        if actor is not None:
            await self.audit.append(actor, "webhook.delete", agent_id, hook_id)

    async def dead_letters(self, agent_id: str, hook_id: str) -> DeadLetterPage:
        return await self.webhooks.dead_letters(agent_id, hook_id)

    async def replay_dead_letter(self, agent_id: str, hook_id: str, event_id: str, actor: str | None = None) -> None:
        await self.webhooks.replay(agent_id, hook_id, event_id)
        if actor is not None:
            await self.audit.append(actor, "webhook.replay", agent_id, hook_id, after={"event_id": event_id})

    async def drop_dead_letter(self, agent_id: str, hook_id: str, event_id: str, actor: str | None = None) -> None:
        await self.webhooks.drop(agent_id, hook_id, event_id)
        if actor is not None:
            await self.audit.append(actor, "webhook.drop", agent_id, hook_id, after={"event_id": event_id})

    async def deliver_webhooks(self) -> dict[str, int]:
        """The worker's pass over every webhook (memory_service/events/delivery.py)."""
        return await self.delivery.run()

    async def purge_expired(self) -> PurgeReport:
        return await self.retention.purge()

    # Users: export and erasure (memory_service/curation/erasure.py)
    async def export_user(self, agent_id: str, user_id: str) -> UserExport:
        return await self.eraser.export_user(agent_id, user_id)

    async def erase_user(self, agent_id: str, user_id: str, actor: str | None = None) -> ErasureReport:
        """``actor``: who asked (an API key's id): the erasure is audited as ``user.erase``, naming
        the user by its digest. The keys it changes are audited in any case, under the actor or
        ``erasure``."""
        report = await self.eraser.erase_user(agent_id, user_id, actor or "erasure")
        if actor is not None:
            await self.audit.append(actor, "user.erase", agent_id, await self.audit.user_digest(agent_id, user_id),
                                    after=report.counts())
        return report

    # Operations: counters, gauges, health
    async def counters(self) -> dict[str, float]:
        """The counters kept in Redis: formations, LLM calls and tokens, consolidations."""
        return await self.state.metrics()

    async def gauges(self) -> dict[str, float]:
        """The live backends' current values (outbox depth and dead letters, breakers) and the job
        queue's depth and lag, by sample name."""
        values: dict[str, float] = {}
        try:
            values.update(await metrics.queue_gauges(self.queue.pool, QUEUE_NAME))
        except Exception:  # Redis is down: /health says so
            pass
        try:
            backends = await self.registry.live()
        except Exception:  # the default backend cannot start: /health says why
            backends = []
        for backend in backends:
            try:
                values.update(await backend.gauges())
            except Exception:  # its store is down: /health says so; the counters still answer
                continue
        return values

    async def health(self) -> dict[str, Any]:
        """Readiness: each store would take a write now (memory_service/backends/readiness.py;
        the graph store's own check: GraphBackend.health), not only answer a PING."""
        state = await readiness.report(self.state.redis)
        backends = await self.registry.health()
        queue = await readiness.report(self.queue.pool)
        return {
            "ok": state["ok"] and queue["ok"] and all(b.get("ok") for b in backends.values()),
            "state": state,
            "queue": queue,
            "backends": backends,
            "default_backend": self.settings.default_memory_backend,
        }


def _audited(record: MemoryRecord) -> dict[str, object]:
    """What the audit log keeps of a memory: never its words (content, title, tags), which
    the log would otherwise keep after the retention job purged them (no route edits it)."""
    return {"id": record.id, "kind": record.kind.value, "namespace": record.namespace,
            "content_chars": len(record.content), "deleted_at": record.deleted_at.isoformat() if record.deleted_at else None}


async def _may_change_graph(reach: Reach | None, namespace: str, unknown: str, what: str, doing: str) -> None:
    """A key limited to some users changes the graph of their namespaces only: another user's
    is answered as unknown, shared knowledge (a shard's, the agent's) is refused."""
    if reach is None or not reach.confined:
        return
    parsed = Namespace.parse(namespace)
    if not await reach.sees_namespace(parsed):
        raise NotFound(unknown)
    if not reach.may_change(parsed):
        raise Forbidden(f"{what} is shared knowledge ({parsed.kind.value}); {doing} needs a key for all of the "
                        "agent's users")
