"""The client library (memory_service.client) against a real server: the session loop, the
admin calls and each family of errors, async and sync; retries on 429 and 503 against real
servers that answer them (a key over its rate limit; a tiny app answering 503 with
Retry-After). Nothing is mocked: requests are counted with httpx's own event hooks."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from memory_service.backends.loopback import LoopbackServer
from memory_service.client import (
    AsyncMemoryClient,
    AuthenticationError,
    ConflictError,
    InvalidRequest,
    MemoryApiError,
    MemoryClient,
    NotFoundError,
    PermissionDenied,
    RateLimitError,
    ServerError,
    ServiceUnavailable,
)
from memory_service.client._common import BACKOFF_BASE, retry_delay
from memory_service.domain.models import Provenance
from memory_service.http.app import create_app
from memory_service.schemas.context import ContextOut
from memory_service.schemas.erasure import ErasureReport, UserExport
from memory_service.schemas.formation import FormationSummary, GateStatus
from memory_service.schemas.memories import MemoryRecord
from memory_service.schemas.records import RecordOut
from memory_service.schemas.search import SearchResult

from .conftest import REPO, flush, suite_settings
from .helpers import wait_embedding_idle
from .store_state import snapshot

AGENT, OTHER = "trip", "rival"
OPERATOR_KEY = secrets.token_urlsafe(32)


async def test_the_session_loop_through_the_async_client(live_server, http):
    async with AsyncMemoryClient(live_server.base_url) as client:
        agent = await client.put_agent(AGENT, memory_backend="graph")
        assert (agent.agent_id, agent.memory_backend) == (AGENT, "graph")
        assert (await client.get_agent(AGENT)).effective_backend == "graph"
        shard = await client.put_shard(AGENT, "travel", name="travel logistics", extraction_focus="flights")
        assert [s.shard_id for s in await client.list_shards(AGENT)] == [shard.shard_id] == ["travel"]

        first = await client.record("s-1", agent_id=AGENT, user_id="alice", role="user",
                                    content="I prefer window seats on every flight.", message_id="m-1")
        assert isinstance(first, RecordOut) and (first.sequence, first.duplicate) == (1, False)
        again = await client.record("s-1", agent_id=AGENT, user_id="alice", role="user",
                                    content="I prefer window seats on every flight.", message_id="m-1")
        assert again.duplicate and again.sequence == 1
        # Without a message_id the client makes one, and the answer names it.
        second = await client.record("s-1", agent_id=AGENT, user_id="alice", role="assistant",
                                     content="Noted: window seats from now on.",
                                     created_at=datetime(2026, 5, 1, 9, 1, tzinfo=UTC))
        assert len(second.message_id) == 32 and second.sequence == 2

        formed = await client.form("s-1")
        assert isinstance(formed, FormationSummary) and formed.formed
        assert set(formed.message_ids) == {"m-1", second.message_id}
        status = await client.session("s-1")
        assert status["formed_messages"] == 2 and status["pending_job"] is None

        block = await client.context(agent_id=AGENT, user_id="alice", session_id="s-1", model="gpt-4o-mini",
                                     query="which seat")
        assert isinstance(block, ContextOut) and "window seats" in block.xml and block.chars <= block.budget
        windowed = await client.context(agent_id=AGENT, user_id="alice", session_id="s-1", query="which seat",
                                        host_window=2)  # the host sends both messages itself
        assert windowed.recall is not None and windowed.recall.host_window == 2
        assert windowed.sections["relevant"] == 0
        found = await client.search(AGENT, "window seats", scope="user", user_id="alice", top_k=3)
        assert isinstance(found, SearchResult) and found.scope == "user"
        assert found.results and all("window" in hit.content.lower() for hit in found.results[:1])
        assert len(found.results) <= 3


async def test_the_sync_client_has_the_same_methods_and_answers(live_server, http):
    async_methods = {name for name in dir(AsyncMemoryClient) if not name.startswith("_")} - {"aclose"}
    sync_methods = {name for name in dir(MemoryClient) if not name.startswith("_")} - {"close"}
    assert async_methods == sync_methods

    def loop() -> tuple[RecordOut, SearchResult, ContextOut]:
        with MemoryClient(live_server.base_url) as client:
            record = client.record("s-sync", agent_id=AGENT, user_id="bob", role="user",
                                   content="My passport expires in March.", message_id="p-1")
            client.form("s-sync")
            found = client.search(AGENT, "passport", scope="session", session_id="s-sync")
            block = client.context(agent_id=AGENT, user_id="bob", session_id="s-sync")
            return record, found, block

    # The server runs on this event loop: the blocking client runs in a thread.
    record, found, block = await asyncio.to_thread(loop)
    assert record.sequence == 1 and not record.duplicate
    assert any("passport" in hit.content for hit in found.results)
    assert "passport" in block.xml


def test_the_sync_client_is_generated_from_the_async_one():
    """memory_service/client/_sync/client.py is what scripts/unasync-client makes of the async source."""
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "unasync-client"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


async def test_each_error_family_raises_its_class_with_the_services_sentence(live_server, http, falkordb_url):
    async with AsyncMemoryClient(live_server.base_url) as client:
        await client.record("s-e", agent_id=AGENT, user_id="alice", role="user", content="Hello there.", message_id="m1")
        await wait_embedding_idle(falkordb_url, AGENT)  # its job's writes are not the refusals'
        before = snapshot(falkordb_url, worker_running=True)

        with pytest.raises(InvalidRequest) as bad_role:
            await client.record("s-e", agent_id=AGENT, user_id="alice", role="robot", content="Hi.", message_id="m2")
        assert bad_role.value.status == 422 and "role" in bad_role.value.detail
        assert (bad_role.value.method, bad_role.value.path) == ("POST", "/v1/sessions/s-e/messages")
        with pytest.raises(InvalidRequest) as bad_top_k:
            await client.search(AGENT, "hello", top_k=0)
        assert "top_k" in bad_top_k.value.detail
        with pytest.raises(ConflictError) as conflict:
            await client.record("s-e", agent_id=AGENT, user_id="alice", role="user", content="Other words.", message_id="m1")
        assert conflict.value.status == 409 and "m1" in conflict.value.detail
        with pytest.raises(NotFoundError) as missing:
            await client.session("no-such-session")
        assert missing.value.status == 404 and "no-such-session" in missing.value.detail
        assert snapshot(falkordb_url, worker_running=True) == before, "a refused request changed the store"

        # An id with slashes is sent escaped, as one segment: it reaches no other route
        # (GET /v1/keys would answer a list).
        with pytest.raises(NotFoundError):
            await client.get_agent("../../v1/keys")


@pytest.fixture(scope="module")
async def keyed_server(falkordb_url):
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY)
    async with LoopbackServer(create_app(settings, run_worker=True)) as server:
        yield server


@pytest.fixture
async def operator(keyed_server, falkordb_url):
    await flush(falkordb_url)
    async with AsyncMemoryClient(keyed_server.base_url, OPERATOR_KEY) as client:
        yield client


async def test_keys_audit_erasure_and_export_with_keys(operator, keyed_server):
    made = await operator.create_key(name="trip admin", role="admin", agents=[AGENT])
    assert made.key.startswith("msk_") and made.agents == [AGENT]
    async with operator.with_api_key(made.key) as admin:
        await admin.put_agent(AGENT, agent_extras={"note": "hello"})
        await admin.record("s-k", agent_id=AGENT, user_id="carol", role="user", content="I live in Lyon.",
                           message_id="c1")
        await admin.form("s-k")
        reader = await admin.create_key(name="reader", role="read", agents=[AGENT])
        assert {k.key_id for k in await admin.list_keys()} >= {made.key_id, reader.key_id}

        page = await admin.audit(agent_id=AGENT, action="agent.put", limit=5)
        assert [entry.action for entry in page.entries] == ["agent.put"]
        assert page.entries[0].key_id == made.key_id and page.entries[0].after["agent_extras"] == {"note": "hello"}

        export = await admin.export_user(AGENT, "carol")
        assert isinstance(export, UserExport) and [m.content for m in export.messages] == ["I live in Lyon."]
        report = await admin.erase_user(AGENT, "carol")
        assert isinstance(report, ErasureReport) and report.removed >= 1
        assert (await admin.erase_user(AGENT, "carol")).removed == 0

        revoked = await admin.revoke_key(reader.key_id)
        assert revoked.revoked_at is not None
        async with operator.with_api_key(reader.key) as gone:
            with pytest.raises(AuthenticationError) as refused:
                await gone.get_agent(AGENT)
            assert refused.value.status == 401 and "revoked" in refused.value.detail


async def test_put_agent_sets_whether_user_scoped_keys_join_other_users_sessions(operator, falkordb_url):
    """users_join_sessions through the typed client, against the real keyed server: off (the
    default), alice's key may not record into the session bob started; on, she may; a PUT
    without it turns it off again."""
    alice_key = await operator.create_key(name="alice", role="write", agents=[AGENT], users=["alice"])
    agent = await operator.put_agent(AGENT, memory_backend="graph")
    assert agent.users_join_sessions is False
    await operator.record("bobs", agent_id=AGENT, user_id="bob", role="user", content="Bob's trip.", message_id="b1")
    await wait_embedding_idle(falkordb_url, AGENT)  # its job's writes are not the refusal's
    async with operator.with_api_key(alice_key.key) as alice:
        before = snapshot(falkordb_url, worker_running=True)
        with pytest.raises(ConflictError):
            await alice.record("bobs", agent_id=AGENT, user_id="alice", role="user", content="Hi.", message_id="a1")
        after = snapshot(falkordb_url, worker_running=True)
        assert after == before, before.changes(after)

        agent = await operator.put_agent(AGENT, memory_backend="graph", users_join_sessions=True)
        assert agent.users_join_sessions is True and (await operator.get_agent(AGENT)).users_join_sessions is True
        assert agent.memory_backend == "graph"
        joined = await alice.record("bobs", agent_id=AGENT, user_id="alice", role="user", content="Hi.", message_id="a1")
        assert joined.sequence == 2 and not joined.duplicate
        assert (await alice.session("bobs"))["session_id"] == "bobs"

        assert (await operator.put_agent(AGENT)).users_join_sessions is False  # replaced: the default again
        await operator.record("bobs-2", agent_id=AGENT, user_id="bob", role="user", content="Bob again.", message_id="b2")
        with pytest.raises(ConflictError):
            await alice.record("bobs-2", agent_id=AGENT, user_id="alice", role="user", content="Hi.", message_id="a2")


async def test_a_key_of_another_agent_is_refused_and_nothing_changes(operator, falkordb_url):
    other = await operator.create_key(name="rival admin", role="admin", agents=[OTHER])
    await operator.put_agent(AGENT)
    before = snapshot(falkordb_url, worker_running=True)
    async with operator.with_api_key(other.key) as rival:
        for call in (rival.put_agent(AGENT, memory_backend="mongo"),
                     rival.record("s-r", agent_id=AGENT, user_id="u", role="user", content="hi", message_id="x"),
                     rival.search(AGENT, "anything")):
            with pytest.raises(PermissionDenied) as refused:
                await call
            assert refused.value.status == 403 and refused.value.detail
    async with operator.with_api_key(None) as anonymous:
        with pytest.raises(AuthenticationError):
            await anonymous.get_agent(AGENT)
    assert snapshot(falkordb_url, worker_running=True) == before


async def test_a_key_over_its_rate_limit_is_retried_then_refused_with_retry_after(operator, keyed_server):
    """429 from the real rate limiter: every retry is sent (counted by httpx's hooks), each
    refused, then RateLimitError carries the service's Retry-After."""
    limited = await operator.create_key(name="slow", role="read", agents=[AGENT], requests_per_minute=1)
    sent: list[str] = []

    async def count(request: httpx.Request) -> None:
        sent.append(request.url.path)

    async with httpx.AsyncClient(event_hooks={"request": [count]}) as pool:
        client = AsyncMemoryClient(keyed_server.base_url, limited.key, max_retries=2, max_retry_wait=0.01,
                                   http_client=pool)
        with pytest.raises(NotFoundError):  # the one request of this minute: no agent yet
            await client.get_agent(AGENT)
        with pytest.raises(RateLimitError) as limited_out:
            await client.get_agent(AGENT)
    assert limited_out.value.status == 429 and "requests per minute" in limited_out.value.detail
    assert limited_out.value.retry_after is not None and 1 <= limited_out.value.retry_after <= 60
    assert len(sent) == 1 + 1 + 2  # the allowed call, then the refused one and its two retries


class Flaky:
    """A real HTTP server answering 503 (or 429) with Retry-After the first ``failures``
    times, then the answer a route of the API would give; it keeps what it was sent."""

    def __init__(self, failures: int, status: int = 503, retry_after: str | None = "1", ok: Any = None):
        self.failures, self.status, self.retry_after, self.ok = failures, status, retry_after, ok
        self.seen: list[tuple[float, str, str, bytes]] = []
        self.app = Starlette(routes=[Route("/{path:path}", self.answer, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])])

    async def answer(self, request: Request) -> JSONResponse:
        self.seen.append((asyncio.get_running_loop().time(), request.method, request.url.path, await request.body()))
        if len(self.seen) <= self.failures:
            headers = {"Retry-After": self.retry_after} if self.retry_after is not None else {}
            return JSONResponse({"detail": "a store is overloaded: try again later"}, status_code=self.status,
                                headers=headers)
        return JSONResponse(self.ok)


