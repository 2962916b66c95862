"""A user's personal statement never reaches another user, offline and on the LLM path.

bob tells the agent his passport number in his session; the agent has a `travel` shard,
so before this fix the statement became a shard fact that carol's block and searches
showed. Here, through the HTTP API of a real server (keys required, a real worker, real
FalkorDB and Redis), with the rule extractor and with the LLM extractor against a fake
OpenAI-compatible endpoint that returns bob's statement as a travel fact (an LLM that
ignores its instructions): carol's block and every search her key may run hold nothing of
it, the shard holds nothing of it, and bob's own memory keeps it.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.domain.models import MemoryKind
from memory_service.domain.namespaces import Namespace
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .fake_llm import EchoLLM

AGENT = "concierge"
SECRET = "BOBPASS77"
OPERATOR_KEY = secrets.token_urlsafe(32)
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
# The fake LLM makes a travel fact of every message that says "travel".
BOB = [
    "Hi, I need help with my trip to Lisbon.",
    f"My passport number is {SECRET} and it expires in May, right before our travel.",
    "The flight to Lisbon leaves Berlin at 9:40 from gate B12.",
    "Thanks, that is all for the travel plans today.",
    "I live in Hamburg with my dog Pretzel.",  # the knowledge graph's facts: bob's, never carol's
]
GRAPH_PRIVATE = ("Hamburg", "Pretzel")
CAROL = [
    "Hello, I am planning a trip too.",
    "The passport office in Berlin opens at 8:30 for travel documents.",
    "Which documents do I need, is a passport enough?",
    "Great, thanks for the tips.",
]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def make_key(http: httpx.AsyncClient, **spec: Any) -> dict[str, str]:
    answer = await http.post("/v1/keys", headers=OPERATOR, json={"name": "test", "agents": [AGENT], **spec})
    assert answer.status_code == 201, answer.text
    return bearer(answer.json()["key"])


async def converse(http: httpx.AsyncClient, auth: dict[str, str], user: str, session: str, lines: list[str]) -> None:
    for i, text in enumerate(lines):
        for role, content in (("user", text), ("assistant", "Noted.")):
            answer = await http.post(f"/v1/sessions/{session}/messages", headers=auth, json={
                "agent_id": AGENT, "user_id": user, "role": role, "content": content,
                "message_id": f"{session}-{i}-{role}", "created_at": f"2026-05-01T09:{i:02d}:00Z"})
            assert answer.status_code == 200, answer.text


@pytest.fixture
async def echo():
    server = await EchoLLM().start()
    yield server
    await server.stop()


@pytest.mark.parametrize("path", ["rules", "llm"])
async def test_bobs_personal_statement_never_reaches_carol(falkordb_url, echo, path):
    await flush(falkordb_url)
    llm = {"extractor": "llm", "llm_base_url": echo.base_url, "llm_model": "echo"} if path == "llm" else {}
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY, **llm)
    async with LoopbackServer(create_app(settings, run_worker=True)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        admin = await make_key(http, role="admin")
        bob = await make_key(http, role="write", users=["bob"])
        carol = await make_key(http, role="write", users=["carol"])
        shard = await http.put(f"/v1/agents/{AGENT}/shards/travel", headers=admin,
                               json={"name": "travel", "extraction_focus": "flights, hotels, passports, visas, travel"})
        assert shard.status_code in (200, 201), shard.text
        await converse(http, bob, "bob", "bob-s1", BOB)
        await converse(http, carol, "carol", "carol-s1", CAROL)
        for session in ("bob-s1", "carol-s1"):
            formed = await http.post(f"/v1/sessions/{session}/form", headers=admin)
            assert formed.status_code == 200 and formed.json()["formed"], formed.text
        if path == "llm":
            assert echo.extractions == 2  # the LLM formed both windows, and returned bob's statement as a fact

        # The store: the shard holds topic knowledge, not bob's passport; bob's namespace holds it.
        service = server.server.config.app.state.service
        _, backend = await service.agents.backend_for(AGENT)
        kinds = [MemoryKind.FACT, MemoryKind.SUGGESTION, MemoryKind.CONSOLIDATED]
        in_shard = [m.content for m in await backend.recent(AGENT, Namespace.shard(AGENT, "travel"), kinds, 100)]
        assert in_shard, "the shard should still get topic knowledge"
        assert not [c for c in in_shard if SECRET in c], in_shard
        assert any("flight to Lisbon" in c or "passport office" in c for c in in_shard), in_shard
        bobs = [m for m in await backend.recent(AGENT, Namespace.user(AGENT, "bob"), [MemoryKind.FACT], 100)]
        assert [m.content for m in bobs if SECRET in m.content], "bob's namespace should keep his statement"
        assert all(m.metadata.user_id == "bob" for m in bobs)

        # carol's block, with a query and without.
        for query in ("passport", "passport number BOBPASS77", None):
            params = {"agent_id": AGENT, "user_id": "carol", "session_id": "carol-s1"}
            block = await http.get("/v1/context", headers=carol, params={**params, **({"query": query} if query else {})})
            assert block.status_code == 200, block.text
            assert SECRET not in block.text and "travel" in block.text.lower()
        for query in ("Where does bob live? Hamburg?", "Is Pretzel bob's dog?"):
            params = {"agent_id": AGENT, "user_id": "carol", "session_id": "carol-s1", "query": query}
            block = await http.get("/v1/context", headers=carol, params=params)
            assert block.status_code == 200 and "<KnownFacts" not in block.text, block.text
        # carol's key sees none of bob's entities (her own list, and bob's refused).
        mine = await http.get(f"/v1/agents/{AGENT}/entities", headers=carol, params={"user_id": "carol"})
        assert mine.status_code == 200 and not [w for w in GRAPH_PRIVATE if w in mine.text], mine.text
        assert (await http.get(f"/v1/agents/{AGENT}/entities", headers=carol,
                               params={"user_id": "bob"})).status_code in (403, 404)

        # Every search carol's key may run: what it answers holds nothing of bob's.
        searches = [
            {"scope": "user", "user_id": "carol"},
            {"scope": "session", "session_id": "carol-s1"},
            {"scope": "shard", "shard_id": "travel"},
            {"scope": "agent"},
            {"scope": "namespaces", "namespaces": [f"shard:{AGENT}:travel"]},
        ]
        answered = 0
        for scope in searches:
            for query in ("passport number", SECRET, "Hamburg Pretzel"):
                found = await http.post(f"/v1/agents/{AGENT}/search", headers=carol,
                                        json={"query": query, "top_k": 50, **scope})
                assert found.status_code in (200, 403, 404), found.text
                if found.status_code == 200:
                    body = found.json()
                    hits = [h["content"] for h in (*body["results"], *body["candidates"])]
                    assert not [h for h in hits if SECRET in h or any(w in h for w in GRAPH_PRIVATE)], (scope, hits)
                    paths = [p["entity"] for h in body["results"] for p in h["explanation"].get("graph", [])]
                    assert not [p for p in paths if p in GRAPH_PRIVATE], (scope, paths)
                    answered += 1
                else:
                    assert SECRET not in found.text
        assert answered >= 2  # at least her own scope answered

        # bob's own block and search keep it.
        block = await http.get("/v1/context", headers=bob, params={
            "agent_id": AGENT, "user_id": "bob", "session_id": "bob-s1", "query": "passport number"})
        assert block.status_code == 200 and SECRET in block.text, block.text
        found = await http.post(f"/v1/agents/{AGENT}/search", headers=bob, json={
            "query": "passport number", "scope": "namespaces", "namespaces": [f"user:{AGENT}:bob"],
            "kinds": ["fact"]})
        if found.status_code == 200:
            assert SECRET in found.text
        found = await http.post(f"/v1/agents/{AGENT}/search", headers=admin, json={
            "query": "passport number", "scope": "namespaces", "namespaces": [f"user:{AGENT}:bob"], "kinds": ["fact"]})
        assert found.status_code == 200 and SECRET in found.json()["results"][0]["content"], found.text
        # bob's block shows his own fact.
        block = await http.get("/v1/context", headers=bob, params={
            "agent_id": AGENT, "user_id": "bob", "session_id": "bob-s1", "query": "Where do I live?"})
        assert block.status_code == 200 and "bob lives in Hamburg" in block.text, block.text
