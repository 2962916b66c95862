"""Every answer is bounded: a hub entity (thousands of facts, built with write-block requests
as an attacker holding a write key would) is read one page at a time, by a read key, over
the real HTTP API: the default page and the largest page are small answers whatever the
entity's degree, the totals count every fact and neighbour, and the pages walk every fact
exactly once (and, together, every neighbour), for a key of all users and one limited to
the hub's user; a key of another user reads it as unknown. Every list route refuses a page
above its maximum. A real server requiring keys, embedded FalkorDB and Redis. (How long a
page takes is bench/'s: bench/entity_pages.py.)"""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.client import AsyncMemoryClient
from memory_service.http.app import create_app
from memory_service.schemas.graph import DEFAULT_FACT_PAGE, MAX_FACT_PAGE

from .conftest import flush, suite_settings

OPERATOR_KEY = secrets.token_urlsafe(32)
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
AGENT = "hub"
REQUESTS, BLOCKS, EDGES = 8, 4, 99  # 3,168 facts, as the attack's 10 requests of 396 built 3,960
FACTS = REQUESTS * BLOCKS * EDGES


def hub_text(request: int) -> str:
    """One write-block request: BLOCKS blocks of EDGES edges from 'Hub' to new entities."""
    blocks = []
    for b in range(BLOCKS):
        edges = [{"source": "Hub", "target": f"T{request}x{b}x{i}", "rel_type": "knows"} for i in range(EDGES)]
        blocks.append(f"<memory_write>{json.dumps({'edges': edges}, separators=(',', ':'))}</memory_write>")
    return "\n".join(blocks)


@pytest.fixture(scope="module")
async def hub(falkordb_url):
    """The server and its keys, with Hub in alice's namespace linked to FACTS entities."""
    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY, memory_write_agents=["*"])
    async with LoopbackServer(create_app(settings)) as server, \
            httpx.AsyncClient(base_url=server.base_url, headers=OPERATOR, timeout=300) as http:
        keys = {}
        for name, spec in (("reader", {"role": "read", "agents": [AGENT]}),
                           ("alice", {"role": "read", "agents": [AGENT], "users": ["alice"]}),
                           ("bob", {"role": "read", "agents": [AGENT], "users": ["bob"]})):
            made = await http.post("/v1/keys", json={"name": name, **spec})
            assert made.status_code == 201, made.text
            keys[name] = {"Authorization": f"Bearer {made.json()['key']}"}
        assert (await http.put(f"/v1/agents/{AGENT}", json={})).status_code == 200
        for request in range(REQUESTS):
            answer = await http.post(f"/v1/agents/{AGENT}/writes/parse",
                                     json={"text": hub_text(request), "namespace": f"user:{AGENT}:alice"})
            assert answer.status_code == 200, answer.text
        listed = await http.get(f"/v1/agents/{AGENT}/entities", params={"user_id": "alice", "name": "hub"})
        [entity] = [e for e in listed.json()["entities"] if e["name"] == "Hub"]
        yield {"http": http, "keys": keys, "id": entity["id"], "url": server.base_url}


async def read(hub: dict[str, Any], key: str, **params: Any) -> httpx.Response:
    return await hub["http"].get(f"/v1/agents/{AGENT}/entities/{hub['id']}", headers=hub["keys"][key], params=params)


async def walk(hub: dict[str, Any], key: str, **params: Any) -> tuple[list[str], set[str], list[dict[str, Any]]]:
    """Every page of the hub's facts: the fact ids in order, the neighbours' ids, the pages."""
    facts: list[str] = []
    neighbours: set[str] = set()
    pages: list[dict[str, Any]] = []
    cursor = None
    for _ in range(FACTS + 1):
        answer = await read(hub, key, **params, **({"cursor": cursor} if cursor else {}))
        assert answer.status_code == 200, answer.text
        page = answer.json()
        pages.append(page)
        facts += [f["id"] for f in page["facts"]]
        neighbours |= {n["id"] for n in page["neighbours"]}
        if (cursor := page["next"]) is None:
            return facts, neighbours, pages
    raise AssertionError("the pages never ended")