AGENT_ANSWER = {"agent_id": AGENT, "memory_backend": None, "agent_extras": {}, "effective_backend": "graph"}


async def test_a_503_is_retried_after_the_retry_after_it_names():
    flaky = Flaky(failures=2, retry_after="1", ok=AGENT_ANSWER)
    async with LoopbackServer(flaky.app) as server, AsyncMemoryClient(server.base_url, max_retries=3) as client:
        agent = await client.get_agent(AGENT)
    assert agent.effective_backend == "graph"
    assert len(flaky.seen) == 3
    times = [seen[0] for seen in flaky.seen]
    # Retry-After: 1 was honoured (a lower bound: waiting less would be the bug).
    assert all(later - earlier >= 0.9 for earlier, later in zip(times, times[1:]))


async def test_retries_are_bounded_and_the_last_answer_is_raised():
    flaky = Flaky(failures=10, retry_after="0")
    async with LoopbackServer(flaky.app) as server, AsyncMemoryClient(server.base_url, max_retries=2) as client:
        with pytest.raises(ServiceUnavailable) as unavailable:
            await client.get_agent(AGENT)
    assert len(flaky.seen) == 3 and unavailable.value.status == 503 and unavailable.value.retry_after == 0
    assert isinstance(unavailable.value, ServerError) and "overloaded" in unavailable.value.detail


