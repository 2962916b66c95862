"""Access control over every route: the routes come from the OpenAPI schema, so a route
added without a decision here fails the suite. Each is called with no key, malformed keys,
a wrong secret, a revoked key, another agent's key and each role below the one it needs:
each answer is 401/403 (404 for a session out of reach) with no data, and nothing stored
changes; the role it needs then succeeds. A real server, real Redis and FalkorDB."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.domain.graph import EntityType, ExtractedEntity, ExtractedFact
from memory_service.formation.graph_update import apply
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .store_state import snapshot

OPERATOR_KEY = secrets.token_urlsafe(32)
AGENT, OTHER = "acme", "rival"
# Words only agent AGENT's data holds: no refused answer may carry one of them.
PRIVATE = ("pelican", "Flights-Secret", "Bo.", "Lyon")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


OPERATOR = bearer(OPERATOR_KEY)


@pytest.fixture(scope="module")
async def keyed_server(falkordb_url):
    """A server that requires keys (no worker: nothing writes on its own during a comparison)."""
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY,
                              memory_write_agents=[AGENT, OTHER])
    app = create_app(settings, run_worker=False)
    async with LoopbackServer(app) as server:
        server.state = app.state  # type: ignore[attr-defined]  # the fixture writes a graph through the service
        yield server


@dataclass
class Keys:
    read: str
    write: str
    admin: str
    other_admin: str  # admin of OTHER
    revoked: str
    bob_writer: str  # write on AGENT for user bob only
    ids: dict[str, str] = field(default_factory=dict)


async def make_key(http: httpx.AsyncClient, auth: dict[str, str], **spec: Any) -> dict[str, Any]:
    answer = await http.post("/v1/keys", headers=auth, json={"name": "test", **spec})
    assert answer.status_code == 201, answer.text
    return answer.json()


@pytest.fixture
async def world(keyed_server, falkordb_url):
    """Two agents with data, and keys of each kind."""
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=keyed_server.base_url, timeout=30) as http:
        made = {name: await make_key(http, OPERATOR, role=role, agents=[agent], **extra) for name, role, agent, extra in [
            ("read", "read", AGENT, {}), ("write", "write", AGENT, {}), ("admin", "admin", AGENT, {}),
            ("other_admin", "admin", OTHER, {}), ("revoked", "admin", AGENT, {}),
            ("bob_writer", "write", AGENT, {"users": ["bob"]}),
        ]}
        assert (await http.delete(f"/v1/keys/{made['revoked']['key_id']}", headers=OPERATOR)).status_code == 200
        keys = Keys(**{name: m["key"] for name, m in made.items()}, ids={name: m["key_id"] for name, m in made.items()})
        admin = bearer(keys.admin)
        for method, url, body in [
            ("PUT", f"/v1/agents/{AGENT}", {"agent_extras": {"note": "pelican"}}),
            ("PUT", f"/v1/agents/{AGENT}/shards/travel", {"name": "Flights-Secret"}),
            ("PUT", f"/v1/agents/{AGENT}/startup/rules", {"priority": "P1", "title": "Rules",
                                                          "content": "Never mention the pelican."}),
            ("POST", "/v1/sessions/alice-s1/messages", {"agent_id": AGENT, "user_id": "alice", "role": "user",
                                                        "content": "I keep a pelican named Bo.", "message_id": "m1"}),
            ("PUT", f"/v1/agents/{OTHER}", {}),
            ("POST", "/v1/sessions/rival-s1/messages", {"agent_id": OTHER, "user_id": "carol", "role": "user",
                                                        "content": "Hello there.", "message_id": "r1"}),
        ]:
            auth = bearer(keys.other_admin) if OTHER in url or body.get("agent_id") == OTHER else admin
            answer = await http.request(method, url, json=body, headers=auth)
            assert answer.status_code in (200, 201), answer.text
        memory = await http.post(f"/v1/agents/{AGENT}/memories", headers=admin, json={
            "namespace": f"user:{AGENT}:alice", "kind": "observation", "content": "Bo the pelican sleeps at noon."})
        assert memory.status_code == 201, memory.text
        keys.ids["memory"] = memory.json()["id"]
        keys.ids.update(await alice_moved(keyed_server.state.service))
        hook = await http.put(f"/v1/agents/{AGENT}/webhooks/h1", headers=admin,
                              json={"url": "https://93.184.215.14/hook", "secret": "pelican-secret-000"})
        assert hook.status_code == 201, hook.text  # no worker runs here: nothing is sent to it
        keys.ids["dead"] = await dead_letter(keyed_server.state.service)
        yield http, keys


async def alice_moved(service: Any) -> dict[str, str]:
    """Alice's part of AGENT's knowledge graph, written as formation writes it: she lived in
    Paris, then in Lyon (the Paris fact closed); she is also called Ally (an alias a split
    takes off). The ids of her entity and of the closed fact."""
    alice = f"user:{AGENT}:alice"
    _, backend = await service.agents.backend_for(AGENT)
    entities = [ExtractedEntity(name=n, type=t, namespace=alice, aliases=["Ally"] if n == "Alice" else []) for n, t in
                (("Alice", EntityType.PERSON), ("Paris", EntityType.PLACE), ("Lyon", EntityType.PLACE))]
    for year, city in ((2020, "Paris"), (2024, "Lyon")):
        fact = ExtractedFact(subject="Alice", predicate="lives_in", object=city, text=f"Alice lives in {city}",
                             valid_at=datetime(year, 1, 1, tzinfo=UTC), namespace=alice)
        changes = await apply(backend, AGENT, entities, [fact], [])
    (closed,) = changes.superseded
    (person,) = [e for e in (await backend.find_entities(AGENT, alice, ["alice"]))]
    return {"entity": person.id, "fact": closed}


async def dead_letter(service: Any) -> str:
    """A dead letter of AGENT's webhook h1 (as the worker's delivery leaves one); its event id."""
    from memory_service.state import keyspace

    (event,) = (await service.events.read(AGENT, "0-0", 1))
    letter = {"event": event.model_dump(mode="json"), "attempts": 8, "error": "HTTP 500",
              "dead_at": datetime.now(UTC).isoformat()}
    await service.state.redis.hset(keyspace.webhook_dead(AGENT, "h1"), event.id, json.dumps(letter))
    return str(event.id)


@dataclass
class Case:
    method: str
    url: str
    needs: str  # "public", "read", "write", "admin" (over AGENT) or "operator"
    json: Any = None
    params: dict[str, Any] | None = None
    out_of_reach: int = 403  # the answer to another agent's key
    ok: tuple[int, ...] = (200,)
    lists_reach: bool = False  # a list any key may read: it answers what the key reaches (no refusal by scope)
    lists_users: bool = False  # a key for some users is answered with theirs (test_lists_show_only_what_a_key_reaches)


def cases(keys: Keys) -> dict[tuple[str, str], Case]:
    """The decision for each route of the OpenAPI schema, on AGENT's data."""
    message = {"agent_id": AGENT, "user_id": "alice", "role": "user", "content": "Another line.", "message_id": "m9"}
    search = {"agent_id": AGENT, "query": "pelican"}
    memory = f"/v1/agents/{AGENT}/memories/{keys.ids.get('memory', 'none')}"
    written = {"namespace": f"user:{AGENT}:alice", "kind": "fact", "content": "Pelicans eat fish."}
    return {
        ("GET", "/v1/agents/{agent_id}/memories/{memory_id}"): Case("GET", memory, "read"),
        ("POST", "/v1/agents/{agent_id}/memories"): Case("POST", f"/v1/agents/{AGENT}/memories", "write", written,
                                                          ok=(201,)),
        ("PATCH", "/v1/agents/{agent_id}/memories/{memory_id}"): Case("PATCH", memory, "write", {"title": "Bo"}),
        ("DELETE", "/v1/agents/{agent_id}/memories/{memory_id}"): Case("DELETE", memory, "write"),
        ("POST", "/v1/agents/{agent_id}/memories/{memory_id}/undelete"): Case("POST", f"{memory}/undelete", "write"),
        # Corrected then undone, if the correction ran first (else there is nothing to undo: 409).
        ("POST", "/v1/agents/{agent_id}/memories/{memory_id}/correct"): Case(
            "POST", f"{memory}/correct", "write", {"content": "Pelicans eat fish, and crabs."}),
        ("POST", "/v1/agents/{agent_id}/memories/{memory_id}/uncorrect"): Case("POST", f"{memory}/uncorrect", "write",
                                                                               ok=(200, 409)),
        # Forgotten (soft: undoable) if the memory is still there to forget; re-formation by an admin, as a dry run.
        ("POST", "/v1/agents/{agent_id}/memories/{memory_id}/forget"): Case("POST", f"{memory}/forget", "write",
                                                                            {"mode": "soft"}, ok=(200, 409)),
        ("POST", "/v1/agents/{agent_id}/reform"): Case("POST", f"/v1/agents/{AGENT}/reform", "admin", {"dry_run": True}),
        ("POST", "/v1/sessions/{session_id}/messages"): Case("POST", "/v1/sessions/alice-s1/messages", "write", message),
        ("POST", "/v1/agents/{agent_id}/messages/batch"): Case(
            "POST", f"/v1/agents/{AGENT}/messages/batch", "write",
            {"messages": [{k: v for k, v in message.items() if k != "agent_id"} | {"session_id": "alice-s1"}]}),
        ("POST", "/v1/sessions/{session_id}/form"): Case("POST", "/v1/sessions/alice-s1/form", "write",
                                                         params={"wait": "false"}, out_of_reach=404),
        ("GET", "/v1/sessions/{session_id}"): Case("GET", "/v1/sessions/alice-s1", "read", out_of_reach=404),
        ("GET", "/v1/context"): Case("GET", "/v1/context", "read",
                                     params={"agent_id": AGENT, "user_id": "alice", "session_id": "alice-s1"}),
        ("GET", "/v1/search"): Case("GET", "/v1/search", "read", params=search),
        ("POST", "/v1/agents/{agent_id}/search"): Case("POST", f"/v1/agents/{AGENT}/search", "read", {"query": "pelican"}),
        ("PUT", "/v1/agents/{agent_id}"): Case("PUT", f"/v1/agents/{AGENT}", "admin", {"agent_extras": {"x": 1}}),
        ("GET", "/v1/agents/{agent_id}"): Case("GET", f"/v1/agents/{AGENT}", "read"),
        ("GET", "/v1/agents/{agent_id}/usage"): Case("GET", f"/v1/agents/{AGENT}/usage", "read"),
        ("PUT", "/v1/agents/{agent_id}/shards/{shard_id}"): Case("PUT", f"/v1/agents/{AGENT}/shards/travel", "admin",
                                                                  {"name": "renamed"}),
        ("GET", "/v1/agents/{agent_id}/shards"): Case("GET", f"/v1/agents/{AGENT}/shards", "read"),
        ("GET", "/metrics"): Case("GET", "/metrics", "operator"),
        ("GET", "/health/live"): Case("GET", "/health/live", "public"),
        ("GET", "/health"): Case("GET", "/health", "public"),
        ("POST", "/v1/keys"): Case("POST", "/v1/keys", "admin", {"name": "n", "role": "read", "agents": [AGENT]},
                                   ok=(201,)),
        ("GET", "/v1/keys"): Case("GET", "/v1/keys", "admin", out_of_reach=200),  # lists the caller's own keys
        ("DELETE", "/v1/keys/{key_id}"): Case("DELETE", f"/v1/keys/{keys.ids['read']}", "admin", out_of_reach=404),
        ("POST", "/v1/agents/{agent_id}/writes/parse"): Case(
            "POST", f"/v1/agents/{AGENT}/writes/parse", "write",
            {"text": '<memory_write>{"observations": [{"text": "a"}]}</memory_write>', "namespace": f"user:{AGENT}:alice"}),
        ("GET", "/v1/audit"): Case("GET", "/v1/audit", "admin", params={"agent_id": AGENT}),
        ("DELETE", "/v1/agents/{agent_id}/users/{user_id}"): Case("DELETE", f"/v1/agents/{AGENT}/users/alice", "admin"),
        ("GET", "/v1/agents/{agent_id}/users/{user_id}/export"): Case("GET", f"/v1/agents/{AGENT}/users/alice/export",
                                                                      "admin"),
        ("PUT", "/v1/agents/{agent_id}/startup/{record_id}"): Case(
            "PUT", f"/v1/agents/{AGENT}/startup/soul", "admin", {"priority": "P0", "title": "Soul", "content": "kind"},
            ok=(200, 201)),
        ("GET", "/v1/agents/{agent_id}/startup"): Case("GET", f"/v1/agents/{AGENT}/startup", "read"),
        ("DELETE", "/v1/agents/{agent_id}/startup/{record_id}"): Case("DELETE", f"/v1/agents/{AGENT}/startup/rules",
                                                                      "admin"),
        ("GET", "/v1/agents/{agent_id}/entities"): Case("GET", f"/v1/agents/{AGENT}/entities", "read",
                                                        params={"user_id": "alice"}),
        ("GET", "/v1/agents/{agent_id}/entities/{entity_id}"): Case(
            "GET", f"/v1/agents/{AGENT}/entities/{keys.ids.get('entity', 'none')}", "read"),
        ("POST", "/v1/agents/{agent_id}/facts/{fact_id}/restore"): Case(
            "POST", f"/v1/agents/{AGENT}/facts/{keys.ids.get('fact', 'none')}/restore", "write"),
        ("POST", "/v1/agents/{agent_id}/entities/{entity_id}/split"): Case(
            "POST", f"/v1/agents/{AGENT}/entities/{keys.ids.get('entity', 'none')}/split", "write",
            json={"alias": "Ally"}),
        ("GET", "/v1/agents"): Case("GET", "/v1/agents", "read", lists_reach=True),
        ("GET", "/v1/agents/{agent_id}/users"): Case("GET", f"/v1/agents/{AGENT}/users", "read", lists_users=True),
        ("GET", "/v1/agents/{agent_id}/sessions"): Case("GET", f"/v1/agents/{AGENT}/sessions", "read",
                                                        params={"user_id": "alice"}),
        ("GET", "/v1/agents/{agent_id}/memories"): Case("GET", f"/v1/agents/{AGENT}/memories", "read",
                                                        params={"user_id": "alice"}),
        ("GET", "/v1/agents/{agent_id}/memories/{memory_id}/detail"): Case("GET", f"{memory}/detail", "read"),
        ("GET", "/v1/agents/{agent_id}/events"): Case("GET", f"/v1/agents/{AGENT}/events", "read", lists_users=True,
                                                      params={"after": "0-0", "timeout": 0.2}),
        ("GET", "/v1/agents/{agent_id}/webhooks"): Case("GET", f"/v1/agents/{AGENT}/webhooks", "admin"),
        ("PUT", "/v1/agents/{agent_id}/webhooks/{webhook_id}"): Case(
            "PUT", f"/v1/agents/{AGENT}/webhooks/h2", "admin",
            {"url": "https://93.184.215.14/hook", "secret": "pelican-secret-000"}, ok=(200, 201)),
        ("GET", "/v1/agents/{agent_id}/webhooks/{webhook_id}"): Case("GET", f"/v1/agents/{AGENT}/webhooks/h1", "admin"),
        ("DELETE", "/v1/agents/{agent_id}/webhooks/{webhook_id}"): Case("DELETE", f"/v1/agents/{AGENT}/webhooks/h1",
                                                                        "admin", ok=(204,)),
        ("GET", "/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters"): Case(
            "GET", f"/v1/agents/{AGENT}/webhooks/h1/dead-letters", "admin"),
        ("POST", "/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}/replay"): Case(
            "POST", f"/v1/agents/{AGENT}/webhooks/h1/dead-letters/{keys.ids.get('dead', '1-0')}/replay", "admin",
            ok=(202,)),
        ("DELETE", "/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}"): Case(
            "DELETE", f"/v1/agents/{AGENT}/webhooks/h1/dead-letters/{keys.ids.get('dead', '1-0')}", "admin", ok=(204,)),
        ("GET", "/v1/agents/{agent_id}/startup/block"): Case(
            "GET", f"/v1/agents/{AGENT}/startup/block", "read",
            params={"session_id": "alice-s1", "mode": "first-run", "model": "gpt-4o-mini"}),
    }


