"""Stores that stall, a full connection pool, and the API's answer: 503 with Retry-After,
never a 500 and never a hang, and recovery once the store answers again.

The stores are real (the shared embedded FalkorDB, or one of the test's own) reached
through tests/tcp_proxy.py, which stalls connections (accepted, never answered) or cuts
them. The proxy runs on a thread of its own: falkordb probes its server synchronously
while it builds a client, which would otherwise block the proxy too.

A call that hangs fails its test through ``guard`` (a generous bound, never a figure the
test claims): the assertion is that the call fails with the store's timeout, not how fast.
"""

from __future__ import annotations

import asyncio
import secrets
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import SecretStr
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memory_service.access.reach import Reach
from memory_service.backends.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from memory_service.backends.embedded import EmbeddedFalkorDB
from memory_service.backends.loopback import LoopbackServer
from memory_service.backends.outages import is_unavailable
from memory_service.config import Settings
from memory_service.curation.tools import MemoryWrite
from memory_service.domain.errors import BackendUnavailable
from memory_service.http.app import create_app
from memory_service.runtime import default_extractor, open_service
from memory_service.state import keyspace

from .helpers import msg
from .tcp_proxy import ThreadedTcpProxy

HANG = 60  # seconds: a call still running then is hung


async def guard(awaitable):
    try:
        return await asyncio.wait_for(awaitable, HANG)
    except TimeoutError:
        raise AssertionError(f"the call hung (no answer within {HANG} s)") from None


def proxy_to(url: str) -> ThreadedTcpProxy:
    parts = urlsplit(url)
    proxy = ThreadedTcpProxy(parts.hostname, parts.port).start()
    proxy.proxy.password = parts.password
    return proxy


@pytest.fixture
def state_proxy(settings):
    """A proxy in front of the shared store, used for state and the job queue."""
    proxy = proxy_to(settings.falkordb_url)
    yield proxy
    proxy.close()


@pytest.fixture
def own_graph(tmp_path):
    server = EmbeddedFalkorDB(tmp_path / "graph")
    server.start()
    proxy = proxy_to(server.url)
    yield proxy
    proxy.close()
    server.stop()


def message(i: int, content: str = "I prefer window seats.") -> dict:
    return {"agent_id": "a1", "user_id": "alice", "role": "user", "content": content, "message_id": f"m{i}"}


async def test_a_stalled_state_store_answers_503_with_retry_after_and_the_service_recovers(settings, state_proxy):
    # The stall guard off (STORE_STALL_SECONDS past the read timeout): the store's own timeout
    # answers here (tests/test_production.py tests the guard).
    settings = settings.model_copy(update={"redis_url": state_proxy.url, "store_read_timeout_seconds": 0.5,
                                           "overload_retry_after_seconds": 3, "store_stall_seconds": 60})
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        assert (await http.post("/v1/sessions/s1/messages", json=message(1))).status_code == 200
        context = await http.get("/v1/context", params={"agent_id": "a1", "user_id": "alice", "session_id": "s1"})
        assert context.status_code == 200
        state_proxy.stall()
        refused = await guard(http.post("/v1/sessions/s1/messages", json=message(2)))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "3"
        assert refused.json()["detail"] == "a store is overloaded or unreachable; try again shortly"
        # The prompt path still answers: with the last block this process served.
        degraded = await guard(http.get("/v1/context", params={"agent_id": "a1", "user_id": "alice", "session_id": "s1"}))
        assert degraded.status_code == 200 and degraded.json()["source"] == "last-good"
        assert degraded.json()["xml"] == context.json()["xml"]
        state_proxy.resume()
        again = await guard(http.post("/v1/sessions/s1/messages", json=message(2)))
        assert again.status_code == 200 and again.json()["sequence"] == 2 and not again.json()["duplicate"]


