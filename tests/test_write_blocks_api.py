"""POST /v1/agents/{agent_id}/writes/parse: a model's write blocks stored all or nothing,
with their provenance, behind the memory tools' rules (writes on per agent, the agent's own
namespaces and sessions): observations as memories, entities and edges in the knowledge
graph (resolved, superseding, mentioned), idempotent per message, refused whole on bad
input, on a Mongo agent and in a session; completed by a retry after a store outage half-way.
A real server, real Redis and FalkorDB (the memory tools' server), the MongoDB stand-in."""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from pydantic import SecretStr

from memory_service.backends.graph import graph_name
from memory_service.backends.loopback import LoopbackServer
from memory_service.backends.outages import is_unavailable
from memory_service.http.app import create_app
from memory_service.runtime import open_service

from .conftest import flush, suite_settings
from .helpers import msg, wait_embedding_idle
from .store_state import snapshot
from .tcp_proxy import ThreadedTcpProxy
from .test_memory_tools import (  # noqa: F401
    AGENT,
    LOCKED,
    OTHER,
    WRITES_OFF,
    audit,
    context,
    http,
    record,
    search,
    tools_server,
)

ALICE_NS = f"user:{AGENT}:alice"

BLOCKS = (
    "Noted, I will remember that.\n"
    '<memory_write>{"observations": [{"text": "Alice is allergic to hazelnuts", "confidence": 0.9, '
    '"tags": ["health"]}]}</memory_write>\n'
    '<shadow_write>{"entities": [{"name": "Lyon", "type": "city"}], '
    '"edges": [{"source": "Alice", "target": "Lyon", "rel_type": "lives_in"}]}</shadow_write>'
)


async def parse(http, text: str, agent: str = AGENT, **extra):
    return await http.post(f"/v1/agents/{agent}/writes/parse",
                           json={"text": text, "namespace": f"user:{agent}:alice", **extra})


def graph_rows(url: str, cypher: str, agent: str = AGENT) -> list[list]:
    client = redis.Redis.from_url(url)
    try:
        return client.execute_command("GRAPH.RO_QUERY", graph_name(agent), cypher)[1]
    finally:
        client.close()


def mentions(url: str) -> set[tuple[str, str]]:
    return {(m.decode(), n.decode()) for m, n in
            graph_rows(url, "MATCH (m:Episodic)-[:MENTIONS]->(n:Entity) RETURN m.uuid, n.name")}


async def test_blocks_are_stored_with_their_provenance(http, falkordb_url):
    await record(http, "s1", "I am allergic to hazelnuts and I live in Lyon.", mid="m1")
    answer = await parse(http, BLOCKS, session_id="s1", message_id="m1")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["blocks"] == 2
    stored = {(m["kind"], m["content"], tuple(m["tags"])) for m in body["written"]}
    assert stored == {("observation", "Alice is allergic to hazelnuts", ("health",))}
    assert all(m["provenance"]["session_id"] == "s1" and m["provenance"]["message_ids"] == ["m1"]
               and m["provenance"]["user_id"] == "alice" for m in body["written"])
    assert [h["content"] for h in await search(http, "hazelnuts", tags=["health"])] == ["Alice is allergic to hazelnuts"]

    # The entities and the edge are the knowledge graph's, in the block's namespace.
    assert [(e["name"], e["type"], e["namespace"]) for e in body["entities"]] == [
        ("Lyon", "place", ALICE_NS), ("Alice", "person", ALICE_NS)]
    [fact] = body["facts"]
    lyon, alice = (e["id"] for e in body["entities"])
    assert (fact["subject_id"], fact["predicate"], fact["object_id"], fact["text"], fact["current"]) == \
        (alice, "lives_in", lyon, "Alice lives in Lyon", True)
    assert fact["message_ids"] == ["m1"] and fact["memory_ids"] == [body["written"][0]["id"]]
    assert body["superseded"] == [] and body["already_stored"] == []
    shown = (await http.get(f"/v1/agents/{AGENT}/entities/{alice}")).json()
    assert [f["id"] for f in shown["facts"]] == [fact["id"]] and [n["name"] for n in shown["neighbours"]] == ["Lyon"]
    assert mentions(falkordb_url) == {(body["written"][0]["id"], "Alice")}  # the observation's text names Alice
    assert "Alice lives in Lyon" in await context(http, "where does alice live?")

    entry = (await audit(http, "memory.write_blocks"))[0]
    assert entry["after"]["blocks"] == 2 and entry["after"]["entities"] == [lyon, alice]
    assert entry["after"]["facts"] == [fact["id"]]
    assert not any(word in str(entry).lower() for word in ("hazelnut", "lyon", "alice lives")), entry


