"""The one interface every memory backend implements (and the contract tests check)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from memory_service.domain.errors import NotSupported
from memory_service.domain.graph import (
    Closing,
    Entity,
    EntityDetail,
    EntityMentions,
    EntitySplit,
    EntityType,
    Fact,
    MentionedEntity,
)
from memory_service.domain.models import Memory, MemoryKind, StoreQuery
from memory_service.domain.namespaces import Namespace

# A page of a listing and the cursor of the next one (None after the last).
Page = tuple[list[Entity], str | None]

# A position in the list of an agent's memories, newest first (``list_memories``): the
# memories after it are those with an earlier ``valid_at`` timestamp, or the same one and a
# smaller id.
Position = tuple[float, str]


class MemoryState(StrEnum):
    """Which memories a listing shows: live ones (what search and the memory block read),
    soft-deleted ones, evicted ones (past a FIFO cap), corrected ones (found wrong and
    replaced, kept as history: docs/corrections.md), or all."""

    LIVE = "live"
    DELETED = "deleted"
    EVICTED = "evicted"
    CORRECTED = "corrected"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class MemoryListing:
    """What ``list_memories`` is asked for: one page of an agent's memories, newest first."""

    namespaces: Sequence[Namespace] | None = None  # None: every namespace of the agent
    kinds: Sequence[MemoryKind] = ()  # empty: every kind
    tags: Sequence[str] = ()  # only memories carrying every one of these tags
    since: datetime | None = None  # valid_at at or after
    until: datetime | None = None  # valid_at at or before
    state: MemoryState = MemoryState.LIVE
    after: Position | None = None  # the previous page's last memory (or where its scan stopped)
    limit: int = 50
    hint: float | None = None  # a backend's own hint carried by the cursor (the graph: its time window)


@dataclass(slots=True)
class ListedPage:
    """A page of ``list_memories``: the memories, newest first, and where the next page starts
    (None: the list is done). A page may hold fewer than asked while ``resume`` is set: the
    backend bounds the work of one page, and went no further."""

    memories: list[Memory]
    resume: Position | None = None
    hint: float | None = None


@dataclass(frozen=True, slots=True)
class RecentRead:
    """One read of ``recent_many``: the ``limit`` most recent memories of ``kinds`` in ``namespace``."""

    namespace: Namespace
    kinds: Sequence[MemoryKind]
    limit: int


@dataclass(frozen=True, slots=True)
class Found:
    """A search candidate not read yet: its id and time, all that ranking needs. The graph's
    scope scan ranks hundreds of memories to keep a hundred, of which a search returns a
    few: it answers with these, and the search reads in full only what it returns
    (memory_service/recall/search.py, ``Ranking.read``)."""

    id: str
    valid_at: datetime


@dataclass(frozen=True, slots=True)
class Brief:
    """What the memory block shows of a relevant memory: its kind, time and searchable text
    (``briefs``: the block reads forty of them on every call, and building whole memories
    cost it more than reading them)."""

    id: str
    kind: MemoryKind
    valid_at: datetime
    text: str
    served_by: str | None = None
    expires_at: datetime | None = None  # a cached block showing it lives no longer (docs/expiry.md)

    @classmethod
    def of(cls, memory: Memory) -> Brief:
        return cls(memory.id, memory.kind, memory.valid_at, memory.search_text, memory.served_by, memory.expires_at)


@dataclass(frozen=True, slots=True)
class Facet:
    """Where and by whom a memory was said: what question-aware ranking reads of the best
    candidates (memory_service/recall/question_rank.py). ``speakers``: its ``user_id`` and
    ``user_ids`` (a message's speaker; an episode's participants), lowercase."""

    id: str
    kind: MemoryKind
    valid_at: datetime
    session_id: str | None
    role: str | None
    speakers: tuple[str, ...]

    @classmethod
    def of(cls, memory: Memory) -> Facet:
        meta = memory.metadata
        return cls(memory.id, memory.kind, memory.valid_at, meta.session_id,
                   None if meta.role is None else str(meta.role),
                   speakers_of(meta.user_id, meta.user_ids))


def speakers_of(user_id: str | None, user_ids: Sequence[str] = ()) -> tuple[str, ...]:
    """A memory's speakers as ``Facet`` keeps them: lowercase, each once."""
    return tuple(dict.fromkeys(u.lower() for u in (user_id, *user_ids) if u))