async def test_a_hub_entity_is_read_in_small_pages(hub):
    first = await read(hub, "reader")
    assert first.status_code == 200, first.text
    page = first.json()
    assert len(page["facts"]) == DEFAULT_FACT_PAGE and page["next"]
    assert page["facts_total"] == FACTS and page["neighbours_total"] == FACTS
    assert len(page["neighbours"]) == DEFAULT_FACT_PAGE  # each fact of the page links one entity
    assert len(first.content) < 40_000, len(first.content)  # the whole entity was 1.9 MB
    widest = await read(hub, "reader", limit=MAX_FACT_PAGE)
    assert len(widest.json()["facts"]) == MAX_FACT_PAGE and len(widest.content) < 160_000, len(widest.content)
    too_wide = await read(hub, "reader", limit=MAX_FACT_PAGE + 1)
    assert too_wide.status_code == 422 and "limit" in too_wide.text


@pytest.mark.parametrize("key", ["reader", "alice"])
async def test_the_pages_walk_every_fact_exactly_once(hub, key):
    facts, neighbours, pages = await walk(hub, key, limit=MAX_FACT_PAGE)
    assert len(facts) == len(set(facts)) == FACTS
    assert len(neighbours) == FACTS
    assert all(p["facts_total"] == FACTS and p["neighbours_total"] == FACTS for p in pages)
    assert all(len(p["facts"]) == MAX_FACT_PAGE for p in pages[:-1]) and len(pages) == -(-FACTS // MAX_FACT_PAGE)
    created = [f["created_at"] for p in pages for f in p["facts"]]
    assert created == sorted(created)  # oldest first, across pages


async def test_another_users_key_reads_the_hub_as_unknown(hub):
    answer = await read(hub, "bob")
    assert answer.status_code == 404, answer.text


async def test_the_typed_client_follows_the_pages(hub):
    async with AsyncMemoryClient(hub["url"], hub["keys"]["reader"]["Authorization"].split()[1]) as client:
        page = await client.get_entity(AGENT, hub["id"])
        assert len(page.facts) == DEFAULT_FACT_PAGE and page.facts_total == FACTS and page.next
        ids = [f.id async for f in client.iter_facts(AGENT, hub["id"], page_size=MAX_FACT_PAGE)]
    assert len(ids) == len(set(ids)) == FACTS


@pytest.mark.parametrize(("path", "limit"), [
    ("/v1/agents", 201), (f"/v1/agents/{AGENT}/users", 201), (f"/v1/agents/{AGENT}/sessions", 201),
    (f"/v1/agents/{AGENT}/memories", 201), (f"/v1/agents/{AGENT}/entities", 201),
    (f"/v1/agents/{AGENT}/entities/ent_{'0' * 24}", MAX_FACT_PAGE + 1), ("/v1/audit", 1001),
])
async def test_every_list_refuses_a_page_above_its_maximum(hub, path, limit):
    answer = await hub["http"].get(path, params={"limit": limit})
    assert answer.status_code == 422 and "limit" in answer.text, (path, answer.text)


async def test_a_search_naming_the_hub_reads_only_its_newest_facts(hub, falkordb_url):
    """The graph signal and the memory block read at most FACTS_PER_ENTITY facts of an entity
    (the newest, chosen in the store), not the hub's thousands; search and the block still answer."""
    from memory_service.backends.graph import GraphBackend
    from memory_service.recall.graph_signal import FACTS_PER_ENTITY, query_graph

    backend = GraphBackend(falkordb_url, suite_settings(falkordb_url))
    await backend.start()
    try:
        found = await query_graph(backend, AGENT, None, ["hub"])
        every = await backend.current_facts(AGENT, f"user:{AGENT}:alice", [hub["id"]])
    finally:
        await backend.close()
    assert [e.id for e in found.entities] == [hub["id"]]
    assert len(every) == FACTS and len(found.facts) == FACTS_PER_ENTITY < FACTS
    newest = sorted(every, key=lambda f: (f.created_at, f.id))[-FACTS_PER_ENTITY:]
    assert {f.id for f in found.facts} == {f.id for f in newest}
    searched = await hub["http"].get("/v1/search", headers=hub["keys"]["reader"],
                                     params={"agent_id": AGENT, "query": "who does Hub know", "scope": "agent"})
    assert searched.status_code == 200, searched.text
    block = await hub["http"].get("/v1/context", headers=hub["keys"]["alice"],
                                  params={"agent_id": AGENT, "user_id": "alice", "session_id": "s-new",
                                          "query": "who does Hub know"})
    assert block.status_code == 200, block.text
