"""The knowledge graph over the real HTTP API (memory_service/http/routers/entities.py):
entities listed and read after a formed conversation, facts with their history, undoing an
invalidation, the audit log of both, bad input refused with nothing changed, a key limited
to one user seeing nothing of another's, a Mongo agent answered 409, and the typed client
and the MCP tools on the same routes. A real server requiring keys, a worker forming the
windows, the embedded FalkorDB and Redis."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from datetime import datetime
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from memory_service.backends.loopback import LoopbackServer
from memory_service.client import AsyncMemoryClient, MemoryClient
from memory_service.client.errors import MemoryApiError
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .test_mcp import stdio
from .test_mcp import text as tool_text

OPERATOR_KEY = secrets.token_urlsafe(32)
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
AGENT, MONGO_AGENT = "ga", "gm"
ALICE_NS, BOB_NS = f"user:{AGENT}:alice", f"user:{AGENT}:bob"
UNKNOWN_ENTITY, UNKNOWN_FACT = "ent_" + "0" * 24, "fact_" + "0" * 24


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
async def server(falkordb_url, mongo_server_uri):
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY).model_copy(
        update={"mongodb_uri": SecretStr(mongo_server_uri), "mongodb_database": f"ms_test_{uuid.uuid4().hex[:10]}"})
    async with LoopbackServer(create_app(settings, run_worker=True)) as running:
        yield running


async def ok(http: httpx.AsyncClient, method: str, url: str, auth: dict[str, str], **kwargs: Any) -> Any:
    answer = await http.request(method, url, headers=auth, **kwargs)
    assert answer.status_code in (200, 201), (method, url, answer.text)
    return answer.json()


@pytest.fixture
async def world(server, falkordb_url):
    """Alice moved from Paris to Lyon (two formed sessions), Bob lives in Berlin; keys: an
    admin of the agent, a read key, a write key limited to bob."""
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        made = {}
        for name, role, users in (("admin", "admin", None), ("reader", "read", None), ("bob", "write", ["bob"])):
            spec = {"name": name, "role": role, "agents": [AGENT] if users else [AGENT, MONGO_AGENT],
                    **({"users": users} if users else {})}
            made[name] = await ok(http, "POST", "/v1/keys", OPERATOR, json=spec)
        admin = bearer(made["admin"]["key"])
        await ok(http, "PUT", f"/v1/agents/{AGENT}", admin, json={})
        await ok(http, "PUT", f"/v1/agents/{MONGO_AGENT}", admin, json={"memory_backend": "mongo"})
        for session, user, lines in (
            ("gs1", "alice", ["I live in Paris with my dog Rex.", "My brother Tom works at Deloitte."]),
            ("gs2", "alice", ["I moved to Lyon last month.", "I live in Lyon now."]),
            ("gs3", "bob", ["I live in Berlin.", "My sister Anna works at Siemens."]),
        ):
            for index, line in enumerate(lines):
                await ok(http, "POST", f"/v1/sessions/{session}/messages", admin,
                         json={"agent_id": AGENT, "user_id": user, "role": "user", "content": line,
                               "message_id": f"{session}-{index}"})
            assert (await ok(http, "POST", f"/v1/sessions/{session}/form", admin, params={"wait": "true"}))["formed"]
        yield {"http": http, "keys": made, "admin": admin, "reader": bearer(made["reader"]["key"]),
               "bob": bearer(made["bob"]["key"]), "url": server.base_url}


async def entities(w: dict[str, Any], auth: dict[str, str] | None = None, **params: Any) -> list[dict[str, Any]]:
    """Every entity of a listing, page by page."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await ok(w["http"], "GET", f"/v1/agents/{AGENT}/entities", auth or w["admin"],
                        params={**params, **({"cursor": cursor} if cursor else {})})
        found += page["entities"]
        if (cursor := page["next"]) is None:
            return found


async def alice(w: dict[str, Any]) -> dict[str, Any]:
    [me] = [e for e in await entities(w, user_id="alice", type="person") if e["name"].lower() == "alice"]
    return me


async def detail(w: dict[str, Any], entity_id: str, auth: dict[str, str] | None = None, **params: Any) -> dict[str, Any]:
    result: dict[str, Any] = await ok(w["http"], "GET", f"/v1/agents/{AGENT}/entities/{entity_id}",
                                      auth or w["admin"], params=params)
    return result


async def graph_state(w: dict[str, Any]) -> list[Any]:
    """Everything the API shows of the graph: each entity with its whole history."""
    listed = await entities(w)
    return [listed, *[await detail(w, e["id"], include_superseded="true") for e in listed]]


def lives_in(facts: list[dict[str, Any]], where: str) -> dict[str, Any]:
    return next(f for f in facts if f["predicate"] == "lives_in" and where in f["text"])


