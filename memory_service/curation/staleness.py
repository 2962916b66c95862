"""Which of an agent's old memories the stale purge takes (STALE_PURGE_DAYS;
docs/memory-tools.md, "Retention"). memory_service/curation/retention.py reads the candidates
(``MemoryBackend.written_before``: written before the cutoff, through an index on the
time) and purges what this module finds stale.

A memory is stale when the latest of its write (``valid_at``), its last update
(``updated_at``) and its last memory_get (the access bookkeeping, ``keyspace.memory_access``)
is older than the cutoff. Search and the memory block do not count as access: they read
many memories at once, and counting them would write on every read.

Every kind is concerned, evicted memories too, except what the pipeline still needs or
another rule governs:

* soft-deleted memories: PURGE_AFTER_DAYS decides their end, and undelete must work until then;
* messages pending formation (their sequence past the session's cursor, in a session that
  is not incognito): a gate, the cold sweep or a claimed window will read them;
* directives and suggestions queued for consolidation (``keyspace.cons_pending``):
  the next consolidation merges them;
* a consolidated memory that is its namespace's latest version (the memory block shows it,
  the next version is built on it), or that merged a memory still stored and not deleted
  (it is what that memory's consolidation made; the purge takes it after its items).

Each lookup is read once per agent and run (sessions, namespaces), so a batch costs a few
round trips, not one per memory.

The access times come through ``AccessTimes``, which retention.py's ``RetentionIndex``
satisfies: this module is the rule, retention.py the job that applies it, and the imports
run one way (retention -> staleness), never back.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from memory_service.backends.base import MemoryBackend
from memory_service.domain.models import Memory, MemoryKind
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.formation.consolidation import latest_consolidated
from memory_service.state.store import SessionCounters, StateStore


class AccessTimes(Protocol):
    """The last memory_get of memories (memory_service/curation/retention.py's ``RetentionIndex``)."""

    async def last_access(self, agent_id: str, memory_ids: Sequence[str]) -> dict[str, datetime]: ...


class StaleFilter:
    """The stale memories of one agent's batches, for one run (it remembers its lookups)."""

    def __init__(self, agent_id: str, backend: MemoryBackend, state: StateStore, index: AccessTimes,
                 cutoff: datetime):
        self.agent_id, self.backend, self.state, self.index, self.cutoff = agent_id, backend, state, index, cutoff
        self._sessions: dict[str, SessionCounters] = {}
        self._queued: dict[str, set[str]] = {}
        self._latest: dict[str, str | None] = {}

    async def stale(self, batch: Sequence[Memory]) -> list[Memory]:
        """The memories of ``batch`` (written before the cutoff) to purge."""
        accessed = await self.index.last_access(self.agent_id, [m.id for m in batch])
        old = [m for m in batch if m.deleted_at is None and not self._touched(m, accessed.get(m.id))]
        doomed = [m for m in old if m.kind is not MemoryKind.CONSOLIDATED and not await self._needed(m)]
        merged = [m for m in old if m.kind is MemoryKind.CONSOLIDATED]
        going = {m.id for m in doomed}
        for memory in merged:
            if not await self._consolidation_needs(memory, going):
                doomed.append(memory)
        return doomed

    def _touched(self, memory: Memory, accessed: datetime | None) -> bool:
        times = [t for t in (memory.valid_at, memory.updated_at, accessed) if t is not None]
        return max(times) >= self.cutoff

    async def _needed(self, memory: Memory) -> bool:
        """Whether formation or consolidation will still read it."""
        if memory.kind is MemoryKind.MESSAGE and memory.metadata.session_id:
            counters = await self._session(memory.metadata.session_id)
            return not counters.incognito and memory.metadata.sequence > counters.cursor
        if Namespace.parse(memory.namespace).kind in (NamespaceKind.USER, NamespaceKind.SHARD):
            if memory.namespace not in self._queued:
                self._queued[memory.namespace] = set(await self.state.consolidation_pending(memory.namespace))
            return memory.id in self._queued[memory.namespace]
        return False

    async def _session(self, session_id: str) -> SessionCounters:
        if session_id not in self._sessions:
            self._sessions[session_id] = await self.state.counters(session_id)
        return self._sessions[session_id]

    async def _consolidation_needs(self, memory: Memory, going: set[str]) -> bool:
        """Whether a consolidated memory is its namespace's latest, or merged a memory still live."""
        if memory.namespace not in self._latest:
            latest = await latest_consolidated(self.backend, self.agent_id, Namespace.parse(memory.namespace))
            self._latest[memory.namespace] = latest.id if latest else None
        if self._latest[memory.namespace] == memory.id:
            return True
        sources = [i for i in memory.metadata.memory_ids if i not in going]
        return any(m.deleted_at is None for m in await self.backend.find(self.agent_id, sources)) if sources else False
