"""The knowledge graph in recall (memory_service/recall/graph_signal.py): the memory block's
<KnownFacts> and search's "graph" signal, against the real embedded FalkorDB through the
facade, after formation built the graph from a conversation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from xml.etree import ElementTree as ET

import pytest
from pydantic import ValidationError

from memory_service.domain.bm25 import QUERY_STOPWORDS
from memory_service.domain.graph import Entity, EntityType, Fact, entity_id, fact_id, query_names
from memory_service.domain.models import Memory, MemoryKind, MessageIn, Provenance
from memory_service.domain.namespaces import Namespace
from memory_service.recall.graph_signal import hub_weight
from memory_service.recall.search import SearchRequest

NOW = datetime.now(UTC).replace(microsecond=0)


def said(user: str, mid: str, text: str, when: datetime | None = None, agent: str = "gr") -> MessageIn:
    return MessageIn(agent_id=agent, user_id=user, role="user", content=text, message_id=mid, created_at=when)


def known_facts(xml: str) -> list[str]:
    return [f.text or "" for f in ET.fromstring(xml).iter("Fact") if f.get("about") is not None]


async def brother(service, user: str, employer: str, session: str) -> None:
    await service.record_message(session, said(user, f"{session}-1", "I live in Paris with my dog Rex."))
    await service.record_message(session, said(user, f"{session}-2", f"My brother Tom works at {employer}."))
    await service.form_memories(session)


def test_query_names_are_words_and_ngrams_without_bare_stopwords():
    names = query_names("Where does Tom's brother, my brother, work?", QUERY_STOPWORDS)
    assert {"tom", "toms", "my brother", "toms brother"} <= set(names)
    assert "where" not in names and "my" not in names
    assert hub_weight(0) == 1.0 and hub_weight(100) < hub_weight(2) < 1.0


async def test_a_query_naming_an_entity_brings_its_current_fact_into_the_block(service):
    await brother(service, "alice", "Deloitte", "s1")
    block = await service.assemble_memory_context("gr", "alice", "s1", query="Where does Tom work?")
    assert "Tom works at Deloitte" in known_facts(block.xml)  # the fact as a fact, not the sentence
    assert block.sections["facts"] >= 1
    assert '<Fact about="Tom"' in block.xml


async def test_a_fact_shows_when_the_query_asks_about_it_not_merely_names_its_end(service):
    await brother(service, "alice", "Deloitte", "s1")
    about_music = await service.assemble_memory_context("gr", "alice", "s1", query="Does Tom like jazz?")
    assert "Tom works at Deloitte" not in known_facts(about_music.xml), about_music.xml
    only_named = await service.assemble_memory_context("gr", "alice", "s1", query="Tom?")
    assert "Tom works at Deloitte" in known_facts(only_named.xml)


async def test_after_a_move_the_old_home_is_no_current_fact_and_as_of_shows_it(service):
    then = NOW - timedelta(days=200)
    await service.record_message("m1", said("carol", "m1-1", "I live in Paris.", then))
    await service.form_memories("m1")
    await service.record_message("m2", said("carol", "m2-1", "I live in Lyon now.", NOW - timedelta(minutes=5)))
    await service.form_memories("m2")
    block = await service.assemble_memory_context("gr", "carol", "m2", query="Where do I live, Paris or Lyon?")
    facts = known_facts(block.xml)
    assert any("Lyon" in f for f in facts) and not any("Paris" in f for f in facts), block.xml
    # The user's own facts show without naming anything.
    # The user's own facts show without a query; with one, those it asks about.
    plain = await service.assemble_memory_context("gr", "carol", "m2")
    assert any("Lyon" in f for f in known_facts(plain.xml)) and "Paris" not in "".join(known_facts(plain.xml))
    # ("hello there" would be no query at all: small talk is not searched, tests/test_small_talk.py)
    unrelated = await service.assemble_memory_context("gr", "carol", "m2", query="what is the capital of Peru")
    assert not known_facts(unrelated.xml), unrelated.xml
    asked = await service.assemble_memory_context("gr", "carol", "m2", query="where do I live these days?")
    assert [f for f in known_facts(asked.xml) if "Lyon" in f] and "Paris" not in "".join(known_facts(asked.xml))
    past = await service.assemble_memory_context("gr", "carol", "m2", query="Where do I live, Paris or Lyon?",
                                                 as_of=then + timedelta(days=1))
    assert any("Paris" in f for f in known_facts(past.xml)) and not any("Lyon" in f for f in known_facts(past.xml))
    assert 'as_of="' in past.xml


async def test_the_graph_signal_finds_a_mention_by_alias_where_full_text_misses(service):
    await brother(service, "alice", "Deloitte", "s1")
    backend = (await service.agents.backend_for("gr"))[1]
    alice = Namespace.user("gr", "alice")
    [tom] = await backend.find_entities("gr", alice, ["tom"])
    await backend.upsert_entities("gr", [Entity(id=tom.id, name=tom.name, type=tom.type, namespace=tom.namespace,
                                                aliases=["Tommy"])])
    result = await service.search("gr", "Tommy", scope="user", user_id="alice")
    assert "graph" in result.signals
    by_graph = [h for h in result.results if "graph" in h.explanation.signals]
    assert by_graph and all("fulltext" not in h.explanation.signals for h in by_graph)
    assert any("Tom works at Deloitte" in h.content for h in by_graph)
    assert {p.entity for h in by_graph for p in h.explanation.graph} >= {"Tom"}
    # One hop out: Deloitte's mentions, reached through Tom's fact, say which fact.
    hops = [p for h in result.results for p in h.explanation.graph if p.via]
    assert any(p.entity == "Deloitte" and "Deloitte" in (p.via or "") for p in hops)


async def test_another_users_entities_never_reach_the_block_or_search(service):
    await brother(service, "alice", "Deloitte", "s1")
    await brother(service, "bob", "Google", "s2")
    block = await service.assemble_memory_context("gr", "alice", "s1", query="Where does Tom work?")
    assert "Google" not in block.xml and "Deloitte" in block.xml
    result = await service.search("gr", "Where does Tom work?", scope="user", user_id="alice")
    assert result.results and all("Google" not in h.content for h in (*result.results, *result.candidates))
    bob = Namespace.user("gr", "bob")
    bobs = {e.id for e in await (await service.agents.backend_for("gr"))[1].find_entities("gr", bob, ["tom", "google"])}
    assert bobs and not {p.entity_id for h in result.results for p in h.explanation.graph} & bobs


async def test_search_as_of_follows_the_facts_true_then(service):
    then = NOW - timedelta(days=200)
    await service.record_message("m1", said("carol", "m1-1", "I live in Paris.", then))
    await service.form_memories("m1")
    await service.record_message("m2", said("carol", "m2-1", "I live in Lyon now.", NOW - timedelta(minutes=5)))
    await service.form_memories("m2")
    now = await service.search("gr", SearchRequest(query="carol", scope="user", user_id="carol"))
    past = await service.search("gr", SearchRequest(query="carol", scope="user", user_id="carol",
                                                    as_of=then + timedelta(days=1)))
    hops_now = {p.entity for h in now.results for p in h.explanation.graph if p.via}
    hops_past = {p.entity for h in past.results for p in h.explanation.graph if p.via}
    assert "Lyon" in hops_now and "Paris" not in hops_now
    assert "Paris" in hops_past and "Lyon" not in hops_past


async def test_a_store_without_a_graph_searches_and_shows_no_facts(service, mongo_uri, mongo_database):
    from memory_service.backends.mongo import MongoBackend

    backend = MongoBackend(mongo_uri, mongo_database, server_selection_timeout_ms=2000)
    await backend.start()
    try:
        memory = Memory(id="mg-1", kind=MemoryKind.FACT, namespace=str(Namespace.user("gm", "alice")),
                        content="My brother Tom works at Deloitte.", metadata=Provenance(agent_id="gm"), valid_at=NOW)
        await backend.write([memory])
        result = await service.retriever.search("gm", backend, SearchRequest(query="Tom"),
                                                namespaces=[Namespace.user("gm", "alice")], resolve_scope=False)
        assert [h.id for h in result.results] == ["mg-1"]
        assert "graph" not in result.signals and not any(d.startswith("graph") for d in result.degraded)
    finally:
        await backend.close()


# Two hops, shared topics and the structural re-rank, on a graph written through the store's
# own API (so that its shape is known exactly): alice's brother Tom works at Deloitte, whose
# office is in Leeds; the travel shard knows Leeds too.

ALICE = Namespace.user("gr", "alice")
TRAVEL = Namespace.shard("gr", "travel")


def entity(ns: Namespace, name: str, type_: EntityType = EntityType.PERSON) -> Entity:
    return Entity(id=entity_id(str(ns), name, type_), name=name, type=type_, namespace=str(ns))


def fact(ns: Namespace, subject: Entity, predicate: str, obj: Entity, text: str) -> Fact:
    return Fact(id=fact_id(str(ns), subject.id, predicate, obj.id), namespace=str(ns), subject_id=subject.id,
                object_id=obj.id, predicate=predicate, text=text)


def note(mid: str, ns: Namespace, content: str) -> Memory:
    return Memory(id=mid, kind=MemoryKind.FACT, namespace=str(ns), content=content, valid_at=NOW,
                  metadata=Provenance(agent_id="gr", user_id="alice" if ns == ALICE else None))


async def tom_graph(service, hub_mentions: int = 0):
    """The graph above; memories that mention no word of the query "Tom" (only the graph finds
    them), and ``hub_mentions`` memories mentioning a hub, Alice herself."""
    await service.record_message("s1", said("alice", "s1-1", "hello"))  # the agent and alice exist
    await service.form_memories("s1", wait=True)  # and nothing changes under the searches afterwards
    backend = (await service.agents.backend_for("gr"))[1]
    tom, deloitte = entity(ALICE, "Tom"), entity(ALICE, "Deloitte", EntityType.ORGANISATION)
    leeds, alice = entity(ALICE, "Leeds", EntityType.PLACE), entity(ALICE, "Alice")
    shard_leeds = entity(TRAVEL, "Leeds", EntityType.PLACE)
    memories = [note("m-tom", ALICE, "my brother is called Tom"),
                note("m-deloitte", ALICE, "the consultancy has a new office tower"),
                note("m-leeds", ALICE, "it rains all winter up north"),
                note("m-guide", TRAVEL, "the city's art gallery is free on Sundays"),
                note("m-plain", ALICE, "a plain note about my brother Tom"),  # full text finds it; it mentions nothing
                *(note(f"m-hub-{i}", ALICE, f"a day out number {i}") for i in range(hub_mentions))]
    await backend.write(memories)
    await backend.upsert_entities("gr", [tom, deloitte, leeds, alice, shard_leeds])
    await backend.add_facts("gr", [fact(ALICE, tom, "works_at", deloitte, "Tom works at Deloitte."),
                                   fact(ALICE, deloitte, "located_in", leeds, "Deloitte's office is in Leeds."),
                                   fact(ALICE, alice, "sibling_of", tom, "Alice is Tom's sister.")])
    for mid, named in (("m-tom", [tom]), ("m-deloitte", [deloitte]), ("m-leeds", [leeds]), ("m-guide", [shard_leeds]),
                       *((f"m-hub-{i}", [alice]) for i in range(hub_mentions))):
        await backend.mention("gr", mid, [e.id for e in named])
    return backend, {"tom": tom, "deloitte": deloitte, "leeds": leeds, "alice": alice, "shard_leeds": shard_leeds}


def by_id(result) -> dict:
    return {h.id: h for h in (*result.results, *result.candidates)}


def by_graph(result) -> dict:
    """The hits the graph signal found (the hash embedder's vectors find about anything in a small store)."""
    return {i: h for i, h in by_id(result).items() if "graph" in h.explanation.signals and h.explanation.graph}


async def test_two_hops_find_a_memory_one_hop_does_not(service):
    await tom_graph(service)
    request = SearchRequest(query="Tom", scope="user", user_id="alice", top_k=20)
    service.settings.search_graph_hops = 1
    one = by_graph(await service.search("gr", request))
    assert {"m-tom", "m-deloitte"} <= set(one) and "m-leeds" not in one
    service.settings.search_graph_hops = 2
    two = by_graph(await service.search("gr", request))
    assert {"m-tom", "m-deloitte", "m-leeds"} <= set(two)
    [path] = two["m-leeds"].explanation.graph
    assert (path.hops, path.path, path.entity, path.topic) == (2, ["Tom", "Deloitte", "Leeds"], "Leeds", False)
    assert path.facts == ["Tom works at Deloitte.", "Deloitte's office is in Leeds."]
    assert path.via == "Deloitte's office is in Leeds."
    # Each hop halves the weight (SEARCH_GRAPH_HOP_DECAY), and the hub penalty of the entity
    # mentioned and of the one passed through applies: the path's weight says so.
    weights = {h: by.explanation.graph[0].weight for h, by in two.items()}
    assert weights["m-tom"] > weights["m-deloitte"] > weights["m-leeds"] > 0
    assert "fulltext" not in two["m-leeds"].explanation.signals
    # Hops 0: the query's own entities only.
    service.settings.search_graph_hops = 0
    zero = by_graph(await service.search("gr", request))
    assert set(zero) == {"m-tom"}


async def test_a_shared_topic_reaches_the_shards_knowledge_of_an_entity_reached(service):
    await tom_graph(service)
    request = SearchRequest(query="Tom", scope="namespaces", namespaces=[str(ALICE), str(TRAVEL)], top_k=20)
    found = by_id(await service.search("gr", request))
    [path] = found["m-guide"].explanation.graph
    assert path.topic and path.path == ["Tom", "Deloitte", "Leeds", "Leeds"] and path.entity == "Leeds"
    assert path.via is None and len(path.facts) == 2
    service.settings.search_graph_topic_weight = 0
    assert "m-guide" not in by_graph(await service.search("gr", request))
    # The user's scope holds no shard: no topic is looked up, nothing of the shard comes back.
    service.settings.search_graph_topic_weight = 0.5
    mine = by_id(await service.search("gr", SearchRequest(query="Tom", scope="user", user_id="alice", top_k=20)))
    assert "m-guide" not in mine and not any(p.topic for h in mine.values() for p in h.explanation.graph)


async def test_a_hub_says_less_than_a_rare_entity(service):
    _, named = await tom_graph(service, hub_mentions=30)
    result = await service.search("gr", SearchRequest(query="Alice and Tom", scope="user", user_id="alice", top_k=40))
    found = by_id(result)
    tom_path = next(p for p in found["m-tom"].explanation.graph if p.entity == "Tom")
    # (the formation of "hello" made alice's person entity first: one entity, named "alice")
    hub_path = next(p for p in found["m-hub-0"].explanation.graph if p.entity_id == named["alice"].id)
    assert hub_path.weight == round(hub_weight(30 + 1), 6)  # 30 mentions and one fact
    assert tom_path.weight == round(hub_weight(3), 6) > 2 * hub_path.weight  # one mention, two facts
    ranked = [h.id for h in result.results]
    assert ranked.index("m-tom") < min(ranked.index(f"m-hub-{i}") for i in range(30) if f"m-hub-{i}" in ranked)
    # In the fusion, the hub's mentions (all scored alike) share one rank, and their term is
    # weighed by their score: the graph signal alone puts them level, and far below Tom's.
    hub_only = [found[f"m-hub-{i}"].explanation for i in range(30) if f"m-hub-{i}" in found]
    assert len(hub_only) == 30 and all(set(e.signals) == {"graph"} for e in hub_only)
    assert len({e.fused for e in hub_only}) == 1 and len({e.signals["graph"].rank for e in hub_only}) == 30
    k, signals = service.settings.search_rrf_k, len(result.signals)
    first = sorted(e.signals["graph"].rank for e in hub_only)
    mean_rank = (first[0] + first[-1]) / 2
    assert abs(hub_only[0].fused - hub_path.weight / (k + mean_rank) / (signals / (k + 1))) < 1e-5
    # Through a hub, a path says little too: Tom's facts from Alice are weighed down by her degree.
    graph = by_id(await service.search("gr", SearchRequest(query="Alice", scope="user", user_id="alice", top_k=40)))
    [via_tom] = graph["m-deloitte"].explanation.graph
    assert [n.lower() for n in via_tom.path] == ["alice", "tom", "deloitte"]
    assert via_tom.weight == round(0.5 ** 2 * hub_weight(3) * hub_weight(3), 6)  # Tom passed through, Deloitte mentioned


async def test_rerank_weights_at_zero_change_nothing_and_weights_are_explained(service):
    await tom_graph(service, hub_mentions=3)
    base = SearchRequest(query="Tom brother", scope="user", user_id="alice", top_k=20)
    plain = await service.search("gr", base)
    zero = await service.search("gr", base.model_copy(update={"centrality_weight": 0.0, "activation_weight": 0.0}))
    assert [(h.id, h.score) for h in zero.results] == [(h.id, h.score) for h in plain.results]
    assert all(h.explanation.structure is None for h in (*plain.results, *zero.results))
    weighted = await service.search("gr", base.model_copy(update={"centrality_weight": 2.0, "activation_weight": 1.0}))
    found = by_id(weighted)
    for h in weighted.results:
        s = h.explanation.structure
        assert s is not None and (s.centrality_weight, s.activation_weight) == (2.0, 1.0)
        assert 1 / 4 - 1e-6 <= s.factor <= 1 + 1e-6
        assert abs(s.factor - (1 + 2 * s.centrality + s.activation) / 4) < 1e-5
        assert abs(h.score - h.explanation.fused * h.explanation.recency * s.factor) < 1e-4
    # Tom's own mention: a query entity (closeness 1) of degree 3, nobody else mentions it.
    tom = found["m-tom"].explanation.structure
    assert (tom.centrality, tom.activation) == (round(hub_weight(3), 6), 0.0)
    assert [(e.entity, e.closeness, e.shared) for e in tom.entities] == [("Tom", 1.0, 0)]
    # The hub's memories share Alice (one hop from Tom) with one another: some of both, on
    # fixed scales, Alice's degree weighing them down.
    hub = found["m-hub-0"].explanation.structure
    [alice] = hub.entities
    assert (alice.entity.lower(), alice.closeness, alice.shared) == ("alice", 0.5, 2)
    assert hub.centrality == round(0.5 * hub_weight(alice.degree), 6) < tom.centrality and 0 < hub.activation < 1
    # A memory that mentions no entity keeps the floor factor.
    plain_note = found["m-plain"].explanation.structure
    assert plain_note.entities == [] and plain_note.factor == 0.25 and "fulltext" in found["m-plain"].explanation.signals
    # Settings give the default weights; a request's own win.
    service.settings.search_rank_centrality = 2.0
    service.settings.search_rank_activation = 1.0
    assert [(h.id, h.score) for h in (await service.search("gr", base)).results] == \
        [(h.id, h.score) for h in weighted.results]
    off = await service.search("gr", base.model_copy(update={"centrality_weight": 0.0, "activation_weight": 0.0}))
    assert [(h.id, h.score) for h in off.results] == [(h.id, h.score) for h in plain.results]


async def test_bad_rerank_weights_are_refused(service, http):
    await tom_graph(service)
    for bad in ({"centrality_weight": -0.1}, {"activation_weight": 10.5}, {"centrality_weight": float("nan")},
                {"activation_weight": float("inf")}):
        with pytest.raises(ValidationError):
            SearchRequest(query="Tom", **bad)
    await http.post("/v1/sessions/h1/messages", json={"agent_id": "gr", "user_id": "alice", "role": "user",
                                                      "content": "hello", "message_id": "h1-1"})
    for params in ({"centrality_weight": "-1"}, {"activation_weight": "11"}, {"centrality_weight": "nan"},
                   {"activation_weight": "lots"}):
        r = await http.get("/v1/search", params={"agent_id": "gr", "query": "hello", **params})
        assert r.status_code == 422, r.text
        assert next(iter(params)) in r.text
    r = await http.post("/v1/agents/gr/search", json={"query": "hello", "activation_weight": -2})
    assert r.status_code == 422 and "activation_weight" in r.text
    ok = await http.get("/v1/search", params={"agent_id": "gr", "query": "hello", "centrality_weight": "1",
                                              "activation_weight": "0.5"})
    assert ok.status_code == 200, ok.text
    assert all(h["explanation"]["structure"]["activation_weight"] == 0.5 for h in ok.json()["results"])