def openapi_routes(spec: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, methods in spec["paths"].items() for method in methods}


async def test_every_route_has_an_access_decision(world):
    http, keys = world
    spec = (await http.get("/openapi.json")).json()
    assert openapi_routes(spec) == set(cases(keys)), "a route was added or removed: decide who may call it here"


# Routes the OpenAPI schema leaves out, by decision: FastAPI's docs, and the web inspector's
# static page and files (memory_service/http/inspector), which hold no data: the page calls the
# API above with the key typed into it. Each is public and the same for every caller.
OUTSIDE_THE_SCHEMA = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc",
                      "/inspector", "/inspector/", "/inspector/static"}


def route_paths(routes: Any) -> set[str]:
    """Every path the app routes, through the routers it included (none has a prefix)."""
    found: set[str] = set()
    for route in routes:
        if hasattr(route, "original_router"):  # FastAPI's included router
            found |= route_paths(route.original_router.routes)
        else:
            found.add(route.path)
    return found


async def test_every_route_outside_the_schema_is_decided_and_holds_no_data(world, falkordb_url):
    http, keys = world
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY, inspector="on")
    app = create_app(settings, run_worker=False)
    spec = app.openapi()
    outside = {path for path in route_paths(app.routes) if path not in spec["paths"]}
    assert outside == OUTSIDE_THE_SCHEMA, "a route outside the OpenAPI schema was added: decide who may call it here"
    async with LoopbackServer(app) as server, httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        for path in ("/inspector", "/inspector/", "/inspector/static/inspector.js"):
            answers = [await client.get(path, headers=headers) for headers in
                       ({}, OPERATOR, bearer(keys.read), bearer(keys.other_admin), bearer("msk_nothex_abc"))]
            assert {a.status_code for a in answers} == {200}, path
            assert len({a.content for a in answers}) == 1, f"{path} differs by caller"
            assert not any(word.lower() in answers[0].text.lower() for word in PRIVATE), path


