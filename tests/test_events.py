"""Change events (docs/events.md): the agent's stream as server-sent events, and webhooks the
worker delivers them to. A real server with its worker, real Redis and FalkorDB, a real
webhook receiver on loopback (and a port where nothing listens: an endpoint that is down)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from memory_service.backends.loopback import LoopbackServer, free_port
from memory_service.http.app import create_app

from .conftest import flush, suite_settings

AGENT = "herald"
SECRET = "s3cret-s3cret-s3cret"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "events.md"


@pytest.fixture(scope="module")
async def server(falkordb_url):
    settings = suite_settings(falkordb_url, memory_write_agents=["*"], webhook_allow_private=True,
                              webhook_retry_base_seconds=0.2, webhook_retry_max_seconds=0.5, webhook_max_attempts=3,
                              webhook_poll_seconds=1, webhook_timeout_seconds=2, events_sse_heartbeat_seconds=0.5)
    async with LoopbackServer(create_app(settings, run_worker=True)) as live:
        yield live


@pytest.fixture
async def http(server, falkordb_url):
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        yield client


class Receiver:
    """A webhook endpoint: keeps every delivery (headers and body)."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []

        async def hook(request: Request) -> Response:
            self.got.append((dict(request.headers), await request.body()))
            return Response(status_code=204)

        self.app = Starlette(routes=[Route("/hook", hook, methods=["POST"])])

    def events(self) -> list[dict]:
        return [json.loads(body) for _, body in self.got]


async def write(http, content: str, user: str = "alice", headers: dict | None = None) -> dict:
    answer = await http.post(f"/v1/agents/{AGENT}/memories", headers=headers or {}, json={
        "namespace": f"user:{AGENT}:{user}", "kind": "observation", "content": content})
    assert answer.status_code == 201, answer.text
    return answer.json()


async def read_sse(http, params: dict | None = None, headers: dict | None = None, seconds: float = 1.5,
                   agent: str = AGENT) -> list[dict]:
    """The events a stream sends in ``seconds`` (its ``timeout``)."""
    events = []
    async with http.stream("GET", f"/v1/agents/{agent}/events", params={"timeout": seconds, **(params or {})},
                           headers=headers or {}) as answer:
        assert answer.status_code == 200, await answer.aread()
        assert answer.headers["content-type"].startswith("text/event-stream")
        async for line in answer.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


def order(event_id: str) -> tuple[int, int]:
    ms, seq = event_id.split("-")
    return int(ms), int(seq)


async def eventually(check, seconds: float = 15.0):
    deadline = time.monotonic() + seconds
    while True:
        if result := await check():
            return result
        if time.monotonic() > deadline:
            raise AssertionError("not in time")
        await asyncio.sleep(0.1)


async def test_tool_changes_and_a_formed_window_are_events_in_order(http):
    memory = await write(http, "Alice keeps a marmoset.")
    assert (await http.patch(f"/v1/agents/{AGENT}/memories/{memory['id']}", json={"title": "pet"})).status_code == 200
    assert (await http.delete(f"/v1/agents/{AGENT}/memories/{memory['id']}")).status_code == 200
    assert (await http.post(f"/v1/agents/{AGENT}/memories/{memory['id']}/undelete")).status_code == 200
    for i, (role, text) in enumerate([("user", "I prefer window seats on flights."), ("assistant", "Noted."),
                                      ("user", "My sister Ana lives in Lisbon."), ("assistant", "Good to know.")]):
        answer = await http.post("/v1/sessions/s1/messages", json={"agent_id": AGENT, "user_id": "alice", "role": role,
                                                                   "content": text, "message_id": f"m{i}"})
        assert answer.status_code == 200
    assert (await http.post("/v1/sessions/s1/form")).json()["formed"]

    events = await read_sse(http, {"after": "0-0"}, seconds=1)
    types = [e["type"] for e in events]
    assert types[:4] == ["written", "updated", "deleted", "undeleted"]
    assert all(e["memory_ids"] == [memory["id"]] and e["namespace"] == f"user:{AGENT}:alice"
               and e["user_id"] == "alice" and e["kind"] == "observation" for e in events[:4])
    assert "content" not in events[0] and "Alice" not in json.dumps(events)  # no memory content
    formed = [e for e in events if e["type"] == "formed"]
    assert formed and all(e["session_id"] == "s1" and e["window"] == 1 for e in formed)
    assert {e["namespace"] for e in formed} >= {"session:s1"}
    ids = [e["id"] for e in events]
    assert ids == sorted(ids, key=order) and len(set(ids)) == len(ids)

    # Resuming with Last-Event-ID (or ?after=) sends only what came after it.
    resumed = await read_sse(http, headers={"Last-Event-ID": events[1]["id"]}, seconds=0.5)
    assert [e["id"] for e in resumed] == ids[2:]
    assert [e["id"] for e in await read_sse(http, {"after": events[-1]["id"]}, seconds=0.5)] == []


