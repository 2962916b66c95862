"""Batch ingest (POST /v1/agents/{agent_id}/messages/batch, docs/ingest.md "Batches"): order
per session, idempotence by message id, per-item refusals, body limits, users' keys,
formation exactly once, and `memory-service import-history` end to end. A real server on
loopback (in this event loop), the embedded FalkorDB/Redis, the worker in process; no
speed is asserted (bench/ingest_bench.py --route batch measures it)."""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from pathlib import Path

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.client import AsyncMemoryClient
from memory_service.domain.models import BatchMessageIn, MemoryKind
from memory_service.domain.namespaces import Namespace
from memory_service.formation.jobs import QUEUE_NAME
from memory_service.http.app import create_app
from memory_service.state import keyspace

from .conftest import REPO, clean_env, flush, suite_settings
from .helpers import wait_embedded, wait_embedding_idle
from .store_state import snapshot
from .test_worker import assert_formed_exactly_once, wait_until_formed

AGENT = "a1"
OPERATOR_KEY = secrets.token_urlsafe(32)
# Small limits, so that the tests pass them cheaply; a window of at most 8 messages, so
# that one batch's session forms in several windows.
LIMITS = {"max_request_bytes": 4096, "max_batch_bytes": 65_536, "max_batch_messages": 50, "max_message_chars": 2000,
          "memory_formation_msg_interval": 5, "max_window_messages": 8}


@pytest.fixture(scope="module")
async def server(falkordb_url):
    app = create_app(suite_settings(falkordb_url, **LIMITS), run_worker=True)
    async with LoopbackServer(app) as running:
        running.state = app.state  # type: ignore[attr-defined]
        yield running


@pytest.fixture
async def http(server, falkordb_url):
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        yield client
    await worker_idle(server.state.service)  # no job of this test writes into the next one's store


async def worker_idle(service, timeout: float = 60) -> None:
    """Until the worker's queue is empty and no job runs (a bound, not a speed check)."""
    redis = service.state.redis
    for _ in range(int(timeout / 0.05)):
        running = [key async for key in redis.scan_iter(match="arq:in-progress:*", count=1000)
                   if not key.startswith("arq:in-progress:cron:")]  # a cron job's mark outlives it
        if not running and not await redis.zcard(QUEUE_NAME):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the worker is still busy: {running}")


def item(session: str, i: int, user: str = "alice", content: str | None = None, **extra) -> dict:
    return {"session_id": session, "user_id": user, "role": "user" if i % 2 == 0 else "assistant",
            "content": content or f"Line {i} of {session}: I prefer seat number {i}.", "message_id": f"{session}-m{i}",
            **extra}


def single(session: str, i: int, agent: str = AGENT, **kwargs) -> dict:
    """The body of the single-message route for ``item(session, i)``."""
    return {"agent_id": agent, **{k: v for k, v in item(session, i, **kwargs).items() if k != "session_id"}}


async def batch(http: httpx.AsyncClient, messages: list, agent: str = AGENT, **kwargs) -> httpx.Response:
    return await http.post(f"/v1/agents/{agent}/messages/batch", json={"messages": messages}, **kwargs)


async def stored(service, session: str, agent: str = AGENT) -> dict[str, int]:
    """The session's stored messages: message id -> sequence."""
    _, backend = await service.agents.backend_for(agent)
    found = await backend.recent(agent, Namespace.session(session), [MemoryKind.MESSAGE], 10_000)
    return {m.metadata.message_ids[0]: m.metadata.sequence for m in found}