def refusals(case: Case, keys: Keys) -> list[tuple[str, dict[str, str], set[int]]]:
    """Each caller that must be refused, its headers and the answers allowed."""
    wrong_secret = keys.admin.rsplit("_", 1)[0] + "_" + secrets.token_urlsafe(32)
    unauthenticated = [
        ("no key", {}, {401}),
        ("not bearer", {"Authorization": f"Basic {keys.admin}"}, {401}),
        ("bare scheme", {"Authorization": "Bearer"}, {401}),
        ("malformed", bearer("msk_nothex_abc"), {401}),
        ("garbage", bearer("x" * 300), {401}),
        ("wrong secret", bearer(wrong_secret), {401}),
        ("revoked", bearer(keys.revoked), {401}),
    ]
    if case.needs == "public":
        return []
    found = list(unauthenticated)
    if case.lists_reach:
        return found
    if case.out_of_reach != 200:
        found.append(("another agent's admin", bearer(keys.other_admin), {case.out_of_reach}))
    ranks = ["read", "write", "admin", "operator"]
    for role in ranks[: ranks.index(case.needs)]:
        found.append((f"role {role}", bearer(getattr(keys, role)), {403}))
    if case.needs in ("read", "write") and not case.lists_users:
        found.append(("a key for another user", bearer(keys.bob_writer), {403, 404}))
    return found


