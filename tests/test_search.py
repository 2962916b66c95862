"""Search and the query-aware memory block, on the real service (embedded FalkorDB, the
deterministic hash embedder, a worker in-process)."""

from __future__ import annotations

from datetime import timedelta
from xml.etree import ElementTree as ET

import pytest

from memory_service.domain.errors import InvalidInput, NotFound
from memory_service.domain.models import AgentSettings, MemoryKind, ShardIn
from memory_service.domain.namespaces import Namespace

from .conftest import graph_client
from .helpers import T0, msg, record_all, wait_embedded

TRIP = [
    ("alice", "user", "We should fly to Lisbon on June 3rd, the flight leaves at 9am."),
    ("alice", "user", "I prefer window seats on every flight."),
    ("assistant", "assistant", "Noted: window seats, Lisbon, June 3rd."),
    ("alice", "user", "My sister Carla lives in Porto and keeps bees."),
]
COOKING = [
    ("bob", "user", "My sourdough starter died again, the kitchen is too cold."),
    ("bob", "user", "Next week I will bake rye bread with caraway seeds."),
]


def best(result) -> list[str]:
    return result.results[0].source_message_ids


def ids_of(result) -> list[str]:
    return [mid for h in result.results for mid in h.source_message_ids]


def sessions_of(result) -> set[str]:
    return {h.session_id for h in result.results}


async def test_every_recorded_message_is_findable_as_itself(service):
    await record_all(service, "trip", "a1", TRIP)
    await wait_embedded(service, "a1")  # full text finds a message at once, the vector index once embedded
    result = await service.search("a1", "where does Carla live with her bees?", top_k=3)
    best = result.results[0]
    assert best.kind is MemoryKind.MESSAGE and best.source_message_ids == ["trip-3"]
    assert best.content == "alice: My sister Carla lives in Porto and keeps bees."
    assert (best.session_id, best.user_id, best.role) == ("trip", "alice", "user")
    assert best.valid_at == T0 + timedelta(minutes=3)
    assert set(best.explanation.signals) == {"fulltext", "vector"}
    assert best.explanation.signals["fulltext"].rank == 1 and best.explanation.activated
    assert result.signals == ["fulltext", "vector"] and result.degraded == []


async def test_formed_memories_are_findable_and_turns_stay_findable(service):
    await record_all(service, "trip", "a1", TRIP)
    await service.form_memories("trip")
    await wait_embedded(service, "a1")  # ranks of both signals: one vector missing can reorder them
    episodes = await service.search("a1", "Lisbon flight window seats", kinds=[MemoryKind.EPISODE])
    assert [h.kind for h in episodes.results] == [MemoryKind.EPISODE]
    assert sorted(episodes.results[0].source_message_ids) == sorted(f"trip-{i}" for i in range(4))
    directive = await service.search("a1", "window seats", kinds=[MemoryKind.DIRECTIVE])
    assert directive.results and directive.results[0].namespace == "user:a1:alice"
    assert directive.results[0].source_message_ids == ["trip-1"]
    turns = await service.search("a1", "I prefer window seats", kinds=[MemoryKind.MESSAGE])
    assert turns.results[0].source_message_ids == ["trip-1"]  # forming did not hide the turn


async def test_message_ids_may_contain_colons(service):
    await service.record_message("s1", msg("a1", "alice", "The boat leaves from pier 7.", mid="D3:7"))
    result = await service.search("a1", "which pier does the boat leave from")
    assert result.results[0].source_message_ids == ["D3:7"]