async def test_each_sessions_messages_keep_the_batchs_order_after_what_the_session_held(http, server):
    service = server.state.service
    one = await http.post("/v1/sessions/s0/messages", json=single("s0", 0))
    assert one.status_code == 200 and one.json()["sequence"] == 1
    # Three sessions interleaved, s0 already holding one message.
    messages = [item(f"s{k}", i) for i in range(1, 13) for k in range(3)]
    answer = await batch(http, messages)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["recorded"], body["duplicate"], body["refused"], body["failed"]) == (36, 0, 0, 0)
    assert [a["index"] for a in body["items"]] == list(range(36))
    for k in range(3):
        sequences = [a["sequence"] for a in body["items"] if a["session_id"] == f"s{k}"]
        assert sequences == list(range(2 if k == 0 else 1, 14 if k == 0 else 13)), sequences
        held = await stored(service, f"s{k}")
        assert held == {a["message_id"]: a["sequence"] for a in body["items"] if a["session_id"] == f"s{k}"} | (
            {"s0-m0": 1} if k == 0 else {})
    assert [s["session_id"] for s in body["sessions"]] == ["s0", "s1", "s2"]


async def test_a_batch_sent_again_is_all_duplicates_and_stores_nothing_twice(http, server, falkordb_url):
    service = server.state.service
    messages = [item(f"d{k}", i) for k in range(2) for i in range(10)]
    assert (await batch(http, messages)).json()["recorded"] == 20
    # Settle the formations the gates opened: the comparison below is of what a replay changes.
    for k in range(2):
        assert (await http.post(f"/v1/sessions/d{k}/form")).status_code == 200
    await wait_embedded(service, AGENT)
    before = snapshot(falkordb_url, worker_running=True)
    again = (await batch(http, messages)).json()
    assert (again["recorded"], again["duplicate"]) == (0, 20)
    assert [a["sequence"] for a in again["items"]] == [i + 1 for _ in range(2) for i in range(10)]
    assert snapshot(falkordb_url, worker_running=True) == before
    # One message recorded alone is a duplicate in a batch, and the other way round.
    alone = await http.post("/v1/sessions/d0/messages", json=single("d0", 3))
    assert alone.json()["duplicate"] is True
    # The same id twice in one batch: one message; the same id with other content: refused.
    twice = (await batch(http, [item("d2", 0), item("d2", 0), item("d2", 0, content="Something else.")])).json()
    assert [a["status"] for a in twice["items"]] == ["recorded", "duplicate", "refused"]
    assert twice["items"][2]["code"] == 409 and "other content" in twice["items"][2]["detail"]
    assert await stored(service, "d2") == {"d2-m0": 1}


async def test_a_batch_leaves_the_indexes_caches_and_embeddings_as_its_messages_one_by_one_would(http, server):
    """A batch writes each user's index entries, generation and the agent's embedding mark
    once for all its messages: the users' sessions, the agent's users, a speaker's cached
    block made stale, every message embedded by the one job its mark enqueued."""
    service = server.state.service
    redis = service.state.redis
    assert (await http.post("/v1/sessions/before/messages", json=single("before", 0, user="bob"))).status_code == 200
    await wait_embedded(service, AGENT)
    for _ in range(2):
        cached = await service.assemble_memory_context(AGENT, "bob", "before")
    assert cached.source == "cache"
    messages = [item("i0", 0), item("i2", 0, user="bob"), item("i1", 0), item("i0", 2), item("i2", 2, user="bob"),
                item("i0", 1), item("i1", 1)]  # assistants answer in i0 and i1 (odd lines)
    answer = (await batch(http, messages)).json()
    assert answer["recorded"] == 7, answer
    assert await redis.smembers(keyspace.user_sessions(AGENT, "alice")) == {"i0", "i1"}
    assert await redis.smembers(keyspace.user_sessions(AGENT, "bob")) == {"before", "i2"}
    assert await redis.smembers(keyspace.user_recorded(AGENT, "alice")) == {"i0", "i1"}
    assert set(await redis.zrange(keyspace.agent_users(AGENT), 0, -1)) == {"alice", "bob"}
    assert (await service.assemble_memory_context(AGENT, "bob", "before")).source != "cache"  # his generation moved
    await wait_embedded(service, AGENT)  # all seven, though only one job was enqueued for them


