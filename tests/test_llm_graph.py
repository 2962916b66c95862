"""The LLM extractor's knowledge graph (issue 16, item 2): the one extraction call per window
also returns entities, facts, and which of the current facts shown to it the window makes
no longer true.

Against real components: a scripted OpenAI-compatible server on loopback (the real
``openai`` client, real HTTP; tests/test_llm_extractor.py), the embedded FalkorDB/Redis,
and the service's own formation (``MemoryService.form_memories``, worker in-process). Each
window is answered by exactly one scripted reply; the server answers any further call with
a 418, so a second call per window fails the test.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from memory_service.domain.graph import Entity, EntityType, ExtractedEntity, ExtractedFact, Fact, entity_id, fact_id
from memory_service.domain.models import Shard, ShardIn
from memory_service.domain.namespaces import Namespace
from memory_service.formation.extractor import KnownGraph, Window
from memory_service.formation.llm_extractor import LLMExtractor
from memory_service.formation.steps import PersonalGuard, extract_claim, write_graph
from memory_service.formation.window import StoredExtraction
from memory_service.runtime import open_service

from .helpers import msg
from .test_llm_extractor import (  # endpoint and llm: the scripted endpoint's fixtures
    MODEL,
    TRIP,
    completion,
    empty_reply,
    endpoint,  # noqa: F401
    llm,  # noqa: F401
    window,
)

AGENT = "lg"


@pytest.fixture
async def service(settings, llm):
    llm_settings = settings.model_copy(update={"extractor": "llm", "llm_base_url": llm.base_url,
                                               "llm_model": MODEL, "consolidator": "rules"})
    async with open_service(llm_settings, run_worker=True) as opened:
        yield opened


def reply(*, entities=(), facts=(), supersedes=(), shards=()) -> dict:
    return {**empty_reply(shards), "entities": list(entities), "facts": list(facts), "supersedes": list(supersedes)}


def entity(name: str, type_: str, namespace: str, aliases=(), summary: str = "") -> dict:
    return {"name": name, "type": type_, "aliases": list(aliases), "summary": summary, "namespace": namespace}


def fact(subject: str, predicate: str, obj: str, text: str, messages=(1,), valid_at: str = "") -> dict:
    return {"subject": subject, "predicate": predicate, "object": obj, "text": text, "valid_at": valid_at,
            "messages": list(messages)}


async def say(service, session: str, *lines: tuple[str, str], day: int = 0) -> None:
    for i, (user, text) in enumerate(lines):
        await service.record_message(session, msg(AGENT, user, text, mid=f"{session}-{i}", minute=day * 1440 + i))


async def facts_of(service, user: str, name: str, **options) -> list[Fact]:
    backend = (await service.agents.backend_for(AGENT))[1]
    ns = Namespace.user(AGENT, user)
    found = await backend.find_entities(AGENT, ns, [name])
    assert found, f"no entity {name!r} in {ns}"
    return await backend.current_facts(AGENT, ns, [found[0].id], **options)


# --- the extractor alone: schema, prompt and reply ---------------------------------------


def known(agent: str = "planner") -> KnownGraph:
    alice = str(Namespace.user(agent, "alice"))
    me = Entity(id=entity_id(alice, "alice", EntityType.PERSON), name="alice", type=EntityType.PERSON, namespace=alice)
    leeds = Entity(id=entity_id(alice, "Leeds", EntityType.PLACE), name="Leeds", type=EntityType.PLACE, namespace=alice)
    home = Fact(id=fact_id(alice, me.id, "lives_in", leeds.id), namespace=alice, subject_id=me.id, object_id=leeds.id,
                predicate="lives_in", text="alice lives in Leeds", valid_at=datetime(2026, 1, 10, tzinfo=UTC))
    return KnownGraph((me, leeds), (home,))


@pytest.fixture
async def extractor(llm):
    async with LLMExtractor(base_url=llm.base_url, model=MODEL, timeout_seconds=5, backoff_seconds=0) as ex:
        yield ex


async def test_the_schema_and_prompt_carry_the_graph_and_the_known_facts(llm, extractor):
    llm.reset(completion(reply()))
    w = window(*TRIP)
    await extractor.extract(Window(w.agent_id, w.session_id, w.messages, w.shards, known()))

    assert len(llm.requests) == 1
    props = llm.schema()["properties"]
    namespaces = ["user:alice", "user:bob", "user:carol", "shard:travel", "shard:food", "shard:release"]
    assert props["entities"]["items"]["properties"]["namespace"]["enum"] == namespaces
    assert props["entities"]["items"]["properties"]["type"]["enum"] == [t.value for t in EntityType]
    assert props["entities"]["maxItems"] == props["facts"]["maxItems"] == 8  # one per message shown
    assert props["supersedes"]["items"]["enum"] == [1] and props["supersedes"]["maxItems"] == 1
    prompt = llm.prompt()
    assert '- "alice"; person; user:alice' in prompt
    assert 'fact 1: user:alice; alice lives_in Leeds; 2026-01-10; "alice lives in Leeds"' in prompt
    system = llm.requests[0]["messages"][0]["content"]
    assert '"supersedes"' in system and "snake_case" in system


async def test_without_known_facts_nothing_can_be_superseded(llm, extractor):
    llm.reset(completion(reply()))
    await extractor.extract(window(*TRIP))
    assert llm.schema()["properties"]["supersedes"]["maxItems"] == 0
    assert "Known facts: none" in llm.prompt()


async def test_graph_items_are_validated_like_the_rest(llm, extractor, caplog):
    llm.reset(completion(reply(
        entities=[
            entity("Lisbon", "place", "shard:travel", aliases=["Lisboa", "lisbon", ""]),
            entity("Lisbon", "place", "shard:travel", aliases=["LIS"]),  # twice: one entity
            entity("Manchester", "place", "user:alice"),
            entity("Gatwick", "airport", "shard:travel"),  # not a type
            entity("Mallory", "person", "user:mallory"),  # not a speaker
            entity("Bob", "person", "shard:archived"),  # no such shard
            entity("  ", "person", "user:bob"),  # no name
        ],
        facts=[
            fact("alice", "lives_in", "Manchester", "alice lives in Manchester", [3], "2026-04"),
            fact("alice", "Lives In", "Manchester", "x", [3]),  # not snake_case
            fact("alice", "visited", "Atlantis", "alice visited Atlantis", [3]),  # no such entity
            fact("alice", "visited", "Lisbon", "alice visited Lisbon", [99]),  # no such message
            fact("bob", "lives_in", "Leeds", "bob lives in Leeds", [4], "last spring"),  # known entity; bad date
        ],
        supersedes=[1, 2, 0, "1", 1],
    )))
    w = window(*TRIP)
    with caplog.at_level(logging.WARNING, logger="memory_service.formation.llm_extractor"):
        result = await extractor.extract(Window(w.agent_id, w.session_id, w.messages, w.shards, known()))

    graph = result.graph
    travel, alice, bob = (str(Namespace.shard("planner", "travel")), str(Namespace.user("planner", "alice")),
                          str(Namespace.user("planner", "bob")))
    by_key = {(e.namespace, e.name): e for e in graph.entities}
    assert by_key[(travel, "Lisbon")].aliases == ["Lisboa", "LIS"]
    assert {(alice, "Manchester"), (alice, "alice"), (bob, "bob"), (bob, "Leeds")} <= set(by_key)
    assert not any(e.name in ("Gatwick", "Mallory") for e in graph.entities) and len(graph.entities) == 5
    assert [(f.subject, f.predicate, f.object, f.namespace, f.message_ids) for f in graph.facts] == [
        ("alice", "lives_in", "Manchester", alice, ["m2"]), ("bob", "lives_in", "Leeds", bob, ["m3"])]
    assert graph.facts[0].valid_at == datetime(2026, 4, 1, tzinfo=UTC) and graph.facts[1].valid_at is None
    assert graph.supersedes == [known().facts[0].id]  # 2, 0 and "1" are no known fact's number; 1 once
    assert caplog.text.count("dropped an extracted") == 10  # 4 entities, 3 facts, 3 numbers
    assert "not the number of a known fact (1 to 1)" in caplog.text
    assert "Atlantis" not in caplog.text and "Gatwick" not in caplog.text  # never an item's words


def test_personal_graph_items_in_a_shard_go_to_their_user_or_are_dropped():
    w = window(("alice", "user", "My brother Tom lives in Porto."),
               ("bob", "user", "The museum in Porto closes at 6pm."))
    agent = w.agent_id
    travel, alice = str(Namespace.shard(agent, "travel")), str(Namespace.user(agent, "alice"))
    entities = [ExtractedEntity(name="Tom", type=EntityType.PERSON, namespace=travel),
                ExtractedEntity(name="Porto", type=EntityType.PLACE, namespace=travel),
                ExtractedEntity(name="Museu", type=EntityType.PLACE, namespace=travel),
                ExtractedEntity(name="alice", type=EntityType.PERSON, namespace=travel),  # a speaker
                ExtractedEntity(name="Eve", type=EntityType.PERSON, namespace=str(Namespace.user(agent, "eve")))]
    facts = [ExtractedFact(subject="Tom", predicate="lives_in", object="Porto", text="Tom lives in Porto",
                           namespace=travel, message_ids=["m0"]),
             ExtractedFact(subject="Museu", predicate="located_in", object="Porto", text="The museum is in Porto",
                           namespace=travel, message_ids=["m1"])]
    kept, routed = PersonalGuard(w).graph(entities, facts)
    where = {(e.name, e.namespace) for e in kept}
    # Tom's home is alice's statement about her brother: in her namespace, with both ends.
    assert [(f.subject, f.namespace) for f in routed] == [("Tom", alice), ("Museu", travel)]
    # Tom stays a shard entity only if nothing personal is said of him there: his one fact
    # moved, and the entity itself (a name, no summary) is not personal; the speaker moved.
    assert {("Tom", alice), ("Porto", alice), ("alice", alice), ("Tom", travel), ("Porto", travel),
            ("Museu", travel)} == where
    # An entity of a namespace the window does not write to (a user who did not speak) is dropped.
    assert not any(e.name == "Eve" for e in kept)


def test_a_personal_shard_item_with_no_user_to_keep_it_is_dropped():
    w = window(("alice", "user", "My passport number is X1234567."), ("bob", "user", "Mine too."),
               ("bob", "assistant", "Your passport expires in May."))
    travel = str(Namespace.shard(w.agent_id, "travel"))
    entities = [ExtractedEntity(name="passport", type=EntityType.OBJECT, namespace=travel,
                                summary="my passport number is X1234567"),
                ExtractedEntity(name="visa", type=EntityType.OBJECT, namespace=travel),
                ExtractedEntity(name="May", type=EntityType.EVENT, namespace=travel)]
    facts = [ExtractedFact(subject="passport", predicate="expires_in", object="May", text="the passport expires in May",
                           namespace=travel, message_ids=["m0"]),
             ExtractedFact(subject="visa", predicate="expires_in", object="May", text="it expires in May",
                           namespace=travel, message_ids=["m2"])]
    kept, routed = PersonalGuard(w).graph(entities, facts)
    alice = str(Namespace.user(w.agent_id, "alice"))
    # The passport fact cites alice's own sentence: it and its two ends go to her namespace.
    # The shard's passport entity (a personal summary, two users in the window: whose it is
    # would be a guess) is dropped; the assistant's "your" with two users names no one, so
    # the visa fact is dropped.
    assert [(f.subject, f.namespace) for f in routed] == [("passport", alice)]
    assert {(e.name, e.namespace) for e in kept} == {("visa", travel), ("May", travel), ("passport", alice),
                                                     ("May", alice)}


# --- formation end to end ------------------------------------------------------------------


async def test_one_call_shows_the_current_fact_and_a_superseding_reply_closes_it(service, llm):
    # Window 1: alice owns a Golf (a predicate the single-valued rule knows nothing of).
    llm.reset(completion(reply(entities=[entity("Golf", "object", "user:alice", summary="alice's car")],
                               facts=[fact("alice", "owns", "Golf", "alice owns a Golf", [1], "2026-01-05")])))
    await say(service, "w1", ("alice", "My car is a Golf, I love it."), ("alice", "It is blue."))
    await service.form_memories("w1")
    assert len(llm.requests) == 1
    [golf] = await facts_of(service, "alice", "alice", predicate="owns")
    assert golf.text == "alice owns a Golf"

    # Window 2: she sold it. The prompt shows the current fact, numbered; the reply supersedes it.
    llm.reset(completion(reply(entities=[entity("Tesla", "object", "user:alice")],
                               facts=[fact("alice", "owns", "Tesla", "alice owns a Tesla", [1], "2026-05-02")],
                               supersedes=[1, 9])))
    await say(service, "w2", ("alice", "I sold the Golf and bought a Tesla."), ("alice", "Charging is easy."), day=1)
    await service.form_memories("w2")
    assert len(llm.requests) == 1  # still one call for the window
    assert 'fact 1: user:alice; alice owns Golf; 2026-01-05; "alice owns a Golf"' in llm.prompt()
    assert llm.schema()["properties"]["supersedes"]["items"]["enum"] == [1]

    [now] = await facts_of(service, "alice", "alice", predicate="owns")
    assert now.text == "alice owns a Tesla"
    history = {f.text: f for f in await facts_of(service, "alice", "alice", predicate="owns", include_superseded=True)}
    old = history["alice owns a Golf"]
    assert old.invalid_at == datetime(2026, 5, 2, tzinfo=UTC) and old.superseded_by == now.id
    entries = (await service.audit.read(AGENT, action="fact.invalidate")).entries
    assert [(e.key_id, e.target) for e in entries] == [("formation", old.id)]
    metrics = await service.state.metrics()
    assert metrics["formations"] == 2 and metrics["llm_calls"] == 2


async def test_superseded_without_a_replacement_closes_at_the_windows_time(service, llm):
    llm.reset(completion(reply(entities=[entity("Sam", "person", "user:bob")],
                               facts=[fact("bob", "friend_of", "Sam", "bob is friends with Sam", [1])])))
    await say(service, "f1", ("bob", "Sam is my best friend."), ("bob", "We met at school."))
    await service.form_memories("f1")
    llm.reset(completion(reply(supersedes=[1])))
    await say(service, "f2", ("bob", "Sam and I are not friends any more."), ("bob", "It is sad."), day=3)
    await service.form_memories("f2")
    assert len(llm.requests) == 1 and "fact 1: user:bob; bob friend_of Sam" in llm.prompt()
    assert await facts_of(service, "bob", "bob", predicate="friend_of") == []
    [old] = await facts_of(service, "bob", "bob", predicate="friend_of", include_superseded=True)
    # The window's time: its last message (day 3, minute 1), as the memories' valid_at.
    assert old.superseded_by is None and old.invalid_at == datetime(2026, 5, 4, 9, 1, tzinfo=UTC)


async def test_items_in_a_shard_about_a_user_land_in_the_users_namespace(service, llm):
    await service.put_shard(AGENT, "travel", ShardIn(name="travel", extraction_focus="flights, trips"))
    llm.reset(completion(reply(
        shards=[Shard(agent_id=AGENT, shard_id="travel", name="travel")],
        entities=[entity("alice", "person", "shard:travel"), entity("Gatwick", "place", "shard:travel"),
                  entity("Lyon", "place", "shard:travel")],
        facts=[fact("alice", "flies_from", "Gatwick", "alice flies from Gatwick", [1]),
               fact("Lyon", "has_airport", "Gatwick", "Lyon has an airport", [2])])))
    await say(service, "p1", ("alice", "My flight to Lyon leaves from Gatwick."), ("carol", "Lyon is lovely in June."))
    await service.form_memories("p1")
    backend = (await service.agents.backend_for(AGENT))[1]
    travel = Namespace.shard(AGENT, "travel")
    in_shard, _ = await backend.list_entities(AGENT, travel)
    mine, _ = await backend.list_entities(AGENT, Namespace.user(AGENT, "alice"))
    assert "alice" not in {e.name for e in in_shard}  # a speaker is never a shard's entity
    assert {"alice", "Gatwick"} <= {e.name for e in mine}
    [flight] = await facts_of(service, "alice", "alice")
    assert flight.text == "alice flies from Gatwick" and flight.namespace == str(Namespace.user(AGENT, "alice"))
    carols, _ = await backend.list_entities(AGENT, Namespace.user(AGENT, "carol"))
    assert carols == []  # nothing of alice's reached another user


async def test_a_retried_write_writes_the_same_graph_from_the_stored_extraction(service, llm):
    """The graph is stored with the extraction: a retried write step (the worker died after
    the graph write) reads it back and writes nothing new, closes nothing twice, asks nothing."""
    llm.reset(completion(reply(entities=[entity("Leeds", "place", "user:alice")],
                               facts=[fact("alice", "lives_in", "Leeds", "alice lives in Leeds", [1], "2026-01-01")])))
    await say(service, "r1", ("alice", "I live in Leeds."), ("alice", "Near the park."))
    await service.form_memories("r1")

    llm.reset(completion(reply(entities=[entity("York", "place", "user:alice")],
                               facts=[fact("alice", "lives_in", "York", "alice lives in York", [1], "2026-05-02")],
                               supersedes=[1])))
    await say(service, "r2", ("alice", "I moved to York."), ("alice", "Smaller city."), day=1)
    windows = service.formation.windows
    claim = await windows.claim("r2", limit=10)
    backend = (await service.agents.backend_for(AGENT))[1]
    stored = await extract_claim(claim, AGENT, backend, service.extractor, [])
    record = await windows.store_extraction(await windows.load("r2"), stored)
    assert len(llm.requests) == 1
    again = StoredExtraction.from_json(stored.to_json())  # as a retry reads it
    assert again == stored and again.supersedes and again.facts

    async def graph_state() -> list:
        rows = await backend._read(AGENT, "MATCH (a)-[e:RELATES_TO]->(b) RETURN e.uuid AS id, e.invalid_at AS "
                                          "invalid, e.superseded_by AS by, e.episodes AS eps ORDER BY id")
        nodes = await backend._read(AGENT, "MATCH (n:Entity) RETURN n.uuid AS id, n.aliases AS aliases ORDER BY id")
        return [rows, nodes]

    await backend.write(list(again.memories))
    first = await write_graph(AGENT, backend, claim, again, service.audit)
    after_first = await graph_state()
    second = await write_graph(AGENT, backend, claim, again, service.audit)
    assert len(first.superseded) == 1 and second.superseded == []
    assert await graph_state() == after_first
    # And the window finishes from its stored extraction: still no second call.
    await service.form_memories("r2")
    assert await graph_state() == after_first and len(llm.requests) == 1
    assert record is not None
    assert len((await service.audit.read(AGENT, action="fact.invalidate")).entries) == 1
    [home] = await facts_of(service, "alice", "alice", predicate="lives_in")
    assert home.text == "alice lives in York"


async def test_the_offline_extractor_is_shown_nothing_and_writes_its_own_graph(settings):
    """With EXTRACTOR=rules nothing changes: no lookup, no call, extract_graph's graph."""
    async with open_service(settings, run_worker=True) as service:
        await say(service, "o1", ("dave", "I live in Paris with my dog Rex."), ("dave", "Paris is great."))
        await service.form_memories("o1")
        facts = await facts_of(service, "dave", "dave")
        assert {f.predicate for f in facts} == {"lives_in", "has_pet"}
