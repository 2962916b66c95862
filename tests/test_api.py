"""The HTTP API on a real uvicorn server on loopback, backed by a real FalkorDB."""

from xml.etree import ElementTree as ET

import pytest
from fastapi import FastAPI

from memory_service.config import Settings
from memory_service.http.app import create_app

from .helpers import wait_embedded

AGENT = "trip-planner"


def message(i: int, content: str, user: str = "alice", role: str = "user", **extra) -> dict:
    return {"agent_id": AGENT, "user_id": user, "role": role, "content": content, "message_id": f"m{i}",
            "created_at": f"2026-05-01T09:{i:02d}:00Z", **extra}


CHAT = [
    message(0, "I prefer window seats on flights."),
    message(1, "Noted, window seats.", role="assistant"),
    message(2, "The flight to Lisbon leaves on June 3rd at 9am."),
    message(3, "I will plan around it.", role="assistant"),
]


async def post_chat(http, session="s1", chat=CHAT):
    return [(await http.post(f"/v1/sessions/{session}/messages", json=m)).json() for m in chat]


async def test_record_answers_with_gate_status_and_is_idempotent(http):
    first = await http.post("/v1/sessions/s1/messages", json=message(0, "hello"))
    assert first.status_code == 200
    body = first.json()
    assert body["sequence"] == 1 and body["duplicate"] is False
    assert body["gate"] == {"open": False, "reason": "1 new message(s), fewer than the minimum 4", "pending_messages": 1,
                            "pending_tokens": pytest.approx(5 / 4.5, abs=0.1), "min_messages": 4, "message_interval": 20,
                            "token_interval": 1000}
    again = (await http.post("/v1/sessions/s1/messages", json=message(0, "hello"))).json()
    assert again["duplicate"] is True and again["sequence"] == 1 and again["gate"]["pending_messages"] == 1


async def test_force_formation_then_context_has_the_memories(http):
    await http.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "travel", "extraction_focus": "flights, dates"})
    await post_chat(http)
    formed = await http.post("/v1/sessions/s1/form")
    assert formed.status_code == 200
    body = formed.json()
    assert body["formed"] and body["message_ids"] == ["m0", "m1", "m2", "m3"] and body["memories"]["episode"] == 1
    ctx = await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1"})
    assert ctx.status_code == 200
    data = ctx.json()
    root = ET.fromstring(data["xml"])
    assert data["chars"] == len(data["xml"]) <= data["budget"]
    # No query: the latest user message is the query; what the vector signal alone finds
    # dissimilar to it (below CONTEXT_MIN_SIMILARITY) is left out, and said so.
    # The travel shard's fact formed from it is found by the search and shown once, among the
    # relevant memories (not again in <CollectiveMemory>).
    assert [e.tag for e in root][-3:] == ["UserMemory", "CurrentConversationContext", "RelevantMemories"]
    assert [m.get("kind") for m in root.iter("Memory")] == ["fact"] and root.find("CollectiveMemory") is None
    assert data["left_out"]["below_threshold"] >= 1 and data["recall"]["min_similarity"] == 0.3
    assert "window seats" in data["xml"]
    assert data["sections"]["conversation"] == 1
    again = (await http.post("/v1/sessions/s1/form")).json()
    assert (again["formed"], again["message_ids"], again["written"], again["reason"]) == (False, [], 0, "no pending messages")


