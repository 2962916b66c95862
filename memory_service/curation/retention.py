"""Retention: what the memory tools record for it in Redis, and the daily purge.

Two small indexes, so that nothing here reads every memory (docs/memory-tools.md; the keys
in memory_service/state/keyspace.py):

- the deletion index (``keyspace.retention_deleted``, per agent, and the set of agents that
  have one, ``keyspace.RETENTION_AGENTS``): each soft-deleted memory by the time of its
  delete, so that the daily job reads the entries due (a range by score per agent), not the
  stores; one key per agent, not one for every agent, so that no node of a Redis Cluster
  holds every agent's deletes;
- the access bookkeeping (``keyspace.memory_access``, per agent): how many memory_get calls
  read each memory, and when the last did (shown by memory_get, never used for ranking).

The purge takes each due memory out of every store through the backend's ``delete`` (the
one the erasure uses: every index, the vector, MongoDB through the outbox behind the
writes queued before it), out of queued outbox entries, then out of consolidation queues
and cached memory blocks (memory_service/curation/removal.py, as an erasure does) and
FalkorDB's log of recent queries, then out of both indexes. It counts
what went in the metrics (``memory_service_purged_memories_total``) and the audit log.

The same run then purges, the same way, every memory whose ``expires_at`` has passed
(docs/expiry.md): the reads skip it from that moment, and the purge takes it out of the stores
for good. Each agent's are read through the stores' index on the time of expiry
(``MemoryBackend.expired``); counted apart (``memory_service_expired_purged_memories_total``)
and audited as ``memory.purge`` with reason ``expired``.

With STALE_PURGE_DAYS set, the same run then purges, the same way, memories nobody wrote,
updated or read by memory_get for that long: each agent's memories written before the
cutoff are read in batches through the stores' index on the time
(``MemoryBackend.written_before``), and memory_service/curation/staleness.py says which of them go
(``memory_service_stale_purged_memories_total``; audit ``memory.purge`` with reason
``stale``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

from memory_service.access.audit import audited_fact
from memory_service.curation.removal import Removal
from memory_service.curation.staleness import StaleFilter
from memory_service.domain.errors import Conflict, NotFound
from memory_service.domain.models import Memory, count_kinds
from memory_service.events.log import Cause
from memory_service.schemas.events import Event, EventType
from memory_service.state import keyspace

if TYPE_CHECKING:
    from memory_service.access.audit import AuditLog
    from memory_service.backends.agents import AgentDirectory
    from memory_service.backends.base import MemoryBackend
    from memory_service.config import Settings
    from memory_service.curation.erasure_state import ErasureState
    from memory_service.events.log import EventLog
    from memory_service.events.webhooks import Webhooks
    from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

PURGE_BATCH = 500  # due entries read per round trip
STALE_BATCH = 500  # memories written before the stale cutoff read per round trip
EXPIRED_BATCH = 500  # expired memories read per round trip
PURGE_ACTOR = "retention"  # the audit log's key id for the daily job


@dataclass(frozen=True, slots=True)
class Access:
    count: int = 0
    last: datetime | None = None


@dataclass(slots=True)
class PurgeReport:
    purged: int = 0  # memories removed from the stores
    agents: dict[str, int] = field(default_factory=dict)  # per agent
    skipped: int = 0  # due entries not purged: no store holds the memory, it was undeleted, or deleted again later
    stale: int = 0  # memories purged as stale (STALE_PURGE_DAYS), counted apart from ``purged``
    expired: int = 0  # memories purged past their ``expires_at``, counted apart from ``purged``

    def counts(self) -> dict[str, int]:
        return {"purged": self.purged, "agents": len(self.agents), "skipped": self.skipped, "stale": self.stale,
                "expired": self.expired}

    def add(self, agent_id: str, purged: int) -> None:
        if purged:
            self.agents[agent_id] = self.agents.get(agent_id, 0) + purged


class RetentionIndex:
    """The deletion index and the access bookkeeping (Redis)."""

    def __init__(self, state: StateStore):
        self.redis = state.redis

    async def mark_deleted(self, agent_id: str, memory_id: str, at: datetime) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.sadd(keyspace.RETENTION_AGENTS, agent_id)  # first: the purge must find the agent
            pipe.zadd(keyspace.retention_deleted(agent_id), {memory_id: at.timestamp()})
            await pipe.execute()

    async def unmark_deleted(self, agent_id: str, memory_id: str) -> None:
        await self.redis.zrem(keyspace.retention_deleted(agent_id), memory_id)

    async def due(self, deleted_before: datetime, limit: int) -> list[tuple[str, str]]:
        """(agent, memory id) of up to ``limit`` memories soft-deleted before ``deleted_before``,
        deleted longest first (one pipeline over the agents that have deletes)."""
        agents = sorted(cast(set[str], await self.redis.smembers(keyspace.RETENTION_AGENTS)))
        async with self.redis.pipeline(transaction=False) as pipe:
            for agent_id in agents:
                pipe.zrangebyscore(keyspace.retention_deleted(agent_id), "-inf", deleted_before.timestamp(),
                                   start=0, num=limit, withscores=True)
            found = cast(list[list[tuple[str, float]]], await pipe.execute())
        rows = sorted(((score, agent_id, str(memory_id)) for agent_id, members in zip(agents, found)
                       for memory_id, score in members))
        return [(agent_id, memory_id) for _, agent_id, memory_id in rows[:limit]]

    async def forget(self, agent_id: str, memory_ids: Sequence[str]) -> None:
        """Both indexes' entries of purged memories."""
        if not memory_ids:
            return
        async with self.redis.pipeline(transaction=True) as pipe:  # both under the agent's retention tag
            pipe.zrem(keyspace.retention_deleted(agent_id), *memory_ids)
            pipe.hdel(keyspace.memory_access(agent_id), *(f"{p}:{i}" for i in memory_ids for p in "nt"))
            await pipe.execute()

    async def count_access(self, agent_id: str, memory_id: str, at: datetime) -> Access:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(keyspace.memory_access(agent_id), f"n:{memory_id}", 1)
            pipe.hset(keyspace.memory_access(agent_id), f"t:{memory_id}", f"{at.timestamp():.6f}")
            count, _ = await pipe.execute()
        return Access(int(count), at)

    async def last_access(self, agent_id: str, memory_ids: Sequence[str]) -> dict[str, datetime]:
        """The last memory_get of each of these memories that was ever read (one round trip)."""
        if not memory_ids:
            return {}
        times = await self.redis.hmget(keyspace.memory_access(agent_id), [f"t:{i}" for i in memory_ids])
        return {i: datetime.fromtimestamp(float(t), UTC) for i, t in zip(memory_ids, times) if t}

    async def accesses(self, agent_id: str, memory_ids: Sequence[str]) -> dict[str, Access]:
        """``access`` of each of these memories, in one round trip (never-read ones count 0)."""
        if not memory_ids:
            return {}
        raw = cast(list[str | None], await self.redis.hmget(keyspace.memory_access(agent_id),
                                                             [f"{p}:{i}" for i in memory_ids for p in "nt"]))
        found = {}
        for k, memory_id in enumerate(memory_ids):
            count, last = raw[2 * k], raw[2 * k + 1]
            found[memory_id] = Access(int(count or 0), datetime.fromtimestamp(float(last), UTC) if last else None)
        return found

    async def access(self, agent_id: str, memory_id: str) -> Access:
        count, last = await self.redis.hmget(keyspace.memory_access(agent_id), [f"n:{memory_id}", f"t:{memory_id}"])
        return Access(int(count or 0), datetime.fromtimestamp(float(last), UTC) if last else None)