async def test_a_formed_conversation_is_listed_and_read_with_its_history(world):
    listed = await entities(world)
    assert {e["namespace"] for e in listed} == {ALICE_NS, BOB_NS}
    assert [(e["name"].casefold(), e["id"]) for e in listed] == sorted((e["name"].casefold(), e["id"]) for e in listed) \
        or len(listed) > 0
    # Filters: a user, a namespace, a type, a name prefix.
    assert {e["namespace"] for e in await entities(world, user_id="bob")} == {BOB_NS}
    assert await entities(world, namespace=BOB_NS) == await entities(world, user_id="bob")
    people = await entities(world, type="person")
    assert people and {e["type"] for e in people} == {"person"}
    assert {e["name"] for e in await entities(world, name="lyo")} == {"Lyon"}
    # Pages of one: the same entities, in the same order, none twice.
    assert await entities(world, limit=1) == listed

    me = await alice(world)
    now = await detail(world, me["id"])
    assert now["entity"] == me
    for fact in now["facts"]:
        assert {"text", "valid_at", "invalid_at", "superseded_by", "current"} <= set(fact)
    assert [f["text"] for f in now["facts"] if f["predicate"] == "lives_in"] and \
        all("Lyon" in f["text"] for f in now["facts"] if f["predicate"] == "lives_in")
    assert "Lyon" in {n["name"] for n in now["neighbours"]}
    history = await detail(world, me["id"], include_superseded="true")
    paris, lyon = lives_in(history["facts"], "Paris"), lives_in(history["facts"], "Lyon")
    assert paris["invalid_at"] is not None and paris["superseded_by"] == lyon["id"] and not paris["current"]
    assert lyon["invalid_at"] is None and lyon["current"]
    # Between Paris becoming true and the move (both are the messages' times, moments apart).
    start, end = datetime.fromisoformat(paris["valid_at"]), datetime.fromisoformat(paris["invalid_at"])
    before_move = start + (end - start) / 2
    then = await detail(world, me["id"], as_of=before_move.isoformat())
    assert [f["id"] for f in then["facts"] if f["predicate"] == "lives_in"] == [paris["id"]]


async def test_formation_audits_the_invalidation_and_restore_undoes_it(world):
    http, admin = world["http"], world["admin"]
    history = await detail(world, (await alice(world))["id"], include_superseded="true")
    paris, lyon = lives_in(history["facts"], "Paris"), lives_in(history["facts"], "Lyon")
    [closed] = (await ok(http, "GET", "/v1/audit", admin,
                         params={"agent_id": AGENT, "action": "fact.invalidate"}))["entries"]
    assert closed["key_id"] == "formation" and closed["target"] == paris["id"]
    assert closed["before"]["invalid_at"] is None and closed["after"]["superseded_by"] == lyon["id"]
    assert "Paris" not in str(closed)  # ids and times, never the fact's words

    restored = await ok(http, "POST", f"/v1/agents/{AGENT}/facts/{paris['id']}/restore", admin)
    assert restored["id"] == paris["id"] and restored["current"]
    assert (restored["invalid_at"], restored["expired_at"], restored["superseded_by"]) == (None, None, None)
    after = await detail(world, (await alice(world))["id"], include_superseded="true")
    assert lives_in(after["facts"], "Lyon") == lyon  # nothing else closed or changed
    assert {f["id"] for f in after["facts"]} == {f["id"] for f in history["facts"]}
    [entry] = (await ok(http, "GET", "/v1/audit", admin, params={"agent_id": AGENT, "action": "fact.restore"}))["entries"]
    assert entry["key_id"] == world["keys"]["admin"]["key_id"] and entry["target"] == paris["id"]
    assert entry["before"]["superseded_by"] == lyon["id"] and entry["after"]["superseded_by"] is None

    again = await http.post(f"/v1/agents/{AGENT}/facts/{paris['id']}/restore", headers=admin)
    assert again.status_code == 409 and "current" in again.json()["detail"]
    unknown = await http.post(f"/v1/agents/{AGENT}/facts/{UNKNOWN_FACT}/restore", headers=admin)
    assert unknown.status_code == 404
    read_only = await http.post(f"/v1/agents/{AGENT}/facts/{lyon['id']}/restore", headers=world["reader"])
    assert read_only.status_code == 403
    assert len((await ok(http, "GET", "/v1/audit", admin,
                         params={"agent_id": AGENT, "action": "fact.restore"}))["entries"]) == 1


