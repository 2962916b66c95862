"""The knowledge graph in the store (issue 16, memory_service/backends/graph_entities.py):
entities, facts and mentions in the agent's FalkorDB graph, against the real embedded store,
and graphiti-core's own readers reading what it writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memory_service.backends.graph import GraphBackend, graph_name
from memory_service.domain.errors import Conflict, InvalidInput, NotFound, NotSupported
from memory_service.domain.graph import Entity, EntityType, Fact, entity_id, fact_id
from memory_service.domain.models import Memory, MemoryKind, Provenance
from memory_service.domain.namespaces import Namespace

A = "a1"
ALICE = Namespace.user(A, "alice")
BOB = Namespace.user(A, "bob")
TRAVEL = Namespace.shard(A, "travel")
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
DIMENSION = 4


@pytest.fixture
async def store(settings):
    backend = GraphBackend(settings.falkordb_url, settings, embedding_dimension=DIMENSION)
    await backend.start()
    yield backend
    await backend.close()


def entity(ns: Namespace, name: str, type_: EntityType = EntityType.PERSON, **extra) -> Entity:
    return Entity(id=entity_id(str(ns), name, type_), name=name, type=type_, namespace=str(ns), **extra)


def fact(ns: Namespace, subject: Entity, predicate: str, obj: Entity, text: str, valid_at: datetime | None = None,
         **extra) -> Fact:
    return Fact(id=fact_id(str(ns), subject.id, predicate, obj.id), namespace=str(ns), subject_id=subject.id,
                object_id=obj.id, predicate=predicate, text=text, valid_at=valid_at, **extra)


def memory(mid: str, ns: Namespace, content: str) -> Memory:
    return Memory(id=mid, kind=MemoryKind.MESSAGE, namespace=str(ns), content=content, valid_at=T0,
                  metadata=Provenance(agent_id=A, user_id="alice", session_id="s1"))


async def counts(store: GraphBackend, agent: str = A) -> tuple[int, int]:
    """(nodes, edges) of the agent's graph: what a refused call must leave as it was."""
    nodes = await store._read(agent, "MATCH (n) RETURN count(n) AS c")
    edges = await store._read(agent, "MATCH ()-[e]->() RETURN count(e) AS c")
    return (nodes[0]["c"] if nodes else 0), (edges[0]["c"] if edges else 0)


async def test_upsert_is_idempotent_and_merges_aliases(store):
    bob = entity(ALICE, "Bob", aliases=["Robert"], summary="Alice's brother", name_embedding=[1.0, 0, 0, 0])
    assert await store.upsert_entities(A, [bob]) == 1
    again = bob.model_copy(update={"aliases": ["my brother"], "summary": ""})
    assert await store.upsert_entities(A, [again, again]) == 0
    assert await counts(store) == (1, 0)
    [found] = await store.find_entities(A, ALICE, ["ROBERT"])
    assert found.id == bob.id and found.aliases == ["Robert", "my brother"] and found.summary == "Alice's brother"
    assert found.name_embedding == [1.0, 0.0, 0.0, 0.0]
    assert [e.id for e in await store.find_entities(A, ALICE, ["my  Brother!"])] == [bob.id]
    labels = await store._read(A, "MATCH (n:Entity) RETURN labels(n) AS l")
    assert sorted(labels[0]["l"]) == ["Entity", "Person"]


async def test_two_namespaces_hold_two_entities_of_one_name_and_lookups_never_cross(store):
    alices_bob, bobs_bob = entity(ALICE, "Bob"), entity(BOB, "Bob")
    assert alices_bob.id != bobs_bob.id
    assert await store.upsert_entities(A, [alices_bob, bobs_bob]) == 2
    assert [e.id for e in await store.find_entities(A, ALICE, ["bob"])] == [alices_bob.id]
    assert [e.id for e in await store.find_entities(A, str(BOB), ["Bob"])] == [bobs_bob.id]
    assert await store.find_entities(A, TRAVEL, ["Bob"]) == []
    # Another agent's namespace is refused, not read: an entity never crosses agents.
    with pytest.raises(InvalidInput, match="another agent"):
        await store.find_entities(A, Namespace.user("a2", "alice"), ["Bob"])
    assert await store.find_entities("a2", Namespace.user("a2", "alice"), ["Bob"]) == []