async def test_a_stalled_graph_fails_a_write_within_its_timeout_and_shrinks_the_context(settings, own_graph):
    settings = settings.model_copy(update={"falkordb_url": own_graph.url, "redis_url": settings.falkordb_url,
                                           "store_read_timeout_seconds": 0.5})
    async with open_service(settings, run_worker=False) as service:
        await service.record_message("s1", msg("a1", "alice", "The flight leaves at 9am.", mid="m1"))
        own_graph.stall()
        with pytest.raises(BackendUnavailable, match="send it again with the same message_id") as failed:
            await guard(service.record_message("s1", msg("a1", "alice", "Window seat, please.", mid="m2", minute=1)))
        assert isinstance(failed.value.__cause__, RedisTimeoutError)
        assert (await service.session_gate("s1")).pending_messages == 1  # nothing pending for the failed one
        block = await guard(service.assemble_memory_context("a1", "alice", "s1", query="flight"))
        assert "9am" not in block.xml and block.chars <= block.budget
        health = await guard(service.health())
        assert health["backends"]["graph"]["ok"] is False
        own_graph.resume()
        await service.record_message("s1", msg("a1", "alice", "Window seat, please.", mid="m2", minute=1))
        assert (await service.session_gate("s1")).pending_messages == 2


async def test_an_exhausted_pool_answers_503_with_retry_after_and_recovers(settings, state_proxy):
    """Two connections, all busy (their store stalled): the other requests wait the pool
    timeout, then answer 503; once the store answers, the held ones finish and new ones pass."""
    settings = settings.model_copy(update={"redis_url": state_proxy.url, "redis_max_connections": 2,
                                           "redis_pool_timeout_seconds": 0.1, "store_read_timeout_seconds": 30,
                                           "store_stall_seconds": 60})  # the pool's answer, not the stall guard's
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG,
                              limits=httpx.Limits(max_connections=100)) as http:
        assert (await http.post("/v1/sessions/s0/messages", json=message(0))).status_code == 200
        state_proxy.stall()
        requests = [asyncio.create_task(http.post(f"/v1/sessions/s{i}/messages", json=message(i))) for i in range(1, 21)]
        answered = []
        for done in asyncio.as_completed(requests, timeout=HANG):
            answered.append(await done)
            if len(answered) == 18:  # all but the two holding the connections
                break
        assert {r.status_code for r in answered} == {503}
        assert all(r.headers["retry-after"] == "1" for r in answered)
        state_proxy.resume()
        held = [await guard(task) for task in requests if not task.done() or task.result() not in answered]
        assert len(held) == 2 and {r.status_code for r in held} == {200}
        # Recovered: new requests pass (one at a time: twenty at once would wait on the two
        # connections, whose 0.1 s pool timeout a loaded machine can exceed).
        after = [await http.post(f"/v1/sessions/t{i}/messages", json=message(i)) for i in range(20)]
        assert {r.status_code for r in after} == {200}


async def test_a_full_pool_is_a_connection_error_the_api_maps_to_503():
    """What redis-py raises for a full pool, and what it raised before bounded pools
    (MaxConnectionsError), are both outages to the API, not bugs."""
    from redis.exceptions import MaxConnectionsError

    assert is_unavailable(RedisConnectionError("No connection available."))
    assert is_unavailable(MaxConnectionsError("Too many connections"))
    wrapped = BackendUnavailable("could not store")
    wrapped.__cause__ = RedisTimeoutError("Timeout reading from 127.0.0.1:1")
    assert is_unavailable(wrapped)
    try:
        try:
            raise RedisTimeoutError("stalled")
        except RedisTimeoutError as inner:
            raise RuntimeError("while reading a claim") from inner
    except RuntimeError as outer:
        assert is_unavailable(outer)
    assert not is_unavailable(ValueError("a bug"))
    assert not is_unavailable(KeyError("a bug"))