async def test_scopes(service):
    await record_all(service, "trip", "a1", TRIP)
    await record_all(service, "bake", "a1", COOKING)
    await record_all(service, "trip2", "a1", [("alice", "user", "Carla sent honey from her bees.")])
    await service.put_shard("a1", "travel", ShardIn(name="travel", extraction_focus="flights"))
    await wait_embedded(service, "a1")  # the ranks below are of both signals (CI once ranked before the last vector)

    # Vector search ranks every memory in the scope, so a scope's results are all of its
    # memories, best first; nothing outside it ever comes back.
    session = await service.search("a1", "bees", scope="session", session_id="trip")
    assert best(session) == ["trip-3"] and sessions_of(session) == {"trip"} and session.namespaces == 1
    user = await service.search("a1", "honey bees", scope="user", user_id="alice")
    assert best(user) == ["trip2-0"] and sessions_of(user) == {"trip", "trip2"}  # alice's sessions, not bob's
    bob = await service.search("a1", "bees sourdough", scope="user", user_id="bob")
    assert best(bob) == ["bake-0"] and sessions_of(bob) == {"bake"}
    listed = await service.search("a1", "bees sourdough", scope="namespaces",
                                  namespaces=["session:bake", "session:trip2"])
    assert sessions_of(listed) == {"bake", "trip2"} and listed.namespaces == 2
    agent = await service.search("a1", "bees sourdough", top_k=20)
    assert sessions_of(agent) == {"trip", "trip2", "bake"}
    assert (await service.search("a1", "bees", scope="shard", shard_id="travel")).results == []


async def test_a_scope_never_reaches_another_agent(service):
    await record_all(service, "trip", "a1", TRIP)
    await service.record_message("other", msg("a2", "alice", "Carla's bees are a secret of agent two."))
    everything = await service.search("a1", "Carla bees secret agent two", top_k=50)
    assert all(h.namespace != "session:other" for h in everything.results)
    alice = await service.search("a1", "Carla bees secret", scope="user", user_id="alice", top_k=50)
    assert "other" not in {h.session_id for h in alice.results}
    for scope in ({"scope": "session", "session_id": "other"},
                  {"scope": "namespaces", "namespaces": ["session:other"]},
                  {"scope": "namespaces", "namespaces": ["user:a2:alice"]},
                  {"scope": "session", "session_id": "never-recorded"}):
        with pytest.raises(NotFound) as caught:
            await service.search("a1", "bees", **scope)
        if scope["scope"] == "session":
            assert "a2" not in str(caught.value)  # the owner of a foreign session is not named
    two = await service.search("a2", "Carla bees")
    assert sessions_of(two) == {"other"}