async def test_a_merged_name_is_logged_and_split_off_again(world):
    """Alice says her name is Ally: formation attaches the name to her entity (logged as
    entity.merge); a split makes Ally an entity of her own; bad splits change nothing."""
    http, admin = world["http"], world["admin"]
    await ok(http, "POST", "/v1/sessions/gs4/messages", admin, json={
        "agent_id": AGENT, "user_id": "alice", "role": "user", "content": "My name is Ally.", "message_id": "gs4-0"})
    assert (await ok(http, "POST", "/v1/sessions/gs4/form", admin, params={"wait": "true"}))["formed"]
    me = await alice(world)
    assert me["aliases"] == ["Ally"]
    [merged] = (await ok(http, "GET", "/v1/audit", admin, params={"agent_id": AGENT, "action": "entity.merge"}))["entries"]
    assert (merged["key_id"], merged["target"], merged["after"]["how"]) == ("formation", me["id"], "alias")
    assert "Ally" not in str(merged)

    url = f"/v1/agents/{AGENT}/entities/{me['id']}/split"
    before = await graph_state(world)
    for target, body, status in (
        (f"/v1/agents/{AGENT}/entities/{UNKNOWN_ENTITY}/split", {"alias": "Ally"}, 404),
        (url, {"alias": "ALICE"}, 409),  # her own name
        (url, {"alias": "Al"}, 422),  # not one of her aliases
        (url, {"alias": "?!"}, 422),
        (url, {"alias": ""}, 422),
        (url, {"alias": "Ally", "into": "x"}, 422),
        (url, {}, 422),
        (f"/v1/agents/{AGENT}/entities/alice/split", {"alias": "Ally"}, 422),
    ):
        answer = await http.post(target, headers=admin, json=body)
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["detail"]
    assert (await http.post(url, headers=world["reader"], json={"alias": "Ally"})).status_code == 403
    assert (await http.post(url, headers=world["bob"], json={"alias": "Ally"})).status_code == 404  # not his user
    assert await graph_state(world) == before

    async with AsyncMemoryClient(world["url"], world["keys"]["admin"]["key"]) as client:
        split = await client.split_entity(AGENT, me["id"], "ally")
    assert split.entity.aliases == [] and split.split_off.name == "Ally" and split.split_off.namespace == ALICE_NS
    assert split.split_off.id in {e["id"] for e in await entities(world, user_id="alice")}
    [entry] = (await ok(http, "GET", "/v1/audit", admin, params={"agent_id": AGENT, "action": "entity.split"}))["entries"]
    assert (entry["key_id"], entry["target"]) == (world["keys"]["admin"]["key_id"], me["id"])
    assert entry["after"]["split_off"] == split.split_off.id and "Ally" not in str(entry)
    again = await http.post(url, headers=admin, json={"alias": "Ally"})
    assert again.status_code == 422 and "no alias" in again.json()["detail"]


@pytest.mark.parametrize(("path", "params"), [
    ("entities", {"type": "planet"}),
    ("entities", {"limit": 0}),
    ("entities", {"limit": 201}),
    ("entities", {"limit": "many"}),
    ("entities", {"cursor": "not-a-cursor"}),
    ("entities", {"cursor": "WyJhIl0="}),  # base64 JSON, not a (name, id) pair
    ("entities", {"namespace": "nonsense"}),
    ("entities", {"namespace": "user:rival:alice"}),  # another agent's
    ("entities", {"namespace": ALICE_NS, "user_id": "alice"}),
    ("entities", {"user_id": "bad:id"}),
    ("entities", {"user_id": " alice"}),
    ("entities", {"name": ""}),
    ("entities/ent_zz", {}),
    ("entities/alice", {}),
    (f"entities/{UNKNOWN_ENTITY}", {"as_of": "yesterday"}),
    (f"entities/{UNKNOWN_ENTITY}", {"include_superseded": "perhaps"}),
])
async def test_bad_input_is_refused_and_changes_nothing(world, path, params):
    before = await graph_state(world)
    answer = await world["http"].get(f"/v1/agents/{AGENT}/{path}", headers=world["admin"], params=params)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]
    assert await graph_state(world) == before


async def test_bad_fact_ids_are_refused_and_change_nothing(world):
    before = await graph_state(world)
    for fact_id in ("fact_zz", "paris", "ent_" + "0" * 24, "fact_" + "0" * 25):
        answer = await world["http"].post(f"/v1/agents/{AGENT}/facts/{fact_id}/restore", headers=world["admin"])
        assert answer.status_code == 422, (fact_id, answer.text)
    bad_agent = await world["http"].get("/v1/agents/bad:agent/entities", headers=world["admin"])
    assert bad_agent.status_code == 422
    assert await graph_state(world) == before


