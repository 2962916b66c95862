"""A window's entities and facts into the agent's graph: resolved, linked, and replacing the
facts they contradict (issue 16; docs/graph.md).

Runs in the window's write step (memory_service/formation/steps.py), after its memories are
written and before the window is marked written, so a failure leaves the window to be
written again, and every operation here is idempotent: entities and facts have ids stable
per namespace (memory_service/domain/graph.py), a mention is a MERGE, and a fact already
closed by the same newer fact is not closed twice. The order is what a reader may see
half-way: entities first, then the facts between them, then the mentions, and last the
old facts the new ones supersede.

Resolution stays inside one namespace: an extracted name is looked up among the entities
of its own namespace (by normalised name and aliases), never another user's, shard's or
agent's, so two users' "Bob" are two entities. A name found is the same entity (its new
aliases are added); a name not found is a new entity.

A fact with a single-valued predicate (``SINGLE_VALUED``: lives_in, works_at...) closes
the subject's current fact of that predicate whose object differs: ``invalid_at`` = when
the new fact became true (its ``valid_at``, else the window's last message), and
``superseded_by`` the new fact's id. Only the subject's own facts of that predicate in that
namespace are read, never the graph. Each fact closed is logged in the audit log
(``fact.invalidate``, actor ``formation``, the fact before and after: ids and times, never
its words) right after it is closed, so every invalidation can be found and undone
(``POST /v1/agents/{agent}/facts/{fact}/restore``). A retried window finds the fact closed
already and neither closes nor logs it again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memory_service.access.audit import AuditLog, audited_fact
from memory_service.domain.errors import Conflict, NotFound
from memory_service.domain.graph import (
    ENDS,
    SINGLE_VALUED,
    Entity,
    ExtractedEntity,
    ExtractedFact,
    Fact,
    Mention,
    entity_id,
    fact_id,
    normalise_name,
)
from memory_service.domain.models import utcnow
from memory_service.stores.base import MemoryBackend

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


Resolved = dict[tuple[str, str], Entity]  # (namespace, normalised name or alias) -> the graph's entity


async def resolve(backend: MemoryBackend, agent_id: str, extracted: Sequence[ExtractedEntity]) -> Resolved:
    """Each extracted entity as the graph's entity, keyed by (namespace, normalised name or
    alias): the stored one where its namespace holds that name, else a new one."""
    return (await resolve_stored(backend, agent_id, extracted))[0]


async def resolve_stored(backend: MemoryBackend, agent_id: str,
                         extracted: Sequence[ExtractedEntity]) -> tuple[Resolved, set[str]]:
    """``resolve``, and the ids of the resolved entities the store held already (a writer
    that reports what it created, memory_service/curation/write_blocks.py, needs them)."""
    stored: set[str] = set()
    by_namespace: dict[str, list[ExtractedEntity]] = {}
    for item in extracted:
        by_namespace.setdefault(item.namespace, []).append(item)
    resolved: dict[tuple[str, str], Entity] = {}
    for namespace, items in by_namespace.items():
        names = sorted({normalise_name(n) for item in items for n in (item.name, *item.aliases)} - {""})
        known: dict[str, Entity] = {}
        for entity in await backend.find_entities(agent_id, namespace, names):
            stored.add(entity.id)
            for name in (entity.name, *entity.aliases):
                known.setdefault(normalise_name(name), entity)
        for item in items:
            keys = [k for k in (normalise_name(n) for n in (item.name, *item.aliases)) if k]
            found = next((known[k] for k in keys if k in known), None)
            if found is None:
                found = Entity(id=entity_id(namespace, item.name, item.type), name=item.name, type=item.type,
                               namespace=namespace, summary=item.summary)
            aliases = sorted({*found.aliases, *(n for n in (item.name, *item.aliases) if normalise_name(n) != normalise_name(found.name))})
            found = found.model_copy(update={"aliases": aliases})
            for key in (normalise_name(found.name), *keys):
                known[key] = found
                resolved[(namespace, key)] = found
    return resolved, stored


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
                memory_ids: Sequence[str] = (), observed_at: datetime | None = None,
                audit: AuditLog | None = None, actor: str = FORMATION_ACTOR,
                resolved: Resolved | None = None) -> GraphChanges:
    """Write one window's entities, facts and mentions; close the facts they replace (each
    logged in ``audit`` under ``actor``, when given). ``resolved``: ``entities`` resolved
    already (``resolve``), by a caller that looked before writing anything else."""

    async def close(old: Fact, invalid_at: datetime, superseded_by: str | None) -> None:
        try:
            after = await backend.invalidate_fact(agent_id, old.id, invalid_at, superseded_by=superseded_by)
        except Conflict:  # closed already: by this window's earlier try, or by a racing one
            return
        changes.superseded.append(old.id)
        if audit is not None:
            await audit.append(actor, "fact.invalidate", agent_id, old.id, before=audited_fact(old),
                               after=audited_fact(after))

    changes = GraphChanges()
    if not entities:
        return changes
    if resolved is None:
        resolved = await resolve(backend, agent_id, entities)
    unique = {e.id: e for e in resolved.values()}
    changes.entities = await backend.upsert_entities(agent_id, list(unique.values()))

    new_facts: list[Fact] = []
    for item in facts:
        subject = resolved.get((item.namespace, normalise_name(item.subject)))
        obj = resolved.get((item.namespace, normalise_name(item.object)))
        if subject is None or obj is None or subject.id == obj.id:
            log.debug("fact %r left out: an end is not among the window's entities", item.text)
            continue
        new_facts.append(Fact(
            id=fact_id(item.namespace, subject.id, item.predicate, obj.id), namespace=item.namespace,
            subject_id=subject.id, object_id=obj.id, predicate=item.predicate, text=item.text,
            valid_at=item.valid_at or observed_at, memory_ids=list(memory_ids), message_ids=item.message_ids,
        ))
    new_facts = [await _again(backend, agent_id, f) for f in new_facts]
    # An ending is not a relation that holds: it closes one (below), and the closed fact's
    # invalid_at is its record.
    endings = [f for f in new_facts if f.predicate in ENDS]
    new_facts = [f for f in new_facts if f.predicate not in ENDS]
    if new_facts:
        changes.facts = await backend.add_facts(agent_id, new_facts)
    changes.stated = [f.id for f in new_facts]

    for mention in mentioned:
        named = sorted({e.id for (_, key), e in resolved.items() if key in mention.names})
        if named:
            changes.mentions += await backend.mention(agent_id, mention.memory_id, named)

    # One value per (subject, predicate): the window's last statement of it wins, and closes
    # every other current one (the store's, and the window's own earlier statements).
    winners = {(f.namespace, f.subject_id, f.predicate): f for f in new_facts if f.predicate in SINGLE_VALUED}
    for (namespace, subject_id, predicate), winner in winners.items():
        for old in await backend.current_facts(agent_id, namespace, [subject_id], predicate=predicate):
            if old.id == winner.id or old.subject_id != subject_id or old.object_id == winner.object_id:
                continue
            if old.valid_at and winner.valid_at and winner.valid_at < old.valid_at:
                # A statement about the past ("I lived in Paris in 2019"): history, not news.
                # (A retried window finds it closed already: the store's copy says.)
                if (await backend.get_fact(agent_id, winner.id)).current_at():
                    await close(winner, old.valid_at, old.id)
                break
            await close(old, winner.valid_at or observed_at or utcnow(), winner.id)

    # An ending ("I left Globex", "I moved out of Leeds") closes what it ends, with no new value.
    for ending in endings:
        for old in await backend.current_facts(agent_id, ending.namespace, [ending.subject_id]):
            if old.predicate in ENDS[ending.predicate] and old.object_id == ending.object_id and old.subject_id == ending.subject_id:
                if old.valid_at and ending.valid_at and ending.valid_at < old.valid_at:
                    continue  # left before it started: an older stint, not this one
                await close(old, ending.valid_at or observed_at or utcnow(), None)
    return changes
