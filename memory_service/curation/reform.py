"""Re-forming one formed window: the memories its extraction made replaced by a new one's.

The one implementation of "form this window again", for its two callers: a re-formation
with the extractor configured now (memory_service/curation/reformation.py, ``memory-service
reform``, ``POST /v1/agents/{agent_id}/reform``) and a forget, which re-forms the window of
a forgotten message from its remaining messages (memory_service/curation/forget.py).

Which memories a window made is kept with the window's entry in the session's formed
windows (``memory_ids``, written by formation, memory_service/formation/steps.py, and by
every re-formation). For windows formed before that was kept, they are found by provenance:
formed kinds of the session whose sequence lies in the window and whose messages are all
the window's. Memories written by hand or by tools never are (they are not in the entry,
and their provenance has no sequence), so a re-formation never touches them.

The steps, each resumable, kept in a record per window (``keyspace`` session part
``reform``; memory_service/state/records.py) so that a crash anywhere is finished by the
next run, exactly once:

1. **planned**: the window's messages to form from (its live ones, less those excluded),
   the old memories' ids, and the knowledge-graph facts and entities that came from them
   alone. A window already being re-formed is finished first.
2. **extracted**: ONE extractor call on those messages, stored in the record before
   anything is written (a retry never calls the extractor again; an LLM answers
   differently each time).
3. the swap, in one statement of the store (``MemoryBackend.swap``): the new memories
   written and the old ones deleted for good (or, for a soft forget, soft-deleted at the
   forget's time) at once, so no reader sees both or neither; then the old ones' facts
   dropped (closed, for a soft forget), the new graph written, the window's entry naming
   the new memories (``memory_ids``, ``reforms``, ``reformed_at``, ``extractor``), caches
   and consolidation queues; every part idempotent. The record is deleted last.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from memory_service.access.audit import AuditLog, audited_fact
from memory_service.backends.base import MemoryBackend
from memory_service.curation.removal import Removal
from memory_service.curation.retention import RetentionIndex
from memory_service.domain.errors import Conflict, NotFound, NotSupported
from memory_service.domain.expiry import ExpiryPolicy
from memory_service.domain.models import Memory, MemoryKind, Provenance, Shard, count_kinds
from memory_service.domain.namespaces import Namespace
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.memories import embed_memories
from memory_service.events.log import Cause, EventLog
from memory_service.formation.extractor import Extractor
from memory_service.formation.steps import CONSOLIDATED_KINDS, extract_claim, write_graph
from memory_service.formation.window import Claim, StoredExtraction
from memory_service.schemas.events import EventType
from memory_service.state import keyspace
from memory_service.state.cache import agent_wide
from memory_service.state.records import Records
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

FORMED_KINDS = (MemoryKind.EPISODE, MemoryKind.FACT, MemoryKind.DIRECTIVE, MemoryKind.SUGGESTION)
PLANNED, EXTRACTED = "planned", "extracted"
REFORM_ACTOR = "reform"  # the audit log's actor for the facts a re-formation closes, with no key


@dataclass(slots=True)
class Reformed:
    """What re-forming one window did."""

    session_id: str
    window: int
    messages: int = 0  # messages it was formed from
    old: list[Memory] = field(default_factory=list)  # the memories taken out
    new: list[Memory] = field(default_factory=list)  # the memories of the new extraction
    facts: list[str] = field(default_factory=list)  # facts dropped (closed, for a soft forget)
    entities: int = 0  # entities dropped: nothing linked to them any more
    extractor: str = ""
    llm_calls: int = 0
    cached_blocks: int = 0


@dataclass(frozen=True, slots=True)
class Window:
    """A formed window as the session keeps it."""

    session_id: str
    number: int
    stored: str  # the entry's JSON, as kept (to replace it)
    entry: dict[str, Any]

    @property
    def first(self) -> int:
        return int(self.entry.get("first_sequence", 0))

    @property
    def last(self) -> int:
        return int(self.entry.get("last_sequence", 0))


async def formed_windows(state: StateStore, session_id: str) -> list[Window]:
    return [Window(session_id, int(entry["window"]), raw, entry) for raw, entry in await state.formed_windows(session_id)
            if isinstance(entry.get("window"), int)]


async def window_of(state: StateStore, session_id: str, sequence: int) -> Window | None:
    """The formed window that held the message of ``sequence``."""
    return next((w for w in await formed_windows(state, session_id) if w.first <= sequence <= w.last), None)


def items(memories: Sequence[Memory]) -> list[list[str | None]]:
    """What a record keeps of memories: [id, namespace, kind, session], never content."""
    return [[m.id, m.namespace, m.kind.value, m.metadata.session_id] for m in memories]


def stubs(agent_id: str, kept: Sequence[Sequence[str | None]]) -> list[Memory]:
    """Memories as a record kept them (no content): what caches, queues, windows' entries and
    events need of memories a crash may have deleted already."""
    return [Memory(id=str(row[0]), kind=MemoryKind(str(row[2])), namespace=str(row[1]), content="",
                   metadata=Provenance(agent_id=agent_id, session_id=row[3] if len(row) > 3 else None))
            for row in kept]


def _live_message(memory: Memory) -> bool:
    return memory.kind is MemoryKind.MESSAGE and memory.deleted_at is None and not memory.expired()


class WindowReformer:
    def __init__(self, state: StateStore, removal: Removal, index: RetentionIndex, audit: AuditLog | None,
                 events: EventLog | None, embedder: Embedder | None):
        self.state, self.removal, self.index, self.audit, self.events = state, removal, index, audit, events
        self.embedder = embedder
        self.records = Records(state.redis)

    @staticmethod
    def _key(session_id: str) -> str:
        return keyspace.session_keys(session_id)["reform"]

    async def in_progress(self, session_id: str) -> list[int]:
        return sorted(int(w) for w in await self.records.all(self._key(session_id)))

    async def session_messages(self, agent_id: str, backend: MemoryBackend, session_id: str) -> list[Memory]:
        return [m for m in await backend.export(agent_id, Namespace.session(session_id)) if m.kind is MemoryKind.MESSAGE]

    async def plan_of(self, agent_id: str, backend: MemoryBackend, window: Window,
                      exclude: Sequence[str] = ()) -> tuple[list[tuple[str, int]], list[Memory]]:
        """(the messages a re-formation would form the window from: [(id, sequence)], the
        memories the window's extraction made that are still stored)."""
        session_id = window.session_id
        session = await backend.export(agent_id, Namespace.session(session_id))
        messages = sorted(((m.metadata.message_ids[0], m.metadata.sequence) for m in session
                           if _live_message(m) and m.metadata.message_ids and window.first <= m.metadata.sequence <= window.last
                           and m.metadata.message_ids[0] not in set(exclude)), key=lambda row: row[1])
        ids = window.entry.get("memory_ids")
        if isinstance(ids, list):
            old = [m for m in await backend.find(agent_id, [str(i) for i in ids]) if m.metadata.agent_id == agent_id]
        else:  # formed before windows kept their memories: by provenance
            in_window = {m.metadata.message_ids[0] for m in session
                         if m.kind is MemoryKind.MESSAGE and m.metadata.message_ids
                         and window.first <= m.metadata.sequence <= window.last}
            namespaces = [Namespace.session(session_id)]
            namespaces += [Namespace.user(agent_id, u) for u in sorted(await self.state.session_users(session_id))]
            namespaces += [Namespace.shard(agent_id, s) for s in await self.state.shards(agent_id)]
            old = []
            for namespace in namespaces:
                for m in session if namespace.kind.value == "session" else await backend.export(agent_id, namespace):
                    p = m.metadata
                    if (m.kind in FORMED_KINDS and p.session_id == session_id and p.message_ids
                            and window.first <= p.sequence <= window.last and set(p.message_ids) <= in_window):
                        old.append(m)
        return messages, old

    async def reform(self, *, agent_id: str, backend: MemoryBackend, window: Window, extractor: Extractor,
                     shards: list[Shard], expiry: ExpiryPolicy | None = None, exclude: Sequence[str] = (),
                     retire_at: datetime | None = None, op: str = "reform", gone: EventType = EventType.DELETED,
                     cause: Cause = Cause()) -> Reformed:
        """Re-form ``window`` (of ``agent_id``, on ``backend``) with ``extractor``, leaving out
        the messages ``exclude`` names; resumes a re-formation of it left unfinished first.
        ``retire_at``: soft-delete the old memories at that time (a soft forget) instead of
        deleting them. ``op`` names the run in the window's entry. ``gone``: the event the old
        memories are announced with."""
        key, name = self._key(window.session_id), str(window.number)
        record = await self.records.get(key, name)
        if record is not None and record.get("op") != op:  # another run's, left by a crash: finished first
            await self._finish(agent_id, backend, window.session_id, record, extractor, shards, expiry,
                               EventType(record.get("gone", EventType.DELETED.value)), Cause(reason=record.get("op")))
            window = next((w for w in await formed_windows(self.state, window.session_id) if w.number == window.number),
                          window)
            record = None
        if record is None:
            messages, old = await self.plan_of(agent_id, backend, window, exclude)
            facts, entities = await self.graph_of(agent_id, backend, [m.id for m in old])
            planned = {"state": PLANNED, "op": op, "window": window.number, "messages": messages,
                       "old": items(old), "facts": facts, "entities": entities,
                       "retire_at": retire_at.isoformat() if retire_at else None, "gone": gone.value,
                       "planned_at": round(time.time(), 3)}
            _, record = await self.records.advance(key, name, "", planned)
            if record is None:  # finished by a racing run meanwhile
                return Reformed(window.session_id, window.number)
        return await self._finish(agent_id, backend, window.session_id, record, extractor, shards, expiry, gone, cause)

    async def graph_of(self, agent_id: str, backend: MemoryBackend, old_ids: list[str]) -> tuple[list[str], list[str]]:
        """The current facts that came from these memories alone, and the entities they link
        or the memories mention (dropped when nothing else links to them)."""
        if not old_ids:
            return [], []
        doomed = set(old_ids)
        facts = [f for f in await backend.facts_citing(agent_id, old_ids) if set(f.memory_ids) <= doomed]
        entities = {e for f in facts for e in (f.subject_id, f.object_id)}
        try:
            for mentioned in (await backend.entities_mentioned(agent_id, old_ids, 100)).values():
                entities.update(e.entity_id for e in mentioned)
        except NotSupported:
            pass
        return [f.id for f in facts], sorted(entities)

    async def _finish(self, agent_id: str, backend: MemoryBackend, session_id: str, record: dict[str, Any],
                      extractor: Extractor, shards: list[Shard], expiry: ExpiryPolicy | None, gone: EventType,
                      cause: Cause) -> Reformed:
        key, name = self._key(session_id), str(record["window"])
        done = Reformed(session_id, int(record["window"]), messages=len(record["messages"]))
        claim = Claim(session_id, int(record["window"]), tuple((str(i), int(s)) for i, s in record["messages"]))
        if record["state"] == PLANNED:
            extraction = await extract_claim(claim, agent_id, backend, extractor, shards, expiry)
            moved, found = await self.records.advance(key, name, PLANNED, {**record, "state": EXTRACTED,
                                                                          "extraction": extraction.to_json()})
            if found is None:
                return done  # finished by a racing run
            record = found
            done.llm_calls = extraction.usage.calls if moved and extraction.usage else 0
        stored = StoredExtraction.from_json(record["extraction"])
        done.new, done.extractor = list(stored.memories), stored.extractor or extractor.name
        new_ids = {m.id for m in stored.memories}
        done.old = [m for m in stubs(agent_id, record["old"]) if m.id not in new_ids]
        old_ids = [m.id for m in done.old]
        retire_at = datetime.fromisoformat(record["retire_at"]) if record.get("retire_at") else None
        if retire_at is not None:  # indexed first, as a soft delete is: the purge finds them
            for memory in done.old:
                await self.index.mark_deleted(agent_id, memory.id, retire_at)
        await embed_memories(self.embedder, done.new)
        await backend.swap(agent_id, done.new, old_ids, retire_at)
        done.facts, done.entities = await self.drop_graph(agent_id, backend, record, retire_at)
        try:
            await write_graph(agent_id, backend, claim, stored, self.audit, self.embedder)
        except NotSupported:
            pass
        done.cached_blocks = (await self.removal.forget(agent_id, done.old)).cached_blocks
        await self._rewrite_entry(session_id, record, done)
        async with self.state.redis.pipeline(transaction=False) as pipe:
            for memory in done.new:
                if memory.kind in CONSOLIDATED_KINDS:
                    pipe.rpush(keyspace.cons_pending(memory.namespace), memory.id)
            await pipe.execute()
        await self.state.cache.bump(*sorted({m.namespace for m in done.new}), agent_wide(agent_id))
        if self.events is not None:
            window_cause = Cause(key_id=cause.key_id, session_id=session_id, window=done.window,
                                 reason=cause.reason or str(record["op"]))
            await self.events.emit_memories(agent_id, gone, done.old, window_cause)
            await self.events.emit_memories(agent_id, EventType.FORMED, done.new, window_cause)
        await self.records.advance(key, name, EXTRACTED, None)
        log.info("re-formed session %s window %d (%d messages): %d memories replaced by %d", session_id, done.window,
                 done.messages, len(done.old), len(done.new))
        return done

    async def drop_graph(self, agent_id: str, backend: MemoryBackend, record: dict[str, Any],
                          retire_at: datetime | None) -> tuple[list[str], int]:
        facts = [str(f) for f in record.get("facts", [])]
        if retire_at is not None:  # a soft forget: closed, kept for its undo
            for fact_id in facts:
                try:
                    before = await backend.get_fact(agent_id, fact_id)
                    after = await backend.invalidate_fact(agent_id, fact_id, retire_at)
                except (Conflict, NotFound, NotSupported):
                    continue  # closed already (a retry), or gone
                if self.audit is not None:
                    await self.audit.append(REFORM_ACTOR, "fact.invalidate", agent_id, fact_id,
                                            before=audited_fact(before), after={**audited_fact(after),
                                                                                "reason": "forgotten"})
            return facts, 0
        await backend.drop_facts(agent_id, facts)
        return facts, await backend.drop_orphan_entities(agent_id, [str(e) for e in record.get("entities", [])])

    async def _rewrite_entry(self, session_id: str, record: dict[str, Any], done: Reformed) -> None:
        """The window's entry names the new memories (visible in the browse API): once per run."""
        current = next((w for w in await formed_windows(self.state, session_id) if w.number == done.window), None)
        if current is None or current.entry.get("op") == record["op"]:
            return  # written by this run already (a retry), or the session's entries are gone
        entry = {**current.entry, "memory_ids": [m.id for m in done.new], "memories": len(done.new),
                 "messages": done.messages, "extractor": done.extractor, "op": record["op"],
                 "reforms": int(current.entry.get("reforms", 0)) + 1, "reformed_at": round(time.time(), 3),
                 "replaced": [m.id for m in done.old], "replaced_kinds": count_kinds(done.old)}
        await self.state.replace_formed_window(session_id, current.stored, entry, current.last)