async def test_facts_current_as_of_and_history_with_invalidate_and_undo(store):
    alice, paris, lyon, acme = (entity(ALICE, "Alice"), entity(ALICE, "Paris", EntityType.PLACE),
                                entity(ALICE, "Lyon", EntityType.PLACE), entity(ALICE, "Acme", EntityType.ORGANISATION))
    await store.upsert_entities(A, [alice, paris, lyon, acme])
    march, june = T0, T0 + timedelta(days=92)
    in_paris = fact(ALICE, alice, "lives_in", paris, "Alice lives in Paris", march, memory_ids=["m1"],
                    created_at=march)
    at_acme = fact(ALICE, alice, "works_at", acme, "Alice works at Acme", march, created_at=march + timedelta(seconds=1))
    assert await store.add_facts(A, [in_paris, at_acme]) == 2
    # The same statement again: no second edge, its provenance grows.
    again = in_paris.model_copy(update={"memory_ids": ["m2"], "message_ids": ["msg-7"]})
    assert await store.add_facts(A, [again]) == 0
    [stored] = await store.current_facts(A, ALICE, [alice.id], predicate="lives_in")
    assert stored.memory_ids == ["m1", "m2"] and stored.message_ids == ["msg-7"] and stored.valid_at == march

    in_lyon = fact(ALICE, alice, "lives_in", lyon, "Alice moved to Lyon", june, created_at=june)
    await store.add_facts(A, [in_lyon])
    closed = await store.invalidate_fact(A, in_paris.id, june, superseded_by=in_lyon.id)
    assert closed.invalid_at == june and closed.superseded_by == in_lyon.id and closed.expired_at is not None

    current = await store.current_facts(A, ALICE, [alice.id])
    assert [f.id for f in current] == [at_acme.id, in_lyon.id]
    assert [f.object_id for f in await store.current_facts(A, ALICE, [lyon.id])] == [lyon.id]  # either end
    in_april = await store.current_facts(A, ALICE, [alice.id], predicate="lives_in", as_of=march + timedelta(days=30))
    assert [f.id for f in in_april] == [in_paris.id]
    assert [f.id for f in await store.current_facts(A, ALICE, [alice.id], predicate="lives_in", as_of=june)] == [in_lyon.id]
    history = await store.current_facts(A, ALICE, [alice.id], include_superseded=True)
    assert [f.id for f in history] == [in_paris.id, at_acme.id, in_lyon.id]
    # Another namespace sees none of them.
    assert await store.current_facts(A, BOB, [alice.id], include_superseded=True) == []

    with pytest.raises(Conflict):
        await store.invalidate_fact(A, in_paris.id, june)
    restored = await store.restore_fact(A, in_paris.id)
    assert restored.invalid_at is None and restored.expired_at is None and restored.superseded_by is None
    assert {f.id for f in await store.current_facts(A, ALICE, [alice.id], predicate="lives_in")} == {in_paris.id, in_lyon.id}
    assert await counts(store) == (4, 3)


async def test_mentions_link_memories_to_entities_once(store):
    bob, lyon = entity(ALICE, "Bob"), entity(ALICE, "Lyon", EntityType.PLACE)
    await store.write([memory("m1", ALICE, "Bob moved to Lyon")])
    await store.upsert_entities(A, [bob, lyon])
    assert await store.mention(A, "m1", [bob.id, lyon.id, bob.id]) == 2
    assert await store.mention(A, "m1", [bob.id]) == 0
    rows = await store._read(A, "MATCH (m:Episodic)-[r:MENTIONS]->(n:Entity) "
                                "RETURN m.uuid AS memory, n.uuid AS entity, r.group_id AS g ORDER BY n.name")
    assert [(r["memory"], r["entity"], r["g"]) for r in rows] == [("m1", bob.id, ALICE.group_id), ("m1", lyon.id, ALICE.group_id)]
    # Read back from the memory's end (search's structural re-rank): its entities with their
    # degrees (here one mention each), at most the limit; unknown memories left out.
    both = await store.entities_mentioned(A, ["m1", "nope"], 5)
    assert set(both) == {"m1"} and {(e.name, e.degree) for e in both["m1"]} == {("Bob", 1), ("Lyon", 1)}
    assert len((await store.entities_mentioned(A, ["m1"], 1))["m1"]) == 1
    assert await store.entities_mentioned(A, [], 5) == {} and await store.entities_mentioned(A, ["m1"], 0) == {}
    # The memory's erasure takes its mentions with it; the entities stay.
    assert await store.delete(A, ["m1"]) == 1
    assert await counts(store) == (2, 0)