async def test_a_stream_sends_new_events_live_with_heartbeats(http):
    async def consume() -> tuple[list[dict], int]:
        events, beats = [], 0
        async with http.stream("GET", f"/v1/agents/{AGENT}/events", params={"timeout": 2.5}) as answer:
            async for line in answer.aiter_lines():
                beats += line == ": heartbeat"
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        return events, beats

    reader = asyncio.create_task(consume())
    await asyncio.sleep(1.2)
    memory = await write(http, "Alice learns the cello.")
    events, beats = await reader
    assert [(e["type"], e["memory_ids"]) for e in events] == [("written", [memory["id"]])] and beats >= 1


async def test_a_key_limited_to_a_user_sees_only_its_users_events(http):
    key = (await http.post("/v1/keys", json={"name": "bob", "role": "read", "agents": [AGENT],
                                             "users": ["bob"]})).json()["key"]
    await write(http, "Alice keeps a marmoset.", user="alice")
    bobs = await write(http, "Bob plays chess.", user="bob")
    shared = await http.post(f"/v1/agents/{AGENT}/memories", json={
        "namespace": f"agent:{AGENT}", "kind": "fact", "content": "The office opens at nine."})
    assert shared.status_code == 201
    seen = await read_sse(http, {"after": "0-0"}, {"Authorization": f"Bearer {key}"}, seconds=0.5)
    assert [e["memory_ids"] for e in seen] == [[bobs["id"]], [shared.json()["id"]]]
    assert all(e["user_id"] in (None, "bob") and e["key_id"] is None for e in seen)
    everything = await read_sse(http, {"after": "0-0"}, seconds=0.5)
    assert len(everything) == 3
    other = (await http.post("/v1/keys", json={"name": "x", "role": "read", "agents": ["elsewhere"]})).json()["key"]
    assert (await http.get(f"/v1/agents/{AGENT}/events", headers={"Authorization": f"Bearer {other}"})).status_code == 403
    # webhooks need admin with a key for every user
    assert (await http.put(f"/v1/agents/{AGENT}/webhooks/h1", headers={"Authorization": f"Bearer {key}"},
                           json={"url": "http://127.0.0.1:9/hook", "secret": SECRET})).status_code == 403


def verify_example() -> str:
    """The receiver's check, as docs/events.md shows it."""
    text = DOCS.read_text()
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]


async def test_webhook_delivery_is_signed_ordered_and_deduplicable(http):
    receiver = Receiver()
    async with LoopbackServer(receiver.app) as hooks:
        put = await http.put(f"/v1/agents/{AGENT}/webhooks/main", json={"url": f"{hooks.base_url}/hook",
                                                                         "secret": SECRET})
        assert put.status_code == 201 and "secret" not in put.json()
        first = await write(http, "Alice keeps a marmoset.")
        second = await write(http, "Alice learns the cello.")
        await eventually(lambda: asyncio.sleep(0, len(receiver.got) >= 2))
        events = receiver.events()
        assert [e["memory_ids"] for e in events] == [[first["id"]], [second["id"]]]
        namespace: dict = {}
        exec(verify_example(), namespace)
        for headers, body in receiver.got:
            assert namespace["verify"](SECRET, headers["x-memory-signature"], body)
            assert not namespace["verify"]("another-secret-0000", headers["x-memory-signature"], body)
            assert headers["x-memory-event-id"] == json.loads(body)["id"]
        stale = "t=1,v1=" + hmac.new(SECRET.encode(), b"1." + receiver.got[0][1], hashlib.sha256).hexdigest()
        assert not namespace["verify"](SECRET, stale, receiver.got[0][1])  # too old
        hook = (await http.get(f"/v1/agents/{AGENT}/webhooks/main")).json()
        assert hook["cursor"] == events[-1]["id"] and hook["attempts"] == 0 and "secret" not in hook
        again = await http.put(f"/v1/agents/{AGENT}/webhooks/main", json={"url": f"{hooks.base_url}/hook",
                                                                           "secret": SECRET})
        assert again.status_code == 200 and again.json()["cursor"] == events[-1]["id"]
    assert (await http.delete(f"/v1/agents/{AGENT}/webhooks/main")).status_code == 204
    assert (await http.get(f"/v1/agents/{AGENT}/webhooks/main")).status_code == 404