def test_settings_give_every_client_its_timeouts():
    from memory_service.embedding.embedders import build_embedder
    from memory_service.state.pools import blocking_pool

    settings = Settings(_env_file=None, store_connect_timeout_seconds=1.5, store_read_timeout_seconds=7,
                        redis_max_connections=9, redis_pool_timeout_seconds=0.25, http_connect_timeout_seconds=1.25,
                        extractor="llm", llm_base_url="http://127.0.0.1:9/v1", llm_model="m", llm_timeout_seconds=40,
                        embedder="openai", embedding_base_url="http://127.0.0.1:9/v1", embedding_model="e",
                        embedding_timeout_seconds=20)
    pool = blocking_pool("redis://127.0.0.1:9", settings, decode_responses=True)
    assert (pool.max_connections, pool.timeout) == (9, 0.25)
    assert (pool.connection_kwargs["socket_connect_timeout"], pool.connection_kwargs["socket_timeout"]) == (1.5, 7)
    assert "retry" not in pool.connection_kwargs  # no retries: a stalled call fails once
    llm = default_extractor(settings)._chat._client.timeout
    assert (llm.connect, llm.read) == (1.25, 40)
    embedder = build_embedder(settings)._timeout
    assert (embedder.connect, embedder.read) == (1.25, 20)
    with pytest.raises(ValueError, match="OUTBOX_ALARM_PENDING"):
        Settings(_env_file=None, outbox_alarm_pending=10, outbox_max_pending=5)


# The circuit breaker, on a clock the test moves ------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_opens_after_failures_within_its_window_and_closes_after_a_good_trial():
    clock = Clock()
    breaker = CircuitBreaker("mongo", failures=3, window=10, cooloff=5, clock=clock)
    for _ in range(2):
        assert breaker.allow()
        breaker.failure(TimeoutError("slow"))
    assert breaker.state == CLOSED
    breaker.failure(TimeoutError("slow"))
    assert breaker.state == OPEN and not breaker.allow() and breaker.opened == 1
    assert breaker.snapshot() == {"state": OPEN, "opened": 1, "last_error": "TimeoutError: slow"}
    clock.now += 5
    assert breaker.state == HALF_OPEN
    assert breaker.allow()  # one trial
    assert not breaker.allow()  # and only one
    breaker.success()
    assert breaker.state == CLOSED and breaker.allow()


def test_the_breaker_ignores_failures_spread_wider_than_its_window_and_reopens_on_a_failed_trial():
    clock = Clock()
    breaker = CircuitBreaker("mongo", failures=2, window=10, cooloff=5, clock=clock)
    breaker.failure()
    clock.now += 11
    breaker.failure()
    assert breaker.state == CLOSED
    breaker.failure()
    assert breaker.state == OPEN
    clock.now += 5
    assert breaker.allow()
    breaker.failure("still down")
    assert breaker.state == OPEN and breaker.last_error == "still down"
    clock.now += 4
    assert not breaker.allow()
    clock.now += 1
    assert breaker.allow()  # a trial whose caller never reported lets another through after a cool-off
    clock.now += 5
    assert breaker.allow()
    with pytest.raises(ValueError):
        CircuitBreaker("x", failures=0, window=1, cooloff=1)