async def test_a_recorded_message_is_retried_with_the_same_message_id():
    gate = GateStatus(open=False, reason="waiting", pending_messages=1, pending_tokens=1.0, min_messages=4,
                      message_interval=10, token_interval=1000)
    flaky = Flaky(failures=1, retry_after="0")
    async with LoopbackServer(flaky.app) as server, AsyncMemoryClient(server.base_url) as client:
        flaky.ok = RecordOut(session_id="s", message_id="x", sequence=1, duplicate=False, gate=gate).model_dump(mode="json")
        assert (await client.record("s", agent_id=AGENT, user_id="u", role="user", content="Hello.")).sequence == 1
    bodies = [json.loads(seen[3]) for seen in flaky.seen]
    assert len(bodies) == 2 and bodies[0] == bodies[1] and len(bodies[0]["message_id"]) == 32


@pytest.mark.parametrize("call", ["create_key", "memory_write"])
async def test_calls_that_may_not_be_repeated_are_not_retried_after_a_503(call):
    flaky = Flaky(failures=1, retry_after="0")
    async with LoopbackServer(flaky.app) as server, AsyncMemoryClient(server.base_url, max_retries=3) as client:
        with pytest.raises(ServiceUnavailable):
            if call == "create_key":
                await client.create_key(name="k", role="read", agents=[AGENT])
            else:
                await client.memory_write(AGENT, content="x", namespace="agent:trip", kind="fact")
    assert len(flaky.seen) == 1