async def test_an_endpoint_that_is_down_gets_retries_then_dead_letters_then_a_replay(http):
    port = free_port()  # nothing listens there yet
    url = f"http://127.0.0.1:{port}/hook"
    assert (await http.put(f"/v1/agents/{AGENT}/webhooks/down", json={"url": url, "secret": SECRET})).status_code == 201
    memory = await write(http, "Alice keeps a marmoset.")

    async def dead() -> list[dict]:
        return (await http.get(f"/v1/agents/{AGENT}/webhooks/down/dead-letters")).json()["dead_letters"]

    letters = await eventually(dead)
    assert len(letters) == 1 and letters[0]["attempts"] == 3 and letters[0]["event"]["memory_ids"] == [memory["id"]]
    assert "Connect" in letters[0]["error"]
    hook = (await http.get(f"/v1/agents/{AGENT}/webhooks/down")).json()
    assert hook["dead_letters"] == 1 and hook["cursor"] == letters[0]["event"]["id"]

    receiver = Receiver()
    async with LoopbackServer(receiver.app, port=port):
        later = await write(http, "Alice learns the cello.")
        await eventually(lambda: asyncio.sleep(0, len(receiver.got) >= 1))
        assert receiver.events()[0]["memory_ids"] == [later["id"]]  # the cursor moved past the dead letter
        event_id = letters[0]["event"]["id"]
        assert (await http.post(f"/v1/agents/{AGENT}/webhooks/down/dead-letters/{event_id}/replay")).status_code == 202
        await eventually(lambda: asyncio.sleep(0, len(receiver.got) >= 2))
        assert receiver.events()[1]["id"] == event_id  # the same id: a host de-duplicates on it
        assert await dead() == []
    assert (await http.post(f"/v1/agents/{AGENT}/webhooks/down/dead-letters/{event_id}/replay")).status_code == 404
    assert (await http.delete(f"/v1/agents/{AGENT}/webhooks/down/dead-letters/{event_id}")).status_code == 404


@pytest.mark.parametrize("body, problem", [
    ({"url": "ftp://127.0.0.1/x", "secret": SECRET}, "url"),
    ({"url": "not a url", "secret": SECRET}, "url"),
    ({"url": "http://127.0.0.1:9/x"}, "secret"),
    ({"url": "http://127.0.0.1:9/x", "secret": "short"}, "secret"),
    ({"url": "http://user:pw@127.0.0.1:9/x", "secret": SECRET}, "credentials"),
    ({"url": "http://127.0.0.1:9/x", "secret": SECRET, "extra": 1}, "extra"),
])
async def test_bad_webhooks_are_refused_and_nothing_is_stored(http, body, problem):
    answer = await http.put(f"/v1/agents/{AGENT}/webhooks/bad", json=body)
    assert answer.status_code == 422 and problem in answer.text
    assert (await http.get(f"/v1/agents/{AGENT}/webhooks")).json() == []
    assert (await http.put(f"/v1/agents/{AGENT}/webhooks/no:colon", json={"url": "http://127.0.0.1:9/x",
                                                                          "secret": SECRET})).status_code == 422
    assert (await http.get(f"/v1/agents/{AGENT}/events", params={"after": "nope"})).status_code == 422
    assert (await http.get(f"/v1/agents/{AGENT}/events", headers={"Last-Event-ID": "x-1"})).status_code == 422