async def test_bad_items_are_refused_alone_and_leave_nothing(http, server):
    service = server.state.service
    taken = await http.post("/v1/sessions/theirs/messages", json=single("theirs", 0, "a2"))
    assert taken.status_code == 200
    messages = [
        item("m", 0),
        item("m", 1, content="Nul \u0000 inside"),
        item("m", 2, content="x" * 2001),  # over MAX_MESSAGE_CHARS
        {k: v for k, v in item("m", 3).items() if k != "role"},
        item("m", 4, role="narrator"),
        "not an object",
        item("m", 6, content="   "),
        item("theirs", 7),  # a session of another agent
        item("m", 8),
        item("m", 9, created_at="0001-01-01T00:00:00+14:00"),
        item("m", 10),
    ]
    answer = await batch(http, messages)
    assert answer.status_code == 200, answer.text
    items = answer.json()["items"]
    assert [a["status"] for a in items] == ["recorded"] + ["refused"] * 7 + ["recorded", "refused", "recorded"]
    assert [a["code"] for a in items if a["status"] == "refused"] == [422, 422, 422, 422, 422, 422, 409, 422]
    assert "U+0000" in items[1]["detail"] and items[1]["message_id"] == "m-m1" and items[1]["session_id"] == "m"
    assert "2000" in items[2]["detail"]
    assert "role" in items[3]["detail"] and "role" in items[4]["detail"]
    assert items[5]["session_id"] is None and "messages.5" in items[5]["detail"]
    assert "blank" in items[6]["detail"] and "theirs" in items[7]["detail"] and "a2" not in items[7]["detail"]
    # In order, without gaps the refused items would have left: reservations come after the checks.
    assert await stored(service, "m") == {"m-m0": 1, "m-m8": 2, "m-m10": 3}
    assert await stored(service, "theirs", "a2") == {"theirs-m0": 1}
    assert await stored(service, "theirs") == {}
    # The refused ids are free: corrected, they record.
    fixed = (await batch(http, [item("m", 1, content="Nul removed")])).json()
    assert fixed["items"][0]["status"] == "recorded" and fixed["items"][0]["sequence"] == 4


async def test_a_content_the_store_refuses_is_refused_alone_and_its_id_released(server):
    """What the HTTP edge does not catch (the Python API takes U+0000): the store refuses the
    row, the group commit bisects it out, its batch-mates are stored."""
    service = server.state.service
    await flush_redis_only(service)
    messages = [BatchMessageIn(**item("p", i)) for i in range(6)]
    messages[3] = BatchMessageIn.model_construct(**(item("p", 3) | {"content": "has \u0000 NUL"}))
    out = await service.record_batch(AGENT, messages)
    assert [a.status for a in out.items] == ["recorded"] * 3 + ["refused"] + ["recorded"] * 2
    assert out.items[3].code == 422 and "free again" in out.items[3].detail
    assert set(await stored(service, "p")) == {f"p-m{i}" for i in (0, 1, 2, 4, 5)}
    again = await service.record_batch(AGENT, [BatchMessageIn(**item("p", 3))])
    assert again.items[0].status == "recorded"
    # The worker's jobs are done before the next test flushes the store.
    await wait_until_formed(service, ["p"])
    await wait_embedded(service, AGENT)


async def flush_redis_only(service) -> None:
    await service.state.redis.flushall()


