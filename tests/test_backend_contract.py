"""The contract every memory backend passes: the graph backend on FalkorDB, and the Mongo
backend on MongoDB (a real server when MONGODB_URI is set, else the in-process stand-in;
the pytest header says which)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from math import sqrt

import pytest

from memory_service.backends.base import Found, RecentRead
from memory_service.domain.models import Memory, MemoryKind, Provenance, StoreQuery
from memory_service.domain.namespaces import Namespace

T0 = datetime(2026, 5, 1, 9, 0, 0, 123456, tzinfo=UTC)
A1, A2 = "a1", "a2"
SESSION = Namespace.session("s-1")
USER = Namespace.user("a1", "alice")
SHARD = Namespace.shard("a1", "travel")
DIMENSION = 4
# Hand-made unit vectors: cosine(X, X) = 1, cosine(X, XY) = 1/sqrt(2), cosine(X, Y) = 0.
X, Y, Z = [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]
XY = [1 / sqrt(2), 1 / sqrt(2), 0.0, 0.0]


def memory(mid: str, kind: MemoryKind, ns: Namespace, content: str, minute: int, seq: int = 0, *,
           agent: str = A1, embedding: list[float] | None = None, **meta) -> Memory:
    return Memory(id=mid, kind=kind, namespace=str(ns), content=content, valid_at=T0 + timedelta(minutes=minute),
                  embedding=embedding,
                  metadata=Provenance(agent_id=agent, user_id="alice", session_id="s-1", message_ids=[f"m{seq}"],
                                      sequence=seq, **meta))


def query(terms=(), vector=None, **scope) -> StoreQuery:
    return StoreQuery(terms=list(terms), vector=vector, **scope)


def ids(hits: dict, signal: str) -> list[str]:
    return [m.id for m, _ in hits.get(signal, [])]


@pytest.fixture(params=["graph", "mongo"])
async def backend(request, settings, mongo_uri, mongo_database):
    if request.param == "graph":
        from memory_service.backends.graph import GraphBackend

        instance = GraphBackend(settings.falkordb_url, settings, embedding_dimension=DIMENSION)
    else:
        from memory_service.backends.mongo import MongoBackend

        instance = MongoBackend(mongo_uri, mongo_database, server_selection_timeout_ms=2000, embedding_dimension=DIMENSION)
    await instance.start()
    yield instance
    await instance.close()


async def test_write_is_idempotent_by_id_and_round_trips_everything(backend):
    original = memory("e1", MemoryKind.EPISODE, SESSION, "Ünïcode <b>&</b> \"quoted\" 🧳", 1, seq=7,
                      user_ids=["alice", "bob"], memory_ids=["x"])
    assert await backend.write([original]) == 1
    assert await backend.write([original.model_copy(update={"content": "changed"})]) == 0
    [stored] = await backend.get(A1, SESSION, ["e1"])
    assert stored.served_by == backend.name  # a read says which store answered it
    assert stored.model_copy(update={"served_by": None}) == original


async def test_a_batch_with_known_and_new_ids_writes_only_the_new(backend):
    first = memory("d1", MemoryKind.DIRECTIVE, USER, "short answers", 1)
    assert await backend.write([first]) == 1
    second = memory("d2", MemoryKind.DIRECTIVE, USER, "no emojis", 2)
    assert await backend.write([first, second]) == 1
    assert await backend.count(A1, USER) == 2


async def test_namespaces_are_isolated(backend):
    await backend.write([memory("f1", MemoryKind.FACT, SHARD, "Alice: flight at 9", 1)])
    other = Namespace.shard("a2", "travel")
    assert await backend.get(A1, other, ["f1"]) == []
    assert await backend.count(A1, other) == 0
    assert await backend.recent(A1, other, [MemoryKind.FACT], 10) == []
    assert await backend.get(A1, Namespace.shard("a1", "travel"), ["f1", "missing"]) != []


async def test_recent_is_chronological_oldest_first_and_filters_kinds(backend):
    # Written out of order; equal times are ordered by sequence.
    items = [
        memory("f3", MemoryKind.FACT, SHARD, "third", 5, seq=3),
        memory("f1", MemoryKind.FACT, SHARD, "first", 1, seq=1),
        memory("s1", MemoryKind.SUGGESTION, SHARD, "a suggestion", 2, seq=2),
        memory("f2", MemoryKind.FACT, SHARD, "second", 5, seq=2),
    ]
    assert await backend.write(items) == 4
    assert [m.content for m in await backend.recent(A1, SHARD, [MemoryKind.FACT], 10)] == ["first", "second", "third"]
    assert [m.content for m in await backend.recent(A1, SHARD, [MemoryKind.FACT], 2)] == ["second", "third"]
    assert [m.id for m in await backend.recent(A1, SHARD, [MemoryKind.FACT, MemoryKind.SUGGESTION], 10)] == [
        "f1", "s1", "f2", "f3"]
    assert await backend.recent(A1, SHARD, [MemoryKind.FACT], 0) == []
    assert await backend.count(A1, SHARD, [MemoryKind.FACT]) == 3 and await backend.count(A1, SHARD) == 4


async def test_recent_many_answers_each_read_as_recent_does_in_order(backend):
    await backend.write([
        memory("f1", MemoryKind.FACT, SHARD, "first", 1, seq=1),
        memory("f2", MemoryKind.FACT, SHARD, "second", 2, seq=2),
        memory("s1", MemoryKind.SUGGESTION, SHARD, "a suggestion", 3, seq=3),
        memory("e1", MemoryKind.EPISODE, SESSION, "an episode", 4, seq=4),
        memory("d1", MemoryKind.DIRECTIVE, USER, "a directive", 5, seq=5),
    ])
    reads = [
        RecentRead(SHARD, [MemoryKind.FACT], 1),
        RecentRead(SESSION, [MemoryKind.EPISODE], 10),
        RecentRead(SHARD, [MemoryKind.FACT], 0),  # nothing asked: nothing read
        RecentRead(USER, [], 10),
        RecentRead(SHARD, [MemoryKind.FACT, MemoryKind.SUGGESTION], 10),
        RecentRead(USER, [MemoryKind.DIRECTIVE], 10),
        RecentRead(Namespace.shard(A1, "empty"), [MemoryKind.FACT], 10),
    ]
    many = await backend.recent_many(A1, reads)
    assert [[m.id for m in found] for found in many] == [["f2"], ["e1"], [], [], ["f1", "f2", "s1"], ["d1"], []]
    for read, found in zip(reads, many, strict=True):
        assert found == await backend.recent(A1, read.namespace, read.kinds, read.limit)
    assert await backend.recent_many(A1, []) == []
    assert await backend.recent_many("nobody", reads) == [[] for _ in reads]  # an unknown agent reads as empty
    assert await backend.agents() == [A1]  # and is not created


async def test_recent_many_by_default_fails_with_the_first_error_and_leaves_no_read_running(
        mongo_uri, mongo_database):
    """The default (the Mongo backend's: one ``recent`` per read at once): a failing read
    fails the whole with its own error, and the reads still waiting are cancelled, not left
    running against a failing store."""
    from memory_service.backends.mongo import MongoBackend

    both_waiting, waiting, cancelled = asyncio.Event(), [], []

    class OneReadFails(MongoBackend):
        async def recent(self, agent_id, namespace, kinds, limit):
            try:
                found = await super().recent(agent_id, namespace, kinds, limit)
                if namespace == SHARD:
                    await both_waiting.wait()  # the other two have read and wait
                    raise ConnectionError("the shard's read failed")
                waiting.append(namespace)
                if len(waiting) == 2:
                    both_waiting.set()
                await asyncio.Event().wait()  # still waiting when the shard's read fails
            except asyncio.CancelledError:
                cancelled.append(namespace)
                raise
            return found

    backend = OneReadFails(mongo_uri, mongo_database, server_selection_timeout_ms=2000, embedding_dimension=DIMENSION)
    await backend.start()
    try:
        reads = [RecentRead(SESSION, [MemoryKind.EPISODE], 5), RecentRead(SHARD, [MemoryKind.FACT], 5),
                 RecentRead(USER, [MemoryKind.DIRECTIVE], 5)]
        with pytest.raises(ConnectionError, match="the shard's read failed"):
            await asyncio.wait_for(backend.recent_many(A1, reads), timeout=10)
        assert sorted(map(str, cancelled)) == sorted([str(SESSION), str(USER)])
    finally:
        await backend.close()


async def test_trim_evicts_the_oldest_and_is_idempotent(backend):
    await backend.write([memory(f"f{i}", MemoryKind.FACT, SHARD, f"fact {i}", i, seq=i) for i in range(5)])
    await backend.write([memory("s1", MemoryKind.SUGGESTION, SHARD, "kept", 0)])
    assert await backend.trim(A1, SHARD, MemoryKind.FACT, 2) == 3
    assert await backend.trim(A1, SHARD, MemoryKind.FACT, 2) == 0
    assert [m.content for m in await backend.recent(A1, SHARD, [MemoryKind.FACT], 10)] == ["fact 3", "fact 4"]
    assert await backend.count(A1, SHARD, [MemoryKind.FACT]) == 2 and await backend.count(A1, SHARD) == 3
    exported = await backend.export(A1, SHARD)
    assert [(m.id, m.evicted) for m in exported if m.kind is MemoryKind.FACT] == [
        ("f0", True), ("f1", True), ("f2", True), ("f3", False), ("f4", False)]
    assert await backend.trim(A1, SHARD, MemoryKind.FACT, 5) == 0  # a larger cap brings nothing back
    assert await backend.trim(A1, SHARD, MemoryKind.FACT, 0) == 2
    assert await backend.count(A1, SHARD, [MemoryKind.FACT]) == 0 and await backend.count(A1, SHARD) == 1


async def test_export_returns_everything_and_an_evicted_memory_stays_evicted_when_copied(backend):
    items = [memory("e1", MemoryKind.EPISODE, SESSION, "what happened", 1, seq=1),
             memory("m1", MemoryKind.MESSAGE, SESSION, "hello", 0, seq=0, role="user"),
             memory("old", MemoryKind.FACT, SHARD, "evicted fact", 0).model_copy(update={"evicted": True})]
    await backend.write(items)
    assert [m.id for m in await backend.export(A1, SESSION)] == ["m1", "e1"]
    [copied] = await backend.export(A1, SHARD)
    assert copied.evicted and await backend.count(A1, SHARD) == 0


async def test_health_reports_ok(backend):
    assert (await backend.health())["ok"] is True


# Search --------------------------------------------------------------------------------


async def test_fulltext_ranks_memories_with_the_query_words_first(backend):
    await backend.write([
        # The words side by side: FalkorDB's scorer divides by the distance between matched
        # terms, so there "Hotel by the station" ranks below a memory with "hotel" alone.
        memory("both", MemoryKind.FACT, SHARD, "Hotel station shuttle", 1),
        memory("one", MemoryKind.FACT, SHARD, "The hotel breakfast starts early", 2),
        memory("none", MemoryKind.FACT, SHARD, "The flight leaves on Monday morning", 3),
    ])
    # Scores are each store's own (docs/mongo-search.md): only the order is the contract.
    hits = await backend.search(A1, query(["hotel", "station"]))
    assert ids(hits, "fulltext") == ["both", "one"]  # "none" has neither word
    scores = [score for _, score in hits["fulltext"]]
    assert scores[0] > scores[1] > 0
    assert "vector" not in hits  # no vector asked for
    assert ids(await backend.search(A1, query(["hotel"], limit=1)), "fulltext") in (["both"], ["one"])
    assert ids(await backend.search(A1, query(["submarine"])), "fulltext") == []


def directions(bare: str) -> list[Memory]:
    """Three facts of the shard with hand-made vectors (Y, X, XY), and one (``bare``) without."""
    return [memory("y", MemoryKind.FACT, SHARD, "orthogonal", 1, embedding=Y),
            memory("x", MemoryKind.FACT, SHARD, "same direction", 2, embedding=X),
            memory("xy", MemoryKind.FACT, SHARD, "half way", 3, embedding=XY),
            memory("bare", MemoryKind.FACT, SHARD, bare, 4)]


async def test_vector_search_ranks_by_cosine_similarity(backend):
    await backend.write(directions("no vector yet"))
    for scope in (None, [SHARD]):  # the agent's whole store, and a scope inside it
        hits = await backend.search(A1, query(vector=X, namespaces=scope))
        assert ids(hits, "vector") == ["x", "xy", "y"], scope
        assert [score for _, score in hits["vector"]] == pytest.approx([1.0, 1 / sqrt(2), 0.0], abs=1e-4)
        assert "fulltext" not in hits  # no terms
        assert ids(await backend.search(A1, query(vector=X, namespaces=scope, limit=2)), "vector") == ["x", "xy"]
    hits = await backend.search(A1, query(["orthogonal"], vector=Y))
    assert ids(hits, "fulltext") == ["y"] and ids(hits, "vector")[0] == "y"


async def test_a_search_like_a_stored_memory_uses_its_vector(backend):
    await backend.write(directions("half way, no vector yet"))
    # Both stores give a stored vector of the model asked (Mongo gave none, stored_embedding's
    # default, so it had no vector signal and the memory block ran the model every time).
    assert await backend.stored_embedding(A1, "xy", None) == pytest.approx(XY, abs=1e-6)
    assert await backend.stored_embedding(A1, "xy", "other") is None
    assert await backend.stored_embedding(A1, "bare", None) is None
    for scope in (None, [SHARD]):  # the indexes, and the scope's scan
        like = await backend.search(A1, StoreQuery(["half"], like="xy", namespaces=scope))
        given = await backend.search(A1, StoreQuery(["half"], vector=XY, namespaces=scope))
        assert ids(given, "vector") == ["xy", "x", "y"] and ids(like, "fulltext") == ids(given, "fulltext")
        assert ids(like, "vector") == ["xy", "x", "y"], scope
        assert [s for _, s in like["vector"]] == pytest.approx([s for _, s in given["vector"]], abs=1e-6)
        for without in ("bare", "unknown"):  # no stored vector: full text alone
            hits = await backend.search(A1, StoreQuery(["half"], like=without, namespaces=scope))
            assert "vector" not in hits and sorted(ids(hits, "fulltext")) == ["bare", "xy"], (scope, without)
        # A vector of another model is not the query's.
        assert "vector" not in await backend.search(A1, StoreQuery([], like="xy", vector_model="other",
                                                                   namespaces=scope))


async def test_search_stays_inside_its_namespaces(backend):
    other_session = Namespace.session("s-2")
    await backend.write([
        memory("in-session", MemoryKind.EPISODE, SESSION, "We booked the hotel", 1, embedding=X),
        memory("in-shard", MemoryKind.FACT, SHARD, "The hotel is near the station", 2, embedding=X),
        memory("other-session", MemoryKind.EPISODE, other_session, "Another hotel", 3, embedding=X),
    ])
    hits = await backend.search(A1, query(["hotel"], vector=X, namespaces=[SESSION]))
    assert ids(hits, "fulltext") == ["in-session"] and ids(hits, "vector") == ["in-session"]
    hits = await backend.search(A1, query(["hotel"], vector=X, namespaces=[SESSION, SHARD]))
    assert sorted(ids(hits, "fulltext")) == ["in-session", "in-shard"]
    assert sorted(ids(hits, "vector")) == ["in-session", "in-shard"]
    hits = await backend.search(A1, query(["hotel"], vector=X))  # every namespace of the agent
    assert sorted(ids(hits, "fulltext")) == sorted(ids(hits, "vector")) == ["in-session", "in-shard", "other-session"]
    hits = await backend.search(A1, query(["hotel"], vector=X, namespaces=[Namespace.shard("a1", "food")]))
    assert ids(hits, "fulltext") == ids(hits, "vector") == []


async def test_two_agents_never_see_each_others_memories(backend):
    """Same session id, same user id, same words and vectors: each agent reads its own."""
    a2_user = Namespace.user(A2, "alice")
    await backend.write([
        memory("a1-episode", MemoryKind.EPISODE, SESSION, "Alice wants a hotel", 1, embedding=X),
        memory("a1-directive", MemoryKind.DIRECTIVE, USER, "Always a hotel near the station", 2, embedding=X),
        memory("a2-episode", MemoryKind.EPISODE, SESSION, "Alice wants a hotel", 1, agent=A2, embedding=X),
        memory("a2-directive", MemoryKind.DIRECTIVE, a2_user, "Always a hotel near the station", 2, agent=A2,
               embedding=X),
    ])
    for agent, other in ((A1, A2), (A2, A1)):
        for scope in (None, [SESSION], [SESSION, Namespace.user(agent, "alice"), Namespace.user(other, "alice")]):
            hits = await backend.search(agent, query(["hotel", "alice"], vector=X, namespaces=scope))
            found = ids(hits, "fulltext") + ids(hits, "vector")
            assert found and all(i.startswith(agent) for i in found), (agent, scope, found)
        assert [m.id for m in await backend.export(agent, SESSION)] == [f"{agent}-episode"]
        assert [m.id for m in await backend.recent(agent, SESSION, [MemoryKind.EPISODE], 10)] == [f"{agent}-episode"]
        assert await backend.get(agent, SESSION, [f"{other}-episode"]) == []
        assert await backend.count(agent, SESSION) == 1
        assert await backend.count(agent, Namespace.user(other, "alice")) == 0
    assert await backend.trim(A1, SESSION, MemoryKind.EPISODE, 0) == 1
    assert await backend.count(A2, SESSION) == 1  # a2's memory of the same session is not trimmed


async def test_search_filters_kinds_and_valid_time(backend):
    await backend.write([
        memory("episode", MemoryKind.EPISODE, SESSION, "hotel booked", 1, embedding=X),
        memory("fact", MemoryKind.FACT, SHARD, "hotel near the station", 5, embedding=X),
        memory("directive", MemoryKind.DIRECTIVE, USER, "hotel rooms on a high floor", 10, embedding=X),
    ])

    async def found(**scope) -> tuple[list[str], list[str]]:
        hits = await backend.search(A1, query(["hotel"], vector=X, **scope))
        return sorted(ids(hits, "fulltext")), sorted(ids(hits, "vector"))

    assert await found(kinds=[MemoryKind.FACT]) == (["fact"], ["fact"])
    assert await found(kinds=[MemoryKind.FACT, MemoryKind.DIRECTIVE]) == (["directive", "fact"],) * 2
    assert await found(since=T0 + timedelta(minutes=3), until=T0 + timedelta(minutes=7)) == (["fact"], ["fact"])
    # Both ends are inclusive.
    assert await found(since=T0 + timedelta(minutes=5)) == (["directive", "fact"],) * 2
    assert await found(until=T0 + timedelta(minutes=5)) == (["episode", "fact"],) * 2
    assert await found(since=T0 + timedelta(minutes=11)) == ([], [])
    assert await found(kinds=[MemoryKind.SUGGESTION]) == ([], [])


async def test_evicted_memories_are_not_searched(backend):
    await backend.write([memory(f"f{i}", MemoryKind.FACT, SHARD, f"hotel fact {i}", i, seq=i, embedding=X)
                         for i in range(3)])
    await backend.write([memory("old", MemoryKind.FACT, SHARD, "hotel fact evicted before", 0, embedding=X)
                         .model_copy(update={"evicted": True})])
    assert await backend.trim(A1, SHARD, MemoryKind.FACT, 1) == 2
    hits = await backend.search(A1, query(["hotel"], vector=X))
    assert ids(hits, "fulltext") == ["f2"] and ids(hits, "vector") == ["f2"]


async def test_unembedded_and_set_embeddings_round_trip(backend):
    await backend.write([
        memory("bare", MemoryKind.FACT, SHARD, "stored while the embedder was down", 1),
        memory("bare-too", MemoryKind.EPISODE, SESSION, "also without a vector", 2),
        memory("embedded", MemoryKind.FACT, SHARD, "stored with its vector", 3, embedding=Y),
    ])
    assert sorted(m.id for m in await backend.unembedded(A1, 10)) == ["bare", "bare-too"]
    [one] = await backend.unembedded(A1, 1)
    assert one.id in ("bare", "bare-too") and one.content
    assert ids(await backend.search(A1, query(vector=X)), "vector") == ["embedded"]

    assert await backend.set_embeddings(A1, {"bare": X, "missing": X}) == 1  # unknown ids are skipped
    assert [m.id for m in await backend.unembedded(A1, 10)] == ["bare-too"]
    assert ids(await backend.search(A1, query(vector=X)), "vector") == ["bare", "embedded"]
    assert await backend.set_embeddings(A1, {"bare-too": Z}) == 1
    assert await backend.unembedded(A1, 10) == []
    assert ids(await backend.search(A1, query(vector=Z)), "vector")[0] == "bare-too"
    assert await backend.set_embeddings(A1, {}) == 0


async def test_unembedded_looks_past_the_ids_a_reader_excludes(backend):
    """A reader skips the memories another caller claimed (memory_service/embedding/once.py)
    and reads past them, instead of the same first ones again."""
    await backend.write([memory(f"bare{i}", MemoryKind.MESSAGE, SESSION, f"message {i}", i) for i in range(5)])
    first = {m.id for m in await backend.unembedded(A1, 2)}
    rest = {m.id for m in await backend.unembedded(A1, 10, first)}
    assert len(first) == 2 and rest == {f"bare{i}" for i in range(5)} - first
    assert await backend.unembedded(A1, 10, {f"bare{i}" for i in range(5)}) == []


async def test_agents_lists_the_agents_with_memories(backend):
    assert await backend.agents() == []
    await backend.write([memory("e1", MemoryKind.EPISODE, SESSION, "one", 1),
                         memory("e2", MemoryKind.EPISODE, SESSION, "two", 1, agent=A2)])
    assert await backend.agents() == [A1, A2]


async def test_reads_of_an_unknown_agent_are_empty_and_create_nothing(backend):
    await backend.write([memory("e1", MemoryKind.EPISODE, SESSION, "hotel", 1, embedding=X)])
    nobody = "nobody"
    assert await backend.get(nobody, SESSION, ["e1"]) == []
    assert await backend.recent(nobody, SESSION, [MemoryKind.EPISODE], 10) == []
    assert await backend.count(nobody, SESSION) == 0
    assert await backend.export(nobody, SESSION) == []
    assert await backend.unembedded(nobody, 10) == []
    hits = await backend.search(nobody, query(["hotel"], vector=X))
    assert ids(hits, "fulltext") == ids(hits, "vector") == []
    assert await backend.agents() == [A1]  # the reads created no storage for "nobody"


async def test_a_soft_deleted_memory_is_read_by_find_and_export_only(backend):
    live = memory("t1", MemoryKind.FACT, SHARD, "the ferry leaves at nine", 1, embedding=X).model_copy(
        update={"tags": ["ferry", "times"]})
    gone = memory("t2", MemoryKind.FACT, SHARD, "the ferry leaves at ten", 2, embedding=X).model_copy(
        update={"tags": ["ferry"]})
    await backend.write([live, gone])
    deleted_at = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    assert await backend.replace(A1, [gone.model_copy(update={"deleted_at": deleted_at, "embedding": None})]) == 1
    assert await backend.replace(A2, [gone.model_copy(update={"deleted_at": None})]) == 0  # another agent's: skipped
    [found] = await backend.find(A1, ["t2"])
    assert found.deleted_at == deleted_at and found.tags == ["ferry"]
    assert await backend.find(A2, ["t2"]) == []
    assert [m.id for m in await backend.export(A1, SHARD)] == ["t1", "t2"]
    assert [m.id for m in await backend.recent(A1, SHARD, [MemoryKind.FACT], 10)] == ["t1"]
    assert [m.id for m in await backend.get(A1, SHARD, ["t1", "t2"])] == ["t1"]
    assert await backend.count(A1, SHARD) == 1
    hits = await backend.search(A1, query(["ferry"], X, namespaces=[SHARD]))
    assert ids(hits, "fulltext") == ["t1"] and ids(hits, "vector") == ["t1"]
    hits = await backend.search(A1, query(["ferry"], X))  # agent-wide: the vector index too
    assert ids(hits, "fulltext") == ["t1"] and ids(hits, "vector") == ["t1"]
    # Undeleted with the same text and no vector given: the stored vector is kept.
    assert await backend.replace(A1, [found.model_copy(update={"deleted_at": None})]) == 1
    assert await backend.unembedded(A1, 10) == []
    hits = await backend.search(A1, query(["ferry"], X, namespaces=[SHARD]))
    assert sorted(ids(hits, "fulltext")) == ["t1", "t2"] and sorted(ids(hits, "vector")) == ["t1", "t2"]


async def test_briefs_give_what_the_block_shows_of_live_memories_only(backend):
    said = memory("b1", MemoryKind.MESSAGE, SESSION, "the ferry leaves at nine", 1, role="user")
    fact = memory("b2", MemoryKind.FACT, SHARD, "Alice takes the <ferry> & the bus", 2)
    gone = memory("b3", MemoryKind.FACT, SHARD, "the ferry leaves at ten", 3)
    evicted = memory("b4", MemoryKind.EPISODE, SESSION, "an old episode", 4).model_copy(update={"evicted": True})
    await backend.write([said, fact, gone, evicted])
    await backend.replace(A1, [gone.model_copy(update={"deleted_at": datetime(2026, 6, 1, tzinfo=UTC)})])
    briefs = {b.id: b for b in await backend.briefs(A1, ["b1", "b2", "b3", "b4", "unknown"])}
    assert sorted(briefs) == ["b1", "b2"]  # neither the soft-deleted, the evicted nor an unknown id
    for stored in (said, fact):
        b = briefs[stored.id]
        assert (b.kind, b.valid_at, b.text) == (stored.kind, stored.valid_at, stored.search_text)
    assert briefs["b1"].text == "alice: the ferry leaves at nine" and briefs["b1"].served_by in (backend.name, None)
    assert await backend.briefs(A2, ["b1"]) == [] and await backend.briefs(A1, []) == []


async def test_facets_give_speaker_role_session_and_time_of_live_memories_only(backend):
    """What question-aware ranking reads of a search's candidates (memory_service/recall/question_rank.py)."""
    said = memory("f1", MemoryKind.MESSAGE, SESSION, "the ferry leaves at nine", 1, role="user")
    answer = memory("f2", MemoryKind.MESSAGE, SESSION, "take the early one", 2, role="assistant")
    episode = memory("f3", MemoryKind.EPISODE, SESSION, "they talked ferries", 3, user_ids=["Alice", "Bob Stone"])
    gone = memory("f4", MemoryKind.MESSAGE, SESSION, "gone", 4, role="user")
    await backend.write([said, answer, episode, gone])
    await backend.replace(A1, [gone.model_copy(update={"deleted_at": datetime(2026, 6, 1, tzinfo=UTC)})])
    facets = {f.id: f for f in await backend.facets(A1, ["f1", "f2", "f3", "f4", "unknown"])}
    assert sorted(facets) == ["f1", "f2", "f3"]
    assert (facets["f1"].role, facets["f1"].speakers, facets["f1"].session_id) == ("user", ("alice",), "s-1")
    assert facets["f1"].valid_at == said.valid_at and facets["f1"].kind is MemoryKind.MESSAGE
    assert facets["f2"].role == "assistant"
    assert facets["f3"].speakers == ("alice", "bob stone") and facets["f3"].role is None
    assert await backend.facets(A2, ["f1"]) == [] and await backend.facets(A1, []) == []


async def test_admitted_is_what_a_search_admits_given_only_ids_and_times(backend):
    """The graph signal finds memories through entities: of those, ``admitted`` keeps what the
    search for its query would admit (live, namespaces, kinds, time, tags). Each comes back
    with its id and time (the graph reads no more; the search reads whole what it keeps)."""
    said = memory("a1", MemoryKind.MESSAGE, SESSION, "the ferry leaves at nine", 1, role="user")
    fact = memory("a2", MemoryKind.FACT, SHARD, "Alice takes the ferry", 2).model_copy(update={"tags": ["sea"]})
    late = memory("a3", MemoryKind.FACT, SHARD, "Alice took the bus", 60)
    gone = memory("a4", MemoryKind.FACT, SHARD, "the ferry leaves at ten", 3)
    evicted = memory("a5", MemoryKind.EPISODE, SESSION, "an old episode", 4).model_copy(update={"evicted": True})
    await backend.write([said, fact, late, gone, evicted])
    await backend.replace(A1, [gone.model_copy(update={"deleted_at": datetime(2026, 6, 1, tzinfo=UTC)})])
    asked = ["a1", "a2", "a3", "a4", "a5", "unknown"]

    async def admitted(**scope) -> dict[str, datetime]:
        return {c.id: c.valid_at for c in await backend.admitted(A1, asked, query(**scope))}

    assert await admitted() == {m.id: m.valid_at for m in (said, fact, late)}  # neither deleted, evicted nor unknown
    assert sorted(await admitted(namespaces=[SHARD])) == ["a2", "a3"]
    assert await admitted(namespaces=[]) == {}
    assert sorted(await admitted(kinds=[MemoryKind.MESSAGE, MemoryKind.EPISODE])) == ["a1"]
    assert sorted(await admitted(since=T0 + timedelta(minutes=2))) == ["a2", "a3"]
    assert sorted(await admitted(until=T0 + timedelta(minutes=2))) == ["a1", "a2"]
    assert sorted(await admitted(tags=("sea",))) == ["a2"]
    assert await backend.admitted(A2, asked, query()) == [] and await backend.admitted(A1, [], query()) == []
    if backend.name == "graph":  # ids and times only: nothing more is read
        assert all(type(c) is Found for c in await backend.admitted(A1, asked, query()))


async def test_replace_re_indexes_a_new_text_and_tags_filter_inside_the_query(backend):
    await backend.write([memory("r1", MemoryKind.OBSERVATION, SHARD, "a heron by the bridge", 1, embedding=X
                                ).model_copy(update={"tags": ["birds"]}),
                         memory("r2", MemoryKind.OBSERVATION, SHARD, "a heron in the reeds", 2, embedding=Y)])
    [stored] = await backend.find(A1, ["r1"])
    changed = stored.model_copy(update={"content": "a kingfisher by the bridge", "title": "river", "tags": ["birds", "river"],
                                        "confidence": 0.5, "updated_at": T0})
    assert await backend.replace(A1, [changed]) == 1
    [after] = await backend.find(A1, ["r1"])
    assert (after.content, after.title, after.tags, after.confidence, after.updated_at) == (
        "a kingfisher by the bridge", "river", ["birds", "river"], 0.5, T0)
    assert ids(await backend.search(A1, query(["kingfisher"])), "fulltext") == ["r1"]
    assert ids(await backend.search(A1, query(["heron"])), "fulltext") == ["r2"]
    assert [m.id for m in await backend.unembedded(A1, 10)] == ["r1"]  # a new text without a vector: backfilled
    assert ids(await backend.search(A1, query(["bridge", "heron"], tags=["river"])), "fulltext") == ["r1"]
    assert ids(await backend.search(A1, query(["bridge", "heron"], tags=["river", "lake"])), "fulltext") == []
    assert ids(await backend.search(A1, query(["heron"], Y, tags=["birds"])), "vector") == []  # r2 has no tags


async def test_written_before_pages_an_agents_memories_by_time_through_its_index(backend):
    tied = [memory(f"w{i}", MemoryKind.FACT, SHARD, f"fact {i}", 5) for i in (3, 1, 2)]  # one time: ids break the tie
    await backend.write([
        memory("w0", MemoryKind.MESSAGE, SESSION, "a message", 0),
        *tied,
        memory("w4", MemoryKind.FACT, SHARD, "evicted", 6).model_copy(update={"evicted": True}),
        memory("w5", MemoryKind.DIRECTIVE, USER, "deleted", 7).model_copy(update={"deleted_at": T0}),
        memory("w6", MemoryKind.EPISODE, SESSION, "at the cutoff", 10),
        memory("w7", MemoryKind.EPISODE, SESSION, "later", 11),
        memory("x1", MemoryKind.FACT, Namespace.shard(A2, "travel"), "another agent's", 1, agent=A2),
    ])
    cutoff = T0 + timedelta(minutes=10)
    pages, after = [], None
    while page := await backend.written_before(A1, cutoff, 2, after):
        pages.append([m.id for m in page])
        after = (page[-1].valid_at.timestamp(), page[-1].id)
    # Every namespace, evicted and soft-deleted ones too (they say so); nothing at or after the cutoff.
    assert pages == [["w0", "w1"], ["w2", "w3"], ["w4", "w5"]]
    [evicted, deleted] = await backend.written_before(A1, cutoff, 2, (tied[0].valid_at.timestamp(), "w3"))
    assert evicted.evicted and deleted.deleted_at is not None and deleted.kind is MemoryKind.DIRECTIVE
    assert [m.id for m in await backend.written_before(A2, cutoff, 10)] == ["x1"]
    assert await backend.written_before("nobody", cutoff, 10) == []  # an unknown agent reads as empty
    assert await backend.written_before(A1, T0, 10) == []  # strictly before
    assert await backend.written_before(A1, cutoff, 0) == []


async def test_a_graph_made_before_the_time_index_gets_it_when_first_paged_by_time(settings):
    from memory_service.backends.graph import GraphBackend, graph_name

    first = GraphBackend(settings.falkordb_url, settings, embedding_dimension=DIMENSION)
    await first.start()
    await first.write([memory("o1", MemoryKind.FACT, SHARD, "an old fact", 1)])
    graph = first.client.select_graph(graph_name(A1))
    await graph.query("DROP INDEX FOR (n:Episodic) ON (n.ts)")  # as the graphs of earlier releases are
    await first.close()

    async def indexed() -> list[str]:
        rows = (await graph.ro_query("CALL db.indexes() YIELD label, properties RETURN properties")).result_set
        return [p for row in rows for p in row[0]]

    later = GraphBackend(settings.falkordb_url, settings, embedding_dimension=DIMENSION)
    await later.start()
    graph = later.client.select_graph(graph_name(A1))
    try:
        assert "ts" not in await indexed()
        assert [m.id for m in await later.written_before(A1, T0 + timedelta(days=1), 10)] == ["o1"]
        assert "ts" in await indexed()
        assert await later.written_before("nobody", T0, 10) == [] and graph_name("nobody") not in await later.client.list_graphs()
    finally:
        await later.close()


async def test_the_query_log_purge_leaves_no_bytes_of_the_purged_queries_behind(settings, tmp_path):
    """FalkorDB logs each query with its parameters in ``telemetry{<graph>}``. Queries that
    run beside the purge are logged after its marker; trimming up to the marker then only
    flags the entries before it in their stream node, their bytes kept, so in a snapshot or
    a rewritten AOF. A server of its own, every entry in one node, DUMP to read the bytes."""
    from redis.asyncio import Redis

    from memory_service.backends.embedded import EmbeddedFalkorDB
    from memory_service.backends.graph import GraphBackend, graph_name

    server = EmbeddedFalkorDB(tmp_path / "own")
    url = server.start()
    raw = Redis.from_url(url)
    backend = GraphBackend(url, settings, embedding_dimension=DIMENSION)
    stream = f"telemetry{{{graph_name(A1)}}}".encode()

    async def logged_bytes() -> bytes:
        return await raw.dump(stream) or b""

    async def others_reading() -> None:
        while True:
            await backend.get(A1, SHARD, ["someone-else"])
            await asyncio.sleep(0.01)

    try:
        for name, value in (("stream-node-max-bytes", "0"), ("stream-node-max-entries", "10000"), ("rdbcompression", "no")):
            await raw.config_set(name, value)
        await backend.start()
        await backend.write([memory("n1", MemoryKind.FACT, SHARD, "a fact", 1)])
        for _ in range(3):
            assert await backend.get(A1, SHARD, ["NEEDLE4471"]) == []  # the parameter is logged
        for _ in range(100):  # FalkorDB writes the log a moment after the queries
            if b"NEEDLE4471" in await logged_bytes():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("FalkorDB never logged the queries")

        beside = asyncio.create_task(others_reading())
        try:
            removed = await backend.purge_query_log(A1)
            for _ in range(100):  # the reads beside it go on being logged
                if b"someone-else" in await logged_bytes():
                    break
                await asyncio.sleep(0.05)
            assert not beside.done()
        finally:
            beside.cancel()
        assert removed >= 4  # the write, three reads and the marker, at least
        assert b"someone-else" in await logged_bytes()
        assert b"NEEDLE4471" not in await logged_bytes()
        assert [m.id for m in await backend.get(A1, SHARD, ["n1"])] == ["n1"]  # the graph itself is untouched
    finally:
        await backend.close()
        await raw.aclose()
        server.stop()


# Changing the embedding model (docs/embeddings.md): every vector carries its model, a query
# is compared with vectors of its own model only, and a re-embed stages then promotes.


def tagged(mid: str, content: str, minute: int, vector: list[float], model: str | None) -> Memory:
    return memory(mid, MemoryKind.FACT, SHARD, content, minute, embedding=vector).model_copy(
        update={"embedding_model": model})


async def test_a_query_meets_only_vectors_of_its_own_model(backend):
    backend.untagged_model = "old"  # what runtime reads from the store's embedder record
    await backend.write([tagged("untagged", "stored before vectors carried a model", 1, X, None),
                         tagged("old", "the old model's", 2, X, "old"),
                         tagged("new", "the new model's", 3, XY, "new")])
    for scope in (None, [SHARD]):  # the agent's vector index, and a scope's exact scan
        assert sorted(ids(await backend.search(A1, query(vector=X, namespaces=scope)), "vector")) == ["new", "old",
                                                                                                      "untagged"]
        assert ids(await backend.search(A1, StoreQuery([], vector=X, vector_model="new", namespaces=scope)),
                   "vector") == ["new"]
        assert sorted(ids(await backend.search(A1, StoreQuery([], vector=X, vector_model="old", namespaces=scope)),
                          "vector")) == ["old", "untagged"]
        assert ids(await backend.search(A1, StoreQuery([], vector=X, vector_model="third", namespaces=scope)),
                   "vector") == []
    assert await backend.set_embeddings(A1, {"old": Y}, model="new") == 1  # the backfill says which model
    assert sorted(ids(await backend.search(A1, StoreQuery([], vector=X, vector_model="new")), "vector")) == ["new", "old"]


async def test_recent_reads_say_the_model_of_a_stored_vector(backend):
    """Without the vector itself: the memory block reads it to know whether a search like its
    latest message can reuse the stored vector, or must embed the text first (a store that
    did not say so made every block run the model)."""
    backend.untagged_model = "old"
    await backend.write([tagged("untagged", "stored before vectors carried a model", 1, X, None),
                         tagged("new", "the new model's", 2, XY, "new"),
                         memory("bare", MemoryKind.FACT, SHARD, "no vector yet", 3)])
    read = [*await backend.recent(A1, SHARD, [MemoryKind.FACT], 10),
            *(await backend.recent_many(A1, [RecentRead(SHARD, [MemoryKind.FACT], 10)]))[0]]
    assert [(m.id, m.embedding_model, m.embedding) for m in read] == 2 * [
        ("untagged", "old", None), ("new", "new", None), ("bare", None, None)]
    await backend.set_embeddings(A1, {"bare": X}, "new")
    assert [(m.id, m.embedding_model) for m in await backend.recent(A1, SHARD, [MemoryKind.FACT], 1)] == [("bare", "new")]


async def test_a_reembed_stages_beside_the_searched_vector_then_promotes(backend):
    backend.untagged_model = "old"
    await backend.write([tagged(f"m{i}", f"memory number {i}", i, X, None if i % 2 else "old") for i in range(5)]
                        + [tagged("done", "already of the new model", 9, Y, "new"), memory("bare", MemoryKind.FACT,
                                                                                         SHARD, "no vector", 10)])
    page, cursor = await backend.reembed_candidates(A1, "new", None, 3)
    assert len(page) == 3 and cursor is not None
    rest, end = await backend.reembed_candidates(A1, "new", cursor, 3)
    assert len(rest) == 3 and end is not None
    assert (await backend.reembed_candidates(A1, "new", end, 3)) == ([], None)
    candidates = dict(page + rest)
    assert sorted(candidates) == ["bare", "m0", "m1", "m2", "m3", "m4"]  # "done" is not one
    assert candidates["m1"] == "memory number 1"  # the text search indexes, which is embedded
    # A text that changed since it was read is not staged (it is a candidate again).
    staged = await backend.stage_embeddings(A1, "new", {i: (text, Z) for i, text in candidates.items()} |
                                            {"m4": ("an older text", Z)})
    assert staged == 5
    assert await backend.reembed_candidates(A1, "new", None, 10) == ([("m4", "memory number 4")], None)
    # Staged vectors are not searched: the old model still finds everything it did.
    assert ids(await backend.search(A1, StoreQuery([], vector=Z, vector_model="new")), "vector") == ["done"]
    assert len(ids(await backend.search(A1, StoreQuery([], vector=X, vector_model="old")), "vector")) == 5
    # A new text drops the staged vector of the old one.
    [m3] = await backend.find(A1, ["m3"])
    await backend.replace(A1, [m3.model_copy(update={"content": "memory number three"})])
    assert sorted(i for i, _ in (await backend.reembed_candidates(A1, "new", None, 10))[0]) == ["m3", "m4"]
    # Promotion: the staged vectors become the searched ones, in batches.
    assert await backend.promote_embeddings(A1, "new", 2) == 2
    assert await backend.promote_embeddings(A1, "new", 10) == 2
    assert await backend.promote_embeddings(A1, "new", 10) == 0
    hits = ids(await backend.search(A1, StoreQuery([], vector=Z, vector_model="new")), "vector")
    assert sorted(hits[:4]) == ["bare", "m0", "m1", "m2"]
    assert [m.id for m in await backend.unembedded(A1, 10)] == ["m3"]  # only the edited one waits
    assert sorted(ids(await backend.search(A1, StoreQuery([], vector=X, vector_model="old")), "vector")) == ["m4"]
    assert await backend.reembed_candidates(A2, "new", None, 10) == ([], None)  # another agent: nothing


async def walk(backend, agent: str = A1, limit: int = 3, **filters) -> list[list[str]]:
    """Every page of ``list_memories`` with these filters, by id."""
    from memory_service.backends.base import MemoryListing

    pages, after, hint = [], None, None
    for _ in range(200):
        page = await backend.list_memories(agent, MemoryListing(limit=limit, after=after, hint=hint, **filters))
        pages.append([m.id for m in page.memories])
        if page.resume is None:
            return pages
        after, hint = page.resume, page.hint
    raise AssertionError("the listing never ended")


async def test_list_memories_walks_every_memory_once_newest_first_with_ties_broken_by_id(backend):
    from memory_service.backends.base import MemoryState

    tied = [memory(f"l{i}", MemoryKind.FACT, SHARD, f"fact {i}", 5) for i in (3, 1, 2)]  # one time: ids break the tie
    years = [memory(f"y{i}", MemoryKind.EPISODE, SESSION, f"long ago {i}", -525_600 * i) for i in (1, 2, 3)]
    await backend.write([
        memory("l0", MemoryKind.MESSAGE, SESSION, "a message", 0), *tied, *years,
        memory("l4", MemoryKind.FACT, SHARD, "evicted", 6).model_copy(update={"evicted": True}),
        memory("l5", MemoryKind.DIRECTIVE, USER, "deleted", 7).model_copy(update={"deleted_at": T0}),
        memory("l6", MemoryKind.OBSERVATION, USER, "tagged", 8).model_copy(update={"tags": ["birds", "river"]}),
        memory("x1", MemoryKind.FACT, Namespace.shard(A2, "travel"), "another agent's", 1, agent=A2),
    ])
    pages = await walk(backend)
    listed = [i for page in pages for i in page]
    assert listed == ["l6", "l3", "l2", "l1", "l0", "y1", "y2", "y3"]  # live ones, newest first, each once
    assert all(len(page) <= 3 for page in pages)
    everything = [i for page in await walk(backend, state=MemoryState.ALL, limit=100) for i in page]
    assert everything == ["l6", "l5", "l4", "l3", "l2", "l1", "l0", "y1", "y2", "y3"]
    assert [i for p in await walk(backend, state=MemoryState.DELETED) for i in p] == ["l5"]
    assert [i for p in await walk(backend, state=MemoryState.EVICTED) for i in p] == ["l4"]
    assert [i for p in await walk(backend, namespaces=[SESSION]) for i in p] == ["l0", "y1", "y2", "y3"]
    assert [i for p in await walk(backend, namespaces=[SESSION, USER], kinds=[MemoryKind.MESSAGE, MemoryKind.OBSERVATION])
            for i in p] == ["l6", "l0"]
    assert [i for p in await walk(backend, kinds=[MemoryKind.FACT]) for i in p] == ["l3", "l2", "l1"]
    assert [i for p in await walk(backend, tags=["river"]) for i in p] == ["l6"]
    assert [i for p in await walk(backend, tags=["river", "lake"]) for i in p] == []
    window = {"since": T0 + timedelta(minutes=-525_600 * 2), "until": T0 + timedelta(minutes=5)}
    assert [i for p in await walk(backend, **window) for i in p] == ["l3", "l2", "l1", "l0", "y1", "y2"]
    assert [i for p in await walk(backend, agent=A2) for i in p] == ["x1"]
    assert [i for p in await walk(backend, agent="nobody") for i in p] == []  # an unknown agent reads as empty
    assert [i for p in await walk(backend, namespaces=[]) for i in p] == []
    assert await backend.agents() == [A1, A2]  # the reads created no storage


async def test_list_memories_misses_nothing_while_memories_arrive(backend):
    await backend.write([memory(f"o{i:02d}", MemoryKind.FACT, SHARD, f"old {i}", i) for i in range(20)])
    from memory_service.backends.base import MemoryListing

    seen, after, hint, added = [], None, None, 0
    while True:
        page = await backend.list_memories(A1, MemoryListing(limit=4, after=after, hint=hint))
        seen += [m.id for m in page.memories]
        # Newer ones, and older ones behind the cursor: each seen at most once, the old ones exactly once.
        await backend.write([memory(f"n{added}", MemoryKind.FACT, SHARD, "new", 100 + added),
                             memory(f"b{added}", MemoryKind.FACT, SHARD, "back-dated", -100 - added)])
        added += 1
        if page.resume is None:
            break
        after, hint = page.resume, page.hint
    assert len(seen) == len(set(seen))
    assert [i for i in seen if i.startswith("o")] == [f"o{i:02d}" for i in reversed(range(20))]
    assert not any(i.startswith("n") for i in seen)  # newer than the first page: a new walk shows them


async def test_the_graph_narrows_a_dense_window_and_reads_ties_past_its_probe(settings, monkeypatch):
    """Few rows per probe: windows holding more are narrowed, down to memories sharing one
    time, which are read together; the walk still lists every memory once, in order."""
    from memory_service.backends import graph
    from memory_service.backends.graph import GraphBackend

    monkeypatch.setattr(graph, "LIST_PROBE_ROWS", 4)
    backend = GraphBackend(settings.falkordb_url, settings, embedding_dimension=DIMENSION)
    await backend.start()
    try:
        spread = [memory(f"s{i:02d}", MemoryKind.FACT, SHARD, "spread", i * 7) for i in range(15)]
        tied = [memory(f"t{i:02d}", MemoryKind.FACT, SHARD, "tied", 50) for i in range(9)]
        await backend.write([*spread, *tied])
        listed = [i for p in await walk(backend, limit=5) for i in p]
        expected = sorted([*spread, *tied], key=lambda m: (m.valid_at, m.id), reverse=True)
        assert listed == [m.id for m in expected]
    finally:
        await backend.close()


async def test_an_expired_memory_leaves_every_read_but_by_id_and_the_purge_finds_it(backend):
    """Expiry (docs/expiry.md): a memory whose ``expires_at`` has passed is skipped as a
    soft-deleted one is (get, recent, count, search agent-wide and scoped, briefs, admitted,
    the browse list), found by id, and listed by ``expired`` for the retention job."""
    from memory_service.backends.base import MemoryListing

    now = datetime.now(UTC)
    gone = memory("x1", MemoryKind.FACT, USER, "alice owns a red kayak", 1, embedding=X)
    gone.expires_at = now - timedelta(seconds=5)
    later = memory("x2", MemoryKind.FACT, USER, "alice owns a blue kayak", 2, embedding=XY)
    later.expires_at = now + timedelta(hours=1)
    kept = memory("x3", MemoryKind.FACT, USER, "alice owns a green kayak", 3, embedding=Y)
    assert await backend.write([gone, later, kept]) == 3
    assert [m.id for m in await backend.get(A1, USER, ["x1", "x2", "x3"])] == ["x2", "x3"]
    assert [m.id for m in await backend.recent(A1, USER, [MemoryKind.FACT], 10)] == ["x2", "x3"]
    [[*many]] = await backend.recent_many(A1, [RecentRead(USER, [MemoryKind.FACT], 10)])
    assert [m.id for m in many] == ["x2", "x3"]
    assert await backend.count(A1, USER) == 2
    for scope in (None, [USER]):
        hits = await backend.search(A1, query(["kayak"], vector=X, namespaces=scope))
        assert sorted(i.id for i, _ in hits["fulltext"]) == ["x2", "x3"]
        assert "x1" not in [i.id for i, _ in hits.get("vector", [])]
    assert sorted(b.id for b in await backend.briefs(A1, ["x1", "x2", "x3"])) == ["x2", "x3"]
    assert sorted(c.id for c in await backend.admitted(A1, ["x1", "x2", "x3"], query())) == ["x2", "x3"]
    assert [m.id for m in (await backend.list_memories(A1, MemoryListing())).memories] == ["x3", "x2"]
    found = {m.id: m for m in await backend.find(A1, ["x1", "x2", "x3"])}
    assert found["x1"].expires_at == gone.expires_at and found["x1"].expired() and not found["x1"].live
    assert found["x2"].expires_at == later.expires_at and found["x2"].live and found["x3"].expires_at is None
    assert [m.id for m in await backend.expired(A1, now, 10)] == ["x1"]
    assert [m.id for m in await backend.expired(A1, now + timedelta(hours=2), 10)] == ["x1", "x2"]
    assert await backend.expired(A2, now, 10) == []
    # An update moves the expiry: the memory is back in the reads once it lies ahead again.
    await backend.replace(A1, [found["x1"].model_copy(update={"expires_at": now + timedelta(hours=1)})])
    assert await backend.count(A1, USER) == 3 and await backend.expired(A1, now, 10) == []


async def test_a_memory_expiring_in_a_moment_is_read_until_then_and_not_after(backend):
    soon = memory("s1", MemoryKind.FACT, USER, "alice is at the harbour", 1)
    soon.expires_at = datetime.now(UTC) + timedelta(seconds=1.0)
    await backend.write([soon])
    assert [m.id for m in await backend.get(A1, USER, ["s1"])] == ["s1"]
    await asyncio.sleep(1.2)
    assert await backend.get(A1, USER, ["s1"]) == [] and await backend.count(A1, USER) == 0
    assert (await backend.search(A1, query(["harbour"]))).get("fulltext", []) == []
