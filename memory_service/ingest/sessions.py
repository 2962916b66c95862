"""The session ledger: recording messages, and evaluating the formation gates as each commits.

A message's secrets are redacted first, as its agent's policy says (backends/agents.py,
``Redactor``; docs/redaction.md): nothing of them reaches a store, a log or its digest.
Then the message is stored (and indexed for full-text search), then committed to its
session's pending window; a gate that opens claims the window and enqueues its formation
job (memory_service/formation/schedule.py). Its embedding comes after: the worker's embedding job (docs/ingest.md).
``form_memories`` forms what is pending on request and waits for it.

Between its reserve and its commit a record is "in flight" (memory_service.state.store): a
write the store refused releases the message id at once; a crash, or a write whose
outcome is unknown, leaves the reservation to ``recover_in_flight`` (a worker cron), which
commits what the store holds and releases the rest, so every stored message ends up
pending or formed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import cast

from memory_service.access.reach import Reach
from memory_service.backends.agents import AgentDirectory
from memory_service.backends.base import MemoryBackend
from memory_service.config import Settings
from memory_service.domain import limits
from memory_service.domain.errors import (
    BackendUnavailable,
    Conflict,
    InvalidInput,
    MemoryServiceError,
    preview,
)
from memory_service.domain.models import AgentSettings, Memory, MemoryKind, MessageIn, Provenance, Role
from memory_service.domain.namespaces import Namespace
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.fresh import FreshVectors
from memory_service.formation import gates
from memory_service.formation.jobs import EMBED_LOCK_MS, JobQueue
from memory_service.formation.schedule import FormationSchedule
from memory_service.formation.steps import message_memory_id
from memory_service.ingest.group_commit import GroupCommit, RowRefused
from memory_service.schemas.formation import GateStatus
from memory_service.state.store import Commit, InFlight, StateStore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RecordResult:
    session_id: str
    message_id: str
    sequence: int
    duplicate: bool
    gate: GateStatus
    formation_job: str | None = None  # the job forming the session's window, if a gate opened
    redacted: dict[str, int] = field(default_factory=dict)  # by kind: what the agent's redaction policy took out


class SessionLedger:
    def __init__(self, settings: Settings, state: StateStore, queue: JobQueue, agents: AgentDirectory,
                 embedder: Embedder | None, formation: FormationSchedule, fresh: FreshVectors | None = None):
        self.settings, self.state, self.queue, self.agents = settings, state, queue, agents
        self.embedder, self.formation = embedder, formation
        self.fresh = fresh or FreshVectors(None)  # a live session's user message embedded at once
        self.writes = GroupCommit(settings.store_write_max_rows, settings.store_write_max_chars)

    async def record_message(self, session_id: str, message: MessageIn, reach: Reach | None = None) -> RecordResult:
        """Store one message (idempotent by message_id) and evaluate the gates.

        In the common case: reserve (the agent's settings, the user's index, then its
        script), the store's write (shared with the agent's concurrent records; the graph's
        statement, then the postings' script), then the commit (the users' indexes, the
        session's atomic commit with its counters, the user's generation and the embedding
        mark: each under its own hash tag, memory_service/state/store.py). On one server the
        reserve is one round trip and the commit one; on a cluster two and three. The
        message is stored without its embedding; the worker adds it.
        ``reach``: the caller's (memory_service/access/reach.py); a key limited to some users
        records into a session other users started only with the agent's
        ``users_join_sessions``, else it is answered as a session of another agent: decided
        by the reservation's script, atomically with the user's joining the session
        (``StateStore.reserve_messages``).
        """
        limits.check_message_chars(message.content, self.settings.max_message_chars)
        # Secrets out before anything is kept of the message, its digest included (docs/redaction.md).
        redacted = await self.agents.redactor(message.agent_id).redacted(message.content, "content")
        if redacted.changed:
            message = message.model_copy(update={"content": redacted.text})
        message_id = message.message_id or uuid.uuid4().hex
        digest = hashlib.sha256(f"{message.role}\x1f{message.user_id}\x1f{message.content}".encode()).hexdigest()[:16]
        reservation = await self.state.reserve_message(session_id, message.agent_id, message_id, digest,
                                                       message.incognito, message.user_id,
                                                       reach.view if reach is not None else None)
        if reservation.digest != digest:
            raise Conflict(f"message_id {preview(message_id)} was already recorded in session {preview(session_id)} with other content")
        _, backend = await self.agents.backend_for(message.agent_id, reservation.agent_settings or AgentSettings())
        memory = Memory(
            id=message_memory_id(session_id, message_id),
            kind=MemoryKind.MESSAGE,
            namespace=str(Namespace.session(session_id)),
            content=message.content,
            metadata=Provenance(
                agent_id=message.agent_id,
                user_id=message.user_id,
                user_ids=[message.user_id],
                session_id=session_id,
                message_ids=[message_id],
                sequence=reservation.sequence,
                role=message.role,
            ),
            valid_at=message.created_at or datetime.now(UTC),
        )
        # Store first, then make it pending: a failed write leaves nothing pending that
        # formation could not read, and the client's retry completes the same message.
        # Stored without its embedding (marked for it): the embedding job adds it.
        await self._store(backend, memory, reservation.sequence)
        commit = await self._commit(session_id, message_id, reservation.sequence, memory, message.incognito,
                                    reservation.committed)
        gate = gates.evaluate(commit.counters, self.settings)
        result = RecordResult(session_id, message_id, reservation.sequence, duplicate=not commit.first, gate=gate,
                              redacted=redacted.counts)
        if commit.first:
            self.fresh.recorded(message.agent_id, backend, memory)
        if gate.open:
            result.formation_job = await self.formation.schedule(session_id, gated=True, counters=commit.counters)
        return result

    async def _store(self, backend: MemoryBackend, memory: Memory, sequence: int) -> None:
        """The record's store write; on failure, its reservation is let go of (released if
        the store refused the message, kept for a retry or the recovery on an outage) and
        the caller told which: 422 or 503. The store's own words go to the log only."""
        meta = memory.metadata
        session_id, message_id = cast(str, meta.session_id), meta.message_ids[0]
        try:
            await self.writes.write(backend, meta.agent_id, memory)
        except RowRefused as refused:
            log.warning("the store refused message %s of session %s (agent %s), its id is released: %s",
                        preview(message_id), preview(session_id), preview(meta.agent_id),
                        preview(str(refused.__cause__), 300))
            await self.let_go(session_id, message_id, sequence, "refused")
            raise InvalidInput(
                f"content: message {preview(message_id)} of session {preview(session_id)} could not be stored: the store refused "
                "its content (characters it cannot hold). Nothing was stored and the message_id is free again: "
                "send it with corrected content") from None
        except BaseException as exc:  # an outage, or the caller gone: the write may have landed
            await self.let_go(session_id, message_id, sequence, "unhold")
            if not isinstance(exc, Exception):
                raise
            log.warning("could not store message %s of session %s (agent %s): %s: %s", preview(message_id),
                        preview(session_id), preview(meta.agent_id), type(exc).__name__, exc)
            # Our own errors (an outbox full, an open breaker) are worded for the caller; a
            # store's or a driver's text is not: it stays in the log.
            why = str(exc) if isinstance(exc, MemoryServiceError) else "the memory store is unavailable"
            raise BackendUnavailable(
                f"could not store message {preview(message_id)} of session {preview(session_id)}: {why}; "
                "nothing is pending for it: send it again with the same message_id") from exc

    async def let_go(self, session_id: str, message_id: str, sequence: int, mode: str) -> None:
        # Best effort: if Redis fails too, the reservation stays in flight and the recovery
        # settles it once it is RECORD_RECOVERY_AFTER_SECONDS old.
        try:
            await asyncio.shield(self.state.release_message(session_id, message_id, sequence, mode))
        except BaseException as exc:
            log.warning("could not let go of the reservation of message %s of session %s (the recovery will): %s",
                        preview(message_id), preview(session_id), exc)
            if not isinstance(exc, Exception):
                raise

    async def _commit(self, session_id: str, message_id: str, sequence: int, memory: Memory,
                      incognito: bool, committed: bool = False) -> Commit:
        """Make the stored ``memory`` (the message) pending, once, and enqueue its embedding.
        ``committed``: its reservation found the id committed already (a retry)."""
        meta = memory.metadata
        role, user_id = meta.role or Role.USER, meta.user_id  # a message always has its role
        commit = await self.state.commit_message(
            session_id, message_id, sequence, gates.weighted_tokens(role, memory.content),
            user_id if role == "user" else None, incognito, meta.agent_id,
            embed_lock_ms=EMBED_LOCK_MS if self.embedder is not None else 0, user_id=user_id, committed=committed,
        )
        if commit.enqueue_embedding:
            await self.enqueue_embedding(meta.agent_id)
        return commit

    async def recover_in_flight(self, limit: int = 1000) -> dict[str, int]:
        """Settle the records left between their reserve and their commit for at least
        RECORD_RECOVERY_AFTER_SECONDS (a crashed process, a write whose outcome was unknown
        and never retried): a message the store holds is committed (the record's own commit,
        idempotent), the id of one it does not hold is released. Up to ``limit`` sessions;
        counts ``committed``, ``released`` and ``sessions``."""
        before = time.time() - self.settings.record_recovery_after_seconds
        report = {"sessions": 0, "committed": 0, "released": 0}
        for session_id in await self.state.sessions_in_flight(before, limit):
            report["sessions"] += 1
            try:
                old = [e for e in await self.state.in_flight(session_id) if e.reserved_at < before]
                if old:
                    committed, released = await self._recover_session(session_id, old)
                    report["committed"] += committed
                    report["released"] += released
                await self.state.settle_in_flight(session_id)
            except Exception as exc:  # the next run tries again
                log.warning("could not recover the records in flight of session %s: %s", preview(session_id), exc)
        if report["committed"] or report["released"]:
            log.info("recovered records left in flight: %d committed, %d released, in %d session(s)",
                     report["committed"], report["released"], report["sessions"])
        return report

    async def _recover_session(self, session_id: str, old: list[InFlight]) -> tuple[int, int]:
        agent_id = (await self.state.counters(session_id)).agent_id
        stored: dict[str, Memory] = {}
        if agent_id is not None:
            _, backend = await self.agents.backend_for(agent_id)
            ids = [message_memory_id(session_id, e.message_id) for e in old]
            stored = {m.id: m for m in await backend.get(agent_id, Namespace.session(session_id), ids)}
        committed = released = 0
        for entry in old:
            memory = stored.get(message_memory_id(session_id, entry.message_id))
            if memory is not None:
                await self._commit(session_id, entry.message_id, entry.sequence, memory, entry.incognito)
                committed += 1
            elif await self.state.release_message(session_id, entry.message_id, entry.sequence, "expired",
                                                  entry.entry):
                released += 1
        if committed:  # as a record would: a gate the commits opened claims its window
            await self.formation.schedule(session_id, gated=True)
        return committed, released

    async def enqueue_embedding(self, agent_id: str) -> None:
        # The message is stored and pending: a queue that fails here must not fail the record.
        # The agent's lock expires, and the next record (or the backfill cron) enqueues again.
        try:
            await self.queue.enqueue_embedding(agent_id)
        except Exception as exc:
            log.warning("could not enqueue the embedding of agent %s's messages (retried within %d s): %s",
                        agent_id, EMBED_LOCK_MS // 1000, exc)