def allowed_key(case: Case, keys: Keys) -> dict[str, str]:
    if case.needs == "public":
        return {}
    return OPERATOR if case.needs == "operator" else bearer(getattr(keys, case.needs))


@pytest.mark.parametrize("route", list(cases(Keys("", "", "", "", "", "", {"read": "k"}))), ids=" ".join)
async def test_route_refuses_every_caller_without_the_right(world, falkordb_url, route):
    http, keys = world
    case = cases(keys)[route]
    # Counting the compared keys only: FalkorDB writes its query logs (telemetry{<graph>})
    # in the background, after the set-up's writes.
    before = snapshot(falkordb_url, worker_running=True)
    for who, headers, statuses in refusals(case, keys):
        answer = await http.request(case.method, case.url, json=case.json, params=case.params, headers=headers)
        assert answer.status_code in statuses, f"{who}: {answer.status_code} {answer.text}"
        body = answer.json()
        assert set(body) == {"detail"}, f"{who}: a refusal carries data: {body}"
        assert not any(word.lower() in answer.text.lower() for word in PRIVATE), f"{who}: {answer.text}"
        if answer.status_code == 401:
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    after = snapshot(falkordb_url, worker_running=True)
    assert after == before, before.changes(after)
    answer = await http.request(case.method, case.url, json=case.json, params=case.params,
                                headers=allowed_key(case, keys))
    assert answer.status_code in case.ok, answer.text