# A backend's answer to a search: per signal ("fulltext", "vector"), candidates best first
# with that signal's raw score (higher is better); each a memory, or a ``Found`` to read
# (with ``find``) if it is kept.
Candidate = Memory | Found
SignalHits = dict[str, Sequence[tuple[Candidate, float]]]


def admits(query: StoreQuery, memory: Memory) -> bool:
    """Whether a search for ``query`` admits ``memory``: live, in its namespaces, of its
    kinds, time range and tags (what each store's search puts in its own query)."""
    if not memory.live:
        return False
    if query.namespaces is not None and memory.namespace not in {str(ns) for ns in query.namespaces}:
        return False
    if query.kinds and memory.kind not in query.kinds:
        return False
    if query.since and memory.valid_at < query.since or query.until and memory.valid_at > query.until:
        return False
    return all(tag in memory.tags for tag in query.tags)


class MemoryBackend(ABC):
    """Stores memories by agent and namespace. Writes are idempotent by ``Memory.id``.

    Every read names the agent: a session namespace does not carry it, and a backend may
    keep each agent's memories apart (the graph backend keeps one graph per agent).
    Reads never create storage.
    """

    name: str

    async def start(self) -> None:
        """Connect and check the store; raise to make the registry fall back."""

    async def close(self) -> None:
        """Release connections."""

    async def describe_shard(self, agent_id: str, shard_id: str, name: str, extraction_focus: str, active: bool) -> None:
        """Record a shard's settings where this store keeps them (by default it does not)."""

    @abstractmethod
    async def health(self) -> dict[str, Any]:
        """``{"ok": bool, ...}`` with whatever helps an operator."""

    async def gauges(self) -> dict[str, float]:
        """Current values for /metrics, by Prometheus name with labels (none by default)."""
        return {}

    @abstractmethod
    async def write(self, memories: Sequence[Memory]) -> int:
        """Store memories whose id is not stored yet; return how many were new.

        Writing an id that exists changes nothing, so a retried formation is a no-op. A
        memory without ``embedding`` is stored and marked for ``unembedded``.
        """

    @abstractmethod
    async def get(self, agent_id: str, namespace: Namespace, ids: Sequence[str]) -> list[Memory]:
        """The memories of ``namespace`` with these ids (missing ids are skipped)."""

    @abstractmethod
    async def recent(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind], limit: int) -> list[Memory]:
        """The ``limit`` most recent memories of these kinds, oldest first."""

    async def recent_many(self, agent_id: str, reads: Sequence[RecentRead]) -> list[list[Memory]]:
        """``recent`` of each read, in order: what the memory block reads of a session, its
        users and the shards. A backend may answer them in one round trip; this one asks
        ``recent`` for each at once. Fails as a whole, with the first read's error, when one
        read fails: the others are cancelled then (none is left running against a failing store)."""
        try:
            async with asyncio.TaskGroup() as group:
                asked = [group.create_task(self.recent(agent_id, r.namespace, r.kinds, r.limit)) for r in reads]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return [task.result() for task in asked]

    @abstractmethod
    async def trim(self, agent_id: str, namespace: Namespace, kind: MemoryKind, keep: int) -> int:
        """Evict all but the ``keep`` most recent memories of ``kind``; return how many went.

        Evicted memories are no longer read by ``recent``, ``search`` or counted; the
        retention policy removes them for good. Idempotent.
        """

    @abstractmethod
    async def export(self, agent_id: str, namespace: Namespace) -> list[Memory]:
        """Every memory of the namespace, evicted ones included, oldest first (for migration)."""

    @abstractmethod
    async def count(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind] = ()) -> int:
        """How many live (not evicted) memories of these kinds, or of all, the namespace holds."""

    @abstractmethod
    async def search(self, agent_id: str, query: StoreQuery) -> SignalHits:
        """Candidates per signal for ``query`` among the agent's live memories.

        ``fulltext`` when ``query.terms`` is not empty, ``vector`` when ``query.vector`` is
        set; each list holds at most ``query.limit`` candidates inside ``query.namespaces``
        (all of the agent's when None), of ``query.kinds`` and in the time range. A
        candidate may be a ``Found`` (its id and time) where reading it whole would cost
        more than ranking it. ``query.like``: the query vector is that memory's stored one
        (``stored_embedding``), and there is no ``vector`` signal when it has none.
        """

    @abstractmethod
    async def agents(self) -> list[str]:
        """The agents this store holds memories of (for maintenance: backfill, migration)."""

    async def list_memories(self, agent_id: str, listing: MemoryListing) -> ListedPage:
        """One page of the agent's memories (the browse API), newest first: ordered by
        ``valid_at`` then id, both descending, after ``listing.after``, inside its filters.
        Keyset pagination through the store's index on the time: a page deep in the list
        costs what the first does. A backend without it answers NotSupported (409)."""
        raise NotSupported(f"the {self.name} backend cannot list memories")

    @abstractmethod
    async def unembedded(self, agent_id: str, limit: int, exclude: Collection[str] = ()) -> list[Memory]:
        """Up to ``limit`` of the agent's memories stored without an embedding, but those of
        ``exclude`` (a reader's skipped ids: claimed by another, memory_service/embedding/once.py)."""

    async def stored_embedding(self, agent_id: str, memory_id: str, model: str | None) -> list[float] | None:
        """The stored embedding of one memory, if it has one of ``model`` (a search by a stored
        message's text then needs no embedding of its own); None by default."""
        return None

    @abstractmethod
    async def set_embeddings(self, agent_id: str, vectors: Mapping[str, Sequence[float]],
                             model: str | None = None) -> int:
        """Store embeddings by memory id, made by ``model`` (an ``Embedder.name``, kept beside
        each vector); ids not stored are skipped; return how many were set."""

    # Changing the embedding model (memory_service/embedding/reembed.py, docs/embeddings.md) ------
    # A memory's searched vector stays where it is while the new model's is staged beside it;
    # once every memory of the agent has one, the staged vectors are promoted in batches.

    @abstractmethod
    async def reembed_candidates(self, agent_id: str, model: str, after: str | None,
                                 limit: int) -> tuple[list[tuple[str, str]], str | None]:
        """Up to ``limit`` of the agent's memories (evicted and soft-deleted included) that
        have no vector of ``model``, neither searched nor staged, as (id, the text search
        indexes), following the cursor ``after`` (None: from the start); and the cursor of
        the next page (None: no more). A memory written behind the cursor meanwhile is found
        by a pass from the start."""

    @abstractmethod
    async def stage_embeddings(self, agent_id: str, model: str, vectors: Mapping[str, tuple[str, Sequence[float]]]) -> int:
        """Stage vectors of ``model`` beside the searched ones, by memory id: ``(text, vector)``
        with the text that was embedded; a memory whose text changed since is skipped (it is
        a candidate again). How many were staged."""

    @abstractmethod
    async def promote_embeddings(self, agent_id: str, model: str, limit: int) -> int:
        """Make up to ``limit`` staged vectors of ``model`` the searched ones (the memory no
        longer waits for the backfill); how many. Call until it returns 0."""

    # The memory tools (memory_service/curation/tools.py, docs/memory-tools.md) ----------------

    @abstractmethod
    async def find(self, agent_id: str, ids: Sequence[str]) -> list[Memory]:
        """The agent's memories with these ids, whatever their namespace, soft-deleted and
        evicted ones included (``deleted_at``, ``evicted`` say so); missing ids are skipped."""

    async def briefs(self, agent_id: str, ids: Sequence[str]) -> list[Brief]:
        """The ``Brief`` of each of the agent's live memories with these ids (others skipped)."""
        return [Brief.of(m) for m in await self.find(agent_id, ids) if m.live]

    async def facets(self, agent_id: str, ids: Sequence[str]) -> list[Facet]:
        """The ``Facet`` of each of the agent's live memories with these ids (others skipped):
        whatever a search's signals answered (a memory or a ``Found``), the question-aware
        ranking reads the speaker, role and session of its best candidates here."""
        return [Facet.of(m) for m in await self.find(agent_id, ids) if m.live]

    async def admitted(self, agent_id: str, ids: Sequence[str], query: StoreQuery) -> list[Candidate]:
        """Of the agent's memories with these ids, those a search for ``query`` admits (live, in
        its namespaces, of its kinds, time range and tags), in no order: the graph signal finds
        its candidates through entities, not through the store's search. A store may answer
        ``Found``s (id and time): the search then reads whole only the memories it keeps (the
        graph does; reading a hundred memories whole cost ~3 ms of CPU, their ids and times
        ~0.5 ms)."""
        return [m for m in await self.find(agent_id, ids) if admits(query, m)]

    @abstractmethod
    async def replace(self, agent_id: str, memories: Sequence[Memory]) -> int:
        """Overwrite what may change of these stored memories, by id: content, title, tags,
        confidence, ``updated_at``, ``deleted_at``, and what search reads (the text and the
        embedding; without one the memory waits for the backfill). Namespace, kind, time and
        provenance stay. Ids not stored are skipped; return how many were updated.

        Every read but ``find``, ``export`` and ``unembedded`` skips a memory with ``deleted_at``,
        and one whose ``expires_at`` has passed; ``expires_at`` is overwritten too."""

    # Retention (memory_service/curation/retention.py, docs/memory-tools.md) ----------------------

    @abstractmethod
    async def written_before(self, agent_id: str, before: datetime, limit: int,
                             after: tuple[float, str] | None = None) -> list[Memory]:
        """Up to ``limit`` of the agent's memories whose ``valid_at`` is before ``before``,
        whatever their namespace, soft-deleted and evicted ones included, ordered by
        (``valid_at``, id) and following ``after`` (the previous batch's last memory:
        ``(valid_at.timestamp(), id)``). Read through an index on the time, so a batch costs
        the memories in the range, not the agent's."""

    @abstractmethod
    async def expired(self, agent_id: str, now: datetime, limit: int) -> list[Memory]:
        """Up to ``limit`` of the agent's memories whose ``expires_at`` is at or before ``now``,
        whatever their namespace or state, soonest expired first (then by id): what the
        retention job purges (docs/expiry.md). Read through an index on ``expires_at``."""

    # Erasing a user (memory_service/curation/erasure.py, docs/erasure.md) ----------------------

    @abstractmethod
    async def delete(self, agent_id: str, ids: Sequence[str]) -> int:
        """Remove the agent's memories with these ids for good, whatever their namespace:
        from every index and every summary the store keeps; return how many were stored.

        Ids not stored are skipped, so a repeated call removes nothing more.
        """

    async def swap(self, agent_id: str, new: Sequence[Memory], old_ids: Sequence[str],
                   retired_at: datetime | None = None) -> tuple[int, int]:
        """Store ``new`` (as ``write``) and take ``old_ids`` out of every read, in one step where
        the store can (the graph: one statement, so no reader sees both or neither): deleted
        for good, or with ``retired_at``, soft-deleted at that time (kept for an undo). A
        window's re-formation (memory_service/formation/reform.py) replaces its memories so.
        Idempotent. (new ones stored, old ones found). This default takes two steps (a reader
        between them sees both)."""
        written = await self.write(new) if new else 0
        if not old_ids:
            return written, 0
        if retired_at is None:
            return written, await self.delete(agent_id, old_ids)
        found = [m.model_copy(update={"deleted_at": retired_at}) for m in await self.find(agent_id, old_ids)
                 if m.metadata.agent_id == agent_id]
        await self.replace(agent_id, found)
        return written, len(found)

    @abstractmethod
    async def set_provenance(self, agent_id: str, memories: Sequence[Memory]) -> int:
        """Replace the stored provenance (``metadata``) of these memories, by id, with theirs;
        nothing else changes. Ids not stored are skipped; return how many were updated."""

    async def scrub_pending(self, agent_id: str, judge: Callable[[Memory], Memory | None],
                            removed_ids: Collection[str]) -> int:
        """Apply ``judge`` to every memory of the agent this backend holds queued but not yet
        stored (None drops it, another Memory replaces it), and drop queued embeddings of
        ``removed_ids``; how many queued operations changed. Backends that queue nothing
        have nothing to scrub."""
        return 0

    async def purge_query_log(self, agent_id: str) -> int:
        """Forget the store's own log of the agent's recent queries, which quotes their
        parameters (the erased data among them); how many entries went. None by default."""
        return 0

    def redis_servers(self) -> list[Any]:
        """The Redis clients of the servers this backend stores in (an erasure rewrites their
        append-only files, memory_service/state/persistence.py). None by default."""
        return []

    # The knowledge graph (issue 16; docs/graph.md) --------------------------------------------
    # Entities and the facts between them, in the agent's graph beside its memories. A backend
    # without a graph answers every call with NotSupported (a 409 that says so), never a 500.

    def _no_graph(self) -> NotSupported:
        return NotSupported(f"the {self.name} backend keeps no knowledge graph (entities and facts); "
                            "use the graph backend (FalkorDB) for them")

    async def upsert_entities(self, agent_id: str, entities: Sequence[Entity]) -> int:
        """Store entities by id; return how many were new. An id already stored keeps its name,
        type and namespace, gains the aliases it lacked, and takes a non-empty summary and a
        name embedding when given. Idempotent: the same entities twice make one node each."""
        raise self._no_graph()

    async def add_facts(self, agent_id: str, facts: Sequence[Fact]) -> int:
        """Store facts by id between stored entities; return how many were new. A fact id
        already stored is the same statement made again: its memory and message ids are
        added to its provenance, nothing else changes. Unknown subject or object ids raise
        InvalidInput and nothing is written."""
        raise self._no_graph()

    async def write_facts(self, agent_id: str, facts: Sequence[Fact],
                          closes: Sequence[Closing] = ()) -> tuple[int, list[str]]:
        """``add_facts`` and the closing of ``closes`` (those still current: ``invalid_at``,
        ``expired_at`` now, ``superseded_by``, which may be one of ``facts``) in one atomic
        step: a reader never sees a new value beside the one it replaces. Returns how many
        facts were new and the ids of the facts closed (those closed already are left)."""
        raise self._no_graph()

    async def mention(self, agent_id: str, memory_id: str, entity_ids: Sequence[str],
                      via: Mapping[str, Sequence[str]] | None = None) -> int:
        """Link a stored memory to the stored entities it names (``MENTIONS``); return how many
        links were new. ``via``: by entity id, the normalised names the memory named it by
        (kept on the link, so that splitting an alias off takes its mentions along). An
        unknown memory raises NotFound, unknown entities InvalidInput."""
        raise self._no_graph()

    async def entity_candidates(self, agent_id: str, namespace: Namespace | str, entity_type: EntityType,
                                limit: int) -> list[Entity]:
        """At most ``limit`` entities of one type in one namespace (which ones, past the limit,
        is the store's choice), without their name embeddings: what resolution compares a name
        no exact lookup found with."""
        raise self._no_graph()

    async def entities_by_id(self, agent_id: str, entity_ids: Sequence[str]) -> list[Entity]:
        """The stored entities of these ids, with their name embeddings; unknown ids are left out."""
        raise self._no_graph()

    async def split_entity(self, agent_id: str, entity_id: str, alias: str) -> EntitySplit:
        """Undo a merge: the alias becomes an entity of its own (same type and namespace, id
        ``entity_id(namespace, alias, type)``), and the facts and mentions that came through
        that name alone move to it; the entity loses the alias. An unknown entity raises
        NotFound; a name that is not one of its aliases InvalidInput; its own name Conflict.
        A split that died half-way is completed by the same call."""
        raise self._no_graph()

    async def find_entities(self, agent_id: str, namespace: Namespace | str, names: Sequence[str]) -> list[Entity]:
        """The entities of ``namespace`` (that one only) whose normalised name or alias is one of
        ``names``'s normalised forms."""
        raise self._no_graph()

    async def current_facts(self, agent_id: str, namespace: Namespace | str, entity_ids: Sequence[str],
                            predicate: str | None = None, as_of: datetime | None = None,
                            include_superseded: bool = False, per_entity: int | None = None) -> list[Fact]:
        """The facts of ``namespace`` with one of these entities as subject or object: current
        ones (neither invalidated nor expired); with ``as_of``, those true then; with
        ``include_superseded``, all of them; with ``per_entity``, only the newest that many of
        each entity (a read's bound: a hub's thousands are never all read). Oldest first."""
        raise self._no_graph()

    async def invalidate_fact(self, agent_id: str, fact_id: str, invalid_at: datetime,
                              superseded_by: str | None = None, corrected_by: str | None = None) -> Fact:
        """Close a current fact: it stopped being true at ``invalid_at``, and the service stops
        showing it as current now (``expired_at``). The edge stays, linked to the fact that
        replaced it, or, closed as wrong, to the memory that corrected its source
        (``corrected_by``, docs/corrections.md). Unknown ids raise NotFound; a fact already
        closed raises Conflict."""
        raise self._no_graph()

    async def restore_fact(self, agent_id: str, fact_id: str) -> Fact:
        """Undo ``invalidate_fact``: the fact is current again. Restoring a current fact changes
        nothing. An unknown id raises NotFound."""
        raise self._no_graph()

    async def list_entities(self, agent_id: str, namespace: Namespace | str | None = None,
                            entity_type: EntityType | None = None, name_prefix: str | None = None,
                            cursor: str | None = None, limit: int = 50,
                            within: Sequence[Namespace | str] | None = None) -> Page:
        """The agent's entities (of one namespace, type, name prefix if given; of the namespaces
        ``within`` names, if given: what a caller limited to some users may see) ordered by
        normalised name then id, ``limit`` at a time; pass the returned cursor for the next page."""
        raise self._no_graph()

    async def drop_namespace_entities(self, agent_id: str, namespace: Namespace | str) -> int:
        """Delete every entity of one namespace with its facts and mentions (an erasure of
        the namespace's user); how many entities went. A store without a graph holds none: 0."""
        return 0

    async def drop_facts(self, agent_id: str, fact_ids: Sequence[str]) -> int:
        """Delete these facts for good (a hard forget of the memories they came from); how many
        went. A store without a graph holds none: 0."""
        return 0

    async def drop_orphan_entities(self, agent_id: str, entity_ids: Sequence[str]) -> int:
        """Delete those of these entities that no fact and no memory links to any more (what a
        hard forget left of them: their names and summaries came from what was forgotten);
        how many went. A store without a graph holds none: 0."""
        return 0

    async def get_fact(self, agent_id: str, fact_id: str) -> Fact:
        """One fact by id, current or not. An unknown id raises NotFound."""
        raise self._no_graph()

    async def facts_citing(self, agent_id: str, memory_ids: Sequence[str]) -> list[Fact]:
        """The current facts that came from one of these memories (their ``memory_ids``), for
        the purge of expired memories (docs/expiry.md). A store without a graph holds none."""
        return []

    async def set_fact_ends(self, agent_id: str, ends: Mapping[str, datetime | None]) -> int:
        """Set each fact's ``expires_at`` (when its source memories all expire; None: never), by
        fact id: a source memory's expiry changed (docs/expiry.md). A store without a graph: 0."""
        return 0

    async def facts_corrected_by(self, agent_id: str, memory_id: str) -> list[Fact]:
        """The facts closed as wrong by the correction ``memory_id`` (``invalidate_fact``'s
        ``corrected_by``), for undoing it (docs/corrections.md). A store without a graph holds none."""
        return []

    async def get_entity(self, agent_id: str, entity_id: str, as_of: datetime | None = None,
                         include_superseded: bool = False, *, within: Sequence[Namespace | str] | None = None,
                         after: tuple[int, str] | None = None, limit: int = 200) -> EntityDetail:
        """One entity with one page of its facts (as ``current_facts`` chooses them, oldest
        first, ``limit`` at most, those after position ``after``), the neighbours those facts
        link it to, and the totals. ``within``: only facts and neighbours of these namespaces
        (an entity of another is unknown). An unknown id raises NotFound."""
        raise self._no_graph()

    # Reading the graph for retrieval (memory_service/recall/graph_signal.py) ---------------------

    async def lookup_entities(self, agent_id: str, namespaces: Sequence[Namespace] | None,
                              names: Sequence[str]) -> list[Entity]:
        """The entities of any of ``namespaces`` (every one of the agent's when None) whose
        normalised name or alias is one of ``names``'s normalised forms."""
        raise self._no_graph()

    async def memories_mentioning(self, agent_id: str, entity_ids: Sequence[str],
                                  namespaces: Sequence[Namespace] | None, limit: int) -> list[EntityMentions]:
        """For each stored entity of ``entity_ids``: its degree and the ids of at most ``limit``
        memories of ``namespaces`` (every one of the agent's when None) that mention it (which
        ones, past the limit, is the store's choice). The memories may be deleted or evicted:
        the reader filters them as it filters any candidate."""
        raise self._no_graph()

    async def entities_mentioned(self, agent_id: str, memory_ids: Sequence[str],
                                 limit: int) -> dict[str, list[MentionedEntity]]:
        """For each stored memory of ``memory_ids`` that mentions entities: at most ``limit`` of
        them, with their degrees (which ones, past the limit, is the store's choice). Memories
        that mention none, or are unknown, are left out."""
        raise self._no_graph()