async def test_list_pages_with_a_cursor_and_filters(store):
    names = [f"Person {i:02d}" for i in range(7)]
    await store.upsert_entities(A, [entity(ALICE, n) for n in names] + [entity(ALICE, "Paris", EntityType.PLACE),
                                                                        entity(BOB, "Person 99")])
    seen, cursor = [], None
    while True:
        page, cursor = await store.list_entities(A, ALICE, EntityType.PERSON, cursor=cursor, limit=3)
        seen.append([e.name for e in page])
        if cursor is None:
            break
    assert seen == [names[:3], names[3:6], names[6:]]
    page, cursor = await store.list_entities(A, ALICE, name_prefix="paR")
    assert [e.name for e in page] == ["Paris"] and cursor is None
    everyone, _ = await store.list_entities(A, limit=100)
    assert len(everyone) == 9 and {e.namespace for e in everyone} == {str(ALICE), str(BOB)}
    assert await store.list_entities("nobody") == ([], None)  # an unknown agent reads as empty
    assert not await store.client.connection.exists(graph_name("nobody"))  # and nothing was created
    with pytest.raises(InvalidInput, match="cursor"):
        await store.list_entities(A, ALICE, cursor="not-a-cursor")
    with pytest.raises(InvalidInput, match="limit"):
        await store.list_entities(A, ALICE, limit=0)


async def test_get_entity_shows_facts_and_neighbours(store):
    alice, bob, paris = entity(ALICE, "Alice"), entity(ALICE, "Bob"), entity(ALICE, "Paris", EntityType.PLACE)
    await store.upsert_entities(A, [alice, bob, paris])
    sibling = fact(ALICE, alice, "sibling_of", bob, "Alice is Bob's sister")
    home = fact(ALICE, alice, "lives_in", paris, "Alice lives in Paris", T0)
    await store.add_facts(A, [sibling, home])
    await store.invalidate_fact(A, home.id, T0 + timedelta(days=1))
    detail = await store.get_entity(A, alice.id)
    assert detail.entity.name == "Alice"
    assert [f.id for f in detail.facts] == [sibling.id] and [n.id for n in detail.neighbours] == [bob.id]
    history = await store.get_entity(A, alice.id, include_superseded=True)
    assert {f.id for f in history.facts} == {sibling.id, home.id} and {n.id for n in history.neighbours} == {bob.id, paris.id}
    with pytest.raises(NotFound):
        await store.get_entity(A, "ent_missing")


async def test_bad_input_is_refused_and_changes_nothing(store):
    alice, paris = entity(ALICE, "Alice"), entity(ALICE, "Paris", EntityType.PLACE)
    await store.upsert_entities(A, [alice])
    await store.write([memory("m1", ALICE, "hello")])
    before = await counts(store)
    ghost = entity(ALICE, "Ghost")
    with pytest.raises(InvalidInput, match="no entity"):  # one endpoint unknown: no fact at all
        await store.add_facts(A, [fact(ALICE, alice, "knows", ghost, "Alice knows a ghost")])
    with pytest.raises(InvalidInput, match="predicate"):
        await store.add_facts(A, [fact(ALICE, alice, "Lives In", alice, "x")])
    with pytest.raises(InvalidInput, match="another agent"):
        await store.upsert_entities(A, [entity(Namespace.user("a2", "x"), "Eve")])
    with pytest.raises(InvalidInput, match="no name"):
        await store.upsert_entities(A, [paris, entity(ALICE, "?!").model_copy(update={"name": "?!"})])
    with pytest.raises(InvalidInput, match="stored as"):  # one id, another type
        await store.upsert_entities(A, [alice.model_copy(update={"type": EntityType.PLACE})])
    with pytest.raises(InvalidInput, match="at least one"):
        await store.mention(A, "m1", [])
    with pytest.raises(InvalidInput, match="no entity"):
        await store.mention(A, "m1", [alice.id, ghost.id])
    with pytest.raises(NotFound):
        await store.mention(A, "m-missing", [alice.id])
    with pytest.raises(NotFound):
        await store.invalidate_fact(A, "fact_missing", T0)
    with pytest.raises(NotFound):
        await store.restore_fact(A, "fact_missing")
    assert await counts(store) == before
    # Empty batches and lookups are no-ops, not errors.
    assert await store.upsert_entities(A, []) == 0 and await store.add_facts(A, []) == 0
    assert await store.find_entities(A, ALICE, []) == [] and await store.current_facts(A, ALICE, []) == []
    assert await counts(store) == before


