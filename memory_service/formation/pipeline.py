"""The work the worker does: forming windows, consolidating, sweeping cold sessions, embedding.

Each entry point is a job body (memory_service/workers/worker.py runs them) and is safe to retry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from memory_service._vendor.arq.jobs import JobStatus
from memory_service.access.audit import AuditLog
from memory_service.backends.agents import AgentDirectory
from memory_service.backends.base import MemoryBackend
from memory_service.backends.registry import BackendRegistry
from memory_service.config import Settings
from memory_service.domain.models import LLMBudget, Memory, MemoryKind
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.once import Embedded, embed_once
from memory_service.embedding.turns import backlog
from memory_service.events.log import EventLog
from memory_service.formation.budgets import BudgetedConsolidator, BudgetedExtractor, UsageLedger
from memory_service.formation.consolidation import Consolidator, RuleBasedConsolidator, consolidate
from memory_service.formation.extractor import Extractor
from memory_service.formation.jobs import EMBED_LOCK_MS, JobQueue, formation_job_id, waited
from memory_service.formation.rule_extractor import RuleBasedExtractor
from memory_service.formation.schedule import FormationSchedule
from memory_service.formation.steps import FormationResult, form_window
from memory_service.schemas.formation import FormationSummary
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

# A window claimed this long ago without a job is lost, not about to be enqueued by its claimer
# (enqueuing it twice would be harmless: arq refuses the second; a restart takes longer than this).
WINDOW_RECOVERY_GRACE_SECONDS = 1.0
EMBED_BATCH = 256  # memories read, embedded and stored per step of an embedding job
EMBED_JOB_SECONDS = 10.0  # then the job enqueues its sequel: formation jobs get their turn
# While records keep coming, a pass waits this long before the next one, so that it finds a
# batch worth its round trips (and the graph's write lock), not the two messages of the
# last few milliseconds. A lone record is embedded at once.
EMBED_LINGER_SECONDS = 0.25


class FormationPipeline:
    def __init__(self, settings: Settings, state: StateStore, queue: JobQueue, registry: BackendRegistry,
                 agents: AgentDirectory, formation: FormationSchedule, extractor: Extractor, consolidator: Consolidator,
                 embedder: Embedder | None, audit: AuditLog | None = None, ledger: UsageLedger | None = None,
                 events: EventLog | None = None):
        self.settings, self.state, self.queue, self.registry = settings, state, queue, registry
        self.agents, self.formation = agents, formation
        self.extractor, self.consolidator, self.embedder = extractor, consolidator, embedder
        self.audit = audit  # where the facts formation closes are logged (``fact.invalidate``)
        self.events = events  # where the memories formed and the facts closed are announced
        # An extractor or consolidator that spends tokens says how many it expects (estimate_tokens):
        # held to the agents' LLM budgets, with the offline one to fall back on (formation/budgets.py).
        self.ledger = ledger
        if ledger is not None and hasattr(extractor, "estimate_tokens"):
            self.extractor = BudgetedExtractor(extractor, RuleBasedExtractor(), ledger, self.llm_budget)

    async def llm_budget(self, agent_id: str) -> LLMBudget:
        settings = await self.state.get_agent(agent_id)
        return settings.llm_budget if settings is not None else LLMBudget()

    def _consolidator(self, agent_id: str) -> Consolidator:
        if self.ledger is None or not hasattr(self.consolidator, "estimate_tokens"):
            return self.consolidator
        return BudgetedConsolidator(self.consolidator, RuleBasedConsolidator(), self.ledger, agent_id, self.llm_budget)

    async def run_formation(self, session_id: str, window: int) -> FormationSummary:
        """Form window ``window`` of the session, resuming at the step its state names."""
        windows = self.formation.windows
        record = await windows.load(session_id)
        if record is None or record.claim.window != window:
            return FormationSummary(session_id=session_id, window=window, extractor=self.extractor.name,
                                    reason="window already formed")
        agent_id = (await self.state.counters(session_id)).agent_id
        if agent_id is None:  # the session's first record names its agent, before it can have a window
            raise RuntimeError(f"session {session_id!r} holds window {window} but names no agent")
        _, backend = await self.agents.backend_for(agent_id)
        shards = await self.agents.list_shards(agent_id)
        result = await form_window(claim=record.claim, agent_id=agent_id, backend=backend, windows=windows,
                                   extractor=self.extractor, shards=shards,
                                   expiry=await self.agents.expiry_policy(agent_id, shards),
                                   embedder=self.embedder, audit=self.audit, events=self.events,
                                   name_similarity=self.settings.entity_name_similarity,
                                   resolve_candidates=self.settings.entity_resolve_candidates,
                                   post_process=lambda formed: self._after_formation(agent_id, backend, formed))
        if result.waiting is not None:
            await self.state.add_metrics(budget_waits=1)
        elif not result.already_formed:  # messages that arrived meanwhile may have opened a gate
            await self.formation.schedule(session_id, gated=True)
        return result.summary()

    async def _after_formation(self, agent_id: str, backend: MemoryBackend, result: FormationResult) -> None:
        """The post-completion work: idempotent, as it runs again if a try dies during it."""
        for namespace in sorted({m.namespace for m in result.memories}):
            ns = Namespace.parse(namespace)
            if ns.kind in (NamespaceKind.SHARD, NamespaceKind.USER):  # a user's: their personal facts
                await backend.trim(agent_id, ns, MemoryKind.FACT, self.settings.facts_per_shard)
            if ns.kind in (NamespaceKind.USER, NamespaceKind.SHARD):
                await self._maybe_consolidate(namespace)

    def _consolidation_threshold(self, namespace: Namespace) -> int:
        if namespace.kind is NamespaceKind.USER:
            return self.settings.consolidate_directives_after
        return self.settings.consolidate_suggestions_after

    async def _maybe_consolidate(self, namespace: str) -> str | None:
        backlog = await self.state.consolidation_backlog(namespace)
        if backlog < self._consolidation_threshold(Namespace.parse(namespace)):
            return None
        version = await self.state.consolidation_version(namespace)
        return await self.queue.enqueue_consolidation(namespace, version, backlog)

    async def run_consolidation(self, namespace: str, version: int, count: int) -> dict[str, Any]:
        """Merge the ``count`` oldest pending items of ``namespace`` into consolidated version+1."""
        ns = Namespace.parse(namespace)
        agent_id = ns.fields[0]
        _, backend = await self.agents.backend_for(agent_id)
        words = self.settings.user_memory_words if ns.kind is NamespaceKind.USER else self.settings.shard_memory_words
        outcome = await consolidate(namespace=ns, version=version, count=count, backend=backend, state=self.state,
                                    consolidator=self._consolidator(agent_id), word_limit=words, agent_id=agent_id,
                                    embedder=self.embedder)
        counters = {"consolidations": 1, "consolidated_items": outcome["items"]} if outcome["consolidated"] else {}
        if usage := outcome.get("usage"):
            counters.update(
                consolidation_llm_calls=usage["calls"], consolidation_llm_attempts=usage["attempts"],
                consolidation_llm_prompt_tokens=usage["prompt_tokens"],
                consolidation_llm_completion_tokens=usage["completion_tokens"], consolidation_llm_seconds=usage["latency_seconds"])
        if outcome.get("llm_budget"):
            counters["budget_offline_consolidations"] = 1
        if counters:
            await self.state.add_metrics(**counters)
        if outcome["consolidated"]:
            await self._maybe_consolidate(namespace)
        return outcome

    async def sweep_cold_sessions(self) -> list[str]:
        """Enqueue the window of sessions idle long enough with the minimum of messages.

        Bounded: at most COLD_SWEEP_MAX_SESSIONS sessions, read COLD_SWEEP_BATCH at a time,
        for at most half the job timeout. Fair: a session it enqueued goes to the back of
        the active set (due again after another idle period, if it still has messages
        pending then), and a session that cannot form (incognito, fewer messages than the
        minimum) leaves the set until its next message; so every run starts with the
        sessions waiting longest, and no set of sessions can keep the others from a turn.
        """
        s = self.settings
        deadline = time.monotonic() + s.worker_job_timeout_seconds / 2
        idle_before = time.time() - s.consider_cold_after_minutes * 60
        min_messages = s.never_form_memories_less_than_n_messages
        enqueued: list[str] = []
        seen: set[str] = set()
        while len(seen) < s.cold_sweep_max_sessions and time.monotonic() < deadline:
            limit = min(s.cold_sweep_batch, s.cold_sweep_max_sessions - len(seen))
            batch = [(sid, score) for sid, score in await self.state.idle_sessions(idle_before, limit) if sid not in seen]
            if not batch:
                break
            visited, unformable = [], []
            for session_id, score in batch:
                seen.add(session_id)
                # The claim itself refuses incognito sessions and those below the minimum.
                if job_id := await self.formation.schedule(session_id, min_messages=min_messages):
                    enqueued.append(job_id)
                    visited.append((session_id, score))
                else:
                    unformable.append((session_id, score))
            await self.state.settle_swept(visited, unformable, time.time())
        if seen:
            log.info("cold-session sweep looked at %d session(s), enqueued %d window(s)", len(seen), len(enqueued))
        return enqueued

    async def recover_windows(self) -> list[str]:
        """Enqueue again the job of each window held without one; the job ids enqueued.

        A window claimed more than WINDOW_RECOVERY_GRACE_SECONDS ago (the claimer enqueues
        its job a moment after the claim) is looked at: its job not found (lost between the
        claim and the enqueue by a crash, or by a store that lost its last writes) is
        enqueued again; one in progress under a worker whose lease ended is released
        (memory_service/formation/leases.py). A job queued, running or kept failed is left
        alone: a failure stays visible until its result expires (WORKER_KEEP_RESULT_SECONDS),
        then the window is tried again. A job that ended leaving its window waiting for the LLM
        budget (formation/budgets.py, ``when_spent: wait``) is enqueued again at every run. At most COLD_SWEEP_MAX_SESSIONS a run, each sent to
        the back of the index, so every held window gets its turn.
        """
        now = time.time()
        enqueued: list[str] = []
        waiting = 0
        for session_id in await self.state.held_windows(now - WINDOW_RECOVERY_GRACE_SECONDS,
                                                        self.settings.cold_sweep_max_sessions):
            record = await self.formation.windows.load(session_id)
            await self.state.looked_at_window(session_id, now, held=record is not None)
            if record is None:
                continue
            job_id = formation_job_id(session_id, record.claim.window)
            status = await self.queue.job(job_id).status()
            if status is JobStatus.not_found:
                enqueued.append(await self.queue.enqueue_formation(session_id, record.claim.window))
            elif status is JobStatus.complete and waited((info := await self.queue.job(job_id).result_info())
                                                         and info.result):
                # It ended waiting for the LLM budget: tried again each run (a period may have turned).
                waiting += 1
                enqueued.append(await self.queue.enqueue_formation(session_id, record.claim.window))
            elif status is JobStatus.in_progress:
                await self.queue.leases.release([job_id])
        if len(enqueued) > waiting:
            log.warning("enqueued again the lost formation job of %d window(s)", len(enqueued) - waiting)
        if waiting:
            log.info("tried again %d window(s) waiting for the LLM budget", waiting)
        return enqueued

    async def embed_pending(self, agent_id: str, batch: int = EMBED_BATCH,
                            seconds: float = EMBED_JOB_SECONDS) -> dict[str, int]:
        """Embed the agent's memories stored without an embedding: the job a record enqueues.

        The caller holds the agent's embedding lock (``StateStore.commit_message`` gave it).
        A pass clears the agent's "due" mark, then embeds until nothing is left; the lock is
        let go only if nothing was marked due meanwhile, else another pass runs, and passes
        are ``EMBED_LINGER_SECONDS`` apart. After ``seconds`` the job enqueues its sequel,
        keeping the lock. A failing embedder ends the job and keeps the lock until it
        expires: records do not call the embedder again before then (the backfill cron also
        retries). Each memory is claimed before it is embedded (memory_service/embedding/once.py):
        one another caller claimed (a record-time run, the backfill) is skipped for the rest of
        the pass, and the job keeps its lock for another pass, until that caller has written it
        or its claim was let go or expired (a caller that died): then the job claims it.
        docs/ingest.md tells the whole protocol. Counts: ``embedded``, ``passes``.
        """
        report = {"embedded": 0, "passes": 0}
        if self.embedder is None:
            return report
        _, backend = await self.agents.backend_for(agent_id)
        deadline = time.monotonic() + seconds
        try:
            while True:
                report["passes"] += 1
                await self.state.start_embedding(agent_id)
                busy: set[str] = set()  # claimed by another caller: not read again this pass
                gone: set[str] = set()  # read but not written (removed meanwhile, a claim expired): nor these
                while memories := await backend.unembedded(agent_id, batch, busy | gone):
                    outcome = await self._embed_once(backend, agent_id, memories)
                    report["embedded"] += outcome.stored
                    if outcome.failed:  # the embedder failed (it logged why)
                        return report
                    busy.update(outcome.busy)
                    if outcome.stored < outcome.claimed:
                        gone.update(m.id for m in memories if m.id not in busy)
                    await self.state.renew_embedding_lock(agent_id, EMBED_LOCK_MS)
                    if time.monotonic() > deadline:
                        await self.queue.enqueue_embedding(agent_id)
                        return report
                    if len(memories) < batch:  # all there was
                        break
                # What another caller holds it writes; if it fails or dies, its claims are let go
                # or expire: so the job keeps its lock and looks again, and claims them then.
                if busy:
                    await self.state.renew_embedding_lock(agent_id, EMBED_LOCK_MS)
                elif not await self.state.finish_embedding(agent_id, EMBED_LOCK_MS):
                    return report
                if time.monotonic() > deadline:
                    await self.queue.enqueue_embedding(agent_id)
                    return report
                await asyncio.sleep(EMBED_LINGER_SECONDS)
        finally:
            if report["embedded"]:
                await self.state.add_metrics(embedded_after_record=report["embedded"])

    async def _embed_once(self, backend: MemoryBackend, agent_id: str, memories: list[Memory]) -> Embedded:
        """Claim, embed and store ``memories`` (those no other caller holds), in calls of the
        embedder's own batch size. The embedding job and the backfill are the backlog: their
        model runs give way to a caller someone waits for (memory_service/embedding/turns.py)."""
        assert self.embedder is not None
        with backlog():
            return await embed_once(self.embedder, self.state.embed_claims, backend, agent_id, memories,
                                    self.settings.embedding_batch_size)

    async def backfill_embeddings(self, batch: int = 64, limit: int | None = None,
                                  on_progress: Callable[[str, int], None] | None = None) -> dict[str, int]:
        """Embed the memories stored without an embedding (the embedder was down); counts.

        Resumable by construction: what is embedded is no longer ``unembedded``. A memory
        another caller claimed (the agent's embedding job, a record-time run) is skipped: it
        embeds it. Stops at ``limit`` memories, or when the embedder fails (what is left
        waits for the next run).
        """
        report = {"embedded": 0, "failed_batches": 0}
        if self.embedder is None:
            return report
        try:
            for backend in await self.registry.live():
                for agent_id in await backend.agents():
                    skipped: set[str] = set()
                    while limit is None or report["embedded"] < limit:
                        size = batch if limit is None else min(batch, limit - report["embedded"])
                        memories = await backend.unembedded(agent_id, size, skipped)
                        if not memories:
                            break
                        outcome = await self._embed_once(backend, agent_id, memories)
                        report["embedded"] += outcome.stored
                        if on_progress and outcome.stored:
                            on_progress(agent_id, outcome.stored)
                        if outcome.failed:  # it logged why
                            report["failed_batches"] += 1
                            return report
                        skipped.update(outcome.busy)
                        if outcome.stored < outcome.claimed:  # removed meanwhile, or its claim expired
                            skipped.update(m.id for m in memories)
        finally:
            if report["embedded"]:
                await self.state.add_metrics(embeddings_backfilled=report["embedded"])
        return report
