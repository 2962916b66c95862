"""Corrections: a memory found wrong is replaced by the right one (docs/corrections.md).

An update (memory_update) says the world changed: the memory keeps its id and its new words
replace the old ones, which were true until then. A correction says the memory was wrong:

* a new memory (the **correction**) takes its place, with the right content, the same kind,
  namespace, provenance, time (``valid_at``) and expiry, and ``corrects`` naming it;
* the old memory is kept, words and all, as history: it gets ``corrected_at`` and
  ``corrected_by`` (the correction's id), and from then on every read but those by id skips
  it (search, the memory block, browse's live list, counts), as a soft delete does, but the
  retention job does not purge it for that (browse's ``corrected`` state lists it);
* the knowledge graph's current facts formed from it close as wrong: ``corrected_by`` on the
  fact, ``invalid_at`` = its ``valid_at`` (it never held: an ``as_of`` read finds it at no
  time), the edge kept. A fact a window formed names every memory of the window; the ones
  closed are those whose two ends the old memory mentions, or that no other live memory
  holds any longer.

Crash-safe by order and by id: the correction's id is derived from the old memory's and the
new content, so a correction cut short and asked again with the same content writes the same
memory; the facts close next (only current ones are read), and the old memory is marked last.
Undoing (``undo``) restores the facts, soft-deletes the correction (purged after
PURGE_AFTER_DAYS, like any delete) and brings the old memory back, in that order: a retry
after a crash finishes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memory_service.backends.base import MemoryBackend
from memory_service.curation.tools import TITLE_CHARS, MemoryTools, NamespaceGuard, _check_text, _now, _redacted
from memory_service.domain.errors import Conflict, InvalidInput
from memory_service.domain.graph import Fact
from memory_service.domain.limits import MESSAGE_CHARS_CEILING, TAGS_CEILING, check_message_chars
from memory_service.domain.models import Memory, MemoryKind, keyed_memory_id
from memory_service.embedding.memories import embed_memories

MENTIONS_READ = 200  # entities of the old memory read to tell which facts it stated


class MemoryCorrection(BaseModel):
    """The right content of a memory found wrong (and, if they were wrong too, its title and tags)."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(min_length=1, max_length=MESSAGE_CHARS_CEILING,
                         description="the right content, at most MAX_MESSAGE_CHARS characters; must differ from the "
                                     "memory's")
    title: str | None = Field(default=None, min_length=1, max_length=TITLE_CHARS,
                              description="a new title (left out: the memory's)")
    tags: list[str] | None = Field(default=None, max_length=TAGS_CEILING, description="new tags (left out: the memory's)")

    @field_validator("content")
    @classmethod
    def _content(cls, value: str) -> str:
        return _check_text(value, "content") or value

    @field_validator("title")
    @classmethod
    def _title(cls, value: str | None) -> str | None:
        return _check_text(value, "title")


@dataclass
class Corrected:
    """What a correction changed: the old memory (marked), its correction, the facts it closed."""

    old: Memory
    new: Memory
    facts: list[Fact] = field(default_factory=list)
    redacted: dict[str, int] = field(default_factory=dict)


@dataclass
class Undone:
    """What undoing a correction changed: the old memory (live again), the correction (soft-deleted
    now, or before), the facts restored."""

    old: Memory
    new: Memory | None
    facts: list[Fact] = field(default_factory=list)
    new_deleted_now: bool = False


def correction_id(agent_id: str, old_id: str, content: str) -> str:
    """The correction's id: the same for the same memory and content (a retry writes it once)."""
    digest = hashlib.sha256(content.encode()).hexdigest()
    return keyed_memory_id(agent_id, f"correction:{old_id}:{digest}")