async def test_context_budget_follows_the_model_name(http):
    await post_chat(http, chat=CHAT * 1)
    await http.post("/v1/sessions/s1/form")
    small = (await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1",
                                                   "model": "llama3.2:3b"})).json()
    default = (await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1"})).json()
    assert small["budget"] == 2000 and default["budget"] == 6000


async def test_agents_and_shards(http):
    missing = await http.get(f"/v1/agents/{AGENT}")
    assert missing.status_code == 404 and "PUT" in missing.json()["detail"]
    put = await http.put(f"/v1/agents/{AGENT}", json={"memory_backend": "graph", "agent_extras": {"tone": "warm"}})
    assert put.status_code == 200 and put.json()["effective_backend"] == "graph"
    assert (await http.get(f"/v1/agents/{AGENT}")).json()["agent_extras"] == {"tone": "warm"}
    created = await http.put(f"/v1/agents/{AGENT}/shards/food", json={"name": "food", "extraction_focus": "dinner"})
    replaced = await http.put(f"/v1/agents/{AGENT}/shards/food", json={"name": "food", "active": False})
    assert (created.status_code, replaced.status_code) == (201, 200)
    shards = (await http.get(f"/v1/agents/{AGENT}/shards")).json()
    assert shards == [{"name": "food", "extraction_focus": "", "active": False, "memory_ttl": None, "agent_id": AGENT, "shard_id": "food"}]


@pytest.mark.parametrize("settings", [
    {"agent_extras": {"experimental_memory_backend": "graphiti", "tone": "warm"}},  # the seeds' flag
    {"memory_backend": "graphiti"},
])
async def test_graphiti_selects_the_graph_backend(http, settings):
    put = await http.put(f"/v1/agents/{AGENT}", json=settings)
    assert put.status_code == 200, put.text
    agent = (await http.get(f"/v1/agents/{AGENT}")).json()
    assert agent["effective_backend"] == "graph"
    assert {k: agent[k] for k in settings} == settings  # stored as given
    await post_chat(http, chat=CHAT[:2])
    assert (await http.post("/v1/sessions/s1/form")).status_code == 200
    context = await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1"})
    assert context.status_code == 200 and context.json()["source"] == "graph", context.text


@pytest.mark.parametrize(
    "method, path, payload, status, words",
    [
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "role": "robot"}, 422, "role"),
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "content": "   "}, 422, "blank"),
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "content": ""}, 422, "content"),
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "content": "x" * 32_001}, 422, "content"),
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "agent_id": "a:b"}, 422, "must not contain ':'"),
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "user_id": " bob"}, 422, "white space"),
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "created_at": "yesterday"}, 422, "created_at"),
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "surprise": 1}, 422, "surprise"),
        ("post", "/v1/sessions/s1/messages", {"content": "hi"}, 422, "agent_id"),
        ("post", "/v1/sessions/a:b/messages", CHAT[0], 422, "must not contain ':'"),
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "content": "tampered"}, 409, "other content"),
        ("post", "/v1/sessions/s1/messages", {**CHAT[0], "agent_id": "intruder", "message_id": "x"}, 409, "belongs to another agent"),
        ("post", "/v1/sessions/nobody/form", None, 404, "no recorded messages"),
        ("put", f"/v1/agents/{AGENT}", {"memory_backend": "cassandra"}, 422, "unknown memory backend"),
        ("put", f"/v1/agents/{AGENT}", {"memory_backend": ""}, 422, "memory_backend"),
        ("put", f"/v1/agents/{AGENT}", {"agent_extras": {"experimental_memory_backend": "neo4j"}}, 422,
         "agent_extras.experimental_memory_backend: unknown memory backend 'neo4j'; registered backends: graph"),
        ("put", f"/v1/agents/{AGENT}", {"agent_extras": {"experimental_memory_backend": "Graphiti "}}, 422,
         "(aliases: 'graphiti' for 'graph')"),
        ("put", f"/v1/agents/{AGENT}", {"agent_extras": {"experimental_memory_backend": 1}}, 422,
         "agent_extras.experimental_memory_backend: a memory backend's name"),
        ("put", f"/v1/agents/{AGENT}", {"memory_backend": "graph", "agent_extras": {"experimental_memory_backend": "x"}},
         422, "agent_extras.experimental_memory_backend: unknown memory backend 'x'"),
        ("put", f"/v1/agents/{AGENT}/shards/s", {"name": ""}, 422, "name"),
        ("put", f"/v1/agents/{AGENT}/shards/a:b", {"name": "x"}, 422, "must not contain ':'"),
        ("get", "/v1/context?agent_id=a&user_id=u", None, 422, "session_id"),
    ],
)
async def test_bad_input_gets_a_clear_4xx_and_changes_nothing(http, method, path, payload, status, words):
    await http.post("/v1/sessions/s1/messages", json=CHAT[0])
    await http.put(f"/v1/agents/{AGENT}", json={"memory_backend": "graph"})
    before_ctx = (await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1"})).json()
    response = await http.request(method.upper(), path, json=payload)
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]
    # Nothing stored changed: the same message is still the only one, settings unchanged.
    again = (await http.post("/v1/sessions/s1/messages", json=CHAT[0])).json()
    assert again["duplicate"] and again["gate"]["pending_messages"] == 1
    assert (await http.get(f"/v1/agents/{AGENT}")).json()["memory_backend"] == "graph"
    after_ctx = (await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1"})).json()
    assert (before_ctx["source"], after_ctx["source"]) == ("graph", "cache")  # no write invalidated it
    assert {**after_ctx, "source": "graph"} == before_ctx


async def test_health_reports_each_dependency(http):
    health = await http.get("/health?detail=true")
    assert health.status_code == 200
    body = health.json()
    assert body["ok"] and body["state"]["ok"] and body["backends"]["graph"]["ok"]
    bare = await http.get("/health")  # readiness for probes: whether, not what
    assert bare.status_code == 200 and bare.json() == {"ok": True}
    live = await http.get("/health/live")  # liveness: answers without touching a dependency
    assert live.status_code == 200 and live.json() == {"ok": True}


async def test_openapi_documents_every_route(http):
    spec = (await http.get("/openapi.json")).json()
    assert set(spec["paths"]) == {
        "/v1/sessions/{session_id}/messages", "/v1/sessions/{session_id}/form", "/v1/context",
        "/v1/agents/{agent_id}", "/v1/agents/{agent_id}/shards/{shard_id}", "/v1/agents/{agent_id}/shards", "/health",
        "/v1/agents/{agent_id}/events", "/v1/agents/{agent_id}/webhooks", "/v1/agents/{agent_id}/webhooks/{webhook_id}",
        "/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters",
        "/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}",
        "/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}/replay",
        "/health/live", "/v1/sessions/{session_id}", "/metrics", "/v1/search", "/v1/agents/{agent_id}/search",
        "/v1/keys", "/v1/keys/{key_id}", "/v1/audit",
        "/v1/agents/{agent_id}/users/{user_id}", "/v1/agents/{agent_id}/users/{user_id}/export",
        "/v1/agents/{agent_id}/startup/{record_id}", "/v1/agents/{agent_id}/startup",
        "/v1/agents/{agent_id}/startup/block",
        "/v1/agents/{agent_id}/memories", "/v1/agents/{agent_id}/memories/{memory_id}",
        "/v1/agents/{agent_id}/memories/{memory_id}/undelete", "/v1/agents/{agent_id}/writes/parse",
        "/v1/agents/{agent_id}/memories/{memory_id}/forget", "/v1/agents/{agent_id}/reform",
        "/v1/agents/{agent_id}/memories/{memory_id}/correct", "/v1/agents/{agent_id}/memories/{memory_id}/uncorrect",
        "/v1/agents/{agent_id}/entities", "/v1/agents/{agent_id}/entities/{entity_id}",
        "/v1/agents/{agent_id}/facts/{fact_id}/restore", "/v1/agents/{agent_id}/entities/{entity_id}/split",
        "/v1/agents/{agent_id}/messages/batch",
        "/v1/agents", "/v1/agents/{agent_id}/users", "/v1/agents/{agent_id}/sessions",
        "/v1/agents/{agent_id}/memories/{memory_id}/detail", "/v1/agents/{agent_id}/usage",
    }
    assert (await http.get("/docs")).status_code == 200


# Each route's operationId, which generated clients take as the method's name: a change here
# renames a method in every client generated from /openapi.json, so make it on purpose.
OPERATION_IDS = {
    ("POST", "/v1/sessions/{session_id}/messages"): "record_message",
    ("POST", "/v1/agents/{agent_id}/messages/batch"): "record_batch",
    ("GET", "/v1/agents"): "list_agents",
    ("GET", "/v1/agents/{agent_id}/users"): "list_users",
    ("GET", "/v1/agents/{agent_id}/sessions"): "list_sessions",
    ("GET", "/v1/agents/{agent_id}/memories"): "list_memories",
    ("GET", "/v1/agents/{agent_id}/memories/{memory_id}/detail"): "get_memory_detail",
    ("POST", "/v1/sessions/{session_id}/form"): "form_memories",
    ("GET", "/v1/sessions/{session_id}"): "get_session",
    ("GET", "/v1/context"): "get_context",
    ("GET", "/v1/search"): "search_memories",
    ("POST", "/v1/agents/{agent_id}/search"): "search_memories_with_body",
    ("PUT", "/v1/agents/{agent_id}"): "put_agent",
    ("GET", "/v1/agents/{agent_id}"): "get_agent",
    ("PUT", "/v1/agents/{agent_id}/shards/{shard_id}"): "put_shard",
    ("GET", "/v1/agents/{agent_id}/shards"): "list_shards",
    ("GET", "/metrics"): "get_metrics",
    ("GET", "/health/live"): "check_liveness",
    ("GET", "/health"): "check_health",
    ("DELETE", "/v1/agents/{agent_id}/users/{user_id}"): "erase_user",
    ("GET", "/v1/agents/{agent_id}/users/{user_id}/export"): "export_user",
    ("POST", "/v1/keys"): "create_key",
    ("GET", "/v1/keys"): "list_keys",
    ("DELETE", "/v1/keys/{key_id}"): "revoke_key",
    ("GET", "/v1/audit"): "read_audit",
    ("GET", "/v1/agents/{agent_id}/usage"): "agent_usage",
    ("GET", "/v1/agents/{agent_id}/events"): "event_stream",
    ("GET", "/v1/agents/{agent_id}/webhooks"): "list_webhooks",
    ("PUT", "/v1/agents/{agent_id}/webhooks/{webhook_id}"): "put_webhook",
    ("GET", "/v1/agents/{agent_id}/webhooks/{webhook_id}"): "get_webhook",
    ("DELETE", "/v1/agents/{agent_id}/webhooks/{webhook_id}"): "delete_webhook",
    ("GET", "/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters"): "webhook_dead_letters",
    ("POST", "/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}/replay"): "replay_dead_letter",
    ("DELETE", "/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}"): "drop_dead_letter",
    ("PUT", "/v1/agents/{agent_id}/startup/{record_id}"): "put_startup_record",
    ("GET", "/v1/agents/{agent_id}/startup"): "list_startup_records",
    ("DELETE", "/v1/agents/{agent_id}/startup/{record_id}"): "delete_startup_record",
    ("GET", "/v1/agents/{agent_id}/startup/block"): "get_startup_block",
    ("GET", "/v1/agents/{agent_id}/memories/{memory_id}"): "memory_get",
    ("POST", "/v1/agents/{agent_id}/memories"): "memory_write",
    ("PATCH", "/v1/agents/{agent_id}/memories/{memory_id}"): "memory_update",
    ("DELETE", "/v1/agents/{agent_id}/memories/{memory_id}"): "memory_delete",
    ("POST", "/v1/agents/{agent_id}/memories/{memory_id}/undelete"): "memory_undelete",
    ("POST", "/v1/agents/{agent_id}/memories/{memory_id}/forget"): "memory_forget",
    ("POST", "/v1/agents/{agent_id}/reform"): "reform_windows",
    ("POST", "/v1/agents/{agent_id}/memories/{memory_id}/correct"): "memory_correct",
    ("POST", "/v1/agents/{agent_id}/memories/{memory_id}/uncorrect"): "memory_uncorrect",
    ("POST", "/v1/agents/{agent_id}/writes/parse"): "parse_writes",
    ("GET", "/v1/agents/{agent_id}/entities"): "list_entities",
    ("GET", "/v1/agents/{agent_id}/entities/{entity_id}"): "get_entity",
    ("POST", "/v1/agents/{agent_id}/facts/{fact_id}/restore"): "restore_fact",
    ("POST", "/v1/agents/{agent_id}/entities/{entity_id}/split"): "split_entity",
}


def operation_ids(spec: dict) -> dict[tuple[str, str], str | None]:
    return {(method.upper(), path): operation.get("operationId")
            for path, methods in spec["paths"].items() for method, operation in methods.items()}


def unreadable_operation_ids(spec: dict) -> list[str]:
    """What is wrong with the schema's operationIds: missing, not a Python identifier, carrying
    FastAPI's default path-and-method suffix, or used twice (FastAPI only warns)."""
    problems, seen = [], {}
    for route, op_id in operation_ids(spec).items():
        if not op_id or not op_id.isidentifier() or "_v1_" in op_id or "__" in op_id:
            problems.append(f"{route}: unreadable operationId {op_id!r}")
        elif op_id in seen:
            problems.append(f"{route}: operationId {op_id!r} is also {seen[op_id]}'s")
        seen.setdefault(op_id, route)
    return problems


async def test_every_route_has_a_readable_unique_operation_id(http):
    spec = (await http.get("/openapi.json")).json()
    assert unreadable_operation_ids(spec) == []
    assert operation_ids(spec) == OPERATION_IDS


def test_the_operation_id_check_catches_fastapis_default_and_a_clash():
    app = create_app(Settings(_env_file=None))

    @app.get("/v1/other-agents/{agent_id}")
    async def get_agent(agent_id: str) -> dict:  # the name of GET /v1/agents/{agent_id}'s handler
        return {}

    with pytest.warns(UserWarning, match="Duplicate Operation ID get_agent"):
        clashing = app.openapi()
    assert unreadable_operation_ids(clashing) == [
        "('GET', '/v1/other-agents/{agent_id}'): operationId 'get_agent' is also ('GET', '/v1/agents/{agent_id}')'s"]

    default = FastAPI()  # FastAPI's own ids: handler name, path and method

    @default.post("/v1/sessions/{session_id}/messages")
    async def record_message(session_id: str) -> dict:
        return {}

    assert unreadable_operation_ids(default.openapi()) == [
        "('POST', '/v1/sessions/{session_id}/messages'): unreadable operationId "
        "'record_message_v1_sessions__session_id__messages_post'"]


async def test_search_over_http_with_explanations_and_bad_input(http, live_server):
    await post_chat(http)
    await wait_embedded(live_server.server.config.app.state.service, AGENT)  # for the vector signal
    found = await http.get("/v1/search", params={"agent_id": AGENT, "query": "when does the Lisbon flight leave",
                                                 "scope": "user", "user_id": "alice", "top_k": 2})
    assert found.status_code == 200, found.text
    body = found.json()
    best = body["results"][0]
    assert best["source_message_ids"] == ["m2"] and best["kind"] == "message" and best["activated"] is True
    assert set(best["explanation"]["signals"]) == {"fulltext", "vector"} and best["age"]
    assert body["scope"] == "user" and body["namespaces"] == 2 and len(body["results"]) == 2
    posted = await http.post(f"/v1/agents/{AGENT}/search", json={"query": "prefer window seats", "kinds": ["message"],
                                                                 "scope": "session", "session_id": "s1"})
    assert posted.status_code == 200 and posted.json()["results"][0]["source_message_ids"] == ["m0"]
    for params, status, detail in [
        ({"query": ""}, 422, "query must not be empty"),
        ({"query": "x" * 2001}, 422, "limit is 2000"),
        ({"query": "x", "top_k": 0}, 422, "top_k"),
        ({"query": "x", "top_k": 1000}, 422, "limit is 100"),
        ({"query": "x", "kinds": "nonsense"}, 422, "kinds"),
        ({"query": "x", "scope": "galaxy"}, 422, "scope"),
        ({"query": "x", "scope": "session", "session_id": "not-there"}, 404, "has no messages recorded by agent"),
        ({"query": "x", "scope": "namespaces", "namespaces": "user:other-agent:alice"}, 404, "is not one of agent"),
    ]:
        answer = await http.get("/v1/search", params={"agent_id": AGENT, **params})
        assert answer.status_code == status and detail in answer.json()["detail"], (params, answer.text)


async def test_context_with_query_and_budget_over_http(http):
    await post_chat(http)
    ctx = await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1",
                                                "query": "does alice prefer window seats?", "budget": 700})
    assert ctx.status_code == 200, ctx.text
    data = ctx.json()
    assert data["budget"] == 700 and data["chars"] <= 700 and data["sections"]["relevant"] >= 1
    shown = {m.text: m for m in ET.fromstring(data["xml"]).findall("RelevantMemories/Memory")}
    assert shown["alice: I prefer window seats on flights."].get("date") == "2026-05-01"
    for params, detail in [({"budget": 10}, "budget must be at least 64"), ({"query": "q" * 5000}, "characters long"),
                           ({"budget": "lots"}, "budget")]:
        bad = await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice", "session_id": "s1", **params})
        assert bad.status_code == 422 and detail in bad.json()["detail"], bad.text
