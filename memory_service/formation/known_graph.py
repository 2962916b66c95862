"""What the graph already knows about a window, looked up before its LLM extraction (no model).

Why: the one extraction call per window (memory_service/formation/llm_extractor.py) also
says which stored facts the window makes no longer true ("I moved to Manchester" ends
"alice lives in Leeds"). For that the model must see those facts, and finding them must
cost no call: the window's candidate names are looked up by normalised name and alias
(the ``name_keys`` index), and the current facts of the entities found are read.

- **Where**: only the namespaces the window writes to: its users' (who wrote a user
  message), its active shards' and the agent's. Never another user's namespace, never
  another agent's graph.
- **Names**: each speaker's user id (the user's own person entity), the names and aliases
  the offline extractor reads in the window (``extract_graph``: names longer than three
  words too), then every message's words and n-grams of up to three words without the
  stopword-only ones (``query_names``, as search reads a query), in window order, at most
  ``MAX_WINDOW_NAMES``. One lookup for all of them (an index seek per name and namespace).
- **Bounded**: at most ``KnownLimits.entities`` entities (speakers first, then by where the
  window first names them) and ``KnownLimits.facts`` current facts (those of the
  first-ranked entities first, newest first within an entity). Past the caps the model
  is not shown a fact and so cannot supersede it; the single-valued rule
  (memory_service/formation/graph_update.py) still closes what it finds.

A store without a graph (Mongo) shows nothing known.
"""

from __future__ import annotations

import asyncio

from memory_service.backends.base import MemoryBackend
from memory_service.domain.errors import NotSupported
from memory_service.domain.graph import Entity, Fact, normalise_name, query_names
from memory_service.domain.models import Role
from memory_service.domain.namespaces import Namespace
from memory_service.formation.entities import extract_graph
from memory_service.formation.extractor import KnownGraph, KnownLimits, Window
from memory_service.formation.rule_extractor import STOP_WORDS

__all__ = ["MAX_WINDOW_NAMES", "known_graph", "window_namespaces"]

MAX_WINDOW_NAMES = 1000  # candidate names looked up per window (x its namespaces: index seeks)


def window_namespaces(window: Window) -> list[Namespace]:
    """The namespaces a window writes its graph to: its users', its active shards', the agent's."""
    users = dict.fromkeys(m.user_id for m in window.messages if m.role == Role.USER and m.user_id)
    return [*(Namespace.user(window.agent_id, u) for u in users),
            *(Namespace.shard(window.agent_id, s.shard_id) for s in window.shards if s.active),
            Namespace.agent(window.agent_id)]


def window_names(window: Window) -> list[str]:
    """The window's candidate entity names, normalised, most telling first."""
    names: dict[str, None] = {}
    for message in window.messages:
        if message.role == Role.USER and message.user_id:
            names.setdefault(normalise_name(message.user_id))
    entities, _ = extract_graph(window)
    for entity in entities:
        for name in (entity.name, *entity.aliases):
            names.setdefault(normalise_name(name))
    for message in window.messages:
        if message.role in (Role.USER, Role.ASSISTANT):
            for name in query_names(message.content, STOP_WORDS, limit=MAX_WINDOW_NAMES):
                names.setdefault(name)
    names.pop("", None)
    return list(names)[:MAX_WINDOW_NAMES]


async def known_graph(backend: MemoryBackend, window: Window, limits: KnownLimits) -> KnownGraph:
    """The stored entities ``window`` names and their current facts, within ``limits``."""
    if limits.entities < 1 or not window.messages:
        return KnownGraph()
    names = window_names(window)
    rank = {name: i for i, name in enumerate(names)}
    try:
        found = await backend.lookup_entities(window.agent_id, window_namespaces(window), names)
    except NotSupported:
        return KnownGraph()

    def first_named(entity: Entity) -> int:
        return min((rank[k] for k in map(normalise_name, (entity.name, *entity.aliases)) if k in rank),
                   default=len(rank))

    entities = sorted(found, key=lambda e: (first_named(e), normalise_name(e.name), e.id))[: limits.entities]
    if limits.facts < 1 or not entities:
        return KnownGraph(tuple(entities))
    order = {e.id: i for i, e in enumerate(entities)}
    by_namespace: dict[str, list[str]] = {}
    for entity in entities:
        by_namespace.setdefault(entity.namespace, []).append(entity.id)
    lists = await asyncio.gather(*(backend.current_facts(window.agent_id, ns, ids) for ns, ids in by_namespace.items()))
    facts = {f.id: f for fs in lists for f in fs}.values()

    def priority(fact: Fact) -> tuple[int, float, str]:
        through = min(order.get(fact.subject_id, len(order)), order.get(fact.object_id, len(order)))
        return through, -(fact.valid_at or fact.created_at).timestamp(), fact.id

    return KnownGraph(tuple(entities), tuple(sorted(facts, key=priority)[: limits.facts]))
