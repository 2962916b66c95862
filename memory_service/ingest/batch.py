"""Recording a batch of messages: many sessions of one agent in one call, each message as
the single route records it (memory_service/ingest/sessions.py), the round trips shared.

A history import sends thousands of messages; one request each costs an HTTP exchange and
three round trips per message (reserve, store write, commit). Here the batch's messages go
through the same three steps together: every reservation in one Redis pipeline, every
store write through the agent's group commit (as many statements as its limits make: 256
rows each), every commit in one pipeline, then one embedding job enqueued for the agent
and one formation claim per session whose gate opened. The scripts are the single
route's (memory_service/state/store.py), so what a 200 means for one message (stored,
searchable, pending once, embedded later) holds for each recorded item, and a message
recorded one way is a duplicate the other way.

Each item is answered on its own (``BatchItemOut``): recorded, duplicate, refused (its own
fault: an id recorded with other content, a session of another agent or of other users, a
content the store refused, a content over MAX_MESSAGE_CHARS, a content holding a secret the
agent's redaction policy refuses (docs/redaction.md; in mode redact its secrets are redacted
as the single route's are), or a problem the caller found while reading it) or failed (an
outage: send it again with the same message_id). One bad item never fails the others; only an outage of Redis itself fails the whole call (and a
call sent again records what is missing and answers the rest as duplicates).

A call cut short (503: Redis went away mid-call, or the stall guard gave up on a frozen
store) says what it recorded: ``BatchProgress`` holds the answers given so far, and the 503
carries them (memory_service/http/overload.py, ``PARTIAL_ANSWER``): ``recorded`` and
``duplicate`` items are recorded, the others ``refused`` or ``failed``, a failed one saying
whether it may have reached the store (its write was under way: if it did, the recovery
records it, and sending it again with the same message_id answers duplicate) or not.

Order: a pipeline runs its commands in order, so the messages of one session get their
sequence numbers in the batch's order (after whatever the session held before), and are
committed in that order. Formation: the gate of each session is evaluated once, on its
counters after its last commit of the batch, and an open gate claims the window exactly as
a record's does (memory_service/formation/schedule.py). The window holds up to
MAX_WINDOW_MESSAGES of the pending messages; when it completes the worker claims the next
one if the gate is still open.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from memory_service.access.reach import Reach
from memory_service.backends.agents import Redactor
from memory_service.domain import limits
from memory_service.domain.errors import (
    BackendUnavailable,
    Conflict,
    InvalidInput,
    MemoryServiceError,
    preview,
)
from memory_service.domain.models import AgentSettings, BatchMessageIn, Memory, MemoryKind, Provenance, RefusedItem
from memory_service.domain.namespaces import Namespace
from memory_service.domain.redaction import SecretsRefused
from memory_service.formation import gates
from memory_service.formation.jobs import EMBED_LOCK_MS
from memory_service.formation.steps import message_memory_id
from memory_service.ingest import pacing
from memory_service.ingest.group_commit import RowRefused
from memory_service.ingest.sessions import SessionLedger
from memory_service.schemas.records import BatchItemOut, BatchOut, BatchSessionOut, ItemStatus
from memory_service.state.store import Commit, CommitCall, Reservation, ReserveCall

log = logging.getLogger(__name__)

# Formation claims of one batch running at once (each is a script and an enqueue).
CLAIMS_AT_ONCE = 32


def digest_of(role: str, user_id: str, content: str) -> str:
    """The content digest a reservation keeps (the same as the single route's)."""
    return hashlib.sha256(f"{role}\x1f{user_id}\x1f{content}".encode()).hexdigest()[:16]


@dataclass(slots=True)
class _Item:
    """An item still being recorded: where it is in the batch, and what is known of it."""

    index: int
    message: BatchMessageIn
    digest: str = ""  # taken in the item's reservation step
    redacted: dict[str, int] = field(default_factory=dict)  # what the agent's redaction policy took out
    reservation: Reservation | None = None
    memory: Memory | None = None


class BatchProgress:
    """The answers a batch gave so far, for an answer cut short (see the module's docstring)."""

    def __init__(self) -> None:
        self.items: Sequence[BatchMessageIn | RefusedItem] = ()
        self.answers: list[BatchItemOut | None] = []
        self.writing: set[int] = set()  # indexes of the items whose store write began

    def so_far(self) -> dict[str, Any]:
        """What the batch answered, each item not answered yet as failed: the fields of BatchOut."""
        done: list[BatchItemOut] = []
        for index, (item, answer) in enumerate(zip(self.items, self.answers, strict=True)):
            if answer is None:
                assert isinstance(item, BatchMessageIn)  # refused items are answered first
                why = ("interrupted while it was written: it may have been stored, and then it is recorded within "
                       "RECORD_RECOVERY_AFTER_SECONDS; send it again with the same message_id (answered duplicate if "
                       "it was)" if index in self.writing else
                       "interrupted before it was written: it is not recorded; send it again with the same message_id")
                answer = _failed(index, item, why)
            done.append(answer)
        counts = {status: sum(1 for a in done if a.status == status) for status in
                  ("recorded", "duplicate", "refused", "failed")}
        return {**counts, "items": [a.model_dump(mode="json") for a in done], "sessions": []}


class BatchLedger:
    """Records batches with a SessionLedger's parts (its group commit, scheduler, queue)."""

    def __init__(self, ledger: SessionLedger):
        self.ledger = ledger

    async def record_batch(self, agent_id: str, items: Sequence[BatchMessageIn | RefusedItem],
                           reach: Reach | None = None, progress: BatchProgress | None = None) -> BatchOut:
        """Record ``items``: messages of ``agent_id``, and those the caller refused already
        (unreadable, beyond its key), answered as such; ``progress`` holds the answers as they
        are given. See the module's docstring."""
        progress = progress or BatchProgress()
        progress.items = items
        answers: list[BatchItemOut | None] = progress.answers
        answers[:] = [None] * len(items)
        live: list[_Item] = []
        for index, item in enumerate(items):
            if isinstance(item, RefusedItem):
                answers[index] = BatchItemOut(index=index, status="refused", session_id=item.session_id,
                                              message_id=item.message_id, code=item.error.status_code,
                                              detail=str(item.error))
                continue
            try:
                limits.check_message_chars(item.content, self.ledger.settings.max_message_chars)
            except MemoryServiceError as exc:
                answers[index] = _refused(index, item, exc)
                continue
            live.append(_Item(index, item))
        redactor = self.ledger.agents.redactor(agent_id)  # the agent's policy read once, if an item needs it
        reserved = await self._reserve_steps(agent_id, live, reach, answers, redactor)
        stored = await self._store_steps(agent_id, reserved, answers, progress)
        commits: dict[str, Commit] = {}
        enqueue = False
        for part in self._steps(stored):
            async with pacing.step():
                last, wants = await self._commit(agent_id, stored[part], answers)
            commits.update(last)  # a later step's commit of a session is its last
            enqueue |= wants
        if enqueue:
            await self.ledger.enqueue_embedding(agent_id)
        async with pacing.step():
            sessions = await self._schedule(commits)
        done = [a for a in answers if a is not None]
        assert len(done) == len(items)
        counts = {status: sum(1 for a in done if a.status == status) for status in
                  ("recorded", "duplicate", "refused", "failed")}
        return BatchOut(**counts, items=done, sessions=sessions)

    def _steps(self, items: list[_Item]) -> list[slice]:
        """The batch's steps (memory_service/ingest/pacing.py): reserved, written and
        committed a step at a time, in order, giving way to other agents between steps."""
        settings = self.ledger.settings
        return pacing.steps(items, settings.batch_step_messages, settings.batch_step_chars,
                            lambda item: len(item.message.content))

    async def _reserve_steps(self, agent_id: str, live: list[_Item], reach: Reach | None,
                             answers: list[BatchItemOut | None], redactor: Redactor) -> list[_Item]:
        """``_reserve`` a step at a time; if the caller goes away, what was reserved is let go of."""
        reserved: list[_Item] = []
        try:
            for part in self._steps(live):
                async with pacing.step():
                    reserved += await self._reserve(agent_id, live[part], reach, answers, redactor)
        except BaseException:
            await asyncio.shield(self._let_go(reserved, [None] * len(reserved), "unhold"))
            raise
        return reserved

    async def _store_steps(self, agent_id: str, reserved: list[_Item], answers: list[BatchItemOut | None],
                           progress: BatchProgress) -> list[_Item]:
        """``_store`` a step at a time; if the caller goes away, what is held and not written
        is let go of."""
        stored: list[_Item] = []
        for part in self._steps(reserved):
            try:
                async with pacing.step():
                    progress.writing.update(item.index for item in reserved[part])
                    stored += await self._store(agent_id, reserved[part], answers)
            except BaseException:  # the rows of this step and the next are let go of, as a record's are
                await asyncio.shield(self._let_go(reserved[part.start:], [None] * (len(reserved) - part.start), "unhold"))
                raise
        return stored

    async def _reserve(self, agent_id: str, live: list[_Item], reach: Reach | None,
                       answers: list[BatchItemOut | None], redactor: Redactor) -> list[_Item]:
        """Every item's reservation in one pipeline; an id committed before is a duplicate at
        once (nothing is written again), an id known with other content a conflict. A key
        limited to users records only into the sessions it may: its reservation's script
        decides it (``StateStore.reserve_messages``), else the item is refused, 409. Each item's
        secrets are redacted first, as the single route's are (an item the agent's policy
        refuses is refused, 422)."""
        live = await self._redacted(live, answers, redactor)
        if not live:
            return live
        for item in live:
            item.digest = digest_of(item.message.role, item.message.user_id, item.message.content)
        users = tuple(reach.view) if reach is not None and reach.view is not None else None
        calls = [ReserveCall(i.message.session_id, agent_id, i.message.message_id, i.digest, i.message.incognito,
                             i.message.user_id, users) for i in live]
        kept = []
        for item, reservation in zip(live, await self.ledger.state.reserve_messages(calls), strict=True):
            m = item.message
            if isinstance(reservation, MemoryServiceError):
                answers[item.index] = _refused(item.index, m, reservation)
            elif isinstance(reservation, Exception):
                log.warning("could not reserve message %s of session %s: %s", preview(m.message_id),
                            preview(m.session_id), reservation)
                answers[item.index] = _failed(item.index, m, "could not reserve its sequence number")
            elif reservation.digest != item.digest:
                answers[item.index] = _refused(item.index, m, Conflict(
                    f"message_id {preview(m.message_id)} was already recorded in session {preview(m.session_id)} with other content"))
            elif reservation.committed:
                answers[item.index] = _answer(item.index, m, "duplicate", reservation.sequence, item.redacted)
            else:
                item.reservation = reservation
                kept.append(item)
        return kept

    @staticmethod
    async def _redacted(live: list[_Item], answers: list[BatchItemOut | None], redactor: Redactor) -> list[_Item]:
        kept = []
        for item in live:
            try:
                redacted = await redactor.redacted(item.message.content, f"messages.{item.index}.content")
            except SecretsRefused as refused:
                answers[item.index] = _refused(item.index, item.message, refused)
                continue
            if redacted.changed:
                item.message = item.message.model_copy(update={"content": redacted.text})
                item.redacted = redacted.counts
            kept.append(item)
        return kept

    async def _store(self, agent_id: str, live: list[_Item], answers: list[BatchItemOut | None]) -> list[_Item]:
        """The items' store writes, through the agent's group commit; a row the store refused
        alone is released (refused), one an outage failed is left held (failed), as a
        record's write would."""
        if not live:
            return live
        reservation = live[0].reservation
        settings = reservation.agent_settings if reservation is not None else None
        _, backend = await self.ledger.agents.backend_for(agent_id, settings or AgentSettings())
        now = datetime.now(UTC)
        for item in live:
            item.memory = _memory(agent_id, item, now)
        memories = [item.memory for item in live if item.memory is not None]
        outcomes = await self.ledger.writes.write_many(backend, agent_id, memories)
        kept: list[_Item] = []
        for item, outcome in zip(live, outcomes, strict=True):
            m = item.message
            if outcome is None:
                kept.append(item)
            elif isinstance(outcome, RowRefused):
                log.warning("the store refused message %s of session %s (agent %s), its id is released: %s",
                            preview(m.message_id), preview(m.session_id), preview(agent_id),
                            preview(str(outcome.__cause__), 300))
                answers[item.index] = _refused(item.index, m, InvalidInput(
                    f"content: message {preview(m.message_id)} of session {preview(m.session_id)} could not be stored: the store "
                    "refused its content (characters it cannot hold). Nothing was stored and the message_id is free "
                    "again: send it with corrected content"))
            else:
                log.warning("could not store message %s of session %s (agent %s): %s: %s", preview(m.message_id),
                            preview(m.session_id), preview(agent_id), type(outcome).__name__, outcome)
                why = str(outcome) if isinstance(outcome, MemoryServiceError) else "the memory store is unavailable"
                answers[item.index] = _failed(item.index, m, f"could not store it: {why}; nothing is pending for it: "
                                                              "send it again with the same message_id")
        await self._let_go(live, outcomes, "")
        return kept

    async def _let_go(self, live: list[_Item], outcomes: Sequence[BaseException | None], mode: str) -> None:
        """Release (refused rows) or unhold (the rest that failed) reservations; best effort,
        the recovery settles what is left (docs/ingest.md, "Crashes")."""
        for item, outcome in zip(live, outcomes, strict=True):
            if outcome is None and not mode:
                continue
            how = mode or ("refused" if isinstance(outcome, RowRefused) else "unhold")
            assert item.reservation is not None
            await self.ledger.let_go(item.message.session_id, item.message.message_id, item.reservation.sequence, how)

    async def _commit(self, agent_id: str, live: list[_Item],
                      answers: list[BatchItemOut | None]) -> tuple[dict[str, Commit], bool]:
        """Every stored item made pending, in one pipeline, in order. The last commit of each
        session, and whether a commit asked for the agent's embedding job."""
        if not live:
            return {}, False
        lock_ms = EMBED_LOCK_MS if self.ledger.embedder is not None else 0
        calls = []
        for item in live:
            m = item.message
            assert item.reservation is not None
            calls.append(CommitCall(m.session_id, m.message_id, item.reservation.sequence,
                                    gates.weighted_tokens(m.role, m.content), m.user_id if m.role == "user" else None,
                                    m.incognito, agent_id, lock_ms, m.user_id))
        last: dict[str, Commit] = {}
        enqueue = False
        for item, commit in zip(live, await self.ledger.state.commit_messages(calls), strict=True):
            m = item.message
            assert item.reservation is not None
            if isinstance(commit, Exception):  # stored, not pending: the retry (or the recovery) commits it
                log.warning("could not commit message %s of session %s: %s", preview(m.message_id),
                            preview(m.session_id), commit)
                answers[item.index] = _failed(item.index, m, "stored but not committed; send it again with the same "
                                                              "message_id")
                continue
            answers[item.index] = _answer(item.index, m, "recorded" if commit.first else "duplicate",
                                          item.reservation.sequence, item.redacted)
            last[m.session_id] = commit
            enqueue |= commit.enqueue_embedding
        return last, enqueue

    async def _schedule(self, commits: dict[str, Commit]) -> list[BatchSessionOut]:
        """Each session's gate on its last commit's counters; an open one claims its window."""
        limiter = asyncio.Semaphore(CLAIMS_AT_ONCE)

        async def one(session_id: str, commit: Commit) -> BatchSessionOut:
            gate = gates.evaluate(commit.counters, self.ledger.settings)
            job = None
            if gate.open:
                async with limiter:
                    job = await self.ledger.formation.schedule(session_id, gated=True, counters=commit.counters)
            return BatchSessionOut(session_id=session_id, gate=gate, formation_job=job)

        return list(await asyncio.gather(*(one(s, c) for s, c in commits.items())))


def _memory(agent_id: str, item: _Item, now: datetime) -> Memory:
    """The message as the store takes it, as the single route builds it. (Validated again:
    pydantic's ``model_construct`` costs more here, inspecting the default factories' signatures
    on every call.)"""
    m, reservation = item.message, item.reservation
    assert reservation is not None
    return Memory(
        id=message_memory_id(m.session_id, m.message_id),
        kind=MemoryKind.MESSAGE,
        namespace=str(Namespace.session(m.session_id)),
        content=m.content,
        metadata=Provenance(agent_id=agent_id, user_id=m.user_id, user_ids=[m.user_id], session_id=m.session_id,
                            message_ids=[m.message_id], sequence=reservation.sequence, role=m.role),
        valid_at=m.created_at or now,
    )


def _answer(index: int, message: BatchMessageIn, status: ItemStatus, sequence: int,
            redacted: dict[str, int]) -> BatchItemOut:
    return BatchItemOut(index=index, status=status, session_id=message.session_id, message_id=message.message_id,
                        sequence=sequence, redacted=redacted)


def _refused(index: int, message: BatchMessageIn, error: MemoryServiceError) -> BatchItemOut:
    return BatchItemOut(index=index, status="refused", session_id=message.session_id, message_id=message.message_id,
                        code=error.status_code, detail=str(error))


def _failed(index: int, message: BatchMessageIn, why: str) -> BatchItemOut:
    error = BackendUnavailable(f"message {preview(message.message_id)} of session {preview(message.session_id)}: {why}")
    return BatchItemOut(index=index, status="failed", session_id=message.session_id, message_id=message.message_id,
                        code=error.status_code, detail=str(error))
