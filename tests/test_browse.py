"""The browse API over real HTTP (a server on loopback, keys required, embedded FalkorDB and
Redis, a worker in process): agents, users and sessions page by page, memories filtered
and walked with cursors (every one once, also while new ones arrive), what a key limited to
some users sees, clear 422s for bad cursors and filters, and one memory's provenance and
history. The backends' own listing is tests/test_backend_contract.py's."""

from __future__ import annotations

import base64
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .store_state import snapshot

OPERATOR_KEY = secrets.token_urlsafe(32)
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
AGENT = "zoo"


@pytest.fixture(scope="module")
async def server(falkordb_url):
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY,
                              memory_write_agents=["*"])
    async with LoopbackServer(create_app(settings, run_worker=True)) as running:
        yield running


@pytest.fixture
async def api(server, falkordb_url):
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=server.base_url, headers=OPERATOR, timeout=30) as http:
        yield http


async def record(api: httpx.AsyncClient, session: str, user: str, content: str, mid: str, agent: str = AGENT,
                 minute: int = 0) -> None:
    answer = await api.post(f"/v1/sessions/{session}/messages", json={
        "agent_id": agent, "user_id": user, "role": "user", "content": content, "message_id": mid,
        "created_at": (datetime(2026, 5, 1, 9, tzinfo=UTC) + timedelta(minutes=minute)).isoformat()})
    assert answer.status_code == 200, answer.text


async def write(api: httpx.AsyncClient, namespace: str, content: str, kind: str = "observation",
                **extra: Any) -> str:
    answer = await api.post(f"/v1/agents/{AGENT}/memories", json={"namespace": namespace, "kind": kind,
                                                                  "content": content, **extra})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


async def walk(api: httpx.AsyncClient, url: str, field: str, headers: dict[str, str] | None = None,
               **params: Any) -> list[list[dict[str, Any]]]:
    """Every page of a list, following `next`."""
    pages, cursor = [], None
    for _ in range(500):
        answer = await api.get(url, params={**params, **({"cursor": cursor} if cursor else {})}, headers=headers)
        assert answer.status_code == 200, answer.text
        pages.append(answer.json()[field])
        cursor = answer.json()["next"]
        if cursor is None:
            return pages
    raise AssertionError("the list never ended")


def flat(pages: list[list[dict[str, Any]]], key: str = "id") -> list[str]:
    return [item[key] for page in pages for item in page]


async def make_key(api: httpx.AsyncClient, **spec: Any) -> dict[str, str]:
    made = await api.post("/v1/keys", json={"name": "browse", **spec})
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['key']}"}


async def test_agents_users_and_sessions_are_listed_page_by_page(api):
    for agent in ("ant", "bee", "cat", "dog", "elk"):
        await record(api, f"{agent}-s", "u", "hello", "m1", agent=agent)
    assert (await api.put("/v1/agents/fox", json={})).status_code == 200  # settings alone make an agent
    pages = await walk(api, "/v1/agents", "agents", limit=2)
    assert flat(pages, "agent_id") == ["ant", "bee", "cat", "dog", "elk", "fox"] and len(pages) == 3
    ant = pages[0][0]
    assert (ant["users"], ant["sessions"], ant["configured"]) == (1, 1, False)
    assert pages[-1][-1]["configured"] is True
    # Users by id; sessions newest first, each with its gate, cursor and activity.
    for i, user in enumerate(("ursula", "tom", "sam", "rita")):
        await record(api, f"{AGENT}-s{i}", user, f"I am {user}.", "m1", minute=i)
    await record(api, f"{AGENT}-s0", "tom", "Me too.", "m2", minute=5)
    assert flat(await walk(api, f"/v1/agents/{AGENT}/users", "users", limit=3), "user_id") == \
        ["rita", "sam", "tom", "ursula"]
    sessions = flat(await walk(api, f"/v1/agents/{AGENT}/sessions", "sessions", limit=3), "session_id")
    assert sessions == [f"{AGENT}-s3", f"{AGENT}-s2", f"{AGENT}-s1", f"{AGENT}-s0"]
    toms = (await api.get(f"/v1/agents/{AGENT}/sessions", params={"user_id": "tom"})).json()["sessions"]
    assert [s["session_id"] for s in toms] == [f"{AGENT}-s1", f"{AGENT}-s0"]
    first = toms[-1]
    assert first["messages"] == 2 and first["gate"]["pending_messages"] == 2 and first["cursor"] == 0
    assert first["last_activity"] is not None and first["created_at"] <= first["last_activity"]
    formed = await api.post(f"/v1/sessions/{AGENT}-s0/form")
    assert formed.status_code == 200 and formed.json()["formed"], formed.text
    [after] = [s for s in (await api.get(f"/v1/agents/{AGENT}/sessions")).json()["sessions"]
               if s["session_id"] == f"{AGENT}-s0"]
    assert after["cursor"] == 2 and after["formed_windows"] == 1 and after["gate"]["pending_messages"] == 0
    assert after["pending_window"] is None


