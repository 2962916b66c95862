"""Erasing a user, and exporting what is held on them (docs/erasure.md).

What is held on user U of agent A (``Holdings``), found from the user's session index
and the stores, never by scanning a keyspace:

* U's messages: every message recorded in a session of A under U's id (any role);
* the memories formed from them: any memory whose provenance names U (``user_id``), cites
  one of U's messages (``message_ids``, within its session), or merged one of the above
  (a consolidated memory's ``memory_ids``), and every later version of such a consolidated
  memory (each version carries the one before);
* everything in U's own namespace (directives and their consolidated versions);
* provenance: other users' memories that list U among a window's speakers (``user_ids``)
  but hold none of U's words keep their content; U's id is taken out of their provenance.

The rule for shared memories: a memory formed from U's messages AND other users' (an
episode of a shared window, a shard's consolidated memory that merged U's suggestion) is
removed whole and nothing is formed again in its place; the report lists each one.

Erasure order, so that a crash at any step is finished by a retry: first the user's API
keys (revoked, or the user taken out of a key for others too: nothing is recorded for the
user meanwhile); find everything; take it out of the queued writes (outbox); out of the
session ledgers (Redis); out of every store; then the consolidation queues, job results,
cached blocks and the user's session index, which is how a retry finds the user's
sessions; last, when anything was found, the stores' query logs and their append-only
files (memory_service/state/persistence.py). The audit log and the logs hold the user only as a
keyed digest (memory_service/access/pseudonyms.py): nothing there to rewrite.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memory_service.access.audit import AuditLog
from memory_service.access.keys import KeyStore
from memory_service.backends.agents import AgentDirectory
from memory_service.backends.base import MemoryBackend
from memory_service.backends.registry import BackendRegistry
from memory_service.curation.erasure_state import ErasureState
from memory_service.curation.removal import Removal
from memory_service.domain.errors import BackendUnavailable, NotSupported
from memory_service.domain.graph import Entity, Fact
from memory_service.domain.models import Memory, MemoryKind, count_kinds, utcnow
from memory_service.domain.namespaces import Namespace
from memory_service.events.log import Cause, Changed, EventLog, names_user
from memory_service.events.webhooks import Webhooks
from memory_service.formation.jobs import JobQueue
from memory_service.schemas.erasure import (
    ErasureReport,
    ExportedMemory,
    SessionMembership,
    SharedReference,
    SharedRemoval,
    UserExport,
)
from memory_service.schemas.events import EventType
from memory_service.schemas.graph import EntityOut, FactOut
from memory_service.state.persistence import rewrite as rewrite_persistence
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

# Memories per delete or provenance call to a store.
STORE_BATCH = 500
GRAPH_PAGE = 200  # entities per listing call of an export


@dataclass(slots=True)
class Holdings:
    """Everything held on one user of one agent, and the rule that judges any memory."""

    agent_id: str
    user_id: str
    message_keys: set[tuple[str, str]] = field(default_factory=set)  # (session, message id) of the user's messages
    removed: dict[str, Memory] = field(default_factory=dict)  # id -> memory to remove
    rewritten: dict[str, Memory] = field(default_factory=dict)  # id -> memory with the user out of its provenance
    shared: dict[str, str] = field(default_factory=dict)  # id -> why a shared memory goes
    first_removed_version: dict[str, int] = field(default_factory=dict)  # namespace -> oldest consolidated version removed
    sessions: dict[str, list[Memory]] = field(default_factory=dict)  # session -> its memories (all users)
    shared_sessions: set[str] = field(default_factory=set)  # sessions other users recorded in

    @property
    def own_namespace(self) -> str:
        return str(Namespace.user(self.agent_id, self.user_id))

    def _reason(self, memory: Memory) -> str | None:
        """Why ``memory`` must go, or None."""
        p = memory.metadata
        if memory.namespace == self.own_namespace:
            return "in the user's namespace"
        if p.user_id == self.user_id:
            return "attributed to the user"
        if p.session_id is not None and any((p.session_id, m) in self.message_keys for m in p.message_ids):
            return "formed from the user's messages"
        if any(i in self.removed for i in p.memory_ids):
            return "merged a removed memory"
        version = self.first_removed_version.get(memory.namespace)
        if memory.kind is MemoryKind.CONSOLIDATED and version is not None and p.sequence > version:
            return "a later version of a removed consolidated memory (each version carries the one before)"
        return None

    def _holds_others(self, memory: Memory) -> bool:
        """Whether a memory to remove also holds other users' contributions."""
        if memory.kind is MemoryKind.MESSAGE or memory.namespace == self.own_namespace:
            return False
        if memory.kind is MemoryKind.CONSOLIDATED:
            return True  # it carries the versions before it, merged from anyone's items
        p = memory.metadata
        if p.session_id is not None and p.message_ids:
            return any((p.session_id, m) not in self.message_keys for m in p.message_ids)
        return bool({*p.user_ids, p.user_id} - {self.user_id, None})

    def judge(self, memory: Memory) -> Memory | None:
        """None: remove it; a copy without the user in its provenance; or ``memory`` itself."""
        if memory.metadata.agent_id != self.agent_id:
            return memory
        if memory.id in self.removed or self._reason(memory):
            return None
        if self.user_id in memory.metadata.user_ids:
            return _without_user(memory, self.user_id)
        return memory

    def add(self, memories: Iterable[Memory]) -> None:
        """Judge memories of one scan: messages and formed items first, then consolidated
        versions (which merge them), oldest version first."""
        ordered = sorted(memories, key=lambda m: (m.kind is MemoryKind.CONSOLIDATED, m.metadata.sequence))
        for memory in ordered:
            if memory.id in self.removed:
                continue
            reason = self._reason(memory)
            if reason is None:
                if self.user_id in memory.metadata.user_ids:
                    self.rewritten[memory.id] = _without_user(memory, self.user_id)
                continue
            self.rewritten.pop(memory.id, None)
            self.removed[memory.id] = memory
            if memory.kind is MemoryKind.CONSOLIDATED:
                known = self.first_removed_version.get(memory.namespace)
                if known is None or memory.metadata.sequence < known:
                    self.first_removed_version[memory.namespace] = memory.metadata.sequence
            if self._holds_others(memory):
                self.shared[memory.id] = reason