@pytest.mark.parametrize("text,where", [
    (BLOCKS + '\n<memory_write>{"observations": [{"text": "x", "confidence": 7}]}</memory_write>',
     "block 3 (<memory_write> at line 4, column 1): observations[0].confidence"),
    (BLOCKS + "\n<memory_write>{", "line 4, column 1: <memory_write> is never closed"),
    (BLOCKS + '\n<memory_write>[{"kind": "entity", "name": "Tom"}, {"kind": "edge", "source": "Tom", "target": "Ann", '
              '"rel_type": "is friends with!"}]</memory_write>', "block 3 (<memory_write> at line 4, column 1): "
                                                                  "items[1].rel_type"),
    (BLOCKS + '\n<memory_write>{"entities": [{"name": "Tom", "type": "dragon"}]}</memory_write>',
     "entities[0].type: Value error, unknown entity type 'dragon'"),
])
async def test_one_malformed_block_stores_nothing(http, falkordb_url, text, where):
    await record(http, "s1", "hello", mid="m1")
    await wait_embedding_idle(falkordb_url, AGENT)
    before = snapshot(falkordb_url, worker_running=True)
    answer = await parse(http, text, session_id="s1")
    assert answer.status_code == 422 and where in answer.json()["detail"], answer.text
    assert snapshot(falkordb_url, worker_running=True).contents == before.contents


async def test_writes_off_another_agents_namespace_or_session_store_nothing(http, falkordb_url):
    await record(http, "s1", "hello", mid="m1")
    await record(http, "other-s", "hello", agent=OTHER, mid="o1")
    for agent in (AGENT, OTHER):  # the records' embedding jobs write on their own: let them finish first
        await wait_embedding_idle(falkordb_url, agent)
    before = snapshot(falkordb_url, worker_running=True)
    off = await parse(http, BLOCKS, agent=LOCKED)
    assert off.status_code == 403 and off.json()["detail"] == WRITES_OFF
    foreign = await http.post(f"/v1/agents/{AGENT}/writes/parse", json={"text": BLOCKS, "namespace": f"user:{OTHER}:alice"})
    assert foreign.status_code == 404 and foreign.json()["detail"].startswith("namespace")
    other_session = await parse(http, BLOCKS, session_id="other-s")
    assert other_session.status_code == 404 and other_session.json()["detail"].startswith("session_id")
    for bad in ({"text": ""}, {"namespace": "nonsense"}, {"message_id": "a/b"}, {"extra": 1}):
        answer = await http.post(f"/v1/agents/{AGENT}/writes/parse",
                                 json={"text": BLOCKS, "namespace": f"user:{AGENT}:alice", **bad})
        assert answer.status_code in (404, 422), (bad, answer.text)
    assert snapshot(falkordb_url, worker_running=True).contents == before.contents


async def test_text_without_blocks_stores_nothing(http):
    answer = await parse(http, "Just an answer, <b>no</b> blocks.")
    assert answer.status_code == 200 and answer.json() == {"blocks": 0, "written": [], "entities": [], "facts": [],
                                                           "superseded": [], "already_stored": [], "redacted": {}}
    assert await audit(http, "memory.write_blocks") == []


async def test_the_same_block_of_the_same_message_is_stored_once(http, falkordb_url):
    await record(http, "s1", "I am allergic to hazelnuts and I live in Lyon.", mid="m1")
    first = await parse(http, BLOCKS, session_id="s1", message_id="m1")
    assert first.status_code == 200 and first.json()["already_stored"] == [], first.text
    ids = [m["id"] for m in first.json()["written"]] + [e["id"] for e in first.json()["entities"]] + \
        [f["id"] for f in first.json()["facts"]]
    assert len(set(ids)) == 1 + 2 + 1
    await wait_embedding_idle(falkordb_url, AGENT)
    before = snapshot(falkordb_url, worker_running=True)

    again = await parse(http, BLOCKS, session_id="s1", message_id="m1")
    assert again.status_code == 200, again.text
    assert again.json()["already_stored"] == ids
    def stored(answer) -> dict:  # served_by says which store answered: only a read has one
        return {**answer.json(), "already_stored": None,
                "written": [{k: v for k, v in m.items() if k != "served_by"} for m in answer.json()["written"]]}
    assert stored(again) == stored(first)  # the memories, entities and facts as stored then, not new copies
    assert snapshot(falkordb_url, worker_running=True).contents == before.contents
    assert [h["content"] for h in await search(http, "hazelnuts", tags=["health"])] == ["Alice is allergic to hazelnuts"]
    assert len(await audit(http, "memory.write_blocks")) == 1  # the repeat changed nothing, so audits nothing