async def test_memories_are_walked_once_newest_first_while_new_ones_arrive(api):
    written = [await write(api, f"user:{AGENT}:alice", f"note {i}") for i in range(23)]  # many share a second
    for i in range(6):
        await record(api, f"{AGENT}-s", "alice", f"Line {i}.", f"m{i}", minute=i)
    seen: list[dict[str, Any]] = []
    cursor, arrivals = None, []
    while True:
        page = (await api.get(f"/v1/agents/{AGENT}/memories",
                              params={"limit": 4, **({"cursor": cursor} if cursor else {})})).json()
        seen += page["memories"]
        arrivals.append(await write(api, f"user:{AGENT}:alice", "arrived during the walk"))
        if (cursor := page["next"]) is None:
            break
    ids = [m["id"] for m in seen]
    assert len(ids) == len(set(ids))
    assert set(written) <= set(ids) and sum(m["kind"] == "message" for m in seen) == 6
    order = [(m["valid_at"], m["id"]) for m in seen]
    assert [(datetime.fromisoformat(t), i) for t, i in order] == \
        sorted(((datetime.fromisoformat(t), i) for t, i in order), reverse=True)
    everything = flat(await walk(api, f"/v1/agents/{AGENT}/memories", "memories", limit=200))
    assert set(arrivals) <= set(everything) and len(everything) == 23 + 6 + len(arrivals)


async def test_each_filter_narrows_the_list(api):
    await api.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "Travel"})
    alice = await write(api, f"user:{AGENT}:alice", "Alice likes herons.", tags=["birds"])
    fact = await write(api, f"user:{AGENT}:alice", "Alice lives in Lyon.", kind="fact", tags=["home", "birds"])
    bob = await write(api, f"user:{AGENT}:bob", "Bob likes kites.")
    shard = await write(api, f"shard:{AGENT}:travel", "Ferries leave at nine.", kind="fact")
    gone = await write(api, f"user:{AGENT}:bob", "Bob moved away.")
    assert (await api.delete(f"/v1/agents/{AGENT}/memories/{gone}")).status_code == 200
    await record(api, f"{AGENT}-s1", "alice", "Hello there.", "m1", minute=0)
    url = f"/v1/agents/{AGENT}/memories"

    async def ids(**params: Any) -> set[str]:
        return set(flat(await walk(api, url, "memories", **params)))

    assert await ids(user_id="alice") == {alice, fact}
    assert await ids(namespace=f"user:{AGENT}:bob") == {bob}
    assert await ids(namespace=f"shard:{AGENT}:travel") == {shard}
    assert len(await ids(session_id=f"{AGENT}-s1")) == 1  # its message
    assert await ids(kind="fact") == {fact, shard}
    assert await ids(kind=["fact", "observation"], user_id="alice") == {alice, fact}
    assert await ids(tag="birds") == {alice, fact}
    assert await ids(tag=["birds", "home"]) == {fact}
    assert await ids(state="deleted") == {gone}
    assert gone in await ids(state="all") and gone not in await ids()
    assert await ids(state="evicted") == set()
    message_time = "2026-05-01T09:00:00+00:00"
    assert len(await ids(until=message_time)) == 1  # the message alone is that old
    assert message_time not in {m["valid_at"] for m in (await api.get(url, params={"since": "2026-05-02T00:00:00Z"})
                                                        ).json()["memories"]}
    assert await ids(namespace="user:another:alice") == set()  # another agent's namespace reads as empty
    assert await ids(session_id="never-recorded") == set()