async def test_a_key_reaches_only_its_agents_keys_and_audit(world):
    http, keys = world
    listed = (await http.get("/v1/keys", headers=bearer(keys.other_admin))).json()
    assert {k["key_id"] for k in listed} == {keys.ids["other_admin"]}
    assert all("key" not in k for k in listed)  # never a secret
    mine = {k["key_id"] for k in (await http.get("/v1/keys", headers=bearer(keys.admin))).json()}
    assert keys.ids["other_admin"] not in mine and {keys.ids["read"], keys.ids["bob_writer"]} <= mine
    # An agent's admin cannot make a key beyond its agent, an operator key, or a key above its role.
    for spec in ({"role": "read", "agents": [OTHER]}, {"role": "read"}, {"role": "admin", "agents": [AGENT, OTHER]}):
        refused = await http.post("/v1/keys", headers=bearer(keys.admin), json={"name": "n", **spec})
        assert refused.status_code == 403, refused.text
    refused = await http.post("/v1/keys", headers=bearer(keys.bob_writer), json={"name": "n", "role": "read",
                                                                                 "agents": [AGENT], "users": ["bob"]})
    assert refused.status_code == 403  # a write key makes no keys
    assert (await http.get("/v1/audit", headers=bearer(keys.admin))).status_code == 403  # the system log: operators