async def test_entity_writes_on_a_new_graph_leave_the_memories_indexed(store):
    """An entity written first creates the agent's graph: the memories' indexes must be made
    with it (a memory write makes them only for a graph with no index at all)."""
    await store.upsert_entities(A, [entity(ALICE, "Alice")])
    await store.write([memory("m1", ALICE, "the lighthouse keeper")])
    from memory_service.domain.models import StoreQuery

    hits = await store.search(A, StoreQuery(terms=["lighthouse"], namespaces=[ALICE]))
    assert [m.id for m, _ in hits["fulltext"]] == ["m1"]


async def test_the_mongo_backend_says_it_has_no_graph(mongo_uri, mongo_database):
    from memory_service.backends.mongo import MongoBackend

    backend = MongoBackend(mongo_uri, mongo_database, server_selection_timeout_ms=2000)
    await backend.start()
    try:
        with pytest.raises(NotSupported, match="no knowledge graph") as raised:
            await backend.list_entities(A)
        assert 400 <= raised.value.status_code < 500
        with pytest.raises(NotSupported):
            await backend.upsert_entities(A, [entity(ALICE, "Alice")])
    finally:
        await backend.close()


async def test_graphiti_core_reads_the_graph_we_write(store):
    """graphiti-core's own read code (its FalkorDB driver, node and edge classes and search
    utilities) over the agent's graph: the entities, facts and mentions come back whole."""
    from graphiti_core.driver.falkordb_driver import FalkorDriver
    from graphiti_core.edges import EntityEdge, EpisodicEdge
    from graphiti_core.nodes import EntityNode, EpisodicNode
    from graphiti_core.search.search_filters import SearchFilters
    from graphiti_core.search.search_utils import edge_similarity_search, get_mentioned_nodes

    alice, lyon = entity(ALICE, "Alice", summary="a user"), entity(ALICE, "Lyon", EntityType.PLACE)
    await store.upsert_entities(A, [alice, lyon])
    moved = fact(ALICE, alice, "lives_in", lyon, "Alice lives in Lyon", T0, memory_ids=["m1"],
                 fact_embedding=[1.0, 0.0, 0.0, 0.0])
    await store.add_facts(A, [moved])
    await store.write([memory("m1", ALICE, "I moved to Lyon")])
    await store.mention(A, "m1", [alice.id, lyon.id])

    driver = FalkorDriver(falkor_db=store.client, database=graph_name(A))
    if driver._init_task is not None:  # it would build Graphiti's own indexes: we read, as they are
        driver._init_task.cancel()
    node = await EntityNode.get_by_uuid(driver, alice.id)
    assert (node.name, node.group_id, node.summary) == ("Alice", ALICE.group_id, "a user")
    assert set(node.labels) == {"Entity", "Person"} and node.attributes["type"] == "person"
    by_group = await EntityNode.get_by_group_ids(driver, [ALICE.group_id])
    assert {n.uuid for n in by_group} == {alice.id, lyon.id}

    edge = await EntityEdge.get_by_uuid(driver, moved.id)
    assert (edge.source_node_uuid, edge.target_node_uuid, edge.name, edge.fact) == (alice.id, lyon.id, "lives_in",
                                                                                   "Alice lives in Lyon")
    assert edge.valid_at == T0 and edge.invalid_at is None and edge.episodes == ["m1"]
    assert [e.uuid for e in await EntityEdge.get_by_group_ids(driver, [ALICE.group_id])] == [moved.id]
    assert [e.uuid for e in await EntityEdge.get_by_node_uuid(driver, lyon.id)] == [moved.id]

    [episode] = await EpisodicNode.get_by_uuids(driver, ["m1"])
    mentioned = await get_mentioned_nodes(driver, [episode])
    assert {n.uuid for n in mentioned} == {alice.id, lyon.id}
    mentions = await EpisodicEdge.get_by_group_ids(driver, [ALICE.group_id])
    assert {(m.source_node_uuid, m.target_node_uuid) for m in mentions} == {("m1", alice.id), ("m1", lyon.id)}

    similar = await edge_similarity_search(driver, [1.0, 0.0, 0.0, 0.0], None, None, SearchFilters(),
                                           group_ids=[ALICE.group_id])
    assert [e.uuid for e in similar] == [moved.id]
    # An invalidation is what Graphiti reads as one: invalid_at and expired_at set.
    await store.invalidate_fact(A, moved.id, T0 + timedelta(days=1))
    closed = await EntityEdge.get_by_uuid(driver, moved.id)
    assert closed.invalid_at == T0 + timedelta(days=1) and closed.expired_at is not None


