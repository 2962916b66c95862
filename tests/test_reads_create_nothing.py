"""Reads of agents, users and sessions that do not exist create nothing: not a key, not a
graph, not a byte. A caller guessing ids must not be able to fill the store."""

import asyncio

import httpx
import pytest
from redis.asyncio import Redis

from memory_service.backends.loopback import LoopbackServer
from memory_service.formation.jobs import QUEUE_NAME
from memory_service.http.app import create_app
from memory_service.state import keyspace

from .conftest import flush, suite_settings
from .store_state import snapshot

AGENT = "reader"


@pytest.fixture
async def http_without_worker(falkordb_url):
    """A live server with no worker, whose cron jobs would write on their own, on a store
    holding one agent with a shard and one session of alice's."""
    await flush(falkordb_url)
    async with LoopbackServer(create_app(suite_settings(falkordb_url), run_worker=False)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            await http.put(f"/v1/agents/{AGENT}", json={"memory_backend": "graph"})
            await http.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "travel", "extraction_focus": "flights"})
            for i, (role, text) in enumerate([("user", "I prefer window seats."), ("assistant", "Noted.")]):
                answer = await http.post("/v1/sessions/s1/messages", json={
                    "agent_id": AGENT, "user_id": "alice", "role": role, "content": text, "message_id": f"m{i}"})
                assert answer.status_code == 200, answer.text
            # The recorded messages queued their agent's embedding job; a worker of another
            # test's server on this store could run it during the reads. Dequeued: the
            # messages stay unembedded (search reads them by full text), and nothing else writes.
            await drop_embedding_jobs(falkordb_url, AGENT)
            # The metrics hash exists before the reads (they count themselves in it).
            assert (await http.get("/v1/context", params={"agent_id": AGENT, "user_id": "alice",
                                                          "session_id": "s1"})).status_code == 200
            yield http


async def drop_embedding_jobs(url: str, agent_id: str) -> None:
    redis = Redis.from_url(url)
    try:
        for job in [j for j in await redis.zrange(QUEUE_NAME, 0, -1) if j.startswith(b"embed:")]:
            await redis.zrem(QUEUE_NAME, job)
            await redis.delete(b"arq:job:" + job)
        await redis.delete(keyspace.embed_due(agent_id), keyspace.embed_lock(agent_id))
    finally:
        await redis.aclose()


def context(agent, user, session, **extra):
    return ("GET", "/v1/context", {"agent_id": agent, "user_id": user, "session_id": session, **extra}, None)


def search(agent, **params):
    return ("GET", "/v1/search", {"agent_id": agent, "query": "window seats", **params}, None)


def search_body(agent, **body):
    return ("POST", f"/v1/agents/{agent}/search", None, {"query": "window seats", **body})


READS = [
    ("GET", "/v1/agents/nobody", None, None),
    ("GET", "/v1/agents/nobody/shards", None, None),
    ("GET", "/v1/sessions/nowhere", None, None),
    ("POST", "/v1/sessions/nowhere/form", None, None),
    ("GET", "/health", None, None),
    ("GET", "/metrics", None, None),
    context("nobody", "alice", "s1"),  # another agent's session: 409
    context("nobody", "nouser", "nowhere"),
    context(AGENT, "nouser", "nowhere"),
    context(AGENT, "alice", "nowhere"),
    context(AGENT, "nouser", "s1"),
    context(AGENT, "nouser", "nowhere", query="window seats", budget=700),
    search("nobody"),
    search("nobody", scope="user", user_id="alice"),
    search(AGENT, scope="user", user_id="nouser"),
    search(AGENT, scope="session", session_id="nowhere"),
    search(AGENT, scope="shard", shard_id="noshard"),
    search(AGENT, scope="namespaces", namespaces=["user:reader:nouser", "shard:reader:noshard"]),
    search_body("nobody"),
    search_body(AGENT, scope="user", user_id="nouser"),
    search_body(AGENT, scope="namespaces", namespaces=["session:nowhere"]),
    ("GET", "/v1/agents/nobody/startup", None, None),
    ("GET", "/v1/agents/nobody/startup/block", {"session_id": "nowhere", "mode": "first-run"}, None),
    ("GET", f"/v1/agents/{AGENT}/startup/block", {"session_id": "nowhere", "mode": "digest", "model": "phi"}, None),
    ("GET", "/v1/agents/nobody/startup/block", {"session_id": "s1", "mode": "digest"}, None),  # another agent's: 409
]


async def test_reading_unknown_agents_users_and_sessions_creates_nothing(http_without_worker, falkordb_url):
    http = http_without_worker
    before = await asyncio.to_thread(snapshot, falkordb_url)
    assert before.keys > 5 and before.graphs == ("ms_agent__reader",)
    changed = []
    for method, path, params, body in READS:
        answer = await http.request(method, path, params=params, json=body)
        assert answer.status_code in (200, 404, 409), (path, params, answer.text)
        after = await asyncio.to_thread(snapshot, falkordb_url)
        if after != before:
            changed.append((method, path, params or body, before.changes(after)))
            before = after
    assert not changed, "\n".join(map(str, changed))


async def test_reading_a_known_session_still_caches_its_block(http_without_worker, falkordb_url):
    # The guard above must not cost the cache: a known user in a known session is cached.
    http = http_without_worker
    params = {"agent_id": AGENT, "user_id": "alice", "session_id": "s1", "budget": 900}
    first = (await http.get("/v1/context", params=params)).json()
    again = (await http.get("/v1/context", params=params)).json()
    assert (first["source"], again["source"]) == ("graph", "cache")
    for unknown in ({"user_id": "nouser"}, {"session_id": "nowhere"}):
        answers = [(await http.get("/v1/context", params={**params, **unknown})).json() for _ in range(2)]
        assert [a["source"] for a in answers] == ["graph", "graph"]
