"""MemoryService: the one entry point. The HTTP API, the CLI and the worker call it.

A thin facade over the parts, each readable alone:

- ``routing.BackendRegistry``: named backend factories, each built once;
- ``agents.AgentDirectory``: agents' and shards' settings, and which backend serves an agent;
- ``sessions.SessionLedger``: recording messages, the gates, scheduling formation windows;
- ``pipeline.FormationPipeline``: the worker's jobs (forming, consolidating, sweeping, embedding);
- ``assembler.ContextAssembler``: the memory block of one model call;
- ``retrieval.Retriever``: search;
- ``keys.KeyStore`` and ``audit.AuditLog``: API keys and the log of changes;
- ``curation.MemoryTools`` and ``retention.Retention``: the agent's memory tools, the daily purge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memory_service.access.audit import AuditLog
from memory_service.access.keys import KeyStore
from memory_service.access.pseudonyms import Pseudonyms
from memory_service.access.reach import Reach
from memory_service.config import Settings
from memory_service.curation.erasure import Eraser, ErasureReport, UserExport
from memory_service.curation.legacy_import import ImportPlan, ImportReport, Progress, apply_import
from memory_service.curation.retention import PurgeReport, Retention, RetentionIndex
from memory_service.curation.tools import DeletedOut, MemoryRecord, MemoryTools, MemoryUpdate, MemoryWrite, NamespaceGuard
from memory_service.curation.write_blocks import store_write_blocks
from memory_service.domain.models import Agent, AgentSettings, MessageIn, Shard, ShardIn
from memory_service.domain.namespaces import validate_id
from memory_service.embedding.embedders import Embedder
from memory_service.formation import gates
from memory_service.formation.consolidation import Consolidator, RuleBasedConsolidator
from memory_service.formation.extractor import Extractor
from memory_service.formation.jobs import JobQueue
from memory_service.formation.pipeline import FormationPipeline
from memory_service.formation.steps import FormationSummary
from memory_service.ingest.sessions import RecordResult, SessionLedger
from memory_service.recall.assembler import ContextAssembler
from memory_service.recall.render import RenderedContext
from memory_service.recall.search import Retriever, SearchRequest, SearchResult
from memory_service.recall.startup import StartupBlock, StartupMode, StartupRecord, StartupRecordIn
from memory_service.state.store import StateStore
from memory_service.stores.agents import AgentDirectory
from memory_service.stores.registry import BackendFactory, BackendRegistry

__all__ = ["MemoryService", "RecordResult"]


class MemoryService:
    def __init__(self, settings: Settings, state: StateStore, extractor: Extractor, queue: JobQueue,
                 consolidator: Consolidator | None = None, embedder: Embedder | None = None):
        self.settings = settings
        self.state = state
        self.extractor = extractor
        self.queue = queue
        self.consolidator = consolidator or RuleBasedConsolidator()
        self.embedder = embedder
        self.registry = BackendRegistry(settings)
        self.retriever = Retriever(settings, state, embedder)
        self.agents = AgentDirectory(settings, state, self.registry)
        self.sessions = SessionLedger(settings, state, queue, self.agents, embedder, extractor.name)
        self.pipeline = FormationPipeline(settings, state, queue, self.registry, self.agents, self.sessions,
                                          extractor, self.consolidator, embedder)
        self.assembler = ContextAssembler(settings, state, self.agents, self.retriever)
        operator_key = settings.operator_api_key.get_secret_value() if settings.operator_api_key else None
        self.keys = KeyStore(state.redis, settings.rate_limit_requests_per_minute, settings.rate_limit_tokens_per_minute,
                             operator_key)
        digest_key = settings.user_digest_key.get_secret_value() if settings.user_digest_key else None
        self.pseudonyms = Pseudonyms(state.redis, digest_key)
        self.audit = AuditLog(state.redis, self.pseudonyms)
        self.eraser = Eraser(state, queue, self.registry, self.agents, self.keys, self.audit)
        self.startup = self.assembler.startup  # startup records (memory_service/recall/startup.py)
        self.retention_index = RetentionIndex(state)
        self.tools = MemoryTools(settings, state, self.agents, self.retention_index, embedder)
        self.retention = Retention(settings, state, self.agents, self.retention_index, self.eraser.redis_side,
                                   self.audit)

    def register_backend(self, name: str, factory: BackendFactory) -> None:
        self.registry.register(name, factory)

    async def close(self) -> None:
        await self.registry.close()
        await self.queue.close()
        await self.state.close()
        for llm_user in (self.extractor, self.consolidator, self.embedder):
            if aclose := getattr(llm_user, "aclose", None):
                await aclose()

    # Agents and shards
    async def put_agent(self, agent_id: str, settings: AgentSettings) -> Agent:
        return await self.agents.put_agent(agent_id, settings)

    async def get_agent(self, agent_id: str) -> Agent:
        return await self.agents.get_agent(agent_id)

    async def put_shard(self, agent_id: str, shard_id: str, shard: ShardIn) -> tuple[Shard, bool]:
        return await self.agents.put_shard(agent_id, shard_id, shard)

    async def list_shards(self, agent_id: str) -> list[Shard]:
        return await self.agents.list_shards(agent_id)

    # Sessions
    async def record_message(self, session_id: str, message: MessageIn, reach: Reach | None = None) -> RecordResult:
        return await self.sessions.record_message(session_id, message, reach)

    async def session_gate(self, session_id: str) -> gates.GateStatus:
        return await self.sessions.session_gate(session_id)

    async def maybe_form_memories(self, session_id: str) -> str | None:
        return await self.sessions.maybe_form_memories(session_id)

    async def form_memories(self, session_id: str, wait: bool = True) -> FormationSummary:
        return await self.sessions.form_memories(session_id, wait)

    async def session_status(self, session_id: str) -> dict[str, Any]:
        return await self.sessions.session_status(session_id)

    # The worker's jobs
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

    # Reading memory
    async def search(self, agent_id: str, query: str | SearchRequest, reach: Reach | None = None,
                     **options: Any) -> SearchResult:
        """Memories of ``agent_id`` relevant to ``query``, best first, each explained.

        ``options`` are the fields of ``SearchRequest``: ``scope`` (agent, user, session,
        shard, namespaces), ``user_id``/``session_id``/``shard_id``/``namespaces``, ``top_k``,
        ``min_score``, ``kinds``, ``since``, ``until``. A scope never reaches another agent's
        namespaces, nor, with a ``reach`` limited to some users, what they may not see.
        """
        validate_id(agent_id, "agent_id")
        request = query if isinstance(query, SearchRequest) else SearchRequest(query=query, **options)
        _, backend = await self.agents.backend_for(agent_id)
        return await self.retriever.search(agent_id, backend, request, reach=reach)

    async def assemble_memory_context(self, agent_id: str, user_id: str, session_id: str, model: str | None = None,
                                      query: str | None = None, budget: int | None = None,
                                      reach: Reach | None = None) -> RenderedContext:
        """The XML memory block for one model call; it fits the budget (see ContextAssembler.assemble)."""
        return await self.assembler.assemble(agent_id, user_id, session_id, model, query, budget, reach)

    # Startup records (memory_service/recall/startup.py; `memory-service import`: legacy_import.py)
    async def put_startup_record(self, agent_id: str, record_id: str,
                                 body: StartupRecordIn) -> tuple[StartupRecord, StartupRecord | None, bool]:
        return await self.startup.put(agent_id, record_id, body)

    async def list_startup_records(self, agent_id: str) -> list[StartupRecord]:
        return await self.startup.list(agent_id)

    async def delete_startup_record(self, agent_id: str, record_id: str) -> StartupRecord | None:
        return await self.startup.delete(agent_id, record_id)

    async def startup_block(self, agent_id: str, model: str | None = None, session_id: str | None = None,
                            mode: StartupMode = StartupMode.ALWAYS, reach: Reach | None = None) -> StartupBlock:
        return await self.startup.block(agent_id, model, session_id, mode, reach)

    async def import_legacy(self, plan: ImportPlan, key_id: str = "cli", on_progress: Progress | None = None) -> ImportReport:
        """Store a planned import (``legacy_import.plan_import``): records, memories, one audit entry."""
        _, backend = await self.agents.backend_for(plan.agent_id)
        return await apply_import(plan, self.startup, backend, self.state, self.embedder, self.audit, key_id, on_progress)
    # The memory tools (memory_service/curation/tools.py; search is ``search`` with ``tags``) and retention
    async def memory_get(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> MemoryRecord:
        return await self.tools.get(agent_id, memory_id, guard)

    async def memory_write(self, agent_id: str, body: MemoryWrite, guard: NamespaceGuard = None) -> MemoryRecord:
        return await self.tools.write(agent_id, body, guard)

    async def memory_update(self, agent_id: str, memory_id: str, body: MemoryUpdate,
                            guard: NamespaceGuard = None) -> MemoryRecord:
        return (await self.tools.update(agent_id, memory_id, body, guard))[1]

    async def memory_delete(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> DeletedOut:
        return (await self.tools.delete(agent_id, memory_id, guard))[0]

    async def memory_undelete(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> MemoryRecord:
        return (await self.tools.undelete(agent_id, memory_id, guard))[0]

    async def parse_writes(self, agent_id: str, text: str, namespace: str, session_id: str | None = None,
                           message_id: str | None = None, guard: NamespaceGuard = None) -> tuple[int, list[MemoryRecord]]:
        """Store the <memory_write>/<shadow_write> blocks of ``text`` (memory_service/curation/write_blocks.py)."""
        return await store_write_blocks(self.tools, agent_id, text, namespace, session_id, message_id, guard)

    async def purge_expired(self) -> PurgeReport:
        return await self.retention.purge()

    # Users: export and erasure (memory_service/curation/erasure.py)
    async def export_user(self, agent_id: str, user_id: str) -> UserExport:
        return await self.eraser.export_user(agent_id, user_id)

    async def erase_user(self, agent_id: str, user_id: str, actor: str = "erasure") -> ErasureReport:
        """``actor``: who asked (an API key's id), for the audit entries of the key changes."""
        return await self.eraser.erase_user(agent_id, user_id, actor)

    async def health(self) -> dict[str, Any]:
        state: dict[str, Any]
        queue: dict[str, Any]
        try:
            state = {"ok": await self.state.ping()}
        except Exception as exc:
            state = {"ok": False, "error": str(exc)}
        backends = await self.registry.health()
        try:
            queue = {"ok": await self.queue.ping()}
        except Exception as exc:
            queue = {"ok": False, "error": str(exc)}
        return {
            "ok": state["ok"] and queue["ok"] and all(b.get("ok") for b in backends.values()),
            "state": state,
            "queue": queue,
            "backends": backends,
            "default_backend": self.settings.default_memory_backend,
        }