@pytest.mark.parametrize("bad, message", [
    ({"query": ""}, "query must not be empty"),
    ({"query": "   \n"}, "query must not be empty"),
    ({"query": "x" * 2001}, "2001 characters long; the limit is 2000"),
    ({"query": "bees", "top_k": 101}, "top_k is 101; the limit is 100"),
    ({"query": "bees", "scope": "session"}, "scope=session needs session_id"),
    ({"query": "bees", "scope": "namespaces"}, "scope=namespaces needs namespaces"),
    ({"query": "bees", "scope": "namespaces", "namespaces": ["nonsense"]}, "has no ':'"),
    ({"query": "bees", "since": T0 + timedelta(days=1), "until": T0}, "since must not be after until"),
])
async def test_bad_searches_are_refused_with_a_sentence(service, bad, message):
    await record_all(service, "trip", "a1", TRIP)
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(")):
        await service.search("a1", **bad)


async def test_threshold_kinds_and_time_range(service):
    await record_all(service, "trip", "a1", TRIP)
    result = await service.search("a1", "Carla bees Porto", min_score=0.99, top_k=3)
    assert all(h.score >= 0.99 and h.activated for h in result.results)
    assert result.candidates and all(not h.activated and h.score < 0.99 for h in result.candidates)
    early = await service.search("a1", "Lisbon window seats Carla", until=T0 + timedelta(minutes=1), top_k=10)
    assert sorted(ids_of(early)) == ["trip-0", "trip-1"]
    late = await service.search("a1", "Lisbon window seats Carla", since=T0 + timedelta(minutes=3), top_k=10)
    assert ids_of(late) == ["trip-3"]
    assistant_only = await service.search("a1", "window seats", kinds=[MemoryKind.DIRECTIVE])
    assert assistant_only.results == []  # nothing formed yet


async def test_recency_never_hides_a_clearly_better_old_match(service):
    await service.record_message("s", msg("a1", "alice", "The vintage Leica camera is in the attic box.", mid="old",
                                          minute=-400 * 24 * 60))
    await service.record_message("s", msg("a1", "alice", "I bought groceries today.", mid="new", minute=5))
    await wait_embedded(service, "a1")  # "groceries" is found by its vector only
    result = await service.search("a1", "where is the vintage Leica camera", top_k=2)
    assert result.results[0].source_message_ids == ["old"]
    assert result.results[0].explanation.age_days > 400
    assert 0.7 <= result.results[0].explanation.recency < result.results[1].explanation.recency <= 1.0


async def test_context_with_a_query_shows_relevant_memories_with_dates(service):
    await record_all(service, "trip", "a1", TRIP)
    await record_all(service, "trip2", "a1", [("alice", "user", "What should I pack?")])
    rendered = await service.assemble_memory_context("a1", "alice", "trip2", query="Where does Carla live?",
                                                     budget=1500)
    assert rendered.chars <= rendered.budget == 1500
    root = ET.fromstring(rendered.xml)
    memories = root.findall("RelevantMemories/Memory")
    assert memories[0].text == "alice: My sister Carla lives in Porto and keeps bees."
    assert memories[0].get("date") == (T0 + timedelta(minutes=3)).strftime("%Y-%m-%d")
    assert memories[0].get("kind") is None  # a message, the kind most are: not said
    assert memories[0].get("age") is None
    assert rendered.sections["relevant"] == len(memories)
    # The same block without a query: the session's latest user message is the query, and
    # is itself left out.
    implicit = await service.assemble_memory_context("a1", "alice", "trip2", budget=1500)
    texts = [m.text for m in ET.fromstring(implicit.xml).findall("RelevantMemories/Memory")]
    assert "alice: What should I pack?" not in texts


async def test_context_relevant_part_respects_every_budget(service):
    lines = [("alice", "user", f"Fact number {i}: the locker code for gym {i} is {1000 + i}, " + "padding " * 30)
             for i in range(30)]
    await record_all(service, "gym", "a1", lines)
    previous, shown, xml = -1, {}, {}
    for budget in (64, 200, 600, 1500, 4000, 16000):
        rendered = await service.assemble_memory_context("a1", "alice", "gym", query="locker code for gym", budget=budget)
        assert len(rendered.xml) == rendered.chars <= budget
        shown[budget] = [m.text for m in ET.fromstring(rendered.xml).findall("RelevantMemories/Memory")]
        xml[budget] = rendered.xml
        assert len(shown[budget]) >= previous
        previous = len(shown[budget])
    every = {f"alice: {text}" for _, _, text in lines}
    # Whole or not at all: a turn this short is never cut to its share; as many as fit.
    assert all("locker code" in t for t in shown[4000]) and set(shown[4000]) <= every
    assert len(shown[4000]) >= 10
    # Room for all: every turn whole, once (as a relevant memory, or inside the episode the
    # worker formed of the first window, which then carries it: ``also="message"``).
    assert set(shown[16000]) <= every
    assert all(xml[16000].count(text.removeprefix("alice: ").strip()) == 1 for text in every)


async def test_context_query_bad_input(service):
    with pytest.raises(InvalidInput, match="budget must be at least 64"):
        await service.assemble_memory_context("a1", "alice", "s", query="x", budget=10)
    with pytest.raises(InvalidInput, match="characters long"):
        await service.assemble_memory_context("a1", "alice", "s", query="x" * 5000)


async def test_one_graph_per_agent_and_reads_create_nothing(service, settings):
    client = graph_client(settings.falkordb_url)  # the cluster's, when the suite's graphs are on one
    try:
        for session in ("s1", "s2", "s3"):
            await service.record_message(session, msg("a1", "alice", f"hello from {session}"))
        await service.record_message("s4", msg("a2", "bob", "hello"))
        assert sorted(await client.list_graphs()) == ["ms_agent__a1", "ms_agent__a2"]
        # What may change on a read: the context cache, its last-good copy, metrics, and the
        # worker's own queue keys (arq, and the embedding queue the recorded messages left,
        # which the worker drains in the background). Nothing else, and no graph.
        # Nor FalkorDB's log of each graph's queries (``telemetry{<graph>}``), which it writes
        # on its own schedule, a second or two after they ran: the records' writes may reach
        # the logs of a1 and a2 after the snapshot (a ghost agent's log would still show).
        query_logs = {"telemetry{ms_agent__a1}", "telemetry{ms_agent__a2}"}

        def stored(keys) -> set[str]:
            return {k for k in keys if not k.startswith(("ms:ctx:", "ms:metrics", "arq:", "memory-service:",
                                                         "ms:embed:")) and k not in query_logs}

        async def every_key() -> list[str]:  # each primary's, on a cluster
            return [k async for k in client.connection.scan_iter(count=1000)]

        keys_before = stored(await every_key())
        await service.search("ghost", "anything at all")
        await service.search("a1", "hello", scope="user", user_id="nobody")
        await service.assemble_memory_context("ghost", "nobody", "no-session", query="hello")
        assert sorted(await client.list_graphs()) == ["ms_agent__a1", "ms_agent__a2"]
        assert stored(await every_key()) == keys_before
    finally:
        await client.aclose()


async def test_routing_a_search_to_the_agents_backend(service):
    await service.put_agent("a1", AgentSettings(memory_backend="graph"))
    await record_all(service, "trip", "a1", TRIP)
    assert (await service.search("a1", "bees")).results[0].namespace == str(Namespace.session("trip"))


async def test_a_time_range_without_a_timezone_is_utc(service):
    await record_all(service, "trip", "a1", TRIP)
    naive = (T0 + timedelta(minutes=1)).replace(tzinfo=None)
    assert sorted(ids_of(await service.search("a1", "Lisbon window seats Carla", until=naive))) == ["trip-0", "trip-1"]


async def test_a_scope_search_reads_whole_only_what_it_keeps_and_never_a_memory_deleted_meanwhile(service):
    """The graph's scope scan answers its candidates by id and time (``Found``); the search
    reads whole only what it returns, and one deleted after the ranking is left out."""
    from memory_service.backends.base import Found
    from memory_service.recall.search import SearchRequest

    await record_all(service, "trip", "a1", TRIP)
    await wait_embedded(service, "a1")
    _, backend = await service.agents.backend_for("a1")
    scope = [Namespace.session("trip")]
    ranking = await service.retriever.rank("a1", backend, SearchRequest(query="window seats flight Lisbon", top_k=3),
                                           scope)
    assert ranking.ranked and all(isinstance(c, Found) for c, _ in ranking.ranked)
    stored = {m.id: m for m in await backend.find("a1", [c.id for c, _ in ranking.ranked])}
    assert all(c.valid_at == stored[c.id].valid_at for c, _ in ranking.ranked)  # recency as from the memory
    first, second = ranking.results(3)[:2]
    assert await backend.delete("a1", [first[0].id]) == 1
    read = await ranking.read([first, second])
    assert [m.id for m, _ in read] == [second[0].id] and read[0][0].content == stored[second[0].id].content
    # The answer: the same order as before the deletion, less the deleted one.
    after = await service.search("a1", "window seats flight Lisbon", scope="session", session_id="trip", top_k=3)
    assert first[0].id not in [h.id for h in after.results] and after.results[0].id == second[0].id


async def test_each_block_is_counted_by_its_source_once_answered(service):
    await record_all(service, "trip", "a1", TRIP)
    first = await service.assemble_memory_context("a1", "alice", "trip")
    again = await service.assemble_memory_context("a1", "alice", "trip")
    await service.assembler.close()  # the counts written after the answers
    counts = await service.state.metrics()
    assert (first.source, again.source) == ("graph", "cache")
    assert counts.get("context_from_graph") == 1 and counts.get("context_from_cache") == 1