def _without_user(memory: Memory, user_id: str) -> Memory:
    metadata = memory.metadata.model_copy(update={"user_ids": [u for u in memory.metadata.user_ids if u != user_id]})
    return memory.model_copy(update={"metadata": metadata})


class Eraser:
    def __init__(self, state: StateStore, queue: JobQueue, registry: BackendRegistry, agents: AgentDirectory,
                 keys: KeyStore, audit: AuditLog, events: EventLog | None = None, webhooks: Webhooks | None = None):
        self.state, self.registry, self.agents = state, registry, agents
        self.keys, self.audit, self.events, self.webhooks = keys, audit, events, webhooks
        self.redis_side = ErasureState(state, queue)
        self.removal = Removal(state, self.redis_side)

    async def _backends(self, agent_id: str, notes: list[str]) -> list[tuple[str, MemoryBackend]]:
        """Every store that may hold the agent's memories: the one serving it first, then
        every other registered one (a migration copies, it does not delete the source).
        A store that cannot start fails the erasure, unless the serving backend mirrors to
        it through its outbox: then the erasure reaches it that way."""
        name, serving = await self.agents.backend_for(agent_id)
        mirrored = getattr(getattr(serving, "mirror", None), "name", None)
        found = [(name, serving)]
        for other in sorted(self.registry.factories):
            if other == name:
                continue
            try:
                backend = await self.registry.get(other)
                if other == mirrored and not (await backend.health()).get("ok"):
                    raise BackendUnavailable(f"{other} does not answer")
            except BackendUnavailable:
                if other != mirrored:
                    raise
                notes.append(f"{other}: unreachable now; the erasure reaches it through the {name} backend's outbox")
                continue
            found.append((other, backend))
        return found

    async def holdings(self, agent_id: str, user_id: str, backends: list[tuple[str, MemoryBackend]]) -> Holdings:
        held = Holdings(agent_id, user_id)

        async def export(namespace: Namespace) -> list[Memory]:
            union: dict[str, Memory] = {}
            for _, backend in backends:
                for memory in await backend.export(agent_id, namespace):
                    union.setdefault(memory.id, memory)
            return list(union.values())

        co_speakers: set[str] = set()
        for session_id in await self.redis_side.user_sessions(agent_id, user_id):
            owner = (await self.state.counters(session_id)).agent_id
            if owner not in (None, agent_id):
                continue  # not this agent's session (cannot happen through the index; never touched)
            memories = await export(Namespace.session(session_id))
            held.sessions[session_id] = memories
            for m in memories:
                if m.kind is MemoryKind.MESSAGE and m.metadata.user_id == user_id:
                    held.message_keys.update((session_id, mid) for mid in m.metadata.message_ids)
            others = {m.metadata.user_id for m in memories
                      if m.kind is MemoryKind.MESSAGE and m.metadata.user_id not in (None, user_id)}
            others = {u for u in others if u is not None} | (set(await self.state.session_users(session_id)) - {user_id})
            if others:
                held.shared_sessions.add(session_id)
            co_speakers |= others | {u for m in memories for u in m.metadata.user_ids} - {user_id}
        for memories in held.sessions.values():
            held.add(memories)
        namespaces = [Namespace.user(agent_id, user_id)]
        namespaces += [Namespace.shard(agent_id, s) for s in await self.state.shards(agent_id)]
        namespaces += [Namespace.user(agent_id, u) for u in sorted(co_speakers)]
        namespaces.append(Namespace.agent(agent_id))
        for namespace in namespaces:
            held.add(await export(namespace))
        return held

    async def export_user(self, agent_id: str, user_id: str) -> UserExport:
        backends = await self._backends(agent_id, [])
        held = await self.holdings(agent_id, user_id, backends)
        out = UserExport(agent_id=agent_id, user_id=user_id, exported_at=utcnow())
        for session_id, memories in sorted(held.sessions.items()):
            mine = sum(1 for m in memories if m.kind is MemoryKind.MESSAGE and m.metadata.user_id == user_id)
            others = {m.metadata.user_id for m in memories if m.kind is MemoryKind.MESSAGE} - {user_id, None}
            out.sessions.append(SessionMembership(session_id=session_id, messages=mine, other_speakers=len(others)))
        lists = {MemoryKind.MESSAGE: out.messages, MemoryKind.EPISODE: out.episodes, MemoryKind.DIRECTIVE: out.directives,
                 MemoryKind.CONSOLIDATED: out.consolidations, MemoryKind.FACT: out.shard_contributions,
                 MemoryKind.SUGGESTION: out.shard_contributions}
        for memory in sorted(held.removed.values(), key=lambda m: (m.valid_at, m.metadata.sequence, m.id)):
            if memory.id in held.shared:
                out.shared.append(SharedReference(id=memory.id, kind=memory.kind, namespace=memory.namespace,
                                                  valid_at=memory.valid_at))
                continue
            p = memory.metadata
            lists.get(memory.kind, out.other).append(ExportedMemory(
                id=memory.id, kind=memory.kind, namespace=memory.namespace, content=memory.content,
                valid_at=memory.valid_at, session_id=p.session_id, role=p.role.value if p.role else None,
                message_ids=[m for m in p.message_ids if (p.session_id, m) in held.message_keys]))
        entities, facts = await self._graph_of(agent_id, Namespace.user(agent_id, user_id), backends)
        out.entities, out.facts = [EntityOut.of(e) for e in entities], [FactOut.of(f) for f in facts]
        return out

    @staticmethod
    async def _graph_of(agent_id: str, namespace: Namespace,
                        backends: list[tuple[str, MemoryBackend]]) -> tuple[list[Entity], list[Fact]]:
        """The entities of ``namespace`` and their facts there (superseded ones too), from every
        store that keeps a graph (the others answer NotSupported: they hold none)."""
        entities: dict[str, Entity] = {}
        facts: dict[str, Fact] = {}
        for _, backend in backends:
            try:
                found: list[Entity] = []
                cursor: str | None = None
                while True:
                    page, cursor = await backend.list_entities(agent_id, namespace, cursor=cursor, limit=GRAPH_PAGE)
                    found += page
                    if cursor is None:
                        break
                for start in range(0, len(found), STORE_BATCH):
                    ids = [e.id for e in found[start : start + STORE_BATCH]]
                    for fact in await backend.current_facts(agent_id, namespace, ids, include_superseded=True):
                        facts.setdefault(fact.id, fact)
            except NotSupported:
                continue
            for entity in found:
                entities.setdefault(entity.id, entity)
        return list(entities.values()), sorted(facts.values(), key=lambda f: (f.created_at, f.id))

    async def erase_user(self, agent_id: str, user_id: str, actor: str = "erasure") -> ErasureReport:
        """``actor``: the key id the audit log records for the key changes (the erasure's caller)."""
        report = ErasureReport(agent_id=agent_id, user_id=user_id)
        digest = await self.audit.user_digest(agent_id, user_id)
        await self._forget_keys(agent_id, user_id, digest, actor, report)
        backends = await self._backends(agent_id, report.notes)
        held = await self.holdings(agent_id, user_id, backends)
        removed_ids = list(held.removed)

        # 1. Queued writes: nothing of the user may reach a store after its erasure there.
        for _, backend in backends:
            report.outbox_entries += await backend.scrub_pending(agent_id, held.judge, removed_ids)

        # 2. Session ledgers: the user's messages out; sessions of the user alone, whole.
        by_session: dict[str, list[str]] = {}
        for session_id, message_id in held.message_keys:
            by_session.setdefault(session_id, []).append(message_id)
        for session_id in sorted(held.sessions):
            if session_id in held.shared_sessions:
                cleanup = await self.redis_side.remove_messages(session_id, user_id, sorted(by_session.get(session_id, [])))
                report.sessions_touched.append(session_id)
            else:
                cleanup = await self.redis_side.drop_session(agent_id, session_id)
                report.sessions_removed.append(session_id)
            report.ledger_entries += cleanup.ledger_entries
            report.windows_dropped += int(cleanup.window_dropped)
            report.job_results += cleanup.job_results

        # 3. The stores: removed for good; others' provenance without the user.
        rewritten = list(held.rewritten.values())
        for name, backend in backends:
            gone = 0
            for start in range(0, len(removed_ids), STORE_BATCH):
                gone += await backend.delete(agent_id, removed_ids[start : start + STORE_BATCH])
            for start in range(0, len(rewritten), STORE_BATCH):
                await backend.set_provenance(agent_id, rewritten[start : start + STORE_BATCH])
            report.stores[name] = gone
            report.entities += await backend.drop_namespace_entities(agent_id, held.own_namespace)
        report.provenance_rewritten = len(rewritten)
        report.memories = count_kinds(held.removed.values())
        report.shared_removed = [SharedRemoval(id=i, kind=held.removed[i].kind, namespace=held.removed[i].namespace,
                                               reason=reason) for i, reason in sorted(held.shared.items())]

        # 4. Consolidation queues, cached blocks, and last the user's own keys (the index
        #    a retry would find the sessions by).
        #    The user's namespace and the sessions removed whole go with their keys.
        dropped = {held.own_namespace, *(str(Namespace.session(s)) for s in report.sessions_removed)}
        forgotten = await self.removal.forget(agent_id, held.removed.values(), dropped)
        report.consolidation_items, report.cached_blocks = forgotten.consolidation_items, forgotten.cached_blocks
        await self.removal.drop_forget_records(agent_id, removed_ids)
        report.user_keys = await self.redis_side.drop_user(agent_id, user_id)
        # The change events naming the user or its sessions go too, from the stream and from
        # the webhooks' dead letters.
        if self.events is not None:
            await self.events.remove_user(agent_id, user_id, report.sessions_removed)
        if self.webhooks is not None:
            await self.webhooks.forget(agent_id, lambda e: names_user(e, agent_id, user_id, report.sessions_removed))

        # 5. Only when something was found: the stores' own logs and files. An unknown user
        #    costs no query-log trim (its marker takes FalkorDB a second or two to log) and
        #    no rewrite; the erasure's reads named only an id nothing was held for.
        found = bool(held.sessions or held.removed or held.rewritten or report.entities or report.outbox_entries or report.user_keys
                     or report.keys_revoked or report.keys_narrowed)
        if found:
            for _, backend in backends:  # last: the erasure's own queries name the user
                report.query_log_entries += await backend.purge_query_log(agent_id)
            servers: list[tuple[str, Any]] = [("state", self.state.redis)]
            servers += [(name, server) for name, backend in backends for server in backend.redis_servers()]
            report.persistence = await rewrite_persistence(servers)
            log.info("erased user %s of agent %s: %d memories (%s), %d sessions touched, %d removed, %d shared "
                     "memories, %d keys revoked, %d narrowed", digest, agent_id, report.removed, report.memories,
                     len(report.sessions_touched), len(report.sessions_removed), len(report.shared_removed),
                     len(report.keys_revoked), len(report.keys_narrowed))
        report.audit_entries = len((await self.audit.read(agent_id, user_id=user_id, limit=1000)).entries)
        if self.events is not None and found:  # naming no user: seen only by callers for every user
            await self.events.emit(agent_id, EventType.ERASED, [Changed(None, None, ())], Cause(key_id=actor))
        return report

    async def _forget_keys(self, agent_id: str, user_id: str, digest: str, actor: str, report: ErasureReport) -> None:
        """The user's keys revoked, or the user taken out of keys for others too; each
        change audited (the log names the user only by ``digest``)."""
        for before, after in await self.keys.forget_user(agent_id, user_id, digest):
            alone = after.users == [digest]
            (report.keys_revoked if alone else report.keys_narrowed).append(after.key_id)
            action = "key.revoke" if alone and before.revoked_at is None else "key.update"
            await self.audit.append_each(actor, action, after.agents, after.key_id, before=before.model_dump(mode="json"),
                                         after={**after.model_dump(mode="json"), "reason": "user.erase"})