async def test_a_memory_write_with_an_idempotency_key_is_retried_with_the_same_body():
    flaky = Flaky(failures=1, retry_after="0")
    now = datetime.now(UTC)
    flaky.ok = MemoryRecord(id="k" * 32, kind="fact", namespace="agent:trip", content="x", valid_at=now, created_at=now,
                            provenance=Provenance(agent_id=AGENT)).model_dump(mode="json")
    async with LoopbackServer(flaky.app) as server, AsyncMemoryClient(server.base_url, max_retries=3) as client:
        written = await client.memory_write(AGENT, content="x", namespace="agent:trip", kind="fact",
                                            idempotency_key="turn-1")
    bodies = [json.loads(seen[3]) for seen in flaky.seen]
    assert written.id == "k" * 32 and len(bodies) == 2 and bodies[0] == bodies[1]
    assert bodies[0]["idempotency_key"] == "turn-1"


async def test_a_429_is_retried_on_every_call_and_other_errors_never():
    limited = Flaky(failures=1, status=429, retry_after="0", ok={**AGENT_ANSWER})
    async with LoopbackServer(limited.app) as server, AsyncMemoryClient(server.base_url) as client:
        await client.put_agent(AGENT)
    assert len(limited.seen) == 2
    for status in (400, 404, 409, 422, 500, 502):
        failing = Flaky(failures=5, status=status, retry_after="0")
        async with LoopbackServer(failing.app) as server, AsyncMemoryClient(server.base_url) as client:
            with pytest.raises(MemoryApiError) as raised:
                await client.get_agent(AGENT)
        assert raised.value.status == status and len(failing.seen) == 1
        assert isinstance(raised.value, ServerError) == (status >= 500)


def _answer(status: int, headers: dict[str, str]) -> httpx.Response:
    return httpx.Response(status, headers=headers, request=httpx.Request("GET", "http://x/"))


def test_retry_delay_honours_retry_after_within_the_cap():
    assert retry_delay(_answer(503, {"Retry-After": "2"}), 0, cap=30) == 2
    assert retry_delay(_answer(429, {"Retry-After": "3600"}), 0, cap=30) == 30  # capped
    assert retry_delay(_answer(503, {"Retry-After": "-5"}), 0, cap=30) == 0
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    assert 15 <= retry_delay(_answer(503, {"Retry-After": later}), 0, cap=30) <= 20  # an HTTP date
    # Without (or with an unreadable) Retry-After: exponential backoff, capped too.
    assert [retry_delay(_answer(503, {}), n, cap=30) for n in range(3)] == [BACKOFF_BASE, 2 * BACKOFF_BASE, 4 * BACKOFF_BASE]
    assert retry_delay(_answer(503, {"Retry-After": "soon"}), 10, cap=3) == 3


def test_bad_client_settings_are_refused():
    with pytest.raises(ValueError, match="max_retries"):
        MemoryClient("http://127.0.0.1:1", max_retries=-1)