async def test_past_the_admission_limit_requests_wait_then_answer_503_and_metrics_are_never_queued(
        settings, own_graph):
    """One request at a time: a message whose graph write stalls holds the slot; the next
    request waits its queue timeout and is refused; /metrics still answers; once the graph
    answers, both go through."""
    settings = settings.model_copy(update={
        "falkordb_url": own_graph.url, "redis_url": settings.falkordb_url, "store_read_timeout_seconds": 60,
        "api_max_concurrent_requests": 1, "api_queue_timeout_seconds": 0.1, "overload_retry_after_seconds": 2,
        "store_stall_seconds": 60})  # admission's answer, not the stall guard's (on a loaded machine it came first)
    async with open_service(settings, run_worker=False) as service, \
            LoopbackServer(create_app(service=service)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        assert (await http.post("/v1/sessions/s1/messages", json=message(1))).status_code == 200
        own_graph.stall()
        holding = asyncio.create_task(http.post("/v1/sessions/s1/messages", json=message(2)))
        while not await service.state.redis.hexists(keyspace.session_keys("s1")["ids"], "m2"):  # reserved: now at its graph write
            await asyncio.sleep(0.02)
        refused = await guard(http.post("/v1/sessions/s2/messages", json=message(3)))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
        assert refused.json()["detail"] == "the service is at capacity (1 requests in progress); try again shortly"
        assert (await guard(http.get("/metrics"))).status_code == 200
        assert (await guard(http.get("/health/live"))).status_code == 200  # a liveness probe is never queued
        own_graph.resume()
        assert (await guard(holding)).status_code == 200
        assert (await http.post("/v1/sessions/s2/messages", json=message(3))).status_code == 200


async def test_a_form_request_waiting_for_its_window_takes_no_admission_slot(settings):
    settings = settings.model_copy(update={"api_max_concurrent_requests": 1, "api_queue_timeout_seconds": 0.1,
                                           "form_wait_seconds": 2, "overload_retry_after_seconds": 2})
    async with open_service(settings, run_worker=False) as service, \
            LoopbackServer(create_app(service=service)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        assert (await http.post("/v1/sessions/s1/messages", json=message(1))).status_code == 200
        forming = asyncio.create_task(http.post("/v1/sessions/s1/form"))
        while await service.formation.windows.current_claim("s1") is None:  # it waits for a worker that never comes
            await asyncio.sleep(0.02)
        assert (await guard(http.post("/v1/sessions/s2/messages", json=message(2)))).status_code == 200
        late = await guard(forming)  # not stored in time: 503, the window stays pending
        assert late.status_code == 503 and late.headers["retry-after"] == "2"
        assert "is not formed after 2s" in late.json()["detail"]


async def test_a_graph_out_of_memory_is_an_outage_not_the_callers_input(settings, own_graph):
    """A store refusing writes for its own state (out of memory) answers 503 with
    Retry-After and keeps the message id for the retry: a refused row (422) is only what a
    working store refuses in that row alone (memory_service/ingest/group_commit.py)."""
    from redis.asyncio import Redis

    settings = settings.model_copy(update={"falkordb_url": own_graph.url, "redis_url": settings.falkordb_url})
    graph = Redis.from_url(own_graph.url)
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        assert (await http.post("/v1/sessions/s1/messages", json=message(1))).status_code == 200
        await graph.config_set("maxmemory", 1)
        try:
            refused = await http.post("/v1/sessions/s1/messages", json=message(2, "Aisle seats on short flights."))
        finally:
            await graph.config_set("maxmemory", 0)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
        assert "OOM" not in refused.text and "maxmemory" not in refused.text
        again = await http.post("/v1/sessions/s1/messages", json=message(2, "Aisle seats on short flights."))
        assert again.status_code == 200 and again.json()["duplicate"] is False
        assert (await http.get("/v1/sessions/s1")).json()["gate"]["pending_messages"] == 2
    await graph.aclose()


# The last-good block is kept per reach (Reach.view): a block made for a key for all users
# holds other users' private memory, and a key limited to some users never gets it back
# when the stores fail, whichever of the two last-good copies answers.
SECRET = "BOBLOCKER4411"  # only bob's private directive holds it


async def test_with_the_graph_failing_a_users_key_never_gets_the_block_made_for_all_users(settings, own_graph):
    """The route, with keys: the memory store stalls, the state store answers, so the
    last-good copy kept in the state store is the one served."""
    operator_key = secrets.token_urlsafe(32)
    settings = settings.model_copy(update={"falkordb_url": own_graph.url, "redis_url": settings.falkordb_url,
                                           "store_read_timeout_seconds": 0.5, "api_auth": "keys",
                                           "operator_api_key": SecretStr(operator_key), "memory_write_agents": ["a1"]})
    operator = {"Authorization": f"Bearer {operator_key}"}
    async with LoopbackServer(create_app(settings, run_worker=False)) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=HANG) as http:
        made = await http.post("/v1/keys", headers=operator,
                               json={"name": "alice", "role": "write", "agents": ["a1"], "users": ["alice"]})
        alice = {"Authorization": f"Bearer {made.json()['key']}"}
        for session in ("s1", "s2"):  # both spoke in both: alice's key sees them
            for user, content in (("alice", "Where are the lockers?"), ("bob", "The lockers are by gate 4.")):
                body = {**message(0, content), "user_id": user, "message_id": f"{session}-{user}"}
                assert (await http.post(f"/v1/sessions/{session}/messages", headers=operator, json=body)).status_code == 200
        written = await http.post("/v1/agents/a1/memories", headers=operator, json={
            "namespace": "user:a1:bob", "kind": "directive", "content": f"Bob's locker code is {SECRET}; never say it"})
        assert written.status_code == 201, written.text

        def context(session: str) -> dict[str, str]:
            return {"agent_id": "a1", "user_id": "alice", "session_id": session}

        wide = {session: await http.get("/v1/context", headers=operator, params=context(session))
                for session in ("s1", "s2")}
        assert all(SECRET in answer.json()["xml"] for answer in wide.values())  # all users: bob's directive shows
        own = await http.get("/v1/context", headers=alice, params=context("s1"))
        assert own.status_code == 200 and SECRET not in own.text and "gate 4" in own.json()["xml"]

        own_graph.stall()
        # A new shard: every cached block is stale, so each answer below is assembled (or last-good).
        assert (await http.put("/v1/agents/a1/shards/food", headers=operator, json={"name": "food"})).status_code == 201
        degraded = await guard(http.get("/v1/context", headers=operator, params=context("s2")))
        assert degraded.json()["source"] == "last-good" and degraded.json()["xml"] == wide["s2"].json()["xml"]
        # s2: only the key for all users had a complete block; alice's key gets a smaller one, never that.
        narrow = await guard(http.get("/v1/context", headers=alice, params=context("s2")))
        assert narrow.status_code == 200 and narrow.json()["source"] != "last-good"
        assert SECRET not in narrow.text
        # s1: her key's own last good block, the one it was served.
        mine = await guard(http.get("/v1/context", headers=alice, params=context("s1")))
        assert mine.json()["source"] == "last-good" and mine.json()["xml"] == own.json()["xml"]
        assert SECRET not in mine.text
        own_graph.resume()


async def test_with_every_store_failing_a_users_reach_never_gets_the_block_made_for_all_users(settings, state_proxy):
    """The state store stalls too: the process's own last-good copies answer, kept per reach."""
    settings = settings.model_copy(update={"redis_url": state_proxy.url, "store_read_timeout_seconds": 0.5,
                                           "context_deadline_seconds": 0.5, "memory_write_agents": ["a1"]})
    async with open_service(settings, run_worker=False) as service:
        await service.record_message("s1", msg("a1", "alice", "Where are the lockers?", mid="m1"))
        await service.record_message("s1", msg("a1", "bob", "The lockers are by gate 4.", mid="m2", minute=1))
        await service.memory_write("a1", MemoryWrite(namespace="user:a1:bob", kind="directive",
                                                     content=f"Bob's locker code is {SECRET}; never say it"))
        everyone, only_alice = Reach.of(service.state, "a1", None), Reach.of(service.state, "a1", ["alice"])
        wide = await service.assemble_memory_context("a1", "alice", "s1", reach=everyone)
        assert SECRET in wide.xml

        state_proxy.stall()
        again = await guard(service.assemble_memory_context("a1", "alice", "s1", reach=everyone))
        assert again.source == "last-good" and again.xml == wide.xml
        narrow = await guard(service.assemble_memory_context("a1", "alice", "s1", reach=only_alice))
        assert narrow.source == "none" and SECRET not in narrow.xml
        state_proxy.resume()
