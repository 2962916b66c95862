"""The knowledge graph in retrieval (issue 16, item 6; docs/graph.md "Reading side").

A query names entities: its words and word n-grams (up to three words, as normalised names
are compared; ``memory_service.domain.graph.query_names``, which formation's LLM path uses
too) are looked up by normalised name and alias among the entities of the
namespaces the reader may see, never by scanning the graph and never in another user's
namespace. From them:

* the memory block shows their facts (current ones; with ``as_of``, those true then), and
* search gains a third signal, "graph": the memories that MENTION a query entity, and, one
  hop out along its facts, those that mention the entity a fact links it to. A path
  weighs 1 (0.5 one hop out) divided by log2(2 + the entity's degree): an entity with
  many mentions and facts (a hub: the user, a city everyone lives in) says little about any
  one memory. A memory's score is the sum of its paths; the signal ranks by it and fuses
  like full text and vectors (reciprocal rank, memory_service/recall/search.py).

A store without a graph (Mongo) answers NotSupported: the block shows no facts and search
runs on its other signals.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memory_service.domain.graph import Entity, Fact
from memory_service.domain.models import Memory, StoreQuery
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.schemas.search import GraphPath
from memory_service.stores.base import MemoryBackend

MAX_NEIGHBOURS = 20  # entities one hop out whose mentions are read
HOP_WEIGHT = 0.5


def hub_weight(degree: int) -> float:
    return 1.0 / math.log2(2 + max(degree, 0))


@dataclass(slots=True)
class QueryGraph:
    """The query's entities and their facts in the namespaces read."""

    entities: list[Entity] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)


async def query_graph(backend: MemoryBackend, agent_id: str, namespaces: Sequence[Namespace] | None,
                      names: Sequence[str], as_of: datetime | None = None,
                      include_superseded: bool = False) -> QueryGraph:
    """The entities ``names`` name in ``namespaces`` (all of the agent's when None), and their
    facts as ``current_facts`` chooses them. NotSupported (no graph) passes to the caller."""
    if not names:
        return QueryGraph()
    entities = await backend.lookup_entities(agent_id, namespaces, names)
    by_namespace: dict[str, list[str]] = {}
    for entity in entities:
        by_namespace.setdefault(entity.namespace, []).append(entity.id)
    fact_lists = await asyncio.gather(*(
        backend.current_facts(agent_id, ns, ids, as_of=as_of, include_superseded=include_superseded)
        for ns, ids in by_namespace.items()))
    facts = list({f.id: f for facts in fact_lists for f in facts}.values())
    return QueryGraph(entities, facts)


@dataclass(slots=True)
class GraphHits:
    hits: list[tuple[Memory, float]] = field(default_factory=list)  # best first
    paths: dict[str, list[GraphPath]] = field(default_factory=dict)  # by memory id


async def graph_hits(backend: MemoryBackend, agent_id: str, query: StoreQuery, found: QueryGraph) -> GraphHits:
    """The graph signal's candidates for ``query`` (its scope, kinds, time range and tags)."""
    if not found.entities:
        return GraphHits()
    seeds = {e.id: e for e in found.entities}
    via: dict[str, Fact] = {}  # neighbour id -> the fact that reaches it
    for fact in found.facts:
        for end, other in ((fact.subject_id, fact.object_id), (fact.object_id, fact.subject_id)):
            if end in seeds and other not in seeds and len(via) < MAX_NEIGHBOURS:
                via.setdefault(other, fact)
    namespaces = query.namespaces
    reached = await backend.memories_mentioning(agent_id, [*seeds, *via], namespaces, query.limit)
    scores: dict[str, float] = {}
    paths: dict[str, list[GraphPath]] = {}
    for mentioned in reached:
        hop = mentioned.entity_id not in seeds
        weight = (HOP_WEIGHT if hop else 1.0) * hub_weight(mentioned.degree)
        path = GraphPath(entity=mentioned.name, entity_id=mentioned.entity_id,
                         via=via[mentioned.entity_id].text if hop else None, weight=round(weight, 6))
        for memory_id in mentioned.memory_ids:
            scores[memory_id] = scores.get(memory_id, 0.0) + weight
            paths.setdefault(memory_id, []).append(path)
    if not scores:
        return GraphHits()
    memories = [m for m in await backend.find(agent_id, list(scores)) if _admitted(m, query)]
    memories.sort(key=lambda m: (-scores[m.id], -m.valid_at.timestamp(), m.id))
    kept = memories[: query.limit]
    return GraphHits([(m, round(scores[m.id], 6)) for m in kept], {m.id: paths[m.id] for m in kept})


def _admitted(memory: Memory, query: StoreQuery) -> bool:
    """What the store's own search would admit: live, in scope, of the kinds, time and tags asked."""
    if memory.deleted_at is not None or memory.evicted:
        return False
    if query.namespaces is not None and memory.namespace not in {str(ns) for ns in query.namespaces}:
        return False
    if query.kinds and memory.kind not in query.kinds:
        return False
    if query.since and memory.valid_at < query.since or query.until and memory.valid_at > query.until:
        return False
    return all(tag in memory.tags for tag in query.tags)


def entity_namespaces(namespaces: Sequence[Namespace]) -> list[Namespace]:
    """The namespaces of ``namespaces`` that hold entities (sessions hold none)."""
    return [ns for ns in namespaces if ns.kind is not NamespaceKind.SESSION]