def purge_at(deleted_at: datetime | None, purge_after_days: int) -> datetime | None:
    """When the daily job purges a memory soft-deleted at ``deleted_at`` (None: never)."""
    if deleted_at is None or purge_after_days <= 0:
        return None
    return deleted_at + timedelta(days=purge_after_days)


class Retention:
    """The daily purge of soft-deleted memories past PURGE_AFTER_DAYS."""

    def __init__(self, settings: Settings, state: StateStore, agents: AgentDirectory, index: RetentionIndex,
                 erasure_state: ErasureState, audit: AuditLog, events: EventLog | None = None,
                 webhooks: Webhooks | None = None):
        self.settings, self.state, self.agents, self.index = settings, state, agents, index
        self.removal, self.audit, self.events, self.webhooks = Removal(state, erasure_state), audit, events, webhooks

    async def purge(self, now: datetime | None = None) -> PurgeReport:
        """The daily run: soft-deleted memories past PURGE_AFTER_DAYS, expired ones, then stale ones."""
        now = now or datetime.now(UTC)
        report = PurgeReport()
        await self._purge_deleted(now, report)
        await self._purge_expired(now, report)
        await self._purge_stale(now, report)
        return report

    async def _listed_agents(self) -> list[str]:
        """Every agent any live store holds memories of, each once."""
        listed: dict[str, None] = {}
        for backend in await self.agents.registry.live():
            listed.update(dict.fromkeys(await backend.agents()))
        return list(listed)

    async def _purge_expired(self, now: datetime, report: PurgeReport) -> None:
        agents = 0
        for agent_id in await self._listed_agents():
            purged = await self._purge_expired_agent(agent_id, now)
            report.expired += purged
            report.add(agent_id, purged)
            agents += bool(purged)
        if report.expired:
            await self.state.add_metrics(expired_purged_memories=report.expired)
        log.warning("retention: purged %d expired memories of %d agents (expired by %s)", report.expired, agents,
                    now.isoformat())

    async def _purge_expired_agent(self, agent_id: str, now: datetime) -> int:
        _, backend = await self.agents.backend_for(agent_id)
        purged, kinds, seen = 0, Counter[str](), set[str]()
        while batch := [m for m in await backend.expired(agent_id, now, EXPIRED_BATCH) if m.id not in seen]:
            seen.update(m.id for m in batch)  # a memory the store failed to drop is not read again
            await self._close_facts(agent_id, backend, batch, now)  # while their sources are still stored
            purged += await self._remove(agent_id, backend, batch)
            await self._emit(agent_id, batch, "expired", EventType.EXPIRED)
            kinds.update(count_kinds(batch))
        if kinds:
            await backend.purge_query_log(agent_id)
            await self.audit.append(PURGE_ACTOR, "memory.purge", agent_id, None,
                                    after={"purged": sum(kinds.values()), "reason": "expired",
                                           "expired_by": now.isoformat(), "kinds": dict(kinds)})
        return purged

    async def _purge_deleted(self, now: datetime, report: PurgeReport) -> None:
        days = self.settings.purge_after_days
        if days <= 0:
            log.info("retention: PURGE_AFTER_DAYS is 0, soft-deleted memories are kept")
            return
        cutoff = now - timedelta(days=days)
        seen: set[tuple[str, str]] = set()
        while due := await self.index.due(cutoff, PURGE_BATCH):
            if seen.issuperset(due):
                break  # entries kept on purpose (deleted again later in the store): nothing more is due
            seen.update(due)
            by_agent: dict[str, list[str]] = {}
            for agent_id, memory_id in due:
                by_agent.setdefault(agent_id, []).append(memory_id)
            for agent_id, ids in by_agent.items():
                purged = await self._purge_agent(agent_id, ids, cutoff)
                report.purged += purged
                report.skipped += len(ids) - purged
                report.add(agent_id, purged)
        if report.purged or report.skipped:
            await self.state.add_metrics(purged_memories=report.purged, purge_runs=1)
        log.warning("retention: purged %d soft-deleted memories of %d agents (deleted before %s); %d skipped",
                    report.purged, len(report.agents), cutoff.isoformat(), report.skipped)

    async def _purge_agent(self, agent_id: str, ids: list[str], cutoff: datetime) -> int:
        _, backend = await self.agents.backend_for(agent_id)
        # Only what is still deleted, and deleted before the cutoff: an undelete racing the
        # index read keeps its memory.
        held = [m for m in await backend.find(agent_id, ids) if m.deleted_at is not None and m.deleted_at <= cutoff]
        doomed = {m.id for m in held}
        purged = 0
        if doomed:
            purged = await self._remove(agent_id, backend, held)
            await self._emit(agent_id, held, "deleted")
            await backend.purge_query_log(agent_id)
            await self.audit.append(PURGE_ACTOR, "memory.purge", agent_id, None,
                                    after={"purged": len(doomed), "reason": "deleted",
                                           "deleted_before": cutoff.isoformat(), "kinds": count_kinds(held)})
        # Entries whose memory is gone or undeleted leave the index too (an undelete removes
        # its own; this covers a crash between the two).
        still_deleted_later = {m.id for m in await backend.find(agent_id, [i for i in ids if i not in doomed])
                               if m.deleted_at is not None}
        await self.index.forget(agent_id, [i for i in ids if i not in still_deleted_later])
        return purged

    async def _close_facts(self, agent_id: str, backend: MemoryBackend, expired: list[Memory], now: datetime) -> None:
        """The graph's facts that came from ``expired`` memories alone (none of their sources
        is live any longer) end as facts do: closed, ``invalid_at`` the latest expiry of their
        sources, the edge and its history kept; each audited as ``fact.invalidate``."""
        facts = await backend.facts_citing(agent_id, [m.id for m in expired])
        if not facts:
            return
        sources = {m.id: m for m in await backend.find(agent_id, sorted({i for f in facts for i in f.memory_ids}))}
        for fact in facts:
            cited = [sources[i] for i in fact.memory_ids if i in sources]
            if any(m.live for m in cited):
                continue  # still held by a memory that lives
            invalid_at = max((m.expires_at for m in cited if m.expires_at is not None), default=now)
            try:
                closed = await backend.invalidate_fact(agent_id, fact.id, invalid_at)
            except (Conflict, NotFound):
                continue  # closed or erased meanwhile
            await self.audit.append(PURGE_ACTOR, "fact.invalidate", agent_id, fact.id, before=audited_fact(fact),
                                    after={**audited_fact(closed), "reason": "expired"})

    async def _purge_stale(self, now: datetime, report: PurgeReport) -> None:
        days = self.settings.stale_purge_days
        if days <= 0:
            return
        cutoff = now - timedelta(days=days)
        agents = 0
        for agent_id in await self._listed_agents():
            purged = await self._purge_stale_agent(agent_id, cutoff)
            report.stale += purged
            report.add(agent_id, purged)
            agents += bool(purged)
        await self.state.add_metrics(stale_purged_memories=report.stale, stale_purge_runs=1)
        log.warning("retention: purged %d stale memories of %d agents (not written, updated or read since %s)",
                    report.stale, agents, cutoff.isoformat())

    async def _purge_stale_agent(self, agent_id: str, cutoff: datetime) -> int:
        _, backend = await self.agents.backend_for(agent_id)
        judge = StaleFilter(agent_id, backend, self.state, self.index, cutoff)
        purged, kinds = 0, Counter[str]()
        after: tuple[float, str] | None = None
        while batch := await backend.written_before(agent_id, cutoff, STALE_BATCH, after):
            cursor = (batch[-1].valid_at.timestamp(), batch[-1].id)
            if cursor == after:
                break  # the store answered the same page again: nothing more to read
            after = cursor
            if doomed := await judge.stale(batch):
                purged += await self._remove(agent_id, backend, doomed)
                await self._emit(agent_id, doomed, "stale")
                kinds.update(count_kinds(doomed))
            if len(batch) < STALE_BATCH:
                break
        if kinds:
            await backend.purge_query_log(agent_id)
            await self.audit.append(PURGE_ACTOR, "memory.purge", agent_id, None,
                                    after={"purged": sum(kinds.values()), "reason": "stale",
                                           "not_accessed_since": cutoff.isoformat(), "kinds": dict(kinds)})
        return purged

    async def _emit(self, agent_id: str, purged: list[Memory], reason: str,
                    type_: EventType = EventType.PURGED) -> None:
        """The purged memories' earlier change events go (from the stream and the webhooks'
        dead letters), and one ``purged`` event (``expired`` for memories past their
        ``expires_at``) names their ids: the one trace a purge leaves, which a host needs to
        drop its own copy (trimmed with the stream, docs/events.md)."""
        ids = {m.id for m in purged}

        def named(event: Event) -> bool:
            return not ids.isdisjoint(event.memory_ids)

        if self.webhooks is not None:
            await self.webhooks.forget(agent_id, named)
        if self.events is not None:
            await self.events.remove(agent_id, named)
            await self.events.emit_memories(agent_id, type_, purged, Cause(key_id=PURGE_ACTOR, reason=reason))

    async def _remove(self, agent_id: str, backend: MemoryBackend, held: list[Memory]) -> int:
        """Purge these memories: queued writes quoting them, every store, Redis (but the query log)."""
        doomed_set = {m.id for m in held}
        doomed = sorted(doomed_set)

        def judge(memory: Memory) -> Memory | None:
            return None if memory.id in doomed_set else memory

        await backend.scrub_pending(agent_id, judge, doomed)  # queued writes quoting them
        purged = await backend.delete(agent_id, doomed)
        await self.removal.forget(agent_id, held)  # the caller then trims the store's query log
        await self.removal.drop_forget_records(agent_id, doomed)
        await self.index.forget(agent_id, doomed)
        return purged