async def test_another_message_block_or_namespace_stores_new_memories(http):
    await record(http, "s1", "I am allergic to hazelnuts.", mid="m1")
    await record(http, "s1", "I said it again.", mid="m2")
    first = (await parse(http, BLOCKS, session_id="s1", message_id="m1")).json()
    other_message = (await parse(http, BLOCKS, session_id="s1", message_id="m2")).json()
    moved = (await parse(http, '<memory_write>{"entities": ["Oslo"]}</memory_write>' + BLOCKS,
                         session_id="s1", message_id="m1")).json()
    elsewhere = (await http.post(f"/v1/agents/{AGENT}/writes/parse", json={
        "text": BLOCKS, "namespace": f"agent:{AGENT}", "session_id": "s1", "message_id": "m1"})).json()
    seen: set[str] = set()
    for answer in (first, other_message, moved, elsewhere):
        ids = {m["id"] for m in answer["written"]}
        assert not ids & seen and not ids & set(answer["already_stored"]), answer
        seen |= ids
    assert len(seen) == 4
    hits = await search(http, "hazelnuts", tags=["health"])
    assert len(hits) == 4  # one copy per message, block position and namespace
    # The graph is one per namespace: another message names the same entities and states the same fact
    # again (already stored, its provenance grown); the agent's namespace has entities of its own.
    graph_ids = [e["id"] for e in first["entities"]] + [f["id"] for f in first["facts"]]
    assert other_message["already_stored"] == graph_ids
    assert other_message["facts"][0]["message_ids"] == ["m1", "m2"]
    assert [e["name"] for e in moved["entities"]] == ["Oslo", "Lyon", "Alice"]
    assert moved["already_stored"] == graph_ids
    assert {e["namespace"] for e in elsewhere["entities"]} == {f"agent:{AGENT}"}
    assert not {e["id"] for e in elsewhere["entities"]} & set(graph_ids)


async def test_a_new_value_supersedes_the_current_one_audited_and_undoable(http):
    for mid, city in (("m1", "Paris"), ("m2", "Lyon")):
        await record(http, "s1", f"I live in {city}.", mid=mid)
        items = [{"kind": "entity", "name": "Alice", "type": "person"},
                 {"kind": "edge", "source": "Alice", "target": city, "rel_type": "lives in", "confidence": 0.9},
                 {"kind": "observation", "name": city, "text": f"{city} is lovely in spring", "tags": ["travel"]}]
        answer = await parse(http, f"ok <shadow_write>{json.dumps(items)}</shadow_write>",
                             session_id="s1", message_id=mid)
        assert answer.status_code == 200, answer.text
        if mid == "m1":
            paris = answer.json()["facts"][0]
    body = answer.json()
    assert [(e["name"], e["type"]) for e in body["entities"]] == [("Alice", "person"), ("Lyon", "place")]
    assert body["superseded"] == [paris["id"]] and body["already_stored"] == [body["entities"][0]["id"]]
    alice = body["entities"][0]["id"]
    history = {f["id"]: f for f in (await http.get(f"/v1/agents/{AGENT}/entities/{alice}",
                                                   params={"include_superseded": "true"})).json()["facts"]}
    assert history[paris["id"]]["superseded_by"] == body["facts"][0]["id"] and not history[paris["id"]]["current"]
    block = await context(http, "where does alice live?")
    assert "Alice lives in Lyon" in block and "Paris" not in block.split("<KnownFacts")[1].split("</KnownFacts>")[0]
    [closed] = await audit(http, "fact.invalidate")
    assert closed["target"] == paris["id"] and closed["after"]["superseded_by"] == body["facts"][0]["id"]
    restored = await http.post(f"/v1/agents/{AGENT}/facts/{paris['id']}/restore")
    assert restored.status_code == 200 and restored.json()["current"], restored.text


async def test_graph_writes_in_a_session_are_refused_whole(http, falkordb_url):
    await record(http, "s1", "hello", mid="m1")
    await wait_embedding_idle(falkordb_url, AGENT)
    before = snapshot(falkordb_url, worker_running=True)
    for text in (BLOCKS, '<memory_write>{"observations": [{"text": "t", "name": "Tom"}]}</memory_write>'):
        answer = await http.post(f"/v1/agents/{AGENT}/writes/parse",
                                 json={"text": text, "namespace": "session:s1", "session_id": "s1"})
        assert answer.status_code == 422 and answer.json()["detail"].startswith("namespace: entities and edges"), \
            answer.text
    assert snapshot(falkordb_url, worker_running=True).contents == before.contents