async def test_the_body_limits_answer_413_and_422_and_store_nothing(http, server, falkordb_url):
    before = snapshot(falkordb_url, worker_running=True)
    too_many = await batch(http, [item("L", i) for i in range(51)])
    assert too_many.status_code == 413 and "51 messages, more than 50 (MAX_BATCH_MESSAGES)" in too_many.text
    too_large = await batch(http, [item("L", i, content="y" * 1900) for i in range(40)])
    assert too_large.status_code == 413 and "65536 bytes (MAX_BATCH_BYTES)" in too_large.text
    for body in ({"messages": []}, {"items": [item("L", 0)]}, [item("L", 0)], {"messages": item("L", 0)}):
        refused = await http.post(f"/v1/agents/{AGENT}/messages/batch", json=body)
        assert refused.status_code == 422 and set(refused.json()) == {"detail", "errors"}, refused.text
    not_json = await http.post(f"/v1/agents/{AGENT}/messages/batch", content=b"{\"messages\": [", headers={
        "Content-Type": "application/json"})
    assert not_json.status_code == 422
    bad_agent = await batch(http, [item("L", 0)], agent="bad:agent")
    assert bad_agent.status_code == 422
    assert snapshot(falkordb_url, worker_running=True) == before
    # The batch takes more than MAX_REQUEST_BYTES (4096 here); every other route does not.
    larger = [item("L", i, content="z" * 300) for i in range(30)]
    assert len(json.dumps({"messages": larger})) > 4096
    assert (await batch(http, larger)).json()["recorded"] == 30
    alone = await http.post("/v1/sessions/L/messages", json=single("L", 99, content="z" * 5000))
    assert alone.status_code == 413 and "MAX_REQUEST_BYTES" in alone.text


@pytest.fixture(scope="module")
async def keyed(falkordb_url, server):
    """A server requiring keys, without a worker of its own: ``server``'s worker runs its jobs."""
    app = create_app(suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY), run_worker=False)
    async with LoopbackServer(app) as running:
        running.state = app.state  # type: ignore[attr-defined]
        yield running


async def test_a_key_for_one_user_records_only_that_users_messages(keyed, falkordb_url):
    await flush(falkordb_url)
    service = keyed.state.service
    operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    async with httpx.AsyncClient(base_url=keyed.base_url, timeout=60) as http:
        made = await http.post("/v1/keys", headers=operator, json={"name": "bob", "role": "write", "agents": [AGENT],
                                                                    "users": ["bob"]})
        bob = {"Authorization": f"Bearer {made.json()['key']}"}
        started = await batch(http, [item("alice-s", 0, user="alice")], headers=operator)
        assert started.json()["recorded"] == 1
        mixed = await batch(http, [item("bob-s", 0, user="bob"), item("bob-s", 1, user="alice"),
                                   item("alice-s", 2, user="bob"), item("bob-s", 3, user="bob")], headers=bob)
        assert mixed.status_code == 200, mixed.text
        items = mixed.json()["items"]
        assert [(a["status"], a["code"]) for a in items] == [("recorded", None), ("refused", 403), ("refused", 409),
                                                             ("recorded", None)]
        assert "'alice' is not one of them" in items[1]["detail"]
        assert await stored(service, "bob-s") == {"bob-s-m0": 1, "bob-s-m3": 2}
        assert await stored(service, "alice-s") == {"alice-s-m0": 1}
        # A batch the key may write none of is refused whole, and changes nothing. (The
        # embedding job of the messages above done first: its writes are not the batch's.)
        await wait_embedding_idle(falkordb_url, AGENT)
        before = snapshot(falkordb_url, worker_running=True)
        none = await batch(http, [item("x", 0, user="alice"), item("x", 1, user="carol")], headers=bob)
        assert none.status_code == 403 and set(none.json()) == {"detail"}
        assert (await batch(http, [item("x", 0, user="bob")], agent="a2", headers=bob)).status_code == 403
        after = snapshot(falkordb_url, worker_running=True)
        assert after == before, before.changes(after)


