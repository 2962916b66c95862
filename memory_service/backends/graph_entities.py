"""The knowledge graph in the agent's FalkorDB graph: entities, the facts between them, and
the memories that mention them (issue 16; docs/graph.md has the schema).

Written in Graphiti's schema, beside the memories' ``Episodic`` nodes, so graphiti-core's own
readers read it (tests/test_graph_store.py proves it):

* ``(:Entity:<Type>)`` nodes (``Person``, ``Place``, ``Organisation``, ``Object``, ``Event``,
  ``Topic``: Graphiti's labels are node labels on FalkorDB) with Graphiti's ``uuid``,
  ``name``, ``group_id`` (the namespace's), ``summary``, ``created_at`` (ISO text),
  ``name_embedding`` (vecf32, when known); ours: ``type``, ``aliases``, ``norm_name`` (the
  normalised name, the listing's sort key) and ``name_keys``, ``<group_id>|<normalised
  name or alias>`` for each name, an indexed list: a lookup by name is an index seek that
  can only find entities of the one namespace the key names.
* ``[:RELATES_TO]`` edges between entities with Graphiti's ``uuid``, ``group_id``, ``name``
  (the predicate), ``fact`` (its text), ``fact_embedding``, ``episodes`` (the memory ids),
  ``created_at``, ``expired_at``, ``valid_at``, ``invalid_at`` (ISO text); ours:
  ``superseded_by``, ``message_ids`` and ``created_ts``/``valid_ts``/``invalid_ts``/
  ``expired_ts``, the same times as Unix seconds, which compare (ISO strings with and
  without microseconds do not sort).
* ``[:MENTIONS]`` edges from a memory's ``Episodic`` node to an entity: ``uuid``,
  ``group_id`` (the memory's), ``created_at``.

What each query costs (n = the query's ids or names, d = an entity's number of facts, N =
the entities of the namespace listed; never the graph's size):

* upsert_entities: one index seek per entity to check types, one MERGE per entity.
* add_facts: one seek per endpoint to check them, then per fact two seeks and a MERGE that
  looks at the edges between its two entities.
* mention: a seek for the memory and one per entity; a MERGE per link.
* find_entities: one seek in the ``name_keys`` index per name (exact keys, one namespace).
* current_facts: a seek per entity, then its d edges, filtered (namespace, predicate, time).
* invalidate_fact / restore_fact: one seek in the RELATES_TO ``uuid`` index.
* get_entity: a seek, its d edges walked twice (the counts, then one page of at most
  ``limit`` facts, sorted and cut in the store), a seek per neighbour of that page.
* list_entities: the namespace's N entities through the ``group_id`` index, sorted, one
  page returned (a name prefix filters them, it is not an index range); without a
  namespace, the agent's entities (a label scan of one agent's graph).
* memories_mentioning: a seek per entity, its degree read from the node, at most a limit of
  its mentions.
* entities_mentioned: a seek per memory (the ``Episodic`` uuid index), at most a limit of
  its mentions, each entity's degree read from the node.

The queries of the memories (memory_service/backends/graph.py) do not change: they read the
``Episodic`` label only. Deleting a memory's node deletes its ``MENTIONS`` edges with it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from memory_service.access.cursors import plain_text
from memory_service.backends.base import MemoryBackend, Page
from memory_service.domain.errors import Conflict, InvalidInput, NotFound, preview
from memory_service.domain.graph import (
    Closing,
    Entity,
    EntityDetail,
    EntityMentions,
    EntitySplit,
    EntityType,
    Fact,
    MentionedEntity,
    normalise_name,
)
from memory_service.domain.graph import entity_id as _entity_id
from memory_service.domain.graph import fact_id as _fact_id
from memory_service.domain.models import utcnow
from memory_service.domain.namespaces import Namespace, NamespaceKind

Row = dict[str, Any]

ENTITY = "Entity"
TYPE_LABELS = {
    EntityType.PERSON: "Person",
    EntityType.PLACE: "Place",
    EntityType.ORGANISATION: "Organisation",
    EntityType.OBJECT: "Object",
    EntityType.EVENT: "Event",
    EntityType.TOPIC: "Topic",
}
# The edge indexes hold ``uuid`` only: an index on the edges' group_id would tempt the
# planner to scan a namespace's edges where following an entity's few is cheaper.
ENTITY_INDEXES = (
    f"CREATE INDEX FOR (n:{ENTITY}) ON (n.uuid, n.group_id, n.name_keys)",
    "CREATE INDEX FOR ()-[e:RELATES_TO]-() ON (e.uuid)",
    "CREATE INDEX FOR ()-[e:MENTIONS]-() ON (e.uuid)",
)
MAX_LIST_LIMIT = 500
MAX_FACT_PAGE = 200  # facts one read of an entity answers at most (so at most as many neighbours)
_PREDICATE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

_ENTITY_FIELDS = ("n.uuid AS uuid, n.name AS name, n.type AS type, n.group_id AS group_id, n.aliases AS aliases, "
                  "n.summary AS summary, n.created_at AS created_at")
_FACT_FIELDS = ("e.uuid AS uuid, e.group_id AS group_id, startNode(e).uuid AS s, endNode(e).uuid AS o, "
                "e.name AS name, e.fact AS fact, e.valid_at AS valid_at, e.invalid_at AS invalid_at, "
                "e.created_at AS created_at, e.expired_at AS expired_at, e.superseded_by AS superseded_by, "
                "e.episodes AS episodes, e.message_ids AS message_ids, e.created_ts AS created_ts, "
                "e.subject_via AS subject_via, e.object_via AS object_via, e.corrected_by AS corrected_by, "
                "e.expires_ts AS expires_ts")
# Not closed in the store (invalidated, superseded, corrected, closed by the purge).
_CURRENT = "e.invalid_ts IS NULL AND e.expired_ts IS NULL"
# What a read shows as current: not closed, and its source memories not all expired
# (``expires_ts``, their latest end; docs/expiry.md), by FalkorDB's clock, as memories are.
_SHOWN_CURRENT = f"{_CURRENT} AND (e.expires_ts IS NULL OR e.expires_ts * 1000 > timestamp())"
_HELD_AT = ("(e.valid_ts IS NULL OR e.valid_ts <= $as_of) AND (e.invalid_ts IS NULL OR $as_of < e.invalid_ts) "
            "AND (e.expires_ts IS NULL OR $as_of < e.expires_ts)")


def name_key(group_id: str, name: str) -> str:
    return f"{group_id}|{normalise_name(name)}"


class EntityGraph(MemoryBackend):
    """The graph API of MemoryBackend on FalkorDB. GraphBackend supplies the two hooks: its
    read-only query (a missing graph reads as empty) and the agent's graph, made ready for
    entity writes (created with every index when new)."""

    async def _read(self, agent_id: str, cypher: str, **params: Any) -> list[Row]:
        raise NotImplementedError

    async def _entity_graph(self, agent_id: str) -> Any:
        raise NotImplementedError

    # Writes ----------------------------------------------------------------------------

    async def upsert_entities(self, agent_id: str, entities: Sequence[Entity]) -> int:
        by_id: dict[str, Entity] = {}
        for entity in entities:
            _group(agent_id, entity.namespace)
            if not normalise_name(entity.name):
                raise InvalidInput(f"entity {entity.id!r} has no name: {preview(entity.name)} has no letter or digit")
            if not entity.id:
                raise InvalidInput("an entity needs an id (memory_service.domain.graph.entity_id)")
            first = by_id.setdefault(entity.id, entity)
            if first.type is not entity.type or first.namespace != entity.namespace:
                raise InvalidInput(f"entity {entity.id!r} is given twice with different types or namespaces")
            if first is not entity:
                by_id[entity.id] = first.model_copy(update={
                    "aliases": _union(first.aliases, entity.aliases), "summary": entity.summary or first.summary,
                    "name_embedding": entity.name_embedding or first.name_embedding})
        if not by_id:
            return 0
        stored = await self._read(agent_id, f"UNWIND $ids AS id MATCH (n:{ENTITY} {{uuid: id}}) "
                                            "RETURN n.uuid AS uuid, n.type AS type, n.group_id AS group_id",
                                  ids=list(by_id))
        for row in stored:
            entity = by_id[row["uuid"]]
            if row["type"] != entity.type.value or row["group_id"] != _group(agent_id, entity.namespace):
                raise InvalidInput(f"entity {entity.id!r} is stored as a {row['type']} of another namespace or type; "
                                   "an id names one entity")
        graph = await self._entity_graph(agent_id)
        created = 0
        for type_, label in TYPE_LABELS.items():
            rows = [_entity_row(agent_id, e) for e in by_id.values() if e.type is type_]
            if not rows:
                continue
            result = await graph.query(
                f"UNWIND $rows AS row MERGE (n:{ENTITY} {{uuid: row.uuid}}) "
                "ON CREATE SET n += row.props "
                "ON MATCH SET n.aliases = n.aliases + [a IN row.props.aliases WHERE NOT a IN n.aliases], "
                "n.name_keys = n.name_keys + [k IN row.props.name_keys WHERE NOT k IN n.name_keys], "
                "n.summary = CASE WHEN row.props.summary = '' THEN n.summary ELSE row.props.summary END "
                f"SET n:{label} "
                "WITH n, row WHERE row.embedding IS NOT NULL SET n.name_embedding = vecf32(row.embedding)",
                {"rows": rows})
            created += int(result.nodes_created)
        return created

    async def add_facts(self, agent_id: str, facts: Sequence[Fact]) -> int:
        return (await self.write_facts(agent_id, facts))[0]

    async def write_facts(self, agent_id: str, facts: Sequence[Fact],
                          closes: Sequence[Closing] = ()) -> tuple[int, list[str]]:
        by_id: dict[str, Fact] = {}
        for fact in facts:
            _group(agent_id, fact.namespace)
            if not _PREDICATE.match(fact.predicate):
                raise InvalidInput(f"fact {fact.id!r}: predicate {preview(fact.predicate)} must be lower-case "
                                   "letters, digits and '_', starting with a letter, at most 64 characters")
            if not fact.text.strip():
                raise InvalidInput(f"fact {fact.id!r} has no text")
            first = by_id.setdefault(fact.id, fact)
            if (first.subject_id, first.predicate, first.object_id) != (fact.subject_id, fact.predicate, fact.object_id):
                raise InvalidInput(f"fact {fact.id!r} is given twice with different statements")
            if first is not fact:
                by_id[fact.id] = first.model_copy(update={"memory_ids": _union(first.memory_ids, fact.memory_ids),
                                                          "message_ids": _union(first.message_ids, fact.message_ids)})
        if not by_id and not closes:
            return 0, []
        await self._require_entities(agent_id, {i for f in by_id.values() for i in (f.subject_id, f.object_id)})
        graph = await self._entity_graph(agent_id)
        now = utcnow()
        # One statement: the new facts and the closing of those they replace are seen together
        # or not at all (a statement is atomic in FalkorDB), never the new value beside the old.
        # A fact closed already (a retry, a racing window) is left as it is and not returned.
        result = await graph.query(
            f"UNWIND $rows AS row MATCH (s:{ENTITY} {{uuid: row.s}}) MATCH (o:{ENTITY} {{uuid: row.o}}) "
            "MERGE (s)-[e:RELATES_TO {uuid: row.uuid}]->(o) "
            "ON CREATE SET e += row.props "
            "ON MATCH SET e.episodes = e.episodes + [x IN row.props.episodes WHERE NOT x IN e.episodes], "
            "e.message_ids = e.message_ids + [x IN row.props.message_ids WHERE NOT x IN e.message_ids], "
            "e.subject_via = coalesce(e.subject_via, []) + [x IN row.props.subject_via WHERE NOT x IN coalesce(e.subject_via, [])], "
            "e.object_via = coalesce(e.object_via, []) + [x IN row.props.object_via WHERE NOT x IN coalesce(e.object_via, [])], "
            # Stated again by memories of another window: held until the later of the two ends
            # (none if either never ends).
            "e.expires_ts = CASE WHEN e.expires_ts IS NULL OR row.props.expires_ts IS NULL THEN NULL "
            "WHEN row.props.expires_ts > e.expires_ts THEN row.props.expires_ts ELSE e.expires_ts END "
            "WITH e, row WHERE row.embedding IS NOT NULL SET e.fact_embedding = vecf32(row.embedding) "
            "WITH count(*) AS written UNWIND $closes AS c "
            "MATCH ()-[o:RELATES_TO {uuid: c.id}]->() WHERE o.invalid_at IS NULL AND o.expired_at IS NULL "
            "SET o.invalid_at = c.invalid_at, o.invalid_ts = c.invalid_ts, o.expired_at = $now, o.expired_ts = $now_ts, "
            "o.superseded_by = c.by RETURN o.uuid",
            {"rows": [_fact_row(agent_id, f) for f in by_id.values()], "now": now.isoformat(), "now_ts": now.timestamp(),
             "closes": [{"id": c.fact_id, "invalid_at": _aware(c.invalid_at).isoformat(),
                         "invalid_ts": _aware(c.invalid_at).timestamp(), "by": c.superseded_by} for c in closes]})
        return int(result.relationships_created), [row[0] for row in result.result_set]

    async def mention(self, agent_id: str, memory_id: str, entity_ids: Sequence[str],
                      via: Mapping[str, Sequence[str]] | None = None) -> int:
        ids = list(dict.fromkeys(entity_ids))
        if not ids:
            raise InvalidInput(f"memory {memory_id!r}: a mention names at least one entity")
        memory = await self._read(agent_id, "MATCH (m:Episodic {uuid: $id}) RETURN m.group_id AS g", id=memory_id)
        if not memory:
            raise NotFound(f"agent {agent_id!r} has no memory {memory_id!r}")
        await self._require_entities(agent_id, set(ids))
        graph = await self._entity_graph(agent_id)
        result = await graph.query(
            "MATCH (m:Episodic {uuid: $mid}) UNWIND $rows AS row "
            f"MATCH (n:{ENTITY} {{uuid: row.entity}}) MERGE (m)-[r:MENTIONS {{uuid: row.uuid}}]->(n) "
            "ON CREATE SET r.group_id = m.group_id, r.created_at = $now, r.via = row.via "
            "ON MATCH SET r.via = coalesce(r.via, []) + [x IN row.via WHERE NOT x IN coalesce(r.via, [])]",
            {"mid": memory_id, "now": utcnow().isoformat(),
             "rows": [{"entity": i, "uuid": _mention_id(memory_id, i), "via": list((via or {}).get(i, ()))}
                      for i in ids]})
        return int(result.relationships_created)

    async def drop_namespace_entities(self, agent_id: str, namespace: Namespace | str) -> int:
        # Through the group_id index, in batches: one statement holds the graph's write lock.
        group = _group(agent_id, namespace)
        dropped = 0
        while rows := await self._read(agent_id, "MATCH (e:Entity {group_id: $group}) RETURN count(e) AS c", group=group):
            if not rows[0]["c"]:
                break
            graph = await self._entity_graph(agent_id)
            result = await graph.query("MATCH (e:Entity {group_id: $group}) WITH e LIMIT 500 DETACH DELETE e "
                                       "RETURN count(e)", {"group": group})
            dropped += int(result.result_set[0][0]) if result.result_set else 0
        return dropped

    async def drop_facts(self, agent_id: str, fact_ids: Sequence[str]) -> int:
        ids = list(dict.fromkeys(fact_ids))
        if not ids:
            return 0
        graph = await self._entity_graph(agent_id)
        result = await graph.query("UNWIND $ids AS id MATCH ()-[e:RELATES_TO {uuid: id}]->() DELETE e", {"ids": ids})
        return int(result.relationships_deleted)

    async def drop_orphan_entities(self, agent_id: str, entity_ids: Sequence[str]) -> int:
        ids = list(dict.fromkeys(entity_ids))
        if not ids:
            return 0
        graph = await self._entity_graph(agent_id)
        result = await graph.query(f"UNWIND $ids AS id MATCH (n:{ENTITY} {{uuid: id}}) WHERE NOT (n)--() DELETE n",
                                   {"ids": ids})
        return int(result.nodes_deleted)

    async def invalidate_fact(self, agent_id: str, fact_id: str, invalid_at: datetime,
                              superseded_by: str | None = None, corrected_by: str | None = None) -> Fact:
        fact = await self._fact(agent_id, fact_id)
        if fact.invalid_at is not None or fact.expired_at is not None:
            raise Conflict(f"fact {fact_id!r} is already closed (superseded by {fact.superseded_by!r}); restore it first")
        if superseded_by is not None:
            if superseded_by == fact_id:
                raise InvalidInput(f"fact {fact_id!r} cannot supersede itself")
            await self._fact(agent_id, superseded_by, what="superseding fact")
        invalid_at, now = _aware(invalid_at), utcnow()
        graph = await self._entity_graph(agent_id)
        await graph.query(
            "MATCH ()-[e:RELATES_TO {uuid: $id}]->() SET e.invalid_at = $invalid_at, e.invalid_ts = $invalid_ts, "
            "e.expired_at = $now, e.expired_ts = $now_ts, e.superseded_by = $by, e.corrected_by = $corrected_by",
            {"id": fact_id, "invalid_at": invalid_at.isoformat(), "invalid_ts": invalid_at.timestamp(),
             "now": now.isoformat(), "now_ts": now.timestamp(), "by": superseded_by, "corrected_by": corrected_by})
        return await self._fact(agent_id, fact_id)

    async def restore_fact(self, agent_id: str, fact_id: str) -> Fact:
        await self._fact(agent_id, fact_id)
        graph = await self._entity_graph(agent_id)
        await graph.query("MATCH ()-[e:RELATES_TO {uuid: $id}]->() SET e.invalid_at = NULL, e.invalid_ts = NULL, "
                          "e.expired_at = NULL, e.expired_ts = NULL, e.superseded_by = NULL, e.corrected_by = NULL",
                          {"id": fact_id})
        return await self._fact(agent_id, fact_id)

    async def split_entity(self, agent_id: str, entity_id: str, alias: str) -> EntitySplit:
        rows = await self._read(agent_id, f"MATCH (n:{ENTITY} {{uuid: $id}}) RETURN {_ENTITY_FIELDS}", id=entity_id)
        if not rows:
            raise NotFound(f"agent {agent_id!r} has no entity {entity_id!r}")
        entity = _entity(rows[0])
        key = normalise_name(alias)
        if not key:
            raise InvalidInput(f"alias {preview(alias)} has no letter or digit")
        if key == normalise_name(entity.name):
            raise Conflict(f"{preview(alias)} is entity {entity_id!r}'s own name, not an alias merged into it; "
                           "split off one of its aliases")
        spelled = [a for a in entity.aliases if normalise_name(a) == key]
        if not spelled:
            shown = ", ".join(repr(a) for a in entity.aliases[:20]) or "none"
            raise InvalidInput(f"entity {entity_id!r} has no alias {preview(alias)} (its aliases: {shown}); nothing changed")
        group = _group(agent_id, entity.namespace)
        split_off = Entity(id=_entity_id(entity.namespace, spelled[0], entity.type), name=spelled[0],
                           type=entity.type, namespace=entity.namespace)
        # In this order, each step idempotent: a split that dies half-way leaves the alias on
        # the entity, so the same call finds it and completes the split.
        await self.upsert_entities(agent_id, [split_off])
        graph = await self._entity_graph(agent_id)
        moving = await self._read(
            agent_id,
            f"MATCH (n:{ENTITY} {{uuid: $id}})-[e:RELATES_TO]-(:{ENTITY}) WITH DISTINCT n, e "
            "WITH e, startNode(e) = n AS out WHERE "
            "(out AND size(coalesce(e.subject_via, [])) > 0 AND all(v IN e.subject_via WHERE v = $key)) OR "
            "(NOT out AND size(coalesce(e.object_via, [])) > 0 AND all(v IN e.object_via WHERE v = $key)) "
            "RETURN e.uuid AS uuid, e.group_id AS g, e.name AS p, startNode(e).uuid AS s, endNode(e).uuid AS o, out",
            id=entity_id, key=key)
        moved: dict[str, str] = {}
        rows_out = []
        for row in moving:
            s, o = (split_off.id, row["o"]) if row["out"] else (row["s"], split_off.id)
            new_id = _fact_id(str(Namespace.from_group_id(row["g"])), s, row["p"], o)
            moved[row["uuid"]] = new_id
            rows_out.append({"old": row["uuid"], "new": new_id, "s": s, "o": o})
        if rows_out:
            await graph.query(
                "UNWIND $rows AS row MATCH ()-[e:RELATES_TO {uuid: row.old}]->() "
                f"MATCH (s:{ENTITY} {{uuid: row.s}}) MATCH (o:{ENTITY} {{uuid: row.o}}) "
                "CREATE (s)-[c:RELATES_TO]->(o) SET c = properties(e) SET c.uuid = row.new DELETE e",
                {"rows": rows_out})
            # The facts these ones closed, or that closed them, name them by id.
            await graph.query(
                f"UNWIND $rows AS row MATCH (n:{ENTITY})-[x:RELATES_TO]-() WHERE n.uuid IN $ids "
                "AND x.superseded_by = row.old SET x.superseded_by = row.new",
                {"rows": rows_out, "ids": [entity_id, split_off.id]})
        # A memory that named the entity by this name alone mentions the new one instead; one
        # that named it by another name too mentions both.
        named = await self._read(agent_id, f"MATCH (m:Episodic)-[r:MENTIONS]->(:{ENTITY} {{uuid: $id}}) "
                                           "WHERE $key IN coalesce(r.via, []) RETURN m.uuid AS m", id=entity_id, key=key)
        mentions = 0
        if named:
            result = await graph.query(
                f"MATCH (x:{ENTITY} {{uuid: $new}}) UNWIND $rows AS row "
                f"MATCH (m:Episodic {{uuid: row.m}})-[r:MENTIONS]->(:{ENTITY} {{uuid: $id}}) "
                "MERGE (m)-[c:MENTIONS {uuid: row.uuid}]->(x) "
                "ON CREATE SET c.group_id = r.group_id, c.created_at = r.created_at, c.via = [$key] "
                "SET r.via = [v IN r.via WHERE v <> $key] WITH r WHERE size(r.via) = 0 DELETE r",
                {"id": entity_id, "new": split_off.id, "key": key,
                 "rows": [{"m": r["m"], "uuid": _mention_id(r["m"], split_off.id)} for r in named]})
            mentions = int(result.relationships_created)
        await graph.query(f"MATCH (n:{ENTITY} {{uuid: $id}}) SET n.aliases = [a IN n.aliases WHERE NOT a IN $spelled], "
                          "n.name_keys = [k IN n.name_keys WHERE k <> $key]",
                          {"id": entity_id, "spelled": spelled, "key": f"{group}|{key}"})
        after = await self.entities_by_id(agent_id, [entity_id, split_off.id])
        by_id = {e.id: e for e in after}
        return EntitySplit(entity=by_id[entity_id], split_off=by_id[split_off.id], facts=moved, mentions=mentions)

    # Reads -----------------------------------------------------------------------------

    async def entity_candidates(self, agent_id: str, namespace: Namespace | str, entity_type: EntityType,
                                limit: int) -> list[Entity]:
        # Through the group_id index; the embeddings stay in the store (a namespace's many).
        rows = await self._read(agent_id, f"MATCH (n:{ENTITY}) WHERE n.group_id = $g AND n.type = $type "
                                          f"WITH n LIMIT $limit RETURN {_ENTITY_FIELDS}",
                                g=_group(agent_id, namespace), type=EntityType(entity_type).value, limit=max(0, limit))
        return [_entity(r) for r in rows]

    async def entities_by_id(self, agent_id: str, entity_ids: Sequence[str]) -> list[Entity]:
        ids = list(dict.fromkeys(entity_ids))
        if not ids:
            return []
        rows = await self._read(agent_id, f"UNWIND $ids AS id MATCH (n:{ENTITY} {{uuid: id}}) "
                                          f"RETURN {_ENTITY_FIELDS}, n.name_embedding AS name_embedding", ids=ids)
        return [_entity(r) for r in rows]


    async def find_entities(self, agent_id: str, namespace: Namespace | str, names: Sequence[str]) -> list[Entity]:
        group = _group(agent_id, namespace)
        keys = list(dict.fromkeys(name_key(group, n) for n in names if normalise_name(n)))
        if not keys:
            return []
        rows = await self._read(
            agent_id,
            f"UNWIND $keys AS k MATCH (n:{ENTITY}) WHERE k IN n.name_keys AND n.group_id = $g "
            f"WITH DISTINCT n RETURN {_ENTITY_FIELDS}, n.name_embedding AS name_embedding ORDER BY n.norm_name, n.uuid",
            keys=keys, g=group)
        return [_entity(r) for r in rows]

    async def current_facts(self, agent_id: str, namespace: Namespace | str, entity_ids: Sequence[str],
                            predicate: str | None = None, as_of: datetime | None = None,
                            include_superseded: bool = False, per_entity: int | None = None) -> list[Fact]:
        return await self._facts_of(agent_id, list(entity_ids), [_group(agent_id, namespace)], predicate, as_of,
                                    include_superseded, per_entity)

    async def list_entities(self, agent_id: str, namespace: Namespace | str | None = None,
                            entity_type: EntityType | None = None, name_prefix: str | None = None,
                            cursor: str | None = None, limit: int = 50,
                            within: Sequence[Namespace | str] | None = None) -> Page:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_LIST_LIMIT}, got {limit}")
        filters: list[str] = []
        params: dict[str, Any] = {"limit": limit + 1}
        if namespace is not None:
            filters.append("n.group_id = $g")
            params["g"] = _group(agent_id, namespace)
        if within is not None:
            filters.append("n.group_id IN $within")
            params["within"] = sorted({_group(agent_id, ns) for ns in within})
        if entity_type is not None:
            filters.append("n.type = $type")
            params["type"] = EntityType(entity_type).value
        if name_prefix:
            filters.append("n.norm_name STARTS WITH $prefix")
            params["prefix"] = normalise_name(name_prefix)
        if cursor is not None:
            after_name, after_id = _decode_cursor(cursor)
            filters.append("(n.norm_name > $after_name OR (n.norm_name = $after_name AND n.uuid > $after_id))")
            params.update(after_name=after_name, after_id=after_id)
        where = f"WHERE {' AND '.join(filters)} " if filters else ""
        rows = await self._read(agent_id, f"MATCH (n:{ENTITY}) {where}WITH n ORDER BY n.norm_name, n.uuid "
                                          f"LIMIT $limit RETURN {_ENTITY_FIELDS}, n.norm_name AS norm_name", **params)
        page = rows[:limit]
        next_cursor = _encode_cursor(page[-1]["norm_name"], page[-1]["uuid"]) if len(rows) > limit else None
        return [_entity(r) for r in page], next_cursor

    async def get_fact(self, agent_id: str, fact_id: str) -> Fact:
        return await self._fact(agent_id, fact_id)

    async def get_entity(self, agent_id: str, entity_id: str, as_of: datetime | None = None,
                         include_superseded: bool = False, *, within: Sequence[Namespace | str] | None = None,
                         after: tuple[int, str] | None = None, limit: int = MAX_FACT_PAGE) -> EntityDetail:
        if not 1 <= limit <= MAX_FACT_PAGE:
            raise InvalidInput(f"limit must be between 1 and {MAX_FACT_PAGE}, got {limit}")
        rows = await self._read(agent_id, f"MATCH (n:{ENTITY} {{uuid: $id}}) RETURN {_ENTITY_FIELDS}", id=entity_id)
        groups = None if within is None else sorted({_group(agent_id, ns) for ns in within})
        if not rows or (groups is not None and rows[0]["group_id"] not in groups):
            raise NotFound(f"agent {agent_id!r} has no entity {entity_id!r}")
        filters, params = _fact_filters(groups, None, as_of, include_superseded)
        where = " AND ".join(filters) or "true"
        seen = "o.uuid <> $id" + (" AND o.group_id IN $groups" if groups is not None else "")
        # Both queries walk the entity's edges once and return a bounded answer: two counts,
        # then one page sorted in the store (ORDER BY ... LIMIT keeps only limit + 1 rows).
        counted = await self._read(
            agent_id, f"MATCH (s:{ENTITY} {{uuid: $id}})-[e:RELATES_TO]-(o:{ENTITY}) WHERE {where} "
                      f"RETURN count(DISTINCT e) AS facts, count(DISTINCT CASE WHEN {seen} THEN o.uuid END) AS neighbours",
            id=entity_id, **params)
        # The sort key is whole microseconds, computed in the store: a float read back from it
        # comes rounded, and a cursor made of one would repeat or skip facts.
        position = ""
        if after is not None:
            position = "WHERE ts > $after_ts OR (ts = $after_ts AND e.uuid > $after_id) "
            params.update(after_ts=int(after[0]), after_id=after[1])
        page = await self._read(
            agent_id, f"MATCH (s:{ENTITY} {{uuid: $id}})-[e:RELATES_TO]-(:{ENTITY}) WHERE {where} "
                      f"WITH DISTINCT e WITH e, toInteger(coalesce(e.created_ts, 0.0) * 1000000) AS ts {position}"
                      f"WITH e, ts ORDER BY ts, e.uuid LIMIT $limit RETURN {_FACT_FIELDS}, ts",
            id=entity_id, limit=limit + 1, **params)
        more = len(page) > limit
        page = page[:limit]
        facts = [_fact(r) for r in page]
        others = list(dict.fromkeys(i for f in facts for i in (f.subject_id, f.object_id) if i != entity_id))
        visible = "WHERE n.group_id IN $groups " if groups is not None else ""
        neighbours = await self._read(agent_id, f"UNWIND $ids AS id MATCH (n:{ENTITY} {{uuid: id}}) {visible}"
                                                f"RETURN {_ENTITY_FIELDS} ORDER BY n.norm_name, n.uuid",
                                      ids=others, groups=groups)
        total = counted[0] if counted else {"facts": 0, "neighbours": 0}
        return EntityDetail(entity=_entity(rows[0]), facts=facts, neighbours=[_entity(r) for r in neighbours],
                            facts_total=int(total["facts"]), neighbours_total=int(total["neighbours"]),
                            after=(int(page[-1]["ts"]), str(page[-1]["uuid"])) if more else None)

    async def lookup_entities(self, agent_id: str, namespaces: Sequence[Namespace] | None,
                              names: Sequence[str]) -> list[Entity]:
        norms = list(dict.fromkeys(k for k in map(normalise_name, names) if k))
        if not norms:
            return []
        if namespaces is not None:
            # Sessions hold no entities: their keys would seek for nothing.
            groups = list(dict.fromkeys(_group(agent_id, ns) for ns in namespaces if ns.kind is not NamespaceKind.SESSION))
            keys = [f"{g}|{n}" for g in groups for n in norms]
            if not keys:
                return []
            cypher = f"UNWIND $keys AS k MATCH (n:{ENTITY}) WHERE k IN n.name_keys WITH DISTINCT n "
            params: dict[str, Any] = {"keys": keys}
        else:  # every namespace of the agent: its entities (a label scan of its own graph)
            cypher = (f"MATCH (n:{ENTITY}) WHERE any(k IN n.name_keys WHERE substring(k, size(n.group_id) + 1) IN $names) "
                      "WITH n ")
            params = {"names": norms}
        rows = await self._read(agent_id, cypher + f"RETURN {_ENTITY_FIELDS} ORDER BY n.norm_name, n.uuid", **params)
        return [_entity(r) for r in rows]

    async def memories_mentioning(self, agent_id: str, entity_ids: Sequence[str],
                                  namespaces: Sequence[Namespace] | None, limit: int) -> list[EntityMentions]:
        ids = list(dict.fromkeys(entity_ids))
        if not ids or limit < 1:
            return []
        where, params = "", {"ids": ids, "limit": limit}
        if namespaces is not None:
            where = "WHERE m.group_id IN $groups "
            params["groups"] = list(dict.fromkeys(ns.group_id for ns in namespaces))
        # indegree/outdegree are read from the node (no edge is walked); the subquery stops at
        # ``limit`` mentions, so a hub costs no more than any other entity.
        rows = await self._read(
            agent_id,
            f"UNWIND $ids AS id MATCH (n:{ENTITY} {{uuid: id}}) "
            "CALL { WITH n OPTIONAL MATCH (m:Episodic)-[:MENTIONS]->(n) " + where +
            "WITH m LIMIT $limit RETURN collect(m.uuid) AS memories } "
            "RETURN id, n.name AS name, indegree(n) + outdegree(n) AS degree, memories", **params)
        return [EntityMentions(r["id"], r["name"], int(r["degree"]), tuple(r["memories"] or ())) for r in rows]

    async def entities_mentioned(self, agent_id: str, memory_ids: Sequence[str],
                                 limit: int) -> dict[str, list[MentionedEntity]]:
        ids = list(dict.fromkeys(memory_ids))
        if not ids or limit < 1:
            return {}
        # A seek per memory in the Episodic uuid index, then at most ``limit`` of its mentions.
        rows = await self._read(
            agent_id,
            "UNWIND $ids AS id MATCH (m:Episodic {uuid: id}) "
            f"CALL {{ WITH m MATCH (m)-[:MENTIONS]->(n:{ENTITY}) WITH n LIMIT $limit "
            "RETURN collect([n.uuid, n.name, indegree(n) + outdegree(n)]) AS entities } "
            "RETURN id, entities", ids=ids, limit=limit)
        return {r["id"]: [MentionedEntity(e[0], e[1], int(e[2])) for e in r["entities"]]
                for r in rows if r["entities"]}

    # Helpers ---------------------------------------------------------------------------

    async def _facts_of(self, agent_id: str, entity_ids: list[str], groups: list[str] | None, predicate: str | None,
                        as_of: datetime | None, include_superseded: bool, per_entity: int | None = None) -> list[Fact]:
        if not entity_ids:
            return []
        filters, params = _fact_filters(groups, predicate, as_of, include_superseded)
        params["ids"] = list(dict.fromkeys(entity_ids))
        match = f"MATCH (s:{ENTITY})-[e:RELATES_TO]-(:{ENTITY}) WHERE {' AND '.join(['s.uuid IN $ids', *filters])} "
        if per_entity is not None:
            # The newest ``per_entity`` of each entity, chosen in the store: a hub's d edges are
            # walked there, and only what is kept is sent and parsed.
            match += ("WITH s, e ORDER BY e.created_ts DESC, e.uuid DESC WITH s, collect(e)[0..$per_entity] AS kept "
                      "UNWIND kept AS e ")
            params["per_entity"] = per_entity
        rows = await self._read(agent_id, f"{match}WITH DISTINCT e RETURN {_FACT_FIELDS} ORDER BY e.created_ts, e.uuid",
                                **params)
        return [_fact(r) for r in rows]

    async def facts_citing(self, agent_id: str, memory_ids: Sequence[str]) -> list[Fact]:
        # No index on a list property: one pass over the agent's facts (the daily purge's, per
        # agent with expired memories).
        if not memory_ids:
            return []
        rows = await self._read(agent_id, f"MATCH ()-[e:RELATES_TO]->() WHERE {_CURRENT} AND "
                                          f"any(x IN e.episodes WHERE x IN $ids) RETURN {_FACT_FIELDS}",
                                ids=list(memory_ids))
        return [_fact(row) for row in rows]

    async def set_fact_ends(self, agent_id: str, ends: Mapping[str, datetime | None]) -> int:
        if not ends:
            return 0
        graph = await self._entity_graph(agent_id)
        result = await graph.query("UNWIND $rows AS row MATCH ()-[e:RELATES_TO {uuid: row.id}]->() "
                                   "SET e.expires_ts = row.ts RETURN count(e)",
                                   {"rows": [{"id": i, "ts": _ts(end)} for i, end in ends.items()]})
        return int(result.result_set[0][0]) if result.result_set else 0

    async def facts_corrected_by(self, agent_id: str, memory_id: str) -> list[Fact]:
        # As facts_citing: one pass over the agent's facts, once per undone correction.
        rows = await self._read(agent_id, f"MATCH ()-[e:RELATES_TO]->() WHERE e.corrected_by = $id "
                                          f"RETURN {_FACT_FIELDS}", id=memory_id)
        return [_fact(row) for row in rows]

    async def _fact(self, agent_id: str, fact_id: str, what: str = "fact") -> Fact:
        rows = await self._read(agent_id, f"MATCH ()-[e:RELATES_TO {{uuid: $id}}]->() RETURN {_FACT_FIELDS}", id=fact_id)
        if not rows:
            raise NotFound(f"agent {agent_id!r} has no {what} {fact_id!r}")
        return _fact(rows[0])

    async def _require_entities(self, agent_id: str, ids: set[str]) -> None:
        rows = await self._read(agent_id, f"UNWIND $ids AS id MATCH (n:{ENTITY} {{uuid: id}}) RETURN n.uuid AS uuid",
                                ids=sorted(ids))
        if missing := ids - {r["uuid"] for r in rows}:
            shown = ", ".join(repr(i) for i in sorted(missing)[:10])
            raise InvalidInput(f"agent {agent_id!r} has no entity {shown}{' ...' if len(missing) > 10 else ''}; "
                               "nothing was written")


def _fact_filters(groups: list[str] | None, predicate: str | None, as_of: datetime | None,
                  include_superseded: bool) -> tuple[list[str], dict[str, Any]]:
    """The WHERE terms (on the edge ``e``) choosing facts: of ``groups``, of a predicate, and
    current, held at ``as_of``, or all of them."""
    filters: list[str] = []
    params: dict[str, Any] = {}
    if groups is not None:
        filters.append("e.group_id IN $groups")
        params["groups"] = groups
    if predicate is not None:
        filters.append("e.name = $predicate")
        params["predicate"] = predicate
    if not include_superseded:
        if as_of is None:
            filters.append(_SHOWN_CURRENT)
        else:
            filters.append(_HELD_AT)
            params["as_of"] = _aware(as_of).timestamp()
    return filters, params


def _group(agent_id: str, namespace: Namespace | str) -> str:
    """The namespace's group_id, refused if it belongs to another agent: an entity is never
    written or looked up across agents."""
    ns = namespace if isinstance(namespace, Namespace) else Namespace.parse(namespace)
    if ns.kind is not NamespaceKind.SESSION and ns.fields[0] != agent_id:
        raise InvalidInput(f"namespace {str(ns)!r} belongs to another agent than {agent_id!r}")
    return ns.group_id


def _union(first: Sequence[str], second: Sequence[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _iso(when: datetime | None) -> str | None:
    return _aware(when).isoformat() if when else None


def _ts(when: datetime | None) -> float | None:
    return _aware(when).timestamp() if when else None


def _mention_id(memory_id: str, entity_id: str) -> str:
    return "mention_" + hashlib.sha256(f"{memory_id}\x1f{entity_id}".encode()).hexdigest()[:24]


def _entity_row(agent_id: str, entity: Entity) -> dict[str, Any]:
    group = _group(agent_id, entity.namespace)
    names = [entity.name, *entity.aliases]
    props = {
        "uuid": entity.id, "name": entity.name, "group_id": group, "summary": entity.summary,
        "created_at": _iso(entity.created_at), "type": entity.type.value, "aliases": list(entity.aliases),
        "norm_name": normalise_name(entity.name),
        "name_keys": list(dict.fromkeys(name_key(group, n) for n in names if normalise_name(n))),
    }
    return {"uuid": entity.id, "props": props, "embedding": entity.name_embedding}


def _fact_row(agent_id: str, fact: Fact) -> dict[str, Any]:
    props = {
        "uuid": fact.id, "group_id": _group(agent_id, fact.namespace), "name": fact.predicate, "fact": fact.text,
        "episodes": list(fact.memory_ids), "message_ids": list(fact.message_ids),
        "created_at": _iso(fact.created_at), "created_ts": _ts(fact.created_at),
        "valid_at": _iso(fact.valid_at), "valid_ts": _ts(fact.valid_at),
        "invalid_at": _iso(fact.invalid_at), "invalid_ts": _ts(fact.invalid_at),
        "expired_at": _iso(fact.expired_at), "expired_ts": _ts(fact.expired_at),
        "superseded_by": fact.superseded_by, "subject_via": list(fact.subject_via), "object_via": list(fact.object_via),
        "expires_ts": _ts(fact.expires_at),
    }
    return {"s": fact.subject_id, "o": fact.object_id, "uuid": fact.id, "props": props,
            "embedding": fact.fact_embedding}


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _entity(row: Row) -> Entity:
    return Entity(id=row["uuid"], name=row["name"], type=EntityType(row["type"]),
                  namespace=str(Namespace.from_group_id(row["group_id"])), aliases=list(row["aliases"] or []),
                  summary=row["summary"] or "", created_at=_time(row["created_at"]) or utcnow(),
                  name_embedding=list(row["name_embedding"]) if row.get("name_embedding") else None)


def _fact(row: Row) -> Fact:
    return Fact(id=row["uuid"], namespace=str(Namespace.from_group_id(row["group_id"])), subject_id=row["s"],
                object_id=row["o"], predicate=row["name"], text=row["fact"], valid_at=_time(row["valid_at"]),
                invalid_at=_time(row["invalid_at"]), created_at=_time(row["created_at"]) or utcnow(),
                expired_at=_time(row["expired_at"]), superseded_by=row["superseded_by"],
                memory_ids=list(row["episodes"] or []), message_ids=list(row["message_ids"] or []),
                subject_via=list(row.get("subject_via") or []), object_via=list(row.get("object_via") or []),
                corrected_by=row.get("corrected_by"),
                expires_at=datetime.fromtimestamp(float(row["expires_ts"]), UTC) if row.get("expires_ts") else None)


def _encode_cursor(norm_name: str, uuid: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([norm_name, uuid]).encode()).decode()


def _decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        name, uuid = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if plain_text(name) and plain_text(uuid):
            return name, uuid
    except (ValueError, TypeError):
        pass
    raise InvalidInput(f"cursor {preview(cursor)} is not one a listing returned")