async def test_a_key_for_some_users_sees_only_what_they_may(api):
    await api.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "Travel"})
    await record(api, f"{AGENT}-alice", "alice", "I keep a pelican.", "m1")
    await record(api, f"{AGENT}-bob", "bob", "I fly kites.", "m1")
    alices = await write(api, f"user:{AGENT}:alice", "Alice keeps a pelican.")
    bobs = await write(api, f"user:{AGENT}:bob", "Bob flies kites.")
    shared = await write(api, f"shard:{AGENT}:travel", "Ferries leave at nine.", kind="fact")
    bob = await make_key(api, role="read", agents=[AGENT], users=["bob"])
    assert [a["agent_id"] for a in (await api.get("/v1/agents", headers=bob)).json()["agents"]] == [AGENT]
    assert flat(await walk(api, f"/v1/agents/{AGENT}/users", "users", headers=bob), "user_id") == ["bob"]
    assert flat(await walk(api, f"/v1/agents/{AGENT}/sessions", "sessions", headers=bob), "session_id") == \
        [f"{AGENT}-bob"]
    seen = await walk(api, f"/v1/agents/{AGENT}/memories", "memories", headers=bob, limit=2)
    namespaces = {m["namespace"] for m in flat_items(seen)}
    assert {bobs, shared} <= set(flat(seen)) and alices not in flat(seen)
    assert namespaces <= {f"user:{AGENT}:bob", f"session:{AGENT}-bob", f"shard:{AGENT}:travel"}
    refused = await api.get(f"/v1/agents/{AGENT}/memories", params={"user_id": "alice"}, headers=bob)
    assert refused.status_code == 403 and "pelican" not in refused.text
    assert (await api.get(f"/v1/agents/{AGENT}/sessions", params={"user_id": "alice"}, headers=bob)).status_code == 403
    hidden = await api.get(f"/v1/agents/{AGENT}/memories", params={"session_id": f"{AGENT}-alice"}, headers=bob)
    assert hidden.status_code == 200 and hidden.json() == {"memories": [], "next": None}
    detail = await api.get(f"/v1/agents/{AGENT}/memories/{alices}/detail", headers=bob)
    assert detail.status_code == 404 and "pelican" not in detail.text
    other = await make_key(api, role="read", agents=["elsewhere"])
    assert (await api.get("/v1/agents", headers=other)).json()["agents"][0]["agent_id"] == "elsewhere"
    assert (await api.get(f"/v1/agents/{AGENT}/memories", headers=other)).status_code == 403


