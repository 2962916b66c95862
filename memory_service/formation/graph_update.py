"""A window's entities and facts into the agent's graph: resolved, linked, and replacing the
facts they contradict (issue 16; docs/graph.md).

Runs in the window's write step (memory_service/formation/steps.py), after its memories are
written and before the window is marked written, so a failure leaves the window to be
written again, and every operation here is idempotent: entities and facts have ids stable
per namespace (memory_service/domain/graph.py), a mention is a MERGE, and a fact already
closed by the same newer fact is not closed twice. The order is what a reader may see
half-way: entities first, then the facts together with the closing of the facts they
replace (one statement, ``MemoryBackend.write_facts``: never the new value beside the old
one), then the mentions.

Resolution stays inside one namespace: an extracted name is looked up among the entities
of its own namespace, never another user's, shard's or agent's, so two users' "Bob" are two
entities. A name or alias found is the same entity; a name not found may still be the one
entity of its type that a lexical guard and the names' embeddings say it is
(memory_service/formation/resolution.py: "Bob" for "Robert", "Tom" for "Tom Baker"); else
it is a new entity. Every name attached to a stored entity is a merge, logged
(``entity.merge``) after it is stored; the facts and mentions record the names they came
through (``subject_via``, ``object_via``, ``via``), so a split can undo it (docs/graph.md,
"Merges and splits").

A fact with a single-valued predicate (``SINGLE_VALUED``: lives_in, works_at...) closes
the subject's current fact of that predicate whose object differs: ``invalid_at`` = when
the new fact became true (its ``valid_at``, else the window's last message), and
``superseded_by`` the new fact's id. Only the subject's own facts of that predicate in that
namespace are read, never the graph. Each fact closed is logged in the audit log
(``fact.invalidate``, actor ``formation``, the fact before and after: ids and times, never
its words) right after it is closed, so every invalidation can be found and undone
(``POST /v1/agents/{agent}/facts/{fact}/restore``). A retried window finds the fact closed
already and neither closes nor logs it again.

An ending (``ENDS``: "alice left Globex", "moved out of Leeds") closes the fact it ends and
is not stored as a fact of its own. A statement true again after its fact was closed
(moving back to Paris) is a new stint: a new edge (``_again``), the old one kept as history.

The LLM extractor also names stored facts the window makes no longer true (``supersedes``:
the ids of facts it was shown, memory_service/formation/known_graph.py). Each is closed the
same way, after the single-valued rule: ``invalid_at`` = the replacing fact's ``valid_at``
(the window's new fact of the same namespace, subject and predicate), else the window's
time; ``superseded_by`` = that fact, or none when the window states no replacement ("we
broke up"). A fact already closed, one the window states again, or one that only began
after the window's time is left as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memory_service.access.audit import AuditLog, audited_fact
from memory_service.access.pseudonyms import namespace_for_log
from memory_service.backends.base import MemoryBackend
from memory_service.domain.errors import NotFound
from memory_service.domain.graph import (
    ENDS,
    SINGLE_VALUED,
    Closing,
    Entity,
    EntityType,
    ExtractedEntity,
    ExtractedFact,
    Fact,
    Mention,
    entity_id,
    fact_id,
    normalise_name,
)
from memory_service.domain.models import utcnow
from memory_service.embedding.embedders import Embedder
from memory_service.events.log import Cause, Changed, EventLog
from memory_service.formation import resolution
from memory_service.schemas.events import EventType

log = logging.getLogger(__name__)

MAX_STINTS = 50  # times one statement may become true again (a bound on the lookups, not a rule of the world)
FORMATION_ACTOR = "formation"  # the audit log's key_id for what the worker's formation changes


@dataclass(slots=True)
class GraphChanges:
    """What one window changed in the graph (counted for the formation summary and metrics)."""

    entities: int = 0
    facts: int = 0
    mentions: int = 0
    superseded: list[str] = field(default_factory=list)  # ids of the facts closed
    stated: list[str] = field(default_factory=list)  # ids of the facts written (new or stated again)
    merges: list[str] = field(default_factory=list)  # ids of the stored entities that got a new name


def audited_merge(merge: Merge) -> dict[str, object]:
    """A merge as the audit log keeps it: ids, how and how close, never the name itself (the
    log outlives an erasure; the entity's aliases show the name while it is stored)."""
    return {"namespace": merge.namespace, "alias_entity_id": merge.alias_entity_id, "how": merge.how,
            "similarity": None if merge.similarity is None else round(merge.similarity, 4)}


def mentions(texts: dict[str, str], entities: Sequence[ExtractedEntity]) -> list[Mention]:
    """Which of ``entities`` each memory's text names (by normalised name or alias, whole
    words): ``texts`` maps memory ids to their content."""
    keys = sorted({k for e in entities for k in (normalise_name(n) for n in (e.name, *e.aliases)) if k})
    found = []
    for memory_id, text in texts.items():
        padded = f" {normalise_name(text)} "
        if named := tuple(k for k in keys if f" {k} " in padded):
            found.append(Mention(memory_id, named))
    return found


@dataclass(frozen=True, slots=True)
class Merge:
    """A name attached to an existing entity by resolution (beyond its exact name): what the
    audit log records (``entity.merge``) and ``split`` undoes."""

    entity_id: str
    namespace: str
    alias: str  # the name as the window wrote it
    alias_entity_id: str  # the id the name would have as an entity of its own (what a split makes)
    how: str  # "alias" (found by another of the window's names for it), or a kind of resolution.name_match
    similarity: float | None = None


Resolved = dict[tuple[str, str], Entity]  # (namespace, normalised name or alias) -> the graph's entity


@dataclass(slots=True)
class Resolution:
    """Each extracted name as the graph's entity, keyed by (namespace, normalised name or
    alias), and the merges that attached new names to stored entities."""

    entities: Resolved = field(default_factory=dict)
    merges: list[Merge] = field(default_factory=list)
    stored: set[str] = field(default_factory=set)  # ids of the resolved entities the store held already


async def _embed(embedder: Embedder | None, names: Sequence[str]) -> dict[str, list[float]]:
    """The names' embeddings (normalised name -> vector); none when there is no embedder or it
    fails: resolution then falls back to names, aliases and the strong forms."""
    todo = sorted(set(names))
    if embedder is None or not todo:
        return {}
    try:
        return dict(zip(todo, await embedder.embed(todo), strict=True))
    except Exception as exc:
        log.warning("could not embed %d entity names; resolving them without embeddings: %s", len(todo), exc)
        return {}


async def resolve(backend: MemoryBackend, agent_id: str, extracted: Sequence[ExtractedEntity], *,
                  embedder: Embedder | None = None, threshold: float = resolution.DEFAULT_THRESHOLD,
                  max_candidates: int = resolution.DEFAULT_MAX_CANDIDATES) -> Resolution:
    """Each extracted entity as the graph's entity: the stored one of its namespace that holds
    one of its names; else the one stored entity of its namespace and type that its name
    matches by a strong form, or by a weak form with close name embeddings
    (memory_service/formation/resolution.py); else a new one. Never across namespaces."""
    by_namespace: dict[str, list[ExtractedEntity]] = {}
    for item in extracted:
        by_namespace.setdefault(item.namespace, []).append(item)
    vectors = await _embed(embedder, [normalise_name(item.name) for item in extracted if normalise_name(item.name)])
    out = Resolution()
    for namespace, items in by_namespace.items():
        names = sorted({normalise_name(n) for item in items for n in (item.name, *item.aliases)} - {""})
        known: dict[str, Entity] = {}
        for entity in await backend.find_entities(agent_id, namespace, names):
            out.stored.add(entity.id)
            for name in (entity.name, *entity.aliases):
                known.setdefault(normalise_name(name), entity)
        pool: dict[EntityType, dict[str, Entity]] = {}  # candidates by type: stored, then this window's new ones
        stored_ids: set[str] = set()  # the pool's stored ones
        for item in items:
            keys = [k for k in (normalise_name(n) for n in (item.name, *item.aliases)) if k]
            found = next((known[k] for k in keys if k in known), None)
            how, similarity = "alias", None
            if found is None:
                if item.type not in pool:
                    candidates = await backend.entity_candidates(agent_id, namespace, item.type, max_candidates)
                    pool[item.type] = {e.id: e for e in candidates}
                    stored_ids.update(pool[item.type])
                match = await _fuzzy(backend, agent_id, item, keys, pool[item.type], vectors, embedder, threshold)
                if match is not None:
                    found, how, similarity = pool[item.type][match.entity_id], match.how, match.similarity
                    if found.id in stored_ids:
                        out.stored.add(found.id)
            if found is None:
                found = Entity(id=entity_id(namespace, item.name, item.type), name=item.name, type=item.type,
                               namespace=namespace, summary=item.summary,
                               name_embedding=vectors.get(normalise_name(item.name)))
            else:
                have = {normalise_name(n) for n in (found.name, *found.aliases)}
                for name in dict.fromkeys(n for n in (item.name, *item.aliases) if normalise_name(n) not in have):
                    have.add(normalise_name(name))
                    out.merges.append(Merge(found.id, namespace, name, entity_id(namespace, name, found.type),
                                            how if normalise_name(name) == normalise_name(item.name) else "alias",
                                            similarity))
            aliases = sorted({*found.aliases, *(n for n in (item.name, *item.aliases) if normalise_name(n) != normalise_name(found.name))})
            found = found.model_copy(update={"aliases": aliases})
            if found.name_embedding is None:
                found.name_embedding = vectors.get(normalise_name(found.name))
            pool.setdefault(found.type, {})[found.id] = found
            for key in (normalise_name(found.name), *keys):
                known[key] = found
                out.entities[(namespace, key)] = found
    # An entity resolved twice in one window keeps every name it was given.
    final = {e.id: e for e in out.entities.values()}
    out.entities = {key: final[e.id] for key, e in out.entities.items()}
    return out


async def _fuzzy(backend: MemoryBackend, agent_id: str, item: ExtractedEntity, keys: list[str],
                 pool: dict[str, Entity], vectors: dict[str, list[float]], embedder: Embedder | None,
                 threshold: float) -> resolution.Match | None:
    """The one candidate of the item's namespace and type its names match (strong form, or
    weak form with close embeddings), if any."""
    candidates = [resolution.Candidate(e.id, tuple(k for k in (normalise_name(n) for n in (e.name, *e.aliases)) if k))
                  for e in pool.values()]
    passed = resolution.guarded(keys, item.type, candidates)
    if len(passed) != 1:  # none, or two entities it may mean: resolution.choose
        return None
    similarity: dict[str, float | None] = {}
    mine = vectors.get(normalise_name(item.name))
    weak = [i for i, how in passed.items() if how not in resolution.STRONG]
    if mine is not None and weak:
        # Stored candidates are read without their vectors (a namespace's many); the few that
        # pass the guard are read again with them, and any stored without one is embedded now.
        stored = {e.id: e for e in await backend.entities_by_id(agent_id, [i for i in weak if pool[i].name_embedding is None])}
        for i in weak:
            if (vector := pool[i].name_embedding or stored.get(i, pool[i]).name_embedding) is None:
                vector = (await _embed(embedder, [normalise_name(pool[i].name)])).get(normalise_name(pool[i].name))
            similarity[i] = resolution.cosine(mine, vector) if vector is not None else None
    return resolution.choose(passed, similarity, threshold)


async def _again(backend: MemoryBackend, agent_id: str, fact: Fact) -> Fact:
    """``fact`` as it is stored: when the same statement was true once and closed before this
    one became true (moved to Lyon, then back to Paris), a new stint with its own id (named by
    the statement's messages, so a retried window finds the same one); the old edge stays
    history. A statement about the closed time itself is the old fact."""
    stints = 0
    while True:
        try:
            stored = await backend.get_fact(agent_id, fact.id)
        except NotFound:
            return fact
        closed = stored.invalid_at or stored.expired_at
        if closed is None or fact.valid_at is None or fact.valid_at < closed or stints >= MAX_STINTS:
            return fact
        stints += 1
        stint = ",".join(sorted(fact.message_ids)) or fact.valid_at.isoformat()
        fact = fact.model_copy(update={"id": fact_id(fact.namespace, fact.subject_id, fact.predicate, fact.object_id,
                                                      f"{stint}#{stints}")})


async def apply(backend: MemoryBackend, agent_id: str, entities: Sequence[ExtractedEntity],
                facts: Sequence[ExtractedFact], mentioned: Sequence[Mention], *,
                memory_ids: Sequence[str] = (), ends_at: datetime | None = None, observed_at: datetime | None = None,
                audit: AuditLog | None = None, actor: str = FORMATION_ACTOR, embedder: Embedder | None = None,
                threshold: float = resolution.DEFAULT_THRESHOLD,
                max_candidates: int = resolution.DEFAULT_MAX_CANDIDATES,
                resolved: Resolution | None = None, supersedes: Sequence[str] = (),
                events: EventLog | None = None, cause: Cause = Cause()) -> GraphChanges:
    """Write one window's entities, facts and mentions; close the facts they replace. Each
    merge of a new name into a stored entity and each fact closed is logged in ``audit``
    under ``actor``, when given. ``embedder`` gives entities their name embeddings (resolution
    compares them). ``resolved``: ``entities`` resolved already (``resolve``), by a caller that
    looked before writing anything else. ``supersedes``: ids of facts the extractor says the
    window ends (an LLM shown them), closed too. ``events``: where the facts closed are
    announced (``superseded``, by namespace, with ``cause``). ``ends_at``: when the
    ``memory_ids`` all expire (``domain.expiry.sources_end``): the facts are held closed by
    reads from then on (docs/expiry.md)."""

    changes = GraphChanges()
    if not entities and not supersedes:
        return changes
    outcome = resolved or await resolve(backend, agent_id, entities, embedder=embedder, threshold=threshold,
                                        max_candidates=max_candidates)
    entities_by_name = outcome.entities
    unique = {e.id: e for e in entities_by_name.values()}
    changes.entities = await backend.upsert_entities(agent_id, list(unique.values()))
    for merge in outcome.merges:  # after the store holds the name: a retried window finds it and logs nothing
        changes.merges.append(merge.entity_id)
        if audit is not None:
            await audit.append(actor, "entity.merge", agent_id, merge.entity_id, after=audited_merge(merge))

    new_facts: list[Fact] = []
    for item in facts:
        subject = entities_by_name.get((item.namespace, normalise_name(item.subject)))
        obj = entities_by_name.get((item.namespace, normalise_name(item.object)))
        if subject is None or obj is None or subject.id == obj.id:
            # Never the fact's words: a log line outlives an erasure.
            log.debug("a fact of %s left out: an end is not among the window's entities",
                      namespace_for_log(item.namespace))
            continue
        new_facts.append(Fact(
            id=fact_id(item.namespace, subject.id, item.predicate, obj.id), namespace=item.namespace,
            subject_id=subject.id, object_id=obj.id, predicate=item.predicate, text=item.text,
            valid_at=item.valid_at or observed_at, memory_ids=list(memory_ids), message_ids=item.message_ids,
            subject_via=[normalise_name(item.subject)], object_via=[normalise_name(item.object)], expires_at=ends_at,
        ))
    new_facts = [await _again(backend, agent_id, f) for f in new_facts]
    # An ending is not a relation that holds: it closes one (below), and the closed fact's
    # invalid_at is its record.
    endings = [f for f in new_facts if f.predicate in ENDS]
    new_facts = [f for f in new_facts if f.predicate not in ENDS]
    # What the window closes is decided first, then written with its facts in one statement
    # (MemoryBackend.write_facts): a reader never sees the new value beside the one it replaces.
    plan = await _closings(backend, agent_id, new_facts, endings, supersedes, observed_at)
    if new_facts or plan:
        changes.facts, closed = await backend.write_facts(agent_id, new_facts, [c for c, _ in plan.values()])
        changes.superseded = closed
        if events is not None and closed:
            by_namespace: dict[str, list[str]] = {}
            for fact_id_ in closed:
                by_namespace.setdefault(plan[fact_id_][1].namespace, []).append(fact_id_)
            await events.emit(agent_id, EventType.SUPERSEDED,
                              [Changed(ns, "graph_fact", tuple(ids)) for ns, ids in by_namespace.items()], cause)
        if audit is not None:  # after the store's change: a retried window finds them closed and logs nothing
            for fact_id_ in closed:
                await audit.append(actor, "fact.invalidate", agent_id, fact_id_, before=audited_fact(plan[fact_id_][1]),
                                   after=audited_fact(await backend.get_fact(agent_id, fact_id_)))
    changes.stated = [f.id for f in new_facts]

    for mention in mentioned:
        via: dict[str, list[str]] = {}  # entity id -> the names the memory named it by
        for (_, key), e in entities_by_name.items():
            if key in mention.names:
                via.setdefault(e.id, []).append(key)
        if via:
            changes.mentions += await backend.mention(agent_id, mention.memory_id, sorted(via), via=via)
    return changes


async def _closings(backend: MemoryBackend, agent_id: str, new_facts: Sequence[Fact], endings: Sequence[Fact],
                    supersedes: Sequence[str], observed_at: datetime | None) -> dict[str, tuple[Closing, Fact]]:
    """The facts the window's facts close, by id, each with the fact as it was: read before
    anything is written, from the subjects' current facts in their namespace (never the graph)."""
    plan: dict[str, tuple[Closing, Fact]] = {}
    when = observed_at or utcnow()

    def close(old: Fact, invalid_at: datetime, by: str | None) -> None:
        plan.setdefault(old.id, (Closing(old.id, invalid_at, by), old))

    async def still_open(fact: Fact) -> bool:
        """Whether ``fact`` is current once written: new, or stored and current."""
        try:
            return (await backend.get_fact(agent_id, fact.id)).current_at()
        except NotFound:
            return True

    # One value per (subject, predicate): the window's last statement of it wins, and closes
    # every other current one (the store's, and the window's own earlier statements).
    winners = {(f.namespace, f.subject_id, f.predicate): f for f in new_facts if f.predicate in SINGLE_VALUED}
    for (namespace, subject_id, predicate), winner in winners.items():
        stored = await backend.current_facts(agent_id, namespace, [subject_id], predicate=predicate)
        ours = [f for f in new_facts if (f.namespace, f.subject_id, f.predicate) == (namespace, subject_id, predicate)]
        for old in {f.id: f for f in (*stored, *ours)}.values():
            if old.id == winner.id or old.subject_id != subject_id or old.object_id == winner.object_id:
                continue
            if old.id in {f.id for f in ours} and not await still_open(old):
                continue
            if old.valid_at and winner.valid_at and winner.valid_at < old.valid_at:
                # A statement about the past ("I lived in Paris in 2019"): history, not news.
                # (A retried window finds it closed already: the store's copy says.)
                if await still_open(winner):
                    close(winner, old.valid_at, old.id)
                break
            close(old, winner.valid_at or when, winner.id)

    # An ending ("I left Globex", "I moved out of Leeds") closes what it ends, with no new value.
    for ending in endings:
        for old in await backend.current_facts(agent_id, ending.namespace, [ending.subject_id]):
            if old.predicate in ENDS[ending.predicate] and old.object_id == ending.object_id and old.subject_id == ending.subject_id:
                if old.valid_at and ending.valid_at and ending.valid_at < old.valid_at:
                    continue  # left before it started: an older stint, not this one
                close(old, ending.valid_at or when, None)

    # The facts the extractor says the window ends (ids of facts it was shown).
    stated = {f.id for f in new_facts}
    replacing = {(f.namespace, f.subject_id, f.predicate): f for f in new_facts}
    for old_id in dict.fromkeys(supersedes):
        try:
            old = await backend.get_fact(agent_id, old_id)
        except NotFound:  # erased since it was shown
            continue
        if not old.current_at() or old.id in stated:
            continue
        new = replacing.get((old.namespace, old.subject_id, old.predicate))
        invalid_at = (new.valid_at if new else None) or when
        if old.valid_at and invalid_at < old.valid_at:
            log.info("fact %s not closed: the window is older than the fact", old.id)
            continue
        close(old, invalid_at, new.id if new else None)
    return plan
