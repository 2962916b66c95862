"""The memory tools: an agent reads, writes, updates, soft-deletes and undeletes its own
memories (docs/memory-tools.md). Search is ``MemoryService.search`` (with ``tags``).

Writes are off unless the operator lists the agent in MEMORY_WRITE_AGENTS: no request
field, header or stored state turns them on, and nothing here hard-deletes (the retention
policy purges, memory_service/curation/retention.py). A memory of another agent is answered as one
that does not exist. Every change bumps the write generation of the memory's namespace and
of the agent, so no cached memory block shows what it was before.

What a write stores has its secrets redacted first, as the agent's redaction policy says
(its content, title and tags; stores/agents.py, ``Redactor``; docs/redaction.md): an
idempotent write repeated redacts the same way, so it matches what it stored.

Writes may be idempotent: a write with an idempotency key gets an id derived from the agent
and the key, so repeating it stores nothing new and answers the memory already there. Write
blocks (memory_service/curation/write_blocks.py) key every memory by the message, the block
and the item; a plain memory_write is keyed only when its caller gives ``idempotency_key``
(docs/memory-tools.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from memory_service.access.reach import Reach
from memory_service.backends.agents import AgentDirectory, Redactor
from memory_service.backends.base import MemoryBackend
from memory_service.config import Settings
from memory_service.curation.retention import RetentionIndex, purge_at
from memory_service.domain.errors import Conflict, Forbidden, InvalidInput, NotFound, preview
from memory_service.domain.expiry import ExpiryPolicy, sources_end
from memory_service.domain.limits import (
    MAX_NAMESPACE_CHARS,
    MESSAGE_CHARS_CEILING,
    TAGS_CEILING,
    check_message_chars,
    check_tags,
    text_problem,
)
from memory_service.domain.models import Memory, MemoryKind, NamespaceText, Provenance, keyed_memory_id
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.domain.redaction import merged
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.memories import embed_memories
from memory_service.schemas.memories import DeletedOut, MemoryRecord
from memory_service.state.cache import agent_wide
from memory_service.state.store import StateStore

TITLE_CHARS = 200
MEMORY_ID_CHARS = 64
IDEMPOTENCY_KEY_CHARS = 200
# Kinds a tool may write: messages are recorded (POST /messages), consolidated memories
# are made by consolidation, whose latest version the memory block shows.
WRITABLE_KINDS = (MemoryKind.OBSERVATION, MemoryKind.FACT, MemoryKind.DIRECTIVE, MemoryKind.SUGGESTION,
                  MemoryKind.EPISODE)

# What the caller may see and change (memory_service/access/reach.py); None: all of the agent. A
# memory it does not see is answered as an unknown one; shared knowledge it may not change, 403.
NamespaceGuard = Reach | None


def _check_text(value: str | None, what: str) -> str | None:
    if value is not None:
        if not value.strip():
            raise ValueError(f"{what} must not be empty or blank")
        if problem := text_problem(value):
            raise ValueError(f"{what} {problem}")
    return value


class MemoryWrite(BaseModel):
    """A memory an agent writes itself."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1, max_length=MESSAGE_CHARS_CEILING,
                         description="the memory, at most MAX_MESSAGE_CHARS characters")
    namespace: NamespaceText = Field(min_length=1, max_length=MAX_NAMESPACE_CHARS,
                                     description="where it lives: 'user:<agent>:<user>', 'shard:<agent>:<shard>', "
                                                 "'session:<session>' (a session of the agent) or 'agent:<agent>'")
    kind: MemoryKind = Field(description="observation, fact, directive, suggestion or episode")
    title: str | None = Field(default=None, min_length=1, max_length=TITLE_CHARS)
    tags: list[str] = Field(default_factory=list, max_length=TAGS_CEILING,
                            description="at most MAX_MEMORY_TAGS, each at most MAX_TAG_CHARS characters")
    confidence: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    expires_at: AwareDatetime | None = Field(
        default=None, description="when it expires (ISO 8601 with a time zone, in the future, within "
                                  "MEMORY_EXPIRY_MAX_DAYS): from then on search, the memory block and browse skip it, "
                                  "and the retention job purges it; without it the agent's time to live for the kind "
                                  "or shard applies, if any (docs/expiry.md)")
    idempotency_key: str | None = Field(
        default=None, min_length=1, max_length=IDEMPOTENCY_KEY_CHARS,
        description="makes the write repeatable: the same key for the same agent stores one memory and answers it "
                    "again (409 if the key was used for another content, namespace or kind); without it every "
                    "write stores a new memory")

    @field_validator("content")
    @classmethod
    def _content(cls, value: str) -> str:
        return _check_text(value, "content") or value

    @field_validator("idempotency_key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        return _check_text(value, "idempotency_key")

    @field_validator("title")
    @classmethod
    def _title(cls, value: str | None) -> str | None:
        return _check_text(value, "title")


class MemoryUpdate(BaseModel):
    """A partial update: only the fields given change (null clears title and confidence)."""

    model_config = ConfigDict(extra="forbid")

    content: str | None = Field(default=None, min_length=1, max_length=MESSAGE_CHARS_CEILING)
    title: str | None = Field(default=None, min_length=1, max_length=TITLE_CHARS)
    tags: list[str] | None = Field(default=None, max_length=TAGS_CEILING)
    confidence: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False)
    kind: MemoryKind | None = None
    expires_at: AwareDatetime | None = Field(
        default=None, description="a new expiry (in the future, within MEMORY_EXPIRY_MAX_DAYS); null: it never expires")

    @field_validator("content")
    @classmethod
    def _content(cls, value: str | None) -> str | None:
        return _check_text(value, "content")

    @field_validator("title")
    @classmethod
    def _title(cls, value: str | None) -> str | None:
        return _check_text(value, "title")


