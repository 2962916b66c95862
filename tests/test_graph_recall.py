"""The knowledge graph in recall (memory_service/recall/graph_signal.py): the memory block's
<KnownFacts> and search's "graph" signal, against the real embedded FalkorDB through the
facade, after formation built the graph from a conversation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from xml.etree import ElementTree as ET

from memory_service.domain.graph import Entity, query_names
from memory_service.domain.models import Memory, MemoryKind, MessageIn, Provenance
from memory_service.domain.namespaces import Namespace
from memory_service.recall.graph_signal import hub_weight
from memory_service.recall.search import QUERY_STOPWORDS, SearchRequest

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
    plain = await service.assemble_memory_context("gr", "carol", "m2", query="hello there")
    assert any("Lyon" in f for f in known_facts(plain.xml)) and "Paris" not in "".join(known_facts(plain.xml))
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
    from memory_service.stores.mongo import MongoBackend

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
