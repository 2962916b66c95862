"""A window's entities and facts into the graph (memory_service/formation/graph_update.py),
against the real embedded FalkorDB: resolution inside one namespace, idempotent writes,
mentions, and single-valued facts that replace each other."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from memory_service.backends.graph import GraphBackend
from memory_service.domain.graph import EntityType, ExtractedEntity, ExtractedFact
from memory_service.domain.models import Memory, MemoryKind, MessageIn, Provenance
from memory_service.domain.namespaces import Namespace
from memory_service.formation.graph_update import apply, mentions

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
async def store(settings):
    backend = GraphBackend(settings.falkordb_url, settings, embedding_dimension=4)
    await backend.start()
    yield backend
    await backend.close()


@pytest.fixture
def agent() -> str:
    return f"gu-{uuid.uuid4().hex[:8]}"


def person(ns: Namespace, name: str, *aliases: str) -> ExtractedEntity:
    return ExtractedEntity(name=name, type=EntityType.PERSON, aliases=list(aliases), namespace=str(ns))


def place(ns: Namespace, name: str) -> ExtractedEntity:
    return ExtractedEntity(name=name, type=EntityType.PLACE, namespace=str(ns))


def lives_in(ns: Namespace, who: str, where: str, when: datetime | None = None) -> ExtractedFact:
    return ExtractedFact(subject=who, predicate="lives_in", object=where, text=f"{who} lives in {where}",
                         valid_at=when, namespace=str(ns), message_ids=["m1"])


async def edges(store: GraphBackend, agent: str) -> int:
    rows = await store._read(agent, "MATCH ()-[e]->() RETURN count(e) AS c")
    return rows[0]["c"] if rows else 0


async def test_the_same_window_twice_changes_nothing_the_second_time(store, agent):
    alice = Namespace.user(agent, "alice")
    window = ([person(alice, "alice"), place(alice, "Lyon")], [lives_in(alice, "alice", "Lyon", T0)])
    first = await apply(store, agent, *window, [])
    assert (first.entities, first.facts) == (2, 1)
    before = await edges(store, agent)
    await apply(store, agent, *window, [])
    assert await edges(store, agent) == before
    listed, _ = await store.list_entities(agent, alice)
    assert sorted(e.name for e in listed) == ["Lyon", "alice"]


async def test_a_name_resolves_only_inside_its_namespace(store, agent):
    alice, bob = Namespace.user(agent, "alice"), Namespace.user(agent, "bob")
    await apply(store, agent, [person(alice, "Tom", "my brother")], [], [])
    await apply(store, agent, [person(bob, "Tom")], [], [])
    in_alice = await store.find_entities(agent, alice, ["tom"])
    in_bob = await store.find_entities(agent, bob, ["tom"])
    assert len(in_alice) == len(in_bob) == 1 and in_alice[0].id != in_bob[0].id
    # An alias seen before resolves to the same entity in its namespace, and only there.
    await apply(store, agent, [person(alice, "my brother")], [], [])
    assert [e.id for e in await store.find_entities(agent, alice, ["my brother"])] == [in_alice[0].id]
    assert await store.find_entities(agent, bob, ["my brother"]) == []


async def test_a_move_closes_the_old_home(store, agent):
    alice = Namespace.user(agent, "alice")
    await apply(store, agent, [person(alice, "alice"), place(alice, "Paris")], [lives_in(alice, "alice", "Paris", T0)], [])
    moved = T0 + timedelta(days=90)
    changes = await apply(store, agent, [person(alice, "alice"), place(alice, "Lyon")],
                          [lives_in(alice, "alice", "Lyon", moved)], [])
    assert len(changes.superseded) == 1
    [me] = await store.find_entities(agent, alice, ["alice"])
    current = await store.current_facts(agent, alice, [me.id], predicate="lives_in")
    assert [f.text for f in current] == ["alice lives in Lyon"]
    history = await store.current_facts(agent, alice, [me.id], predicate="lives_in", include_superseded=True)
    old = next(f for f in history if f.text == "alice lives in Paris")
    assert old.invalid_at == moved and old.superseded_by == current[0].id
    then = await store.current_facts(agent, alice, [me.id], predicate="lives_in", as_of=T0 + timedelta(days=1))
    assert [f.text for f in then] == ["alice lives in Paris"]


async def test_a_statement_about_the_past_does_not_close_the_present(store, agent):
    alice = Namespace.user(agent, "alice")
    await apply(store, agent, [person(alice, "alice"), place(alice, "Lyon")], [lives_in(alice, "alice", "Lyon", T0)], [])
    window = ([person(alice, "alice"), place(alice, "Paris")], [lives_in(alice, "alice", "Paris", T0 - timedelta(days=400))])
    past = await apply(store, agent, *window, [])
    again = await apply(store, agent, *window, [])  # a retried window: the past fact is closed already
    assert again.superseded == []
    [me] = await store.find_entities(agent, alice, ["alice"])
    assert [f.text for f in await store.current_facts(agent, alice, [me.id], predicate="lives_in")] == ["alice lives in Lyon"]
    assert len(past.superseded) == 1


async def test_the_last_statement_of_a_window_wins(store, agent):
    alice = Namespace.user(agent, "alice")
    await apply(store, agent, [person(alice, "alice"), place(alice, "Paris"), place(alice, "Lyon")],
                [lives_in(alice, "alice", "Paris"), lives_in(alice, "alice", "Lyon")], [], observed_at=T0)
    [me] = await store.find_entities(agent, alice, ["alice"])
    assert [f.text for f in await store.current_facts(agent, alice, [me.id], predicate="lives_in")] == ["alice lives in Lyon"]


async def test_accumulating_predicates_close_nothing(store, agent):
    alice = Namespace.user(agent, "alice")
    likes = [ExtractedFact(subject="alice", predicate="visited", object=city, text=f"alice visited {city}",
                           namespace=str(alice)) for city in ("Paris", "Lyon")]
    changes = await apply(store, agent, [person(alice, "alice"), place(alice, "Paris"), place(alice, "Lyon")], likes, [])
    assert changes.superseded == [] and changes.facts == 2


async def test_memories_mention_the_entities_they_name(store, agent):
    alice = Namespace.user(agent, "alice")
    session = Namespace.session("s-gu")
    memory = Memory(id="mem-1", kind=MemoryKind.MESSAGE, namespace=str(session), content="I moved to Lyon with Tom",
                    metadata=Provenance(agent_id=agent, user_id="alice", session_id="s-gu"), valid_at=T0)
    await store.write([memory])
    entities = [person(alice, "Tom"), place(alice, "Lyon"), place(alice, "Paris")]
    changes = await apply(store, agent, entities, [], mentions({"mem-1": memory.content, "mem-2": "nothing here"}, entities))
    assert changes.mentions == 2
    rows = await store._read(agent, "MATCH (:Episodic {uuid: 'mem-1'})-[:MENTIONS]->(e:Entity) RETURN e.name AS n ORDER BY n")
    assert [r["n"] for r in rows] == ["Lyon", "Tom"]


async def test_a_fact_whose_end_is_unknown_is_left_out(store, agent):
    alice = Namespace.user(agent, "alice")
    changes = await apply(store, agent, [person(alice, "alice")], [lives_in(alice, "alice", "Atlantis")], [])
    assert changes.facts == 0 and await edges(store, agent) == 0


async def test_formation_builds_the_graph_and_a_later_move_supersedes_the_old_home(service):
    """Through the facade, as the worker forms windows: a conversation leaves entities,
    fact edges and mentions in the agent's graph, and a later window that moves the user
    closes the old fact."""
    def said(mid: str, text: str) -> MessageIn:
        return MessageIn(agent_id="ga", user_id="alice", role="user", content=text, message_id=mid)

    await service.record_message("gs1", said("m1", "I live in Paris with my dog Rex."))
    await service.record_message("gs1", said("m2", "My brother Tom works at Deloitte."))
    await service.form_memories("gs1")
    backend = (await service.agents.backend_for("ga"))[1]
    relationships = await backend._read("ga", "MATCH ()-[e:RELATES_TO]->() RETURN count(e) AS c")
    mentioned = await backend._read("ga", "MATCH (:Episodic)-[m:MENTIONS]->(:Entity) RETURN count(m) AS c")
    assert relationships[0]["c"] >= 2 and mentioned[0]["c"] >= 2
    alice = Namespace.user("ga", "alice")
    [me] = await backend.find_entities("ga", alice, ["alice"])
    assert [f.text for f in await backend.current_facts("ga", alice, [me.id], predicate="lives_in")] != []

    await service.record_message("gs2", said("m3", "I moved to Lyon last month."))
    await service.record_message("gs2", said("m4", "I live in Lyon now."))
    await service.form_memories("gs2")
    current = await backend.current_facts("ga", alice, [me.id], predicate="lives_in")
    history = await backend.current_facts("ga", alice, [me.id], predicate="lives_in", include_superseded=True)
    assert ["Lyon" in f.text for f in current] == [True]
    assert any("Paris" in f.text and f.invalid_at is not None for f in history)


async def test_leaving_closes_what_it_ends_and_nothing_else(store, agent):
    alice = Namespace.user(agent, "alice")
    globex = ExtractedEntity(name="Globex", type=EntityType.ORGANISATION, namespace=str(alice))
    works = ExtractedFact(subject="alice", predicate="works_at", object="Globex", text="alice works at Globex",
                          valid_at=T0 - timedelta(days=300), namespace=str(alice))
    await apply(store, agent, [person(alice, "alice"), place(alice, "Lyon"), globex],
                [works, lives_in(alice, "alice", "Lyon", T0 - timedelta(days=300))], [])
    left = ExtractedFact(subject="alice", predicate="left", object="Globex", text="alice left Globex", valid_at=T0,
                         namespace=str(alice))
    changes = await apply(store, agent, [person(alice, "alice"), globex], [left], [])
    [me] = await store.find_entities(agent, alice, ["alice"])
    current = {f.text for f in await store.current_facts(agent, alice, [me.id])}
    assert current == {"alice lives in Lyon"}  # the ending is no fact of its own: the closed one records it
    [closed] = changes.superseded
    old = await store.get_fact(agent, closed)
    assert old.text == "alice works at Globex" and old.invalid_at == T0 and old.superseded_by is None
    assert (await apply(store, agent, [person(alice, "alice"), globex], [left], [])).superseded == []  # a retry
    # Leaving before the stint began ("I left Globex in 2019", said after rejoining) closes nothing.
    bob = Namespace.user(agent, "bob")
    bob_globex = globex.model_copy(update={"namespace": str(bob)})
    await apply(store, agent, [person(bob, "bob"), bob_globex],
                [works.model_copy(update={"subject": "bob", "namespace": str(bob), "valid_at": T0})], [])
    early = left.model_copy(update={"subject": "bob", "namespace": str(bob), "valid_at": T0 - timedelta(days=900)})
    assert (await apply(store, agent, [person(bob, "bob"), bob_globex], [early], [])).superseded == []


async def test_moving_back_is_a_new_stint_and_the_old_one_stays_history(store, agent):
    alice = Namespace.user(agent, "alice")
    world = [person(alice, "alice"), place(alice, "Paris"), place(alice, "Lyon")]
    for days, city, mid in ((300, "Paris", "m1"), (200, "Lyon", "m2"), (100, "Paris", "m3")):
        fact = lives_in(alice, "alice", city, T0 - timedelta(days=days)).model_copy(update={"message_ids": [mid]})
        await apply(store, agent, world, [fact], [])
        again = await apply(store, agent, world, [fact], [])  # a retried window changes nothing
        assert again.superseded == []
    [me] = await store.find_entities(agent, alice, ["alice"])
    now = await store.current_facts(agent, alice, [me.id], predicate="lives_in")
    assert [(f.text, f.valid_at) for f in now] == [("alice lives in Paris", T0 - timedelta(days=100))]
    history = await store.current_facts(agent, alice, [me.id], predicate="lives_in", include_superseded=True)
    assert sorted((f.text, f.invalid_at is None) for f in history) == [
        ("alice lives in Lyon", False), ("alice lives in Paris", False), ("alice lives in Paris", True)]
    # Restating the first stint's time ("I lived in Paris back then") is that old fact, not news.
    past = lives_in(alice, "alice", "Paris", T0 - timedelta(days=250)).model_copy(update={"message_ids": ["m4"]})
    assert (await apply(store, agent, world, [past], [])).superseded == []
    assert len(await store.current_facts(agent, alice, [me.id], predicate="lives_in", include_superseded=True)) == 3


async def test_a_store_cut_during_the_graph_write_shows_nothing_half_written(settings, agent):
    """The connection to the store is cut as the window's facts go out: the move is not half
    there (Lyon current beside Paris); the retried window completes it, logged once."""
    from urllib.parse import urlsplit

    from redis.asyncio import Redis

    from memory_service.access.audit import AuditLog

    from .tcp_proxy import ThreadedTcpProxy

    parts = urlsplit(settings.falkordb_url)
    proxy = ThreadedTcpProxy(parts.hostname, parts.port).start()
    proxy.proxy.password = parts.password
    store = GraphBackend(proxy.url, settings, embedding_dimension=4)
    await store.start()
    redis = Redis.from_url(settings.falkordb_url, decode_responses=True)
    audit = AuditLog(redis)
    try:
        alice = Namespace.user(agent, "alice")
        world = [person(alice, "alice"), place(alice, "Paris"), place(alice, "Lyon")]
        await apply(store, agent, world, [lives_in(alice, "alice", "Paris", T0 - timedelta(days=30))], [], audit=audit)
        cut = []

        def cut_the_facts(connection: int, direction: str, chunk: bytes) -> bool:
            if direction == "up" and b"UNWIND $closes" in chunk and not cut:
                cut.append(connection)
                return False
            return True

        proxy.proxy.tap = cut_the_facts
        move = ([*world], [lives_in(alice, "alice", "Lyon", T0)], [])
        with pytest.raises(Exception):
            await apply(store, agent, *move, audit=audit)
        assert cut
        [me] = await store.find_entities(agent, alice, ["alice"])
        seen = [f.text for f in await store.current_facts(agent, alice, [me.id], predicate="lives_in")]
        assert seen == ["alice lives in Paris"]  # the old value whole, not both
        changes = await apply(store, agent, *move, audit=audit)  # the retried window
        assert len(changes.superseded) == 1
        seen = [f.text for f in await store.current_facts(agent, alice, [me.id], predicate="lives_in")]
        assert seen == ["alice lives in Lyon"]
        assert (await apply(store, agent, *move, audit=audit)).superseded == []
        assert len((await audit.read(agent, action="fact.invalidate")).entries) == 1
    finally:
        await store.close()
        await redis.aclose()
        proxy.close()
