"""The knowledge graph in retrieval (issue 16, item 6; docs/graph.md "Reading side").

A query names entities: its words and word n-grams (up to three words, as normalised names
are compared; ``memory_service.domain.graph.query_names``, which formation's LLM path uses
too) are looked up by normalised name and alias among the entities of the
namespaces the reader may see, never by scanning the graph and never in another user's
namespace. From them:

* the memory block shows their facts (current ones; with ``as_of``, those true then), and
* search gains a third signal, "graph": the memories that MENTION an entity the query
  reaches. It reaches its own entities (hop 0), the entities their facts link them to (hop
  1), and those the facts of hop-1 entities link to (hop 2; ``SEARCH_GRAPH_HOPS``), at most
  ``SEARCH_GRAPH_FANOUT`` new entities per hop, the facts sharing words with the query
  first, then the newest: so a hub with a thousand facts costs its d edges walked in the
  store, never a thousand entities followed, and at most FACTS_PER_ENTITY of its facts (the
  newest) are read. Then the shared topics: the namesakes, in the search's shards
  and agent namespace, of the entities reached (a shard holds the topic knowledge about a
  place or a thing a user only mentions; found by the same name-key seeks as the query's
  entities). A path weighs ``SEARCH_GRAPH_HOP_DECAY`` per fact followed (x
  ``SEARCH_GRAPH_TOPIC_WEIGHT`` for a topic), divided by log2(2 + degree) of the entity
  mentioned and of every entity passed through after the query's own: an entity with many
  mentions and facts (a hub: the user, a city everyone lives in) says little about any one
  memory, and a path through one says little about where it leads. A memory's score is the
  sum of its paths; the signal ranks by it and fuses like full text and vectors
  (reciprocal rank, its term weighed by the score: memory_service/recall/search.py).
* the fused candidates can be re-ranked by structure (``structure``): centrality, how
  close the entities a candidate mentions are to the query's (the paths above, with the
  hub penalty), and activation, how many other candidates mention the same entities (hub
  penalty again): the subject the candidates have in common. Each is on a fixed scale,
  capped at 1 (``structure`` says why not relative to the best candidate), so a weight says
  how much of a score the structure can move. Both weights are 0 by default (measured:
  docs/benchmarks/graph_rank.md).

A store without a graph (Mongo) answers NotSupported: the block shows no facts and search
runs on its other signals.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memory_service.backends.base import Candidate, MemoryBackend
from memory_service.domain.graph import Entity, Fact, MentionedEntity, normalise_name
from memory_service.domain.models import StoreQuery
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.schemas.search import EntityWeight, GraphPath, Structure

ENTITIES_PER_MEMORY = 20  # entities of one candidate the re-rank reads
# Facts of one entity a search or a memory block reads, the newest: what a read costs the
# store is bounded whatever an entity's degree (a hub of 3,960 facts, built with a write key,
# cost every search naming it ~580 ms to read whole). An entity of the benchmarks has far fewer.
FACTS_PER_ENTITY = 200
TOPIC_KINDS = (NamespaceKind.SHARD, NamespaceKind.AGENT)  # where shared topics are looked up
_WORD = re.compile(r"\w+")


def hub_weight(degree: int) -> float:
    return 1.0 / math.log2(2 + max(degree, 0))


@dataclass(frozen=True, slots=True)
class GraphOptions:
    """How far the signal reaches (Settings ``SEARCH_GRAPH_*``)."""

    hops: int = 2
    decay: float = 0.5
    fanout: int = 20
    topic_weight: float = 0.5


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
    facts = await facts_of(backend, agent_id, {e.id: e.namespace for e in entities}, as_of, include_superseded)
    return QueryGraph(entities, facts)


async def facts_of(backend: MemoryBackend, agent_id: str, namespaces: dict[str, str], as_of: datetime | None,
                   include_superseded: bool) -> list[Fact]:
    """The facts of the entities ``namespaces`` maps to their namespace, each once: at most
    FACTS_PER_ENTITY of each, the newest."""
    by_namespace: dict[str, list[str]] = {}
    for entity_id, namespace in namespaces.items():
        by_namespace.setdefault(namespace, []).append(entity_id)
    fact_lists = await asyncio.gather(*(
        backend.current_facts(agent_id, ns, ids, as_of=as_of, include_superseded=include_superseded,
                              per_entity=FACTS_PER_ENTITY)
        for ns, ids in by_namespace.items()))
    return list({f.id: f for facts in fact_lists for f in facts}.values())


@dataclass(frozen=True, slots=True)
class Reached:
    """An entity the signal reached: through which entities (``path``, ids from a query
    entity to this one), which facts, and whether as a shared topic."""

    entity_id: str
    path: tuple[str, ...]
    facts: tuple[str, ...] = ()
    topic: bool = False

    @property
    def hops(self) -> int:
        return len(self.facts)


@dataclass(slots=True)
class GraphHits:
    hits: list[tuple[Candidate, float]] = field(default_factory=list)  # best first (a Found: read when kept)
    paths: dict[str, list[GraphPath]] = field(default_factory=dict)  # by memory id
    closeness: dict[str, float] = field(default_factory=dict)  # entity id -> its best path's weight before its own hub penalty


async def graph_hits(backend: MemoryBackend, agent_id: str, query: StoreQuery, found: QueryGraph,
                     options: GraphOptions = GraphOptions(), as_of: datetime | None = None,
                     include_superseded: bool = False) -> GraphHits:
    """The graph signal's candidates for ``query`` (its scope, kinds, time range and tags),
    following facts as ``found``'s were chosen (current, ``as_of``, ``include_superseded``)."""
    if not found.entities:
        return GraphHits()
    reached: dict[str, Reached] = {e.id: Reached(e.id, (e.id,)) for e in found.entities}
    terms = {t.lower() for t in query.terms}
    facts, frontier = found.facts, list(reached)
    for hop in range(1, options.hops + 1):
        step = _follow(facts, frontier, reached, terms, options.fanout)
        reached |= step
        if hop == options.hops or not step:
            break
        facts = await facts_of(backend, agent_id, {i: _namespace_of(i, facts) for i in step}, as_of, include_superseded)
        frontier = list(step)
    mentioned = await backend.memories_mentioning(agent_id, list(reached), query.namespaces, query.limit)
    topics = [ns for ns in query.namespaces or () if ns.kind in TOPIC_KINDS]
    if options.topic_weight > 0 and topics:
        named = {normalise_name(m.name): reached[m.entity_id] for m in mentioned if reached[m.entity_id].hops}
        namesakes = [e for e in await backend.lookup_entities(agent_id, topics, list(named)) if e.id not in reached]
        extra: dict[str, Reached] = {}
        for entity in namesakes[: options.fanout]:
            source = named.get(normalise_name(entity.name)) or next(
                (r for n, r in named.items() if n in {normalise_name(a) for a in entity.aliases}), None)
            if source is not None:
                extra[entity.id] = Reached(entity.id, (*source.path, entity.id), source.facts, topic=True)
        if extra:
            reached |= extra
            mentioned += await backend.memories_mentioning(agent_id, list(extra), query.namespaces, query.limit)
    names = {m.entity_id: m.name for m in mentioned}
    degrees = {m.entity_id: m.degree for m in mentioned}
    closeness = {i: _closeness(r, degrees, options) for i, r in reached.items() if i in degrees}
    scores: dict[str, float] = {}
    paths: dict[str, list[GraphPath]] = {}
    for m in mentioned:
        r = reached[m.entity_id]
        weight = closeness[m.entity_id] * hub_weight(m.degree)
        path = GraphPath(entity=m.name, entity_id=m.entity_id, via=r.facts[-1] if r.facts and not r.topic else None,
                         hops=r.hops, path=[names.get(i, i) for i in r.path], facts=list(r.facts), topic=r.topic,
                         weight=round(weight, 6))
        for memory_id in m.memory_ids:
            scores[memory_id] = scores.get(memory_id, 0.0) + weight
            paths.setdefault(memory_id, []).append(path)
    if not scores:
        return GraphHits(closeness=closeness)
    # Read by id in score order, twice the limit at a time, until the limit is admitted: a
    # hub's reach (up to (entities + 2 x fan-out) x limit mentions) is never read whole.
    ordered = sorted(scores, key=lambda i: (-scores[i], i))
    memories: list[Candidate] = []
    for start in range(0, len(ordered), 2 * query.limit):
        memories += await backend.admitted(agent_id, ordered[start:start + 2 * query.limit], query)
        if len(memories) >= query.limit:
            break
    memories.sort(key=lambda m: (-scores[m.id], -m.valid_at.timestamp(), m.id))
    kept = memories[: query.limit]
    return GraphHits([(m, round(scores[m.id], 6)) for m in kept], {m.id: paths[m.id] for m in kept}, closeness)