def flat_items(pages: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [item for page in pages for item in page]


def forged(body: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


@pytest.mark.parametrize(("params", "words"), [
    ({"cursor": "not a cursor!"}, "not a cursor of this API"),
    ({"cursor": forged({"v": 1, "k": "sessions", "f": "x", "n": 3})}, "not a cursor of this API"),
    ({"cursor": forged({"v": 1, "k": "sessions", "f": "x", "n": 3}) + "." + "A" * 43}, "not a cursor of this list"),
    ({"cursor": forged({"v": 9, "k": "memories"}) + "." + "A" * 43}, "forged"),
    ({"cursor": forged([1, 2])}, "not a cursor of this API"),
    ({"kind": "gossip"}, "kind"),
    ({"state": "sleeping"}, "state"),
    ({"since": "yesterday"}, "since"),
    ({"limit": 0}, "limit"),
    ({"limit": 100_000}, "limit"),
    ({"user_id": "alice", "session_id": "s1"}, "give one of namespace, user_id and session_id"),
    ({"since": "2026-05-02T00:00:00Z", "until": "2026-05-01T00:00:00Z"}, "since: later than until"),
    ({"namespace": "nowhere"}, "namespace"),
    ({"tag": ""}, "tag"),
])
async def test_bad_cursors_and_filters_get_a_clear_422_and_change_nothing(api, falkordb_url, params, words):
    await write(api, f"user:{AGENT}:alice", "Alice likes herons.")
    before = snapshot(falkordb_url, worker_running=True)
    answer = await api.get(f"/v1/agents/{AGENT}/memories", params=params)
    assert answer.status_code == 422, answer.text
    assert words in answer.text, answer.text
    assert snapshot(falkordb_url, worker_running=True) == before


async def test_a_cursor_is_refused_with_other_filters_or_on_another_list(api):
    for i in range(4):
        await write(api, f"user:{AGENT}:alice", f"note {i}")
    url = f"/v1/agents/{AGENT}/memories"
    cursor = (await api.get(url, params={"limit": 2, "user_id": "alice"})).json()["next"]
    assert cursor
    other = await api.get(url, params={"limit": 2, "cursor": cursor})
    assert other.status_code == 422 and "made for other filters" in other.text
    assert (await api.get(f"/v1/agents/{AGENT}/sessions", params={"cursor": cursor})).status_code == 422
    assert (await api.get("/v1/agents", params={"cursor": cursor})).status_code == 422
    payload, mac = cursor.split(".")
    damaged = forged({**json.loads(base64.urlsafe_b64decode(payload + "==")), "t": "soon"}) + "." + mac
    answer = await api.get(url, params={"limit": 2, "user_id": "alice", "cursor": damaged})
    assert answer.status_code == 422 and "damaged" in answer.text


async def test_a_memory_shows_its_messages_window_extractor_access_count_and_history(api):
    for i, line in enumerate(["I live in Lyon now.", "I prefer short answers.", "My sister is called Ana."]):
        await record(api, f"{AGENT}-s1", "alice", line, f"m{i}", minute=i)
    formed = await api.post(f"/v1/sessions/{AGENT}-s1/form")
    assert formed.status_code == 200 and formed.json()["formed"], formed.text
    made = flat_items(await walk(api, f"/v1/agents/{AGENT}/memories", "memories"))
    [episode] = [m for m in made if m["kind"] == "episode"]
    detail = (await api.get(f"/v1/agents/{AGENT}/memories/{episode['id']}/detail")).json()
    assert [m["provenance"]["message_ids"] for m in detail["messages"]] == [["m0"], ["m1"], ["m2"]] or \
        [m["content"] for m in detail["messages"]] == ["I live in Lyon now.", "I prefer short answers.",
                                                       "My sister is called Ana."]
    window = detail["window"]
    assert (window["window"], window["first_sequence"], window["last_sequence"], window["messages"]) == (1, 1, 3, 3)
    assert window["extractor"] == formed.json()["extractor"] and window["memories"] >= 1
    assert detail["history"] == [] and detail["history_complete"] is True  # formation is not audited
    # A tool-written memory: its audit entries, newest first; the detail counts no access.
    mid = await write(api, f"user:{AGENT}:alice", "Alice keeps a pelican.")
    assert (await api.patch(f"/v1/agents/{AGENT}/memories/{mid}", json={"title": "pet"})).status_code == 200
    assert (await api.get(f"/v1/agents/{AGENT}/memories/{mid}")).status_code == 200  # memory_get: one access
    assert (await api.delete(f"/v1/agents/{AGENT}/memories/{mid}")).status_code == 200
    detail = (await api.get(f"/v1/agents/{AGENT}/memories/{mid}/detail")).json()
    assert [e["action"] for e in detail["history"]] == ["memory.delete", "memory.update", "memory.write"]
    assert detail["memory"]["access_count"] == 1 and detail["memory"]["deleted_at"] is not None
    assert detail["messages"] == [] and detail["window"] is None
    again = (await api.get(f"/v1/agents/{AGENT}/memories/{mid}/detail")).json()
    assert again["memory"]["access_count"] == 1
    listed = (await api.get(f"/v1/agents/{AGENT}/memories", params={"state": "deleted"})).json()["memories"]
    assert [(m["id"], m["access_count"]) for m in listed] == [(mid, 1)]
    missing = await api.get(f"/v1/agents/{AGENT}/memories/nope/detail")
    assert missing.status_code == 404


async def test_data_stored_before_the_indexes_is_indexed_once_at_start(api, falkordb_url):
    """An older release kept no browse indexes: the start-up indexes its agents, sessions and
    users (simulated by deleting the indexes, as an upgrade finds them)."""
    from redis.asyncio import Redis

    from memory_service.runtime import open_service
    from memory_service.state import keyspace

    await record(api, f"{AGENT}-old1", "alice", "Hello.", "m1", minute=0)
    await record(api, f"{AGENT}-old2", "bob", "Hi.", "m1", minute=1)
    redis = Redis.from_url(falkordb_url)
    await redis.delete(keyspace.AGENTS, keyspace.BROWSE_INDEX, keyspace.agent_users(AGENT),
                       keyspace.agent_session_order(AGENT), keyspace.agent_session_count(AGENT))
    await redis.aclose()
    assert (await api.get("/v1/agents")).json()["agents"] == []
    async with open_service(suite_settings(falkordb_url), run_worker=False):
        pass
    assert [a["agent_id"] for a in (await api.get("/v1/agents")).json()["agents"]] == [AGENT]
    assert flat(await walk(api, f"/v1/agents/{AGENT}/users", "users"), "user_id") == ["alice", "bob"]
    assert flat(await walk(api, f"/v1/agents/{AGENT}/sessions", "sessions"), "session_id") == \
        [f"{AGENT}-old2", f"{AGENT}-old1"]


async def test_the_client_lists_and_iterates_every_page(api, server):
    from memory_service.client import AsyncMemoryClient

    for i in range(7):
        await write(api, f"user:{AGENT}:alice", f"note {i}", kind="fact" if i % 2 else "observation", tags=["t"])
    await record(api, f"{AGENT}-s1", "alice", "Hello.", "m1")
    async with AsyncMemoryClient(server.base_url, OPERATOR_KEY) as client:
        assert [a.agent_id async for a in client.iter_agents(page_size=1)] == [AGENT]
        assert [u.user_id async for u in client.iter_users(AGENT)] == ["alice"]
        assert [s.session_id async for s in client.iter_sessions(AGENT, user_id="alice")] == [f"{AGENT}-s1"]
        facts = [m async for m in client.iter_memories(AGENT, kinds=["fact"], tags=["t"], page_size=2)]
        assert len(facts) == 3 and all(m.kind == "fact" for m in facts)
        everything = [m.id async for m in client.iter_memories(AGENT, page_size=3)]
        assert len(everything) == len(set(everything)) == 8
        page = await client.list_memories(AGENT, user_id="alice", limit=5)
        assert len(page.memories) == 5 and page.next
        detail = await client.memory_detail(AGENT, facts[0].id)
        assert detail.memory.id == facts[0].id and [e.action for e in detail.history] == ["memory.write"]


async def cli(server: Any, *args: str, key: str = OPERATOR_KEY) -> tuple[int, str]:
    """`memory-service ARGS` against the server, as its console script runs (a process of its own)."""
    import asyncio
    import os
    import sys

    from .conftest import REPO, clean_env

    env = {**clean_env(), "MEMORY_SERVICE_API_KEY": key, "COLUMNS": "250", "PYTHONPATH": str(REPO)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memory_service.cli", *args, "--api", server.base_url, cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert os.path.isdir(REPO)
    return int(process.returncode or 0), out.decode()


async def test_the_cli_lists_and_shows_memories_and_sessions(api, server):
    for i in range(5):
        await write(api, f"user:{AGENT}:alice", f"Alice note number {i}.", tags=["notes"])
    await record(api, f"{AGENT}-s1", "alice", "I live in Lyon now.", "m1")
    await record(api, f"{AGENT}-s1", "alice", "My sister is called Ana.", "m2", minute=1)
    assert (await api.post(f"/v1/sessions/{AGENT}-s1/form")).status_code == 200
    code, out = await cli(server, "memories", "list", "--agent", AGENT, "--user", "alice", "--limit", "3")
    assert code == 0, out
    assert out.count("Alice note number") == 3 and "3 shown; more with --cursor" in out  # written in one second
    code, out = await cli(server, "memories", "list", "--agent", AGENT, "--user", "alice", "--limit", "3", "--all",
                          "--json")
    assert code == 0, out
    listed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(listed) == len({m["id"] for m in listed}) >= 5
    episode = next(m for m in (await api.get(f"/v1/agents/{AGENT}/memories", params={"kind": "episode"})
                               ).json()["memories"])
    code, out = await cli(server, "memories", "show", episode["id"], "--agent", AGENT)
    assert code == 0, out
    assert "formed from" in out and "I live in Lyon now." in out and "extractor" in out
    code, out = await cli(server, "sessions", "list", "--agent", AGENT)
    assert code == 0, out
    assert f"{AGENT}-s1" in out and "no more" in out
    code, out = await cli(server, "sessions", "show", f"{AGENT}-s1")
    assert code == 0, out
    assert "formed_windows" in out
    code, out = await cli(server, "memories", "list", "--agent", AGENT, "--kind", "gossip")
    assert code == 1 and "422" in out and "kind" in out
    code, out = await cli(server, "memories", "show", "nope", "--agent", AGENT)
    assert code == 1 and "404" in out