async def test_a_bad_block_after_a_good_parse_changes_nothing(http, falkordb_url):
    await record(http, "s1", "hello", mid="m1")
    first = await parse(http, BLOCKS, session_id="s1", message_id="m1")
    assert first.status_code == 200, first.text
    await wait_embedding_idle(falkordb_url, AGENT)
    before = snapshot(falkordb_url, worker_running=True)
    bad = await parse(http, BLOCKS + '\n<memory_write>{"observations": [{"text": ""}]}</memory_write>',
                      session_id="s1", message_id="m1")
    assert bad.status_code == 422 and "block 3" in bad.json()["detail"], bad.text
    assert snapshot(falkordb_url, worker_running=True).contents == before.contents


@pytest.fixture(scope="module")
async def mongo_tools_server(falkordb_url, mongo_server_uri):
    settings = suite_settings(falkordb_url, memory_write_agents=["*"]).model_copy(update={
        "mongodb_uri": SecretStr(mongo_server_uri), "mongodb_database": f"ms_test_{uuid.uuid4().hex[:10]}"})
    async with LoopbackServer(create_app(settings, run_worker=True)) as server:
        yield server


async def test_a_mongo_agent_refuses_graph_items_and_stores_nothing(mongo_tools_server, falkordb_url):
    """Chosen: 409 (the Mongo backend keeps no graph), never entities flattened into facts;
    a block of observations alone is stored as on any backend."""
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=mongo_tools_server.base_url, timeout=30) as client:
        assert (await client.put("/v1/agents/mongo-a", json={"memory_backend": "mongo"})).status_code == 200
        before = snapshot(falkordb_url, worker_running=True)
        for text in (BLOCKS, '<memory_write>[{"kind": "observation", "text": "t", "name": "Tom"}]</memory_write>'):
            answer = await client.post("/v1/agents/mongo-a/writes/parse",
                                       json={"text": text, "namespace": "user:mongo-a:alice"})
            assert answer.status_code == 409 and "mongo backend keeps no knowledge graph" in answer.json()["detail"], \
                answer.text
        assert snapshot(falkordb_url, worker_running=True).contents == before.contents
        hits = await client.post("/v1/agents/mongo-a/search", json={"query": "hazelnuts"})
        assert hits.json()["results"] == []
        plain = await client.post("/v1/agents/mongo-a/writes/parse", json={
            "text": '<memory_write>{"observations": [{"text": "Alice is allergic to hazelnuts"}]}</memory_write>',
            "namespace": "user:mongo-a:alice"})
        assert plain.status_code == 200 and len(plain.json()["written"]) == 1 and plain.json()["entities"] == []


async def test_a_store_outage_half_way_is_completed_by_the_retry(settings):
    """The store cut as the facts are written: memories and entities are in, the facts not;
    the same call again writes what is missing (the facts, the mention) and nothing twice."""
    parts = urlsplit(settings.falkordb_url)
    proxy = ThreadedTcpProxy(parts.hostname, parts.port).start()
    proxy.proxy.password = parts.password
    config = settings.model_copy(update={"falkordb_url": proxy.url, "redis_url": settings.falkordb_url,
                                         "memory_write_agents": [AGENT]})
    try:  # memories and graph through the proxy, state on the shared store directly
        async with open_service(config, run_worker=False) as service:
            await service.record_message("s1", msg(AGENT, "alice", "I live in Lyon.", mid="m1"))

            def cut_at_facts(connection: int, direction: str, chunk: bytes) -> bool:
                return not (direction == "up" and b"MERGE (s)-[e:RELATES_TO" in chunk)
            proxy.proxy.tap = cut_at_facts
            with pytest.raises(Exception) as cut:  # noqa: PT011 (the store's client's error: the API answers it 503)
                await service.parse_writes(AGENT, BLOCKS, ALICE_NS, "s1", "m1", actor="k1")
            assert is_unavailable(cut.value), cut.value
            proxy.proxy.tap = None
            url = settings.falkordb_url
            assert graph_rows(url, "MATCH (n:Entity) RETURN n.name ORDER BY n.name") == [[b"Alice"], [b"Lyon"]]
            assert graph_rows(url, "MATCH ()-[e:RELATES_TO]->() RETURN count(e)") == [[0]]
            assert mentions(url) == set()

            retried = await service.parse_writes(AGENT, BLOCKS, ALICE_NS, "s1", "m1", actor="k1")
            [memory] = retried.written
            assert retried.already_stored == [memory.id, *(e.id for e in retried.entities)]  # the fact is new
            assert [f.text for f in retried.facts] == ["Alice lives in Lyon"]
            assert mentions(url) == {(memory.id, "Alice")}
            again = await service.parse_writes(AGENT, BLOCKS, ALICE_NS, "s1", "m1", actor="k1")
            assert again.already_stored == [memory.id, *(e.id for e in again.entities), again.facts[0].id]
            assert graph_rows(url, "MATCH ()-[e:RELATES_TO]->() RETURN count(e)") == [[1]]
    finally:
        proxy.close()