async def test_a_key_for_some_users_reaches_only_them(world):
    http, keys = world
    bob = bearer(keys.bob_writer)
    line = {"agent_id": AGENT, "user_id": "bob", "role": "user", "content": "Bob likes kites.", "message_id": "b1"}
    assert (await http.post("/v1/sessions/bob-s1/messages", json=line, headers=bob)).status_code == 200
    as_alice = await http.post("/v1/sessions/bob-s1/messages", json={**line, "user_id": "alice", "message_id": "b2"},
                               headers=bob)
    assert as_alice.status_code == 403 and "'alice' is not one of them" in as_alice.json()["detail"]
    ctx = await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "bob", "session_id": "bob-s1"}, headers=bob)
    assert ctx.status_code == 200
    assert (await http.get("/v1/sessions/bob-s1", headers=bob)).status_code == 200
    assert (await http.get("/v1/sessions/alice-s1", headers=bob)).status_code == 404  # bob never spoke there
    user_search = await http.get("/v1/search", headers=bob, params={"agent_id": AGENT, "query": "kites", "scope": "user",
                                                                    "user_id": "bob"})
    assert user_search.status_code == 200
    for scope in ({"scope": "agent"}, {"scope": "user", "user_id": "alice"}):
        found = await http.get("/v1/search", headers=bob, params={"agent_id": AGENT, "query": "pelican", **scope})
        assert found.status_code == 403, (scope, found.text)
    # Shared knowledge is every user's (tests/test_user_confinement.py tries the rest).
    shard = await http.get("/v1/search", headers=bob, params={"agent_id": AGENT, "query": "pelican", "scope": "shard",
                                                              "shard_id": "travel"})
    assert shard.status_code == 200, shard.text


