"""Forgetting a message or a memory with everything formed from it (docs/forget.md).

A delete that leaves what was derived from the deleted thing is no forget: an episode
keeps the words of its messages, a consolidated memory the directives it merged, a graph
fact the statement it came from. ``Forgetter.forget`` follows provenance:

- **a message**: its window (the formed window that held it) is re-formed from its
  remaining messages (memory_service/curation/reform.py, the one re-formation there is),
  which replaces every memory the window's extraction made; memories citing the message
  outside that window (a write block parsed from it) go;
- **any memory**: it goes, with every consolidated version that merged it (and the later
  versions, each carrying the one before; the namespace falls back to the version before);
- the knowledge-graph facts that came from what went alone (``memory_ids``), and, for a
  hard forget, the entities nothing links to any more;
- its vectors and full-text postings (with the memory), the consolidation queues, the
  agent's cached and last good memory blocks (memory_service/curation/removal.py).

Two modes, told apart in the API: **soft** takes everything out of every read at once
(search, the block, browse) but keeps it, soft-deleted, until the daily purge; undone by
``undelete`` on the same id (``Forgetter.undo``). **Hard** deletes it for good, as an erasure
does: the stores, the session ledger's entry, the change events naming it, the graph
store's query log and the append-only files (memory_service/state/persistence.py).

Exactly once across crashes: the plan (ids only, never content) and the step reached are
kept in a record (``keyspace.forget_records``; memory_service/state/records.py) before
anything changes; the window's re-formation keeps its own (its one extraction stored
before the swap). A forget asked again (the same request, after a crash) resumes where
the record says; every step is idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from memory_service.access.audit import AuditLog, audited_fact
from memory_service.access.reach import Reach
from memory_service.backends.agents import AgentDirectory
from memory_service.backends.base import MemoryBackend
from memory_service.curation.erasure_state import ErasureState
from memory_service.curation.reform import Reformed, WindowReformer, formed_windows, items, stubs, window_of
from memory_service.curation.removal import Removal
from memory_service.curation.retention import RetentionIndex
from memory_service.curation.tools import MemoryTools
from memory_service.domain.errors import Conflict, InvalidInput, NotFound, NotSupported
from memory_service.domain.models import Memory, MemoryKind, count_kinds
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.events.log import Cause, EventLog
from memory_service.events.webhooks import Webhooks
from memory_service.formation.extractor import Extractor
from memory_service.formation.window import WindowState, WindowStore
from memory_service.schemas.events import Event, EventType
from memory_service.schemas.lifecycle import ForgetMode, ForgetReport, ReformedWindow
from memory_service.state import keyspace
from memory_service.state.persistence import rewrite as rewrite_persistence
from memory_service.state.records import Records
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

PLANNED, DONE = "planned", "done"
FORGET_ACTOR = "forget"  # the audit log's actor when no key asked (the CLI)


def _op(memory_id: str, at: str) -> str:
    return f"forget:{memory_id}:{at}"


class Forgetter:
    def __init__(self, state: StateStore, agents: AgentDirectory, tools: MemoryTools, index: RetentionIndex,
                 redis_side: ErasureState, extractor: Extractor, audit: AuditLog, events: EventLog,
                 webhooks: Webhooks, reformer: WindowReformer):
        self.state, self.agents, self.tools, self.index = state, agents, tools, index
        self.redis_side, self.extractor, self.audit = redis_side, extractor, audit
        self.events, self.webhooks, self.reformer = events, webhooks, reformer
        self.removal = Removal(state, redis_side)
        self.records = Records(state.redis)
        self.windows = WindowStore(state)

    # Forgetting ---------------------------------------------------------------------------

    async def forget(self, agent_id: str, memory_id: str, mode: ForgetMode, guard: Reach | None = None,
                     actor: str | None = None, target_event: EventType = EventType.FORGOTTEN) -> ForgetReport:
        """Forget ``memory_id`` of ``agent_id`` with everything formed from it (or finish the
        forget of it a crash left). ``target_event``: the change event the memory itself is
        announced with (``deleted`` for ``DELETE .../memories/{id}``), the rest ``forgotten``."""
        key = keyspace.forget_records(agent_id)
        record = await self.records.get(key, memory_id)
        if record is not None and record["state"] == DONE and mode is ForgetMode.SOFT:
            await self.tools.peek(agent_id, memory_id, guard)  # the caller must still see it
            return ForgetReport.model_validate(record["report"])  # forgotten already: the same answer
        if record is None or record["state"] == DONE:  # nothing under way (or a soft forget made hard)
            backend, target = await self.tools.changeable(agent_id, memory_id, guard)
            record = await self._plan(agent_id, backend, target, mode, record, actor, target_event)
        else:
            await self.tools.changeable(agent_id, memory_id, guard)  # who may not forget it may not finish it
        return await self._run(agent_id, record)

    async def _plan(self, agent_id: str, backend: MemoryBackend, target: Memory, mode: ForgetMode,
                    soft: dict[str, Any] | None, actor: str | None, target_event: EventType) -> dict[str, Any]:
        at = datetime.now(UTC).replace(microsecond=0)
        if target.deleted_at is not None and soft is None and mode is ForgetMode.SOFT:
            raise Conflict(f"memory {target.id!r} is deleted already: undelete it first, or forget it with mode hard")
        removed: dict[str, Memory] = {target.id: target}
        window: list[Any] | None = None
        message: list[str] | None = None
        kept: set[str] = set()  # the window's memories: the re-formation replaces them
        if soft is not None:  # a soft forget made hard: what it retired goes for good
            retired = soft["removed"] + (soft.get("reformed") or {}).get("removed", [])
            removed.update({m.id: m for m in await backend.find(agent_id, retired)})
            message = soft.get("message")
        elif target.kind is MemoryKind.MESSAGE:
            session_id, message_id = target.metadata.session_id, target.metadata.message_ids[0]
            assert session_id is not None  # every message is recorded in a session
            message = [session_id, message_id]
            held = await self.windows.load(session_id)
            # A window claimed but not extracted leaves a deleted message out (and a hard forget
            # drops the claim); one extracted already would write the message's words after us.
            if held is not None and message_id in held.claim.message_ids and held.state is not WindowState.CLAIMED:
                raise Conflict(f"message {message_id!r} is in the window of session {session_id!r} being formed now: "
                               "forget it once that window is formed (GET /v1/sessions/{session_id} shows it)")
            formed = await window_of(self.state, session_id, target.metadata.sequence)
            if formed is not None:
                window = [session_id, formed.number]
                _, old = await self.reformer.plan_of(agent_id, backend, formed)
                kept = {m.id for m in old}
            for memory in await self._citing(agent_id, backend, session_id, message_id):
                if memory.id not in kept:
                    removed[memory.id] = memory
        versions, requeue = await self._consolidated(agent_id, backend, [*removed.values()], kept)
        removed.update({m.id: m for m in versions})
        facts, entities = await self.reformer.graph_of(agent_id, backend, list(removed))
        if soft is not None:
            facts = sorted({*facts, *soft.get("facts", []), *(soft.get("report") or {}).get("facts", [])})
        planned = {"state": PLANNED, "mode": mode.value, "target": target.id, "at": at.isoformat(),
                   "op": _op(target.id, at.isoformat()), "message": message, "window": window,
                   "removed": list(removed), "items": items(list(removed.values())), "kinds": count_kinds(removed.values()),
                   "requeue": requeue if mode is ForgetMode.HARD else [], "facts": facts, "entities": entities,
                   "actor": actor, "target_event": target_event.value,
                   "reformed": soft.get("reformed") if soft is not None else None}
        expected = DONE if soft is not None else ""
        moved, record = await self.records.advance(keyspace.forget_records(agent_id), target.id, expected, planned)
        if record is None:
            raise NotFound(f"memory_id {target.id!r}: agent {agent_id!r} has no such memory")
        return record  # this plan, or the one a racing call stored first

    async def _citing(self, agent_id: str, backend: MemoryBackend, session_id: str, message_id: str) -> list[Memory]:
        """Memories (not messages) whose provenance cites the message: in its session, its
        speakers' namespaces, the shards and the agent's namespace (where formation and
        write blocks put them)."""
        namespaces = [Namespace.session(session_id)]
        namespaces += [Namespace.user(agent_id, u) for u in sorted(await self.state.session_users(session_id))]
        namespaces += [Namespace.shard(agent_id, s) for s in await self.state.shards(agent_id)]
        namespaces.append(Namespace.agent(agent_id))
        found: dict[str, Memory] = {}
        for namespace in namespaces:
            for memory in await backend.export(agent_id, namespace):
                p = memory.metadata
                if memory.kind is not MemoryKind.MESSAGE and p.session_id == session_id and message_id in p.message_ids:
                    found[memory.id] = memory
        return list(found.values())

    async def _consolidated(self, agent_id: str, backend: MemoryBackend, removed: Sequence[Memory],
                            kept: set[str]) -> tuple[list[Memory], list[list[str]]]:
        """The consolidated versions that merged a memory going (the window's too), with the
        later versions of their namespaces (each carries the one before); and the other items
        those versions merged, [namespace, id], to merge again."""
        going = {m.id for m in removed} | kept
        namespaces = {m.namespace for m in removed} | {m.namespace for m in await backend.find(agent_id, sorted(kept))}
        versions: list[Memory] = []
        requeue: list[list[str]] = []
        for text in sorted(namespaces):
            namespace = Namespace.parse(text)
            if namespace.kind not in (NamespaceKind.USER, NamespaceKind.SHARD):
                continue
            consolidated = sorted((m for m in await backend.export(agent_id, namespace)
                                   if m.kind is MemoryKind.CONSOLIDATED), key=lambda m: m.metadata.sequence)
            first = next((m.metadata.sequence for m in consolidated if going & set(m.metadata.memory_ids)), None)
            if first is None:
                continue
            doomed = [m for m in consolidated if m.metadata.sequence >= first]
            versions += doomed
            others = {i for m in doomed for i in m.metadata.memory_ids} - going
            live = {m.id for m in await backend.find(agent_id, sorted(others)) if m.live}
            requeue += [[text, i] for m in doomed for i in m.metadata.memory_ids if i in live]
        return versions, requeue

    async def _run(self, agent_id: str, record: dict[str, Any]) -> ForgetReport:
        _, backend = await self.agents.backend_for(agent_id)
        key = keyspace.forget_records(agent_id)
        mode, at = ForgetMode(record["mode"]), datetime.fromisoformat(record["at"])
        hard = mode is ForgetMode.HARD
        cause = Cause(key_id=record.get("actor"), reason=mode.value)
        going = stubs(agent_id, record["items"])  # what caches, queues and events need, stored or not
        # 1. The memory and what was formed from it outside its window.
        if hard:
            doomed = {m.id for m in going}
            await backend.scrub_pending(agent_id, lambda m: None if m.id in doomed else m, sorted(doomed))
            await backend.delete(agent_id, sorted(doomed))
            await self.index.forget(agent_id, sorted(doomed))
        else:
            stored = [m for m in await backend.find(agent_id, record["removed"]) if m.metadata.agent_id == agent_id]
            await self.tools.retire(agent_id, backend, [m for m in stored if m.deleted_at is None], at)
        forgotten = await self.removal.forget(agent_id, going)  # queues, generations, cached blocks
        # 2. The window of a forgotten message, formed again without it, once: kept in the record.
        if record.get("window") and not record.get("reformed"):
            reformed = await self._reform(agent_id, backend, record, None if hard else at)
            if reformed is not None:
                record = {**record, "reformed": reformed.model_dump(mode="json")}
                await self.records.advance(key, record["target"], PLANNED, record)
        # 3. The graph: facts from what went alone, and (hard) the entities left unlinked.
        facts, entities = await self.reformer.drop_graph(agent_id, backend, record, None if hard else at)
        # 4. Consolidation: the other items of removed versions queued again.
        if record["requeue"]:
            async with self.state.redis.pipeline(transaction=False) as pipe:
                for namespace, memory_id in record["requeue"]:
                    pipe.rpush(keyspace.cons_pending(namespace), memory_id)
                await pipe.execute()
        report = ForgetReport(id=record["target"], agent_id=agent_id, mode=mode, undoable=not hard, forgotten_at=at,
                              memories=dict(record["kinds"]), memory_ids=list(record["removed"]), facts=facts,
                              entities=entities, requeued=len(record["requeue"]), cached_blocks=forgotten.cached_blocks)
        if record.get("reformed"):
            window = ReformedWindow.model_validate(record["reformed"])
            report.reformed.append(window)
            for kind, n in window.removed_kinds.items():
                report.memories[kind] = report.memories.get(kind, 0) + n
            report.memory_ids += window.removed
            report.facts += [f for f in window.facts if f not in report.facts]
            report.entities += window.entities
        # 5. Hard: the ledger's entry, the events naming it, the store's query log, the files.
        gone_ids = set(report.memory_ids)
        if hard:
            if record.get("message"):
                session_id, message_id = record["message"]
                report.ledger_entries = (await self.redis_side.remove_messages(session_id, "", [message_id])).ledger_entries

            def named(event: Event) -> bool:  # the earlier events naming what went; the forget's own stay
                return event.type is not EventType.FORGOTTEN and not gone_ids.isdisjoint(event.memory_ids)

            await self.webhooks.forget(agent_id, named)
            await self.events.remove(agent_id, named)
            report.query_log_entries = await backend.purge_query_log(agent_id)
            servers: list[tuple[str, Any]] = [("state", self.state.redis)]
            servers += [("graph", server) for server in backend.redis_servers()]
            report.persistence = await rewrite_persistence(servers)
        # 6. Announced, audited (ids and counts only), and marked done.
        target_event = EventType(record.get("target_event", EventType.FORGOTTEN.value))
        await self.events.emit_memories(agent_id, target_event, [m for m in going if m.id == record["target"]], cause)
        await self.events.emit_memories(agent_id, EventType.FORGOTTEN, [m for m in going if m.id != record["target"]],
                                        cause)
        if target_event is EventType.FORGOTTEN:  # a delete (``deleted``) is audited by its caller, with these ids
            await self.audit.append(record.get("actor") or FORGET_ACTOR, "memory.forget", agent_id, record["target"],
                                    after=report.model_dump(mode="json", exclude={"agent_id", "id"}))
        if hard:
            await self.records.advance(key, record["target"], PLANNED, None)
        else:
            await self.records.advance(key, record["target"], PLANNED,
                                       {**record, "state": DONE, "report": report.model_dump(mode="json")})
        log.info("forgot memory %s of agent %s (%s): %d memories, %d window(s) re-formed, %d facts", record["target"],
                 agent_id, mode.value, len(report.memory_ids), len(report.reformed), len(report.facts))
        return report

    async def _reform(self, agent_id: str, backend: MemoryBackend, record: dict[str, Any],
                      retire_at: datetime | None) -> ReformedWindow | None:
        session_id, number = record["window"]
        op = record["op"]
        window = next((w for w in await formed_windows(self.state, session_id) if w.number == int(number)), None)
        if window is None:
            return None  # the session is gone (erased)
        if window.entry.get("op") == op and int(number) not in await self.reformer.in_progress(session_id):
            # Re-formed by this forget before a crash: the entry names what it replaced.
            entry = window.entry
            return ReformedWindow(session_id=session_id, window=int(number), messages=int(entry.get("messages", 0)),
                                  removed=list(entry.get("replaced", [])),
                                  removed_kinds=dict(entry.get("replaced_kinds", {})),
                                  formed=list(entry.get("memory_ids", [])))
        shards = await self.agents.list_shards(agent_id)
        exclude = [record["message"][1]] if record.get("message") else []
        done: Reformed = await self.reformer.reform(
            agent_id=agent_id, backend=backend, window=window, extractor=self.extractor, shards=shards,
            expiry=await self.agents.expiry_policy(agent_id, shards), exclude=exclude, retire_at=retire_at, op=op,
            gone=EventType.FORGOTTEN, cause=Cause(key_id=record.get("actor"), reason="forgotten"))
        return ReformedWindow(session_id=session_id, window=done.window, messages=done.messages,
                              removed=[m.id for m in done.old], removed_kinds=count_kinds(done.old),
                              formed=[m.id for m in done.new], facts=done.facts, entities=done.entities,
                              llm_calls=done.llm_calls)

    async def unfinished(self, agent_id: str) -> list[str]:
        """The ids of the agent's forgets a crash left unfinished."""
        return sorted(i for i, r in (await self.records.all(keyspace.forget_records(agent_id))).items()
                      if r.get("state") != DONE)

    async def resume(self, agent_id: str) -> list[ForgetReport]:
        """Finish every forget of the agent a crash left (what the same requests again would do)."""
        reports = []
        for memory_id in await self.unfinished(agent_id):
            record = await self.records.get(keyspace.forget_records(agent_id), memory_id)
            if record is not None and record.get("state") == PLANNED:
                reports.append(await self._run(agent_id, record))
        return reports

    # Undoing a soft forget ----------------------------------------------------------------

    async def soft_forgotten(self, agent_id: str, memory_id: str) -> bool:
        record = await self.records.get(keyspace.forget_records(agent_id), memory_id)
        return record is not None and record.get("state") == DONE and record.get("mode") == ForgetMode.SOFT.value

    async def undo(self, agent_id: str, memory_id: str, guard: Reach | None = None,
                   actor: str | None = None) -> Memory:
        """Undo a soft forget: what it retired is live again, the window's memories as they were
        before (the re-formed ones deleted), the facts it closed current again."""
        key = keyspace.forget_records(agent_id)
        record = await self.records.get(key, memory_id)
        if record is None or record.get("state") != DONE or record.get("mode") != ForgetMode.SOFT.value:
            raise InvalidInput(f"memory {memory_id!r} was not soft-forgotten")
        backend, _ = await self.tools.changeable(agent_id, memory_id, guard)
        revived_ids = list(record["removed"])
        reformed = record.get("reformed")
        if reformed:
            session_id, number = reformed["session_id"], reformed["window"]
            window = next((w for w in await formed_windows(self.state, session_id) if w.number == number), None)
            if window is not None and window.entry.get("op") != record["op"]:
                raise Conflict(f"the window of memory {memory_id!r} was formed again since it was forgotten: its "
                               "forget cannot be undone")
            new = [m for m in await backend.find(agent_id, reformed["formed"]) if m.metadata.agent_id == agent_id]
            await backend.delete(agent_id, [m.id for m in new])
            await self.removal.forget(agent_id, new)
            revived_ids += reformed["removed"]
            window = next((w for w in await formed_windows(self.state, session_id) if w.number == number), None)
            if window is not None:
                entry = {**window.entry, "memory_ids": reformed["removed"], "memories": len(reformed["removed"]),
                         "op": f"undo:{record['op']}", "replaced": reformed["formed"]}
                await self.state.replace_formed_window(session_id, window.stored, entry, window.last)
        revived = await self.tools.revive(agent_id, backend,
                                          [m for m in await backend.find(agent_id, revived_ids) if m.deleted_at])
        facts = [*record.get("facts", []), *((record.get("report") or {}).get("facts", []))]
        for fact_id in dict.fromkeys(facts):
            try:
                before = await backend.get_fact(agent_id, fact_id)
                after = await backend.restore_fact(agent_id, fact_id)
            except (Conflict, NotFound, NotSupported):
                continue
            await self.audit.append(actor or FORGET_ACTOR, "fact.restore", agent_id, fact_id,
                                    before=audited_fact(before), after=audited_fact(after))
        await self.events.emit_memories(agent_id, EventType.UNDELETED, revived, Cause(key_id=actor, reason="unforget"))
        await self.audit.append(actor or FORGET_ACTOR, "memory.unforget", agent_id, memory_id,
                                after={"memory_ids": [m.id for m in revived], "facts": list(dict.fromkeys(facts))})
        await self.records.advance(key, memory_id, DONE, None)
        return next(m for m in await backend.find(agent_id, [memory_id]))