def _follow(facts: Sequence[Fact], frontier: Sequence[str], reached: dict[str, Reached], terms: set[str],
            fanout: int) -> dict[str, Reached]:
    """The entities ``facts`` link the ``frontier`` to that are not reached yet: at most
    ``fanout``, through the facts sharing the most words with the query, then the newest."""
    ends = set(frontier)
    options: dict[str, tuple[tuple[int, float], Reached]] = {}
    for fact in facts:
        words = {w.lower() for w in _WORD.findall(fact.text)}
        rank = (-len(words & terms), -(fact.valid_at or fact.created_at).timestamp())
        for end, other in ((fact.subject_id, fact.object_id), (fact.object_id, fact.subject_id)):
            if end in ends and other not in reached:
                before = reached[end]
                option = Reached(other, (*before.path, other), (*before.facts, fact.text))
                if other not in options or rank < options[other][0]:
                    options[other] = (rank, option)
    best = sorted(options.values(), key=lambda pair: (pair[0], pair[1].entity_id))[:fanout]
    return {r.entity_id: r for _, r in best}


def _namespace_of(entity_id: str, facts: Sequence[Fact]) -> str:
    """The namespace of an entity a fact reached: the fact's (a fact joins entities of its own namespace)."""
    return next(f.namespace for f in facts if entity_id in (f.subject_id, f.object_id))