async def test_lists_show_only_what_a_key_reaches(world):
    http, keys = world
    agents = (await http.get("/v1/agents", headers=bearer(keys.other_admin))).json()["agents"]
    assert [a["agent_id"] for a in agents] == [OTHER]
    everyone = (await http.get("/v1/agents", headers=OPERATOR)).json()["agents"]
    assert [a["agent_id"] for a in everyone] == [AGENT, OTHER]
    bob = bearer(keys.bob_writer)
    assert [u["user_id"] for u in (await http.get(f"/v1/agents/{AGENT}/users", headers=bob)).json()["users"]] == ["bob"]
    assert [u["user_id"] for u in (await http.get(f"/v1/agents/{AGENT}/users", headers=bearer(keys.read))
                                   ).json()["users"]] == ["alice"]
    assert (await http.get(f"/v1/agents/{AGENT}/sessions", headers=bob)).json()["sessions"] == []
    memories = (await http.get(f"/v1/agents/{AGENT}/memories", headers=bob)).json()["memories"]
    assert not any(word.lower() in json.dumps(memories).lower() for word in PRIVATE)


async def test_a_session_of_another_agent_is_refused_without_naming_it(world):
    http, keys = world
    squat = await http.post("/v1/sessions/alice-s1/messages", headers=bearer(keys.other_admin), json={
        "agent_id": OTHER, "user_id": "carol", "role": "user", "content": "mine now", "message_id": "x1"})
    assert squat.status_code == 409 and AGENT not in squat.text
    # Read, it is a session nobody recorded in: the same block, nothing of it.
    blocks = [await http.get("/v1/context", headers=bearer(keys.other_admin),
                             params={"agent_id": OTHER, "user_id": "carol", "session_id": session, "query": "pelican"})
              for session in ("alice-s1", "never-recorded")]
    assert [b.status_code for b in blocks] == [200, 200]
    assert blocks[0].json()["xml"] == blocks[1].json()["xml"] and "pelican" not in blocks[0].text.lower()


async def test_revoking_a_key_takes_effect_at_once_on_every_replica(world, falkordb_url):
    http, keys = world
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY)
    async with LoopbackServer(create_app(settings, run_worker=False)) as replica:
        async with httpx.AsyncClient(base_url=replica.base_url, timeout=30) as other:
            assert (await other.get(f"/v1/agents/{AGENT}", headers=bearer(keys.read))).status_code == 200
            revoked = await http.delete(f"/v1/keys/{keys.ids['read']}", headers=bearer(keys.admin))
            assert revoked.status_code == 200 and revoked.json()["revoked_at"]
            refused = await other.get(f"/v1/agents/{AGENT}", headers=bearer(keys.read))
            assert refused.status_code == 401 and refused.json() == {"detail": "this API key was revoked"}
            again = await http.delete(f"/v1/keys/{keys.ids['read']}", headers=bearer(keys.admin))
            assert again.status_code == 200  # idempotent


async def test_health_detail_and_metrics_need_an_operator_key(world):
    http, keys = world
    bare = await http.get("/health")
    assert bare.status_code == 200 and bare.json() == {"ok": True}
    assert (await http.get("/health", params={"detail": "true"})).status_code == 401
    assert (await http.get("/health", params={"detail": "true"}, headers=bearer(keys.admin))).status_code == 403
    detail = await http.get("/health", params={"detail": "true"}, headers=OPERATOR)
    assert detail.status_code == 200 and detail.json()["state"]["ok"]
    assert (await http.get("/metrics", headers=OPERATOR)).status_code == 200


async def test_cors_is_off_unless_configured(world, falkordb_url):
    http, _ = world
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"}
    answer = await http.options("/v1/context", headers=preflight)
    assert "access-control-allow-origin" not in answer.headers
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY,
                              cors_allow_origins=["https://app.example"])
    async with LoopbackServer(create_app(settings, run_worker=False)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            allowed = await client.options("/v1/context", headers={**preflight, "Origin": "https://app.example"})
            assert allowed.headers["access-control-allow-origin"] == "https://app.example"
            # A browser may send and read the request id (docs/deploy.md, "Logs").
            with_id = await client.options("/v1/context", headers={
                **preflight, "Origin": "https://app.example", "Access-Control-Request-Headers": "x-request-id"})
            assert with_id.status_code == 200
            read = await client.get("/health/live", headers={"Origin": "https://app.example"})
            assert "x-request-id" in read.headers["access-control-expose-headers"].lower()
            refused = await client.options("/v1/context", headers=preflight)
            assert "access-control-allow-origin" not in refused.headers
