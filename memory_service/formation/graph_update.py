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
from memory_service.domain.errors import Conflict, NotFound
from memory_service.domain.graph import (
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

FORMATION_ACTOR = "formation"  # the audit log's key_id for what the worker's formation changes


@dataclass(slots=True)
class GraphChanges:
    """What one window changed in the graph (counted for the formation summary and metrics)."""

    entities: int = 0
    facts: int = 0
    mentions: int = 0
    superseded: list[str] = field(default_factory=list)  # ids of the facts closed


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


async def resolve(backend: MemoryBackend, agent_id: str, extracted: Sequence[ExtractedEntity]) -> dict[tuple[str, str], Entity]:
    """Each extracted entity as the graph's entity, keyed by (namespace, normalised name or
    alias): the stored one where its namespace holds that name, else a new one."""
    by_namespace: dict[str, list[ExtractedEntity]] = {}
    for item in extracted:
        by_namespace.setdefault(item.namespace, []).append(item)
    resolved: dict[tuple[str, str], Entity] = {}
    for namespace, items in by_namespace.items():
        names = sorted({normalise_name(n) for item in items for n in (item.name, *item.aliases)} - {""})
        known: dict[str, Entity] = {}
        for entity in await backend.find_entities(agent_id, namespace, names):
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
    return resolved


async def apply(backend: MemoryBackend, agent_id: str, entities: Sequence[ExtractedEntity],
                facts: Sequence[ExtractedFact], mentioned: Sequence[Mention], *,
                memory_ids: Sequence[str] = (), observed_at: datetime | None = None,
                audit: AuditLog | None = None, supersedes: Sequence[str] = ()) -> GraphChanges:
    """Write one window's entities, facts and mentions; close the facts they replace and the
    ``supersedes`` ones (each logged in ``audit``, when given)."""

    async def close(old: Fact, invalid_at: datetime, superseded_by: str | None) -> None:
        try:
            after = await backend.invalidate_fact(agent_id, old.id, invalid_at, superseded_by=superseded_by)
        except Conflict:  # closed already: by this window's earlier try, or by a racing one
            return
        changes.superseded.append(old.id)
        if audit is not None:
            await audit.append(FORMATION_ACTOR, "fact.invalidate", agent_id, old.id, before=audited_fact(old),
                               after=audited_fact(after))

    changes = GraphChanges()
    if not entities and not supersedes:
        return changes
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
    if new_facts:
        changes.facts = await backend.add_facts(agent_id, new_facts)

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
        invalid_at = (new.valid_at if new else None) or observed_at or utcnow()
        if old.valid_at and invalid_at < old.valid_at:
            log.info("fact %s not closed: the window is older than the fact", old.id)
            continue
        await close(old, invalid_at, new.id if new else None)
    return changes