def _closeness(reached: Reached, degrees: dict[str, int], options: GraphOptions) -> float:
    """A path's weight before the hub penalty of the entity it ends at: the decay per fact
    followed, the topic weight for a namesake, and the hub penalty of every entity passed
    through after the query's own (a path through a hub says little about where it leads)."""
    weight = options.decay ** reached.hops * (options.topic_weight if reached.topic else 1.0)
    for passed in reached.path[1:-1]:
        weight *= hub_weight(degrees.get(passed, 0))
    return weight


async def structure(backend: MemoryBackend, agent_id: str, memory_ids: Sequence[str], closeness: dict[str, float],
                    centrality_weight: float, activation_weight: float) -> dict[str, Structure]:
    """The structural re-rank of the candidates ``memory_ids``: for each, its centrality and
    activation (0 for one that mentions no entity) and the factor they make of them.
    ``closeness``: the graph signal's, by entity id.

    Both are on fixed scales, capped at 1, never relative to the best candidate: scaled to
    the best, a hub's faint evidence would become a full 1 whenever nothing better is there
    (every candidate that names the user would win a factor over every other)."""
    mentioned = await backend.entities_mentioned(agent_id, memory_ids, ENTITIES_PER_MEMORY)
    candidates = len(dict.fromkeys(memory_ids))
    sharing: dict[str, int] = {}
    for entities in mentioned.values():
        for e in {e.entity_id: e for e in entities}.values():
            sharing[e.entity_id] = sharing.get(e.entity_id, 0) + 1
    out = {}
    for memory_id in dict.fromkeys(memory_ids):
        central = active = 0.0
        counted = []
        for e in {e.entity_id: e for e in mentioned.get(memory_id, ())}.values():
            near, shared = closeness.get(e.entity_id, 0.0), sharing[e.entity_id] - 1
            central += near * hub_weight(e.degree)
            active += shared / max(candidates - 1, 1) * hub_weight(e.degree)
            counted.append(_entity_weight(e, near, shared))
        c, a = min(central, 1.0), min(active, 1.0)
        factor = (1 + centrality_weight * c + activation_weight * a) / (1 + centrality_weight + activation_weight)
        out[memory_id] = Structure(centrality=round(c, 6), activation=round(a, 6),
                                   centrality_weight=centrality_weight, activation_weight=activation_weight,
                                   factor=round(factor, 6), entities=counted)
    return out


def _entity_weight(entity: MentionedEntity, closeness: float, shared: int) -> EntityWeight:
    return EntityWeight(entity=entity.name, entity_id=entity.entity_id, degree=entity.degree,
                        closeness=round(closeness, 6), shared=shared)


def entity_namespaces(namespaces: Sequence[Namespace]) -> list[Namespace]:
    """The namespaces of ``namespaces`` that hold entities (sessions hold none)."""
    return [ns for ns in namespaces if ns.kind is not NamespaceKind.SESSION]