async def test_private_addresses_are_refused_unless_allowed(falkordb_url):
    from memory_service.domain.errors import InvalidInput
    from memory_service.events.webhooks import check_url

    for url in ("http://127.0.0.1/x", "http://10.0.0.8/x", "http://[::1]/x", "http://169.254.169.254/latest",
                "http://localhost:8080/x", "http://[::ffff:127.0.0.1]/x"):
        with pytest.raises(InvalidInput, match="WEBHOOK_ALLOW_PRIVATE"):
            await check_url(url, allow_private=False)
        await check_url(url, allow_private=True)
    await check_url("https://93.184.215.14/hook", allow_private=False)


async def test_the_clients_follow_events_and_manage_webhooks(server, http):
    from memory_service.client import AsyncMemoryClient, MemoryClient
    from memory_service.client.errors import NotFoundError

    memory = await write(http, "Alice keeps a marmoset.")
    async with AsyncMemoryClient(server.base_url) as client:
        events = [e async for e in client.events(AGENT, after="0-0", timeout=0.5)]
        assert [(e.type.value, e.memory_ids) for e in events] == [("written", [memory["id"]])]
        assert [e async for e in client.events(AGENT, after=events[0].id, timeout=0.5)] == []
        hook = await client.put_webhook(AGENT, "c1", url="http://127.0.0.1:9/hook", secret=SECRET)
        assert hook.id == "c1" and hook.cursor == events[0].id
        assert [h.id for h in await client.list_webhooks(AGENT)] == ["c1"]
        assert (await client.webhook_dead_letters(AGENT, "c1")).dead_letters == []
        with pytest.raises(NotFoundError):
            await client.replay_dead_letter(AGENT, "c1", "1-0")
        await client.delete_webhook(AGENT, "c1")
        with pytest.raises(NotFoundError):
            await client.get_webhook(AGENT, "c1")

    def follow() -> list:
        with MemoryClient(server.base_url) as sync:
            return list(sync.events(AGENT, after="0-0", timeout=0.5))

    assert [e.id for e in await asyncio.to_thread(follow)] == [events[0].id]


async def test_an_erasure_is_an_event_and_leaves_nothing_of_the_user(falkordb_url):
    """(The purge's events: tests/test_retention.py, whose process counters a purge here would move.)"""
    from datetime import UTC, datetime

    from memory_service.curation.tools import MemoryWrite
    from memory_service.events.log import Changed
    from memory_service.runtime import open_service
    from memory_service.schemas.events import EventType, WebhookIn
    from memory_service.state import keyspace

    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, memory_write_agents=["*"], webhook_allow_private=True)
    async with open_service(settings, run_worker=False) as service:
        def body(user: str, text: str) -> MemoryWrite:
            return MemoryWrite(namespace=f"user:{AGENT}:{user}", kind="observation", content=text)

        bobs = await service.memory_write(AGENT, body("bob", "Bob plays chess."))
        (first,) = await service.events.read(AGENT, "0-0", 100)  # bob's, before alice's
        alices = await service.memory_write(AGENT, body("alice", "Alice keeps a marmoset."))
        await service.webhooks.put(AGENT, "h", WebhookIn(url="http://127.0.0.1:9/", secret=SECRET))
        (dead_id,) = await service.events.emit(AGENT, EventType.WRITTEN, [Changed(f"user:{AGENT}:alice", "fact", ("x",))])
        letter = {"event": (await service.events.read(AGENT, first.id, 100))[-1].model_dump(mode="json"),
                  "attempts": 1, "error": "down", "dead_at": datetime.now(UTC).isoformat()}
        await service.state.redis.hset(keyspace.webhook_dead(AGENT, "h"), dead_id, json.dumps(letter))
        await service.erase_user(AGENT, "alice", actor="k1")
        left = await service.events.read(AGENT, "0-0", 100)
        assert all(e.user_id != "alice" and alices.id not in e.memory_ids for e in left)
        assert left[0].memory_ids == [bobs.id]  # another user's events stay
        assert left[-1].type is EventType.ERASED and left[-1].user_id is None and left[-1].key_id == "k1"
        assert (await service.webhooks.dead_letters(AGENT, "h")).dead_letters == []