async def test_the_mirror_sends_graph_calls_to_the_graph_alone(store, mongo_uri, mongo_database):
    from redis.asyncio import Redis

    from memory_service.backends.mirror import MirroredBackend
    from memory_service.backends.mongo import MongoBackend
    from memory_service.backends.outbox import TARGETS, Outbox

    redis = Redis.from_url(store.url)
    mongo = MongoBackend(mongo_uri, mongo_database, server_selection_timeout_ms=2000)
    mirrored = MirroredBackend(store, mongo, Outbox(redis, TARGETS))
    try:
        alice = entity(ALICE, "Alice")
        assert await mirrored.upsert_entities(A, [alice]) == 1
        assert [e.id for e in await mirrored.find_entities(A, ALICE, ["alice"])] == [alice.id]
        assert (await mirrored.get_entity(A, alice.id)).entity.name == "Alice"
        assert await mirrored.entities_mentioned(A, ["m-unknown"], 5) == {}
        assert await mirrored.outbox.depth() == {t: 0 for t in TARGETS}  # nothing queued for MongoDB
    finally:
        await redis.aclose()


async def test_the_mirror_reads_the_blocks_recent_reads_in_one_graph_call_and_its_briefs_and_admitted_light(
        store, mongo_uri, mongo_database):
    """The block's reads keep the graph's fast paths behind the mirror: the recent reads in one
    call (one round trip), briefs and the graph signal's candidates as the graph answers them
    (not whole memories). A read the graph answers empty falls back to MongoDB only for an
    agent whose memories may live there only, as ``recent`` does."""
    from redis.asyncio import Redis

    from memory_service.backends.base import Found, RecentRead
    from memory_service.backends.mirror import MirroredBackend
    from memory_service.backends.mongo import MongoBackend
    from memory_service.backends.outbox import TARGETS, Outbox
    from memory_service.domain.models import StoreQuery

    redis = Redis.from_url(store.url)
    mongo = MongoBackend(mongo_uri, mongo_database, server_selection_timeout_ms=2000)
    await mongo.start()
    only_mongo = {"yes": False}

    async def mongo_only(agent_id: str) -> bool:
        return only_mongo["yes"]

    mirrored = MirroredBackend(store, mongo, Outbox(redis, TARGETS), mongo_only=mongo_only)
    in_graph = memory("g1", ALICE, "kept in the graph")
    in_mongo = memory("m1", BOB, "kept in mongo only")
    await store.write([in_graph])
    await mongo.write([in_mongo])
    calls: list[str] = []
    graph_recent_many, graph_recent = store.recent_many, store.recent

    async def counting_many(agent_id, reads):
        calls.append("recent_many")
        return await graph_recent_many(agent_id, reads)

    async def counting_one(agent_id, namespace, kinds, limit):
        calls.append("recent")
        return await graph_recent(agent_id, namespace, kinds, limit)

    store.recent_many, store.recent = counting_many, counting_one
    reads = [RecentRead(ALICE, [MemoryKind.MESSAGE], 5), RecentRead(BOB, [MemoryKind.MESSAGE], 5),
             RecentRead(TRAVEL, [MemoryKind.MESSAGE], 0)]
    try:
        found = await mirrored.recent_many(A, reads)
        assert [[m.id for m in got] for got in found] == [["g1"], [], []] and calls == ["recent_many"]
        assert found[0][0].served_by == "graph"
        only_mongo["yes"] = True  # e.g. an agent that opted in to the graph without a migration
        found = await mirrored.recent_many(A, reads)
        assert [[(m.id, m.served_by) for m in got] for got in found] == [[("g1", "graph")], [("m1", "mongo")], []]
        assert calls == ["recent_many", "recent_many"]
        # A memory deleted in the graph while MongoDB's copy waits in the outbox is not shown.
        gone = memory("d1", ALICE, "deleted in the graph")
        await store.write([gone])
        await mongo.write([gone])
        await store.replace(A, [gone.model_copy(update={"deleted_at": T0})])
        briefs = await mirrored.briefs(A, ["g1", "d1", "unknown"])
        assert [(b.id, b.served_by) for b in briefs] == [("g1", "graph")]
        admitted = await mirrored.admitted(A, ["g1", "m1"], StoreQuery([]))
        assert admitted == [Found("g1", T0)]  # the graph's answer: ids and times
    finally:
        await mongo.close()
        await redis.aclose()