class Corrections:
    def __init__(self, tools: MemoryTools):
        self.tools = tools

    async def correct(self, agent_id: str, memory_id: str, body: MemoryCorrection,
                      guard: NamespaceGuard = None) -> Corrected:
        tools = self.tools
        backend, old = await tools.writable(agent_id, memory_id, guard)
        if old.kind is MemoryKind.MESSAGE:
            raise InvalidInput(f"memory_id {memory_id!r} is a recorded message, what was said: correct the memories "
                               "formed from it (or delete the message)")
        _check_current(old)
        check_message_chars(body.content, tools.settings.max_message_chars)
        tags = tools.check_tags(body.tags) if body.tags is not None else None
        content, title, tags, redacted = await _redacted(tools.agents.redactor(agent_id), body.content, body.title, tags)
        assert content is not None
        if content == old.content and (title is None or title == old.title) and (tags is None or tags == old.tags):
            raise InvalidInput(f"content: the same as memory {memory_id!r}'s; nothing to correct")
        now = _now()
        new = old.model_copy(update={
            "id": correction_id(agent_id, old.id, content), "content": content,
            "title": old.title if title is None else title, "tags": list(old.tags) if tags is None else tags,
            "corrects": old.id, "corrected_at": None, "corrected_by": None, "deleted_at": None, "updated_at": now,
            "embedding": None, "embedding_model": None, "metadata": old.metadata.model_copy(deep=True)})
        await self._store(agent_id, backend, new)
        facts = await self._close_facts(agent_id, backend, old, new.id)
        marked = old.model_copy(update={"corrected_at": now, "corrected_by": new.id})
        await backend.replace(agent_id, [marked])
        await tools.changed(agent_id, marked, new)
        return Corrected(marked, new, facts, redacted)

    async def undo(self, agent_id: str, memory_id: str, guard: NamespaceGuard = None) -> Undone:
        """Undo the correction of ``memory_id`` (the memory that was corrected)."""
        tools = self.tools
        backend, old = await tools.writable(agent_id, memory_id, guard)
        if old.corrected_by is None:
            raise Conflict(f"memory {memory_id!r} is not corrected: there is no correction to undo"
                           + (f" (it is the correction of {old.corrects!r}: undo that one)" if old.corrects else ""))
        found = await backend.find(agent_id, [old.corrected_by])
        new = found[0] if found else None  # purged, erased: nothing of it left to undo
        if new is not None and new.corrected_by is not None:
            raise Conflict(f"memory {memory_id!r}'s correction {new.id!r} was corrected since (by "
                           f"{new.corrected_by!r}): undo that correction first")
        restored = []
        for fact in await backend.facts_corrected_by(agent_id, old.corrected_by):
            restored.append(await backend.restore_fact(agent_id, fact.id))
        deleted_now = False
        if new is not None and new.deleted_at is None:
            (await tools.retire(agent_id, backend, [new]))
            new = (await backend.find(agent_id, [new.id]) or [new])[0]
            deleted_now = True
        revived = old.model_copy(update={"corrected_at": None, "corrected_by": None})
        await backend.replace(agent_id, [revived])
        await tools.changed(agent_id, revived)
        return Undone(revived, new, restored, deleted_now)

    async def _store(self, agent_id: str, backend: MemoryBackend, new: Memory) -> None:
        """Write the correction; one already stored under its id (a retry, or the same correction
        made again after an undo soft-deleted it) is stored again as ``new`` says, live."""
        tools = self.tools
        await embed_memories(tools.embedder, [new])
        if await backend.find(agent_id, [new.id]):
            await tools.index.unmark_deleted(agent_id, new.id)
            await backend.replace(agent_id, [new])
        else:
            await backend.write([new])

    async def _close_facts(self, agent_id: str, backend: MemoryBackend, old: Memory, correction: str) -> list[Fact]:
        """Close the current facts formed from ``old`` as wrong (module docstring)."""
        facts = await backend.facts_citing(agent_id, [old.id])
        if not facts:
            return []
        mentioned = {e.entity_id for e in (await backend.entities_mentioned(agent_id, [old.id], MENTIONS_READ))
                     .get(old.id, [])}
        others = sorted({i for f in facts for i in f.memory_ids} - {old.id})
        live = {m.id for m in await backend.find(agent_id, others) if m.live}
        closed = []
        for fact in facts:
            stated = fact.subject_id in mentioned and fact.object_id in mentioned
            if not stated and any(i in live for i in fact.memory_ids if i != old.id):
                continue  # held by another memory of its window, which the correction leaves right
            try:
                closed.append(await backend.invalidate_fact(agent_id, fact.id, fact.valid_at or fact.created_at,
                                                            corrected_by=correction))
            except Conflict:
                continue  # closed meanwhile
        return closed


def _check_current(memory: Memory) -> None:
    if memory.corrected_by is not None:
        raise Conflict(f"memory {memory.id!r} was corrected already, by {memory.corrected_by!r}: correct that one "
                       "(or undo the correction first)")
    if memory.deleted_at is not None:
        raise Conflict(f"memory {memory.id!r} is deleted: undelete it before correcting it")
    if memory.evicted:
        raise Conflict(f"memory {memory.id!r} was evicted (past its namespace's cap): it is no longer read")
    if memory.expired():
        raise Conflict(f"memory {memory.id!r} expired at {memory.expires_at}: write it again instead")