async def test_batch_recorded_sessions_are_formed_exactly_once(http, server):
    service = server.state.service
    sessions = {f"f{k}": (f"user{k}", [f"f{k}-m{i}" for i in range(30)]) for k in range(3)}
    messages = [item(s, i, user=user, content=f"I prefer seat number {i} on every flight of {s}.") | {"role": "user"}
                for i in range(30) for s, (user, _) in sessions.items()]
    for start in range(0, len(messages), 45):  # two batches, each splitting sessions
        answer = (await batch(http, messages[start:start + 45])).json()
        assert answer["recorded"] == 45
        assert all(s["gate"]["open"] and s["formation_job"] for s in answer["sessions"]), answer["sessions"]
    await wait_until_formed(service, list(sessions))
    await assert_formed_exactly_once(service, sessions)
    for s in sessions:
        assert (await service.session_status(s))["formed_windows"] >= 4  # at most 8 messages a window
    # Sent again, the batch forms nothing more.
    assert (await batch(http, messages[:45])).json()["duplicate"] == 45
    await asyncio.sleep(0.5)
    await wait_until_formed(service, list(sessions))
    await assert_formed_exactly_once(service, sessions)


async def test_the_client_sends_a_batch_and_fills_in_message_ids(server, falkordb_url):
    await flush(falkordb_url)
    async with AsyncMemoryClient(server.base_url) as client:
        out = await client.record_batch(AGENT, [
            BatchMessageIn(**item("c", 0)),
            {"session_id": "c", "user_id": "alice", "role": "user", "content": "No id given."},
        ])
    assert [a.status for a in out.items] == ["recorded", "recorded"] and out.items[1].message_id
    assert [a.sequence for a in out.items] == [1, 2]


async def run_import(*args: str) -> tuple[int, str]:
    env = clean_env() | {"PYTHONPATH": str(REPO), "COLUMNS": "200"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "memory_service.cli", "import-history", *args,
                                                env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=180)
    return proc.returncode, out.decode()


async def test_import_history_records_a_file_and_a_second_run_skips_it(server, falkordb_url, tmp_path: Path):
    await flush(falkordb_url)
    service = server.state.service
    lines = []
    for i in range(70):
        line = {"agent_id": AGENT if i % 10 else "a2", "user_id": "alice", "session_id": f"{'h' if i % 10 else 'o'}{i % 3}",
                "role": "user", "content": f"History line {i}.", "created_at": f"2025-03-01T09:{i % 60:02d}:00Z"}
        if i % 2:
            line["message_id"] = f"line-{i}"  # the others get ids derived from the line
        lines.append(json.dumps(line))
    lines[5] = "{not json"
    lines[6] = json.dumps({"user_id": "alice", "session_id": "h0", "role": "user", "content": "no agent"})
    lines[8] = json.dumps({"agent_id": AGENT, "user_id": "alice", "session_id": "h2", "role": "user",
                           "content": "NUL \u0000 here", "message_id": "nul"})
    path = tmp_path / "history.jsonl"
    path.write_text("\n".join(lines) + "\n\n")
    code, out = await run_import(str(path), "--api", server.base_url, "--batch-size", "16")
    assert code == 1, out
    assert "67 recorded, 0 duplicate (recorded before), 3 refused, 0 failed" in out, out
    assert "line 6: refused: not a JSON line" in out and "line 7: refused: no agent_id" in out
    assert "line 9: refused: 422" in out and "U+0000" in out
    # Per session, in the file's order (the a2 lines are another agent's sessions).
    for k in range(3):
        held = await stored(service, f"h{k}")
        expected = [i for i in range(70) if i % 3 == k and i % 10 and i not in (5, 6, 8)]
        assert sorted(held.values()) == list(range(1, len(expected) + 1))
        by_sequence = sorted(held, key=held.get)
        assert [mid for mid in by_sequence if mid.startswith("line-")] == [f"line-{i}" for i in expected if i % 2]
    assert [len(await stored(service, f"o{k}", "a2")) for k in range(3)] == [3, 2, 2]  # lines 1, 11, ..., 61
    # Run again: everything recorded is a duplicate, nothing is stored twice.
    code, out = await run_import(str(path), "--api", server.base_url)
    assert code == 1 and "0 recorded, 67 duplicate (recorded before), 3 refused, 0 failed" in out, out
    assert [len(await stored(service, f"h{k}")) for k in range(3)] == [20, 21, 19]  # 60 lines of agent a1