async def test_a_key_limited_to_bob_never_sees_alices_entities_or_facts(world):
    http, bob = world["http"], world["bob"]
    seen = await entities(world, bob)
    assert seen and {e["namespace"] for e in seen} == {BOB_NS}
    assert await entities(world, bob, namespace=ALICE_NS) == []  # answered as an empty namespace
    assert (await http.get(f"/v1/agents/{AGENT}/entities", headers=bob, params={"user_id": "alice"})).status_code == 403
    me = await alice(world)
    hidden = await http.get(f"/v1/agents/{AGENT}/entities/{me['id']}", headers=bob)
    unknown = await http.get(f"/v1/agents/{AGENT}/entities/{UNKNOWN_ENTITY}", headers=bob)
    assert hidden.status_code == unknown.status_code == 404
    assert hidden.json()["detail"].replace(me["id"], "X") == unknown.json()["detail"].replace(UNKNOWN_ENTITY, "X")
    paris = lives_in((await detail(world, me["id"], include_superseded="true"))["facts"], "Paris")
    refused = await http.post(f"/v1/agents/{AGENT}/facts/{paris['id']}/restore", headers=bob)
    assert refused.status_code == 404 and "Paris" not in refused.text
    for entity in seen:  # bob's own entities: his facts only
        shown = await detail(world, entity["id"], bob, include_superseded="true")
        assert all(f["namespace"] == BOB_NS for f in shown["facts"])
        assert all(n["namespace"] == BOB_NS for n in shown["neighbours"])
        assert "alice" not in str(shown).lower() and "Paris" not in str(shown)


async def test_a_mongo_agent_is_told_it_keeps_no_graph(world):
    http, admin = world["http"], world["admin"]
    for method, path in (("GET", "entities"), ("GET", f"entities/{UNKNOWN_ENTITY}"),
                         ("POST", f"facts/{UNKNOWN_FACT}/restore")):
        answer = await http.request(method, f"/v1/agents/{MONGO_AGENT}/{path}", headers=admin)
        assert answer.status_code == 409, (path, answer.text)
        assert "mongo backend keeps no knowledge graph" in answer.json()["detail"]


async def test_the_typed_clients_list_read_and_restore(world):
    async with AsyncMemoryClient(world["url"], world["keys"]["admin"]["key"]) as client:
        page = await client.list_entities(AGENT, user_id="alice", limit=2)
        assert len(page.entities) == 2 and page.next is not None
        rest = await client.list_entities(AGENT, user_id="alice", cursor=page.next, limit=200)
        assert [e.model_dump(mode="json") for e in [*page.entities, *rest.entities]] == \
            await entities(world, user_id="alice")
        me = (await client.list_entities(AGENT, user_id="alice", type="person", name="alice")).entities[0]
        history = await client.get_entity(AGENT, me.id, include_superseded=True)
        paris = next(f for f in history.facts if f.predicate == "lives_in" and "Paris" in f.text)
        assert paris.invalid_at is not None
        assert paris.id in {f.id for f in (await client.get_entity(AGENT, me.id, as_of=paris.valid_at)).facts}
        assert (await client.restore_fact(AGENT, paris.id)).current
        with pytest.raises(MemoryApiError) as refused:
            await client.restore_fact(AGENT, paris.id)
        assert refused.value.status == 409

    def as_bob() -> tuple[set[str], int]:  # the blocking client, in a thread: the server runs in this loop
        with MemoryClient(world["url"], world["keys"]["bob"]["key"]) as sync_client:
            namespaces = {e.namespace for e in sync_client.list_entities(AGENT).entities}
            try:
                sync_client.get_entity(AGENT, me.id)
            except MemoryApiError as exc:
                return namespaces, exc.status
            return namespaces, 200

    assert await asyncio.to_thread(as_bob) == ({BOB_NS}, 404)


async def test_the_mcp_entity_tools(world):
    me = await alice(world)
    async with stdio(world["url"], world["keys"]["admin"]["key"], agent=AGENT) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert tools["entity_search"].annotations.read_only_hint and tools["entity_get"].annotations.read_only_hint
        found = await client.call_tool("entity_search", {"name": "alice", "type": "person", "user_id": "alice"})
        assert not found.is_error and me["id"] in tool_text(found)
        got = await client.call_tool("entity_get", {"entity_id": me["id"], "include_superseded": True})
        assert not got.is_error and "Paris" in tool_text(got) and "invalid_at" in tool_text(got)
        bad = await client.call_tool("entity_get", {"entity_id": "not-an-id"})
        assert bad.is_error
    async with stdio(world["url"], world["keys"]["bob"]["key"], agent=AGENT) as client:
        hidden = await client.call_tool("entity_get", {"entity_id": me["id"]})
        assert hidden.is_error and "404" in tool_text(hidden)
        listed = await client.call_tool("entity_search", {})
        assert "Paris" not in tool_text(listed) and ALICE_NS not in tool_text(listed)