@dataclass(frozen=True)
class Written:
    """What a write stored: every memory asked for, in order, and the ids of those that were
    already stored (idempotent writes repeated), which this write did not change."""

    records: list[MemoryRecord]
    already_stored: list[str]


def _now() -> datetime:
    # Whole seconds: the stores keep a timestamp, and a repeated delete answers the same date.
    return datetime.now(UTC).replace(microsecond=0)


class MemoryTools:
    def __init__(self, settings: Settings, state: StateStore, agents: AgentDirectory, index: RetentionIndex,
                 embedder: Embedder | None):
        self.settings, self.state, self.agents, self.index, self.embedder = settings, state, agents, index, embedder

    def writes_allowed(self, agent_id: str) -> bool:
        listed = self.settings.memory_write_agents
        return "*" in listed or agent_id in listed

    def require_writes(self, agent_id: str) -> None:
        if not self.writes_allowed(agent_id):
            raise Forbidden(f"memory writes are off for agent '{agent_id}': the operator turns them on with "
                            "MEMORY_WRITE_AGENTS")

    # Reads ------------------------------------------------------------------------------

    async def get(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> MemoryRecord:
        """The memory with its provenance; counts the access (soft-deleted ones are answered too)."""
        _, memory = await self._find(agent_id, memory_id, guard)
        access = await self.index.count_access(agent_id, memory.id, datetime.now(UTC))
        if guard is not None:
            (memory,) = await guard.shown([memory])  # its provenance as the caller may see it
        return self.record(memory, access.count, access.last)

    async def changeable(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> tuple[MemoryBackend, Memory]:
        """(the agent's backend, the memory) if the caller sees it and may change it (a forget's
        target); NotFound or Forbidden as ``update`` answers. Writes need not be on."""
        return await self._find(agent_id, memory_id, guard, changing=True)

    async def peek(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> Memory:
        """The memory, as ``get`` finds it, without counting an access (the browse API)."""
        return (await self._find(agent_id, memory_id, guard))[1]

    # Writes -----------------------------------------------------------------------------

    async def write(self, agent_id: str, body: MemoryWrite, guard: NamespaceGuard = None) -> tuple[MemoryRecord, bool]:
        """(the memory, whether it was already stored: an idempotency key used before)."""
        written = await self.write_many(agent_id, [body], guard)
        return written.records[0], bool(written.already_stored)

    async def write_many(self, agent_id: str, bodies: list[MemoryWrite], guard: NamespaceGuard = None,
                         session_id: str | None = None, message_id: str | None = None) -> Written:
        """Store ``bodies`` all or none: every one is checked before any is written, and they
        are written in one batch. ``session_id``/``message_id``: where they were said (a
        session of the agent), kept in their provenance. A body with an ``idempotency_key``
        already stored is answered as stored and not written again (its id in ``already_stored``)."""
        reach = await self._writer(agent_id, guard, session_id)
        redactor = self.agents.redactor(agent_id)
        # The agent's times to live, read once, for the bodies without their own expires_at.
        policy = await self.agents.expiry_policy(agent_id) if any(b.expires_at is None for b in bodies) else None
        prepared = [await self._prepare(agent_id, body, reach, session_id, message_id, redactor, policy)
                    for body in bodies]
        memories = [memory for memory, _ in prepared]
        if not memories:
            return Written([], [])
        _, backend = await self.agents.backend_for(agent_id)
        keyed = [m.id for m, body in zip(memories, bodies) if body.idempotency_key is not None]
        stored = {m.id: m for m in await backend.find(agent_id, keyed) if m.metadata.agent_id == agent_id} \
            if keyed else {}
        for memory in memories:
            if (old := stored.get(memory.id)) is not None and \
                    (old.content, old.namespace, old.kind) != (memory.content, memory.namespace, memory.kind):
                raise Conflict(f"idempotency_key: memory {memory.id!r} was written with this key and another content, "
                               "namespace or kind")
        new = list({m.id: m for m in memories if m.id not in stored}.values())  # a key twice in a batch: once
        if new:
            await embed_memories(self.embedder, new)
            await backend.write(new)
            await self._changed(agent_id, *new)
            # The browse indexes: the agent, and the users whose namespaces were written.
            users = sorted({ns.fields[1] for m in new if (ns := Namespace.parse(m.namespace)).kind is NamespaceKind.USER})
            await self.state.index_agent(agent_id)
            for user_id in users:
                await self.state.index_agent(agent_id, user_id)
        records = [self.record(stored.get(m.id, m)) for m in memories]
        for record, (_, redacted) in zip(records, prepared, strict=True):
            record.redacted = redacted or None
        return Written(records, list(dict.fromkeys(m.id for m in memories if m.id in stored)))

    async def writable_target(self, agent_id: str, namespace: str, guard: NamespaceGuard = None,
                              session_id: str | None = None, message_id: str | None = None) -> Namespace:
        """The namespace a write of the caller goes to, checked as ``write_many`` checks each
        body's (writes on, the agent's own namespace, the caller's reach, the session and
        the cited message), for a writer whose writes are not all memories (write blocks'
        entities and edges)."""
        reach = await self._writer(agent_id, guard, session_id)
        target = await self._writable_namespace(agent_id, namespace, reach)
        if message_id is not None:
            await self._cited(agent_id, message_id, session_id, target)
        return target

    async def _writer(self, agent_id: str, guard: NamespaceGuard, session_id: str | None) -> Reach:
        self.require_writes(agent_id)
        reach = guard or Reach(self.state, agent_id)
        if session_id is not None and not await reach.sees_session(session_id):
            raise NotFound(f"session_id: session {session_id!r} has no messages recorded by agent {agent_id!r}")
        return reach

    async def _prepare(self, agent_id: str, body: MemoryWrite, reach: Reach, session_id: str | None,
                       message_id: str | None, redactor: Redactor,
                       policy: ExpiryPolicy | None = None) -> tuple[Memory, dict[str, int]]:
        """The memory ``body`` stores, checked, its secrets redacted; and what was redacted."""
        namespace = await self._writable_namespace(agent_id, body.namespace, reach)
        if message_id is not None:
            await self._cited(agent_id, message_id, session_id, namespace)
        self._check_kind(body.kind)
        check_message_chars(body.content, self.settings.max_message_chars)
        tags = self._tags(body.tags)
        now = _now()
        expires_at = self._check_expiry(body.expires_at, now)
        if expires_at is None and policy is not None:
            expires_at = policy.expires_at(body.kind.value, str(namespace), now)
        provenance = Provenance(agent_id=agent_id, session_id=session_id,
                                message_ids=[message_id] if message_id else [])
        if namespace.kind is NamespaceKind.USER:
            provenance.user_id = namespace.fields[1]
        elif namespace.kind is NamespaceKind.SESSION:
            provenance.session_id = namespace.fields[0]
        memory_id = uuid.uuid4().hex if body.idempotency_key is None else keyed_memory_id(agent_id, body.idempotency_key)
        content, title, kept_tags, redacted = await _redacted(redactor, body.content, body.title, tags)
        assert content is not None and kept_tags is not None  # given, so redacted
        return Memory(id=memory_id, kind=body.kind, namespace=str(namespace), content=content, metadata=provenance,
                      valid_at=now, title=title, tags=kept_tags, confidence=body.confidence,
                      expires_at=expires_at), redacted

    async def update(self, agent_id: str, memory_id: str, body: MemoryUpdate,
                     guard: NamespaceGuard = None) -> tuple[MemoryRecord, MemoryRecord]:
        """(before, after). Refuses a soft-deleted memory (409: undelete it first)."""
        self.require_writes(agent_id)
        backend, memory = await self._find(agent_id, memory_id, guard, changing=True)
        if memory.deleted_at is not None:
            raise Conflict(f"memory {memory_id!r} is deleted: undelete it before updating it")
        if memory.corrected_by is not None:
            raise Conflict(f"memory {memory_id!r} was corrected, by {memory.corrected_by!r}: it is kept as history; "
                           "update the correction")
        if memory.expired():
            raise Conflict(f"memory {memory_id!r} expired at {memory.expires_at}: the retention job purges it; "
                           "write it again to keep it")
        given = body.model_fields_set
        if "content" in given and body.content is None:
            raise InvalidInput("content: must not be null (send the new content, or leave the field out)")
        if "kind" in given and body.kind is None:
            raise InvalidInput("kind: must not be null")
        changes: dict[str, object] = {}
        if body.content is not None:
            check_message_chars(body.content, self.settings.max_message_chars)
        if body.kind is not None:
            self._check_kind(body.kind)
            changes["kind"] = body.kind
        tags = self._tags(body.tags or []) if "tags" in given else None
        content, title, tags, redacted = await _redacted(self.agents.redactor(agent_id), body.content, body.title, tags)
        if content is not None:
            changes["content"] = content
        if tags is not None:
            changes["tags"] = tags
        if "title" in given:
            changes["title"] = title
        if "confidence" in given:
            changes["confidence"] = body.confidence
        if "expires_at" in given:
            changes["expires_at"] = self._check_expiry(body.expires_at, _now())
        before = self.record(memory)
        updated = memory.model_copy(update={**changes, "updated_at": _now()})
        if updated.search_text != memory.search_text:
            updated.embedding = None
            await embed_memories(self.embedder, [updated])  # re-indexed: the stores take the new vector
        await backend.replace(agent_id, [updated])
        if updated.expires_at != memory.expires_at:
            await _refresh_fact_ends(agent_id, backend, updated)
        await self._changed(agent_id, updated)
        after = self.record(updated)
        after.redacted = redacted or None
        return before, after

    async def delete(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> tuple[DeletedOut, bool]:
        """Soft delete; (the answer, whether this call deleted it). A second call answers the same dates."""
        self.require_writes(agent_id)
        backend, memory = await self._find(agent_id, memory_id, guard, changing=True)
        if memory.deleted_at is None:
            return (await self.retire(agent_id, backend, [memory]))[0], True
        return DeletedOut(id=memory.id, deleted_at=memory.deleted_at,
                          purge_at=purge_at(memory.deleted_at, self.settings.purge_after_days)), False

    async def undelete(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> tuple[MemoryRecord, bool]:
        """The memory, live again; (the record, whether this call changed it)."""
        self.require_writes(agent_id)
        backend, memory = await self._find(agent_id, memory_id, guard, changing=True)
        changed = memory.deleted_at is not None
        if changed:
            memory = (await self.revive(agent_id, backend, [memory]))[0]
        access = await self.index.access(agent_id, memory.id)
        return self.record(memory, access.count, access.last), changed

    # The soft delete and its undoing, without a caller to check: ``delete`` and ``undelete``
    # above after their checks, and the operator's import that follows its files
    # (memory_service/curation/legacy_import.py), which removes what a file no longer holds.

    async def retire(self, agent_id: str, backend: MemoryBackend, memories: Sequence[Memory],
                     at: datetime | None = None) -> list[DeletedOut]:
        """Soft-delete live ``memories`` of ``agent_id`` (at ``at``, else now): read by id only until the purge."""
        deleted_at = at or _now()
        retired = [m.model_copy(update={"deleted_at": deleted_at}) for m in memories]
        if not retired:
            return []
        for memory in retired:  # indexed first: a crash after it leaves an entry the purge checks against the store
            await self.index.mark_deleted(agent_id, memory.id, deleted_at)
        await backend.replace(agent_id, retired)
        await self._changed(agent_id, *retired)
        return [DeletedOut(id=m.id, deleted_at=deleted_at, purge_at=purge_at(deleted_at, self.settings.purge_after_days))
                for m in retired]

    async def revive(self, agent_id: str, backend: MemoryBackend, memories: Sequence[Memory]) -> list[Memory]:
        """Soft-deleted ``memories`` of ``agent_id`` live again."""
        revived = [m.model_copy(update={"deleted_at": None}) for m in memories]
        if not revived:
            return []
        await backend.replace(agent_id, revived)
        for memory in revived:
            await self.index.unmark_deleted(agent_id, memory.id)
        await self._changed(agent_id, *revived)
        return revived

    # For the other curators of a memory (memory_service/curation/corrections.py) ---------

    async def writable(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> tuple[MemoryBackend, Memory]:
        """The memory, for a change: writes on, the caller sees it and may change its namespace."""
        self.require_writes(agent_id)
        return await self.changeable(agent_id, memory_id, guard)

    def check_tags(self, tags: list[str]) -> list[str]:
        return self._tags(tags)

    async def changed(self, agent_id: str, *memories: Memory) -> None:
        """Every cached block that may show ``memories`` is stale."""
        await self._changed(agent_id, *memories)

    # Helpers ----------------------------------------------------------------------------

    def record(self, memory: Memory, access_count: int = 0, last_accessed_at: datetime | None = None) -> MemoryRecord:
        return MemoryRecord(
            id=memory.id, kind=memory.kind, namespace=memory.namespace, content=memory.content, title=memory.title,
            tags=list(memory.tags), confidence=memory.confidence, valid_at=memory.valid_at, created_at=memory.valid_at,
            updated_at=memory.updated_at, deleted_at=memory.deleted_at, expires_at=memory.expires_at,
            corrected_at=memory.corrected_at, corrected_by=memory.corrected_by, corrects=memory.corrects,
            purge_at=purge_at(memory.deleted_at, self.settings.purge_after_days), provenance=memory.metadata,
            access_count=access_count, last_accessed_at=last_accessed_at, served_by=memory.served_by)

    async def _find(self, agent_id: str, memory_id: str, guard: NamespaceGuard,
                    changing: bool = False) -> tuple[MemoryBackend, Memory]:
        if not memory_id or len(memory_id) > MEMORY_ID_CHARS or not memory_id.isprintable():
            raise InvalidInput(f"memory_id {preview(memory_id)} is not a memory id: 1 to {MEMORY_ID_CHARS} printable "
                               "characters")
        _, backend = await self.agents.backend_for(agent_id)
        found = [m for m in await backend.find(agent_id, [memory_id]) if m.metadata.agent_id == agent_id]
        if not found:
            # Another agent's memory gets the same answer: ids of other tenants are not the caller's to learn.
            raise NotFound(f"memory_id {memory_id!r}: agent {agent_id!r} has no such memory")
        if guard is not None:
            namespace = Namespace.parse(found[0].namespace)
            if not await guard.sees_namespace(namespace):
                raise NotFound(f"memory_id {memory_id!r}: agent {agent_id!r} has no such memory")
            if changing:
                self._check_changeable(guard, namespace)
        return backend, found[0]

    async def _writable_namespace(self, agent_id: str, text: str, reach: Reach) -> Namespace:
        try:
            namespace = Namespace.parse(text)
        except InvalidInput as exc:
            raise InvalidInput(f"namespace: {exc}") from None
        if namespace.kind is NamespaceKind.SESSION:
            if not await reach.sees_session(namespace.fields[0]):  # unknown, another agent's or unseen: one answer
                raise NotFound(f"namespace: session {namespace.fields[0]!r} has no messages recorded by agent {agent_id!r}")
        elif namespace.fields[0] != agent_id:
            raise NotFound(f"namespace: {preview(text)} is not one of agent {agent_id!r}'s")
        elif namespace.kind is NamespaceKind.USER and not reach.sees_user(namespace.fields[1]):
            raise Forbidden(f"namespace: this API key is limited to some users of agent {agent_id!r}, and "
                            f"{namespace.fields[1]!r} is not one of them")
        self._check_changeable(reach, namespace)
        return namespace

    @staticmethod
    def _check_changeable(reach: Reach, namespace: Namespace) -> None:
        if not reach.may_change(namespace):
            raise Forbidden(f"this API key is limited to some users of agent {reach.agent_id!r}: it changes only their "
                            "user namespaces and the sessions they took part in, not shared knowledge")

    async def _cited(self, agent_id: str, message_id: str, session_id: str | None, namespace: Namespace) -> None:
        """A cited message must be one recorded in the session given (or the namespace's session),
        which the caller sees (checked before): provenance never points at what it may not see."""
        said_in = session_id or (namespace.fields[0] if namespace.kind is NamespaceKind.SESSION else None)
        if said_in is None:
            raise InvalidInput("message_id: give the session_id the message was said in")
        if not await self.state.has_message(said_in, message_id):
            raise NotFound(f"message_id: session {said_in!r} has no message {message_id!r}")

    def _check_expiry(self, expires_at: datetime | None, now: datetime) -> datetime | None:
        """A writer's ``expires_at``: ahead of ``now`` and within MEMORY_EXPIRY_MAX_DAYS."""
        if expires_at is None:
            return None
        if expires_at <= now:
            raise InvalidInput(f"expires_at: {expires_at.isoformat()} has passed; give a time in the future")
        horizon = self.settings.memory_expiry_max_days
        if expires_at > now + timedelta(days=horizon):
            raise InvalidInput(f"expires_at: {expires_at.isoformat()} is more than MEMORY_EXPIRY_MAX_DAYS "
                               f"({horizon} days) ahead")
        return expires_at.astimezone(UTC)

    def _check_kind(self, kind: MemoryKind) -> None:
        if kind not in WRITABLE_KINDS:
            raise InvalidInput(f"kind: {kind.value!r} cannot be written by a tool; one of "
                               f"{', '.join(k.value for k in WRITABLE_KINDS)}")

    def _tags(self, tags: list[str]) -> list[str]:
        return check_tags(tags, self.settings.max_memory_tags, self.settings.max_tag_chars)

    async def _changed(self, agent_id: str, *memories: Memory) -> None:
        # The agent's generation too: a block's relevant memories come from sessions it does
        # not list as dependencies (every session the user spoke in).
        await self.state.cache.bump(*sorted({m.namespace for m in memories}), agent_wide(agent_id))


async def _refresh_fact_ends(agent_id: str, backend: MemoryBackend, memory: Memory) -> None:
    """The graph facts ``memory`` is a source of end when their sources (as stored now, those
    not deleted or corrected) all expire: its new ``expires_at`` moves that (docs/expiry.md)."""
    facts = await backend.facts_citing(agent_id, [memory.id])
    if not facts:
        return
    sources = {m.id: m for m in await backend.find(agent_id, sorted({i for f in facts for i in f.memory_ids}))}
    sources[memory.id] = memory
    holding = {i: m for i, m in sources.items() if m.deleted_at is None and m.corrected_at is None}
    await backend.set_fact_ends(agent_id, {
        f.id: sources_end(holding[i].expires_at for i in f.memory_ids if i in holding) for f in facts})


async def _redacted(redactor: Redactor, content: str | None, title: str | None,
                    tags: list[str] | None) -> tuple[str | None, str | None, list[str] | None, dict[str, int]]:
    """A memory's content, title and tags as the agent's redaction policy stores them (each
    left None if None), and what was redacted from them, by kind."""
    counts: list[dict[str, int]] = []

    async def one(text: str, field: str) -> str:
        redacted = await redactor.redacted(text, field)
        counts.append(redacted.counts)
        return redacted.text

    content = None if content is None else await one(content, "content")
    title = None if title is None else await one(title, "title")
    tags = None if tags is None else [await one(tag, "tags") for tag in tags]
    return content, title, tags, merged(*counts)
