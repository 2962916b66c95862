"""The client's memory-tool methods against the real routes. Writes are on for AGENT only
(MEMORY_WRITE_AGENTS)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.client import (
    AsyncMemoryClient,
    ConflictError,
    DeletedMemory,
    InvalidRequest,
    MemoryClient,
    MemoryRecord,
    NotFoundError,
    PermissionDenied,
)
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .store_state import snapshot

AGENT, READ_ONLY = "curator", "bystander"


@pytest.fixture(scope="module")
async def tools_server(falkordb_url):
    settings = suite_settings(falkordb_url, memory_write_agents=[AGENT])
    async with LoopbackServer(create_app(settings, run_worker=True)) as server:
        yield server


@pytest.fixture
async def client(tools_server, falkordb_url):
    await flush(falkordb_url)
    async with AsyncMemoryClient(tools_server.base_url) as opened:
        yield opened


async def test_write_get_update_delete_undelete(client):
    written = await client.memory_write(AGENT, content="The office moves to Lyon in June.", namespace=f"agent:{AGENT}",
                                        kind="fact", title="Office move", tags=["office", "plans"], confidence=0.8)
    assert isinstance(written, MemoryRecord) and written.tags == ["office", "plans"] and written.deleted_at is None
    got = await client.memory_get(AGENT, written.id)
    assert (got.content, got.title, got.confidence) == ("The office moves to Lyon in June.", "Office move", 0.8)
    assert got.access_count >= 1

    updated = await client.memory_update(AGENT, written.id, title="Office move (confirmed)", confidence=0.95)
    assert (updated.title, updated.confidence, updated.content) == ("Office move (confirmed)", 0.95, got.content)
    cleared = await client.memory_update(AGENT, written.id, title=None)  # None clears; unnamed fields stay
    assert (cleared.title, cleared.confidence, cleared.tags) == (None, 0.95, ["office", "plans"])
    untagged = await client.memory_update(AGENT, written.id, tags=None)
    assert (untagged.tags, untagged.confidence) == ([], 0.95)
    await client.memory_update(AGENT, written.id, tags=["office", "plans"])

    found = await client.search(AGENT, "office Lyon", tags=["office"])
    assert [hit.id for hit in found.results] == [written.id]
    assert (await client.search(AGENT, "office Lyon", tags=["office", "nope"])).results == []

    deleted = await client.memory_delete(AGENT, written.id)
    assert isinstance(deleted, DeletedMemory) and deleted.id == written.id
    assert await client.memory_delete(AGENT, written.id) == deleted  # idempotent: the same dates
    assert (await client.search(AGENT, "office Lyon")).results == []
    with pytest.raises(ConflictError):
        await client.memory_update(AGENT, written.id, title="too late")

    restored = await client.memory_undelete(AGENT, written.id)
    assert restored.deleted_at is None
    assert [hit.id for hit in (await client.search(AGENT, "office Lyon")).results] == [written.id]


async def test_tool_errors_raise_their_classes_and_change_nothing(client, falkordb_url):
    written = await client.memory_write(AGENT, content="Quarterly review on Friday.", namespace=f"agent:{AGENT}",
                                        kind="fact")
    before = snapshot(falkordb_url, worker_running=True)
    with pytest.raises(NotFoundError):
        await client.memory_get(AGENT, "no-such-memory")
    with pytest.raises(NotFoundError):  # another agent's memory: the same answer as none
        await client.memory_get(READ_ONLY, written.id)
    with pytest.raises(InvalidRequest) as bad:
        await client.memory_update(AGENT, written.id, confidence=7)
    assert "confidence" in bad.value.detail
    with pytest.raises(PermissionDenied) as off:
        await client.memory_write(READ_ONLY, content="x", namespace=f"agent:{READ_ONLY}", kind="fact")
    assert "MEMORY_WRITE_AGENTS" in off.value.detail
    assert snapshot(falkordb_url, worker_running=True) == before


async def test_the_sync_client_reaches_the_tools_too(tools_server, client):
    def curate() -> tuple[MemoryRecord, MemoryRecord]:
        with MemoryClient(tools_server.base_url) as sync:
            written = sync.memory_write(AGENT, content="Parking is behind the building.", namespace=f"agent:{AGENT}",
                                        kind="fact")
            return written, sync.memory_get(AGENT, written.id)

    written, got = await asyncio.to_thread(curate)
    assert got.id == written.id and got.content == written.content


async def test_write_blocks_then_search_and_context_as_of_and_with_history(client, tools_server):
    """The typed client writes the graph (write_blocks) and reads it at a time: search's
    ``as_of``/``include_superseded`` and the block's ``as_of``, against the real routes."""
    namespace = f"user:{AGENT}:alice"
    await client.record("s1", agent_id=AGENT, user_id="alice", role="user", content="Hello again.", message_id="m0")
    written = {}
    for city, note in (("Paris", "Paris has a lovely old town"), ("Lyon", "Lyon has wonderful food markets")):
        items = [{"kind": "entity", "name": "Alice", "type": "person"},
                 {"kind": "edge", "source": "Alice", "target": city, "rel_type": "lives_in"},
                 {"kind": "observation", "name": city, "text": note}]
        written[city] = await client.write_blocks(AGENT, f"<memory_write>{json.dumps(items)}</memory_write>",
                                                  namespace=namespace)
        if city == "Paris":
            between = datetime.now(UTC)
            await asyncio.sleep(0.05)
    paris, lyon = written["Paris"].facts[0], written["Lyon"].facts[0]
    assert written["Lyon"].superseded == [paris.id] and lyon.current
    again = await client.write_blocks(AGENT, f"<memory_write>{json.dumps(items)}</memory_write>", namespace=namespace)
    assert set(again.already_stored) == {again.written[0].id, *(e.id for e in again.entities), lyon.id}

    def reached(result) -> set[str]:  # the memories the graph signal reached, by their first words
        return {hit.content.split()[0] for hit in result.results if hit.explanation.graph}
    query = "Where does Alice live?"
    now = await client.search(AGENT, query, scope="user", user_id="alice")
    then = await client.search(AGENT, query, scope="user", user_id="alice", as_of=between)
    history = await client.search(AGENT, query, scope="user", user_id="alice", include_superseded=True)
    assert (reached(now), reached(then), reached(history)) == ({"Lyon"}, {"Paris"}, {"Paris", "Lyon"})

    block_now = (await client.context(agent_id=AGENT, user_id="alice", session_id="s1", query=query)).xml
    block_then = (await client.context(agent_id=AGENT, user_id="alice", session_id="s1", query=query,
                                       as_of=between)).xml
    assert "Alice lives in Lyon" in block_now and "Alice lives in Paris" not in block_now
    assert "Alice lives in Paris" in block_then and "<KnownFacts as_of=" in block_then

    def sync_search() -> set[str]:
        with MemoryClient(tools_server.base_url) as sync_client:
            return reached(sync_client.search(AGENT, query, scope="user", user_id="alice", as_of=between))
    assert await asyncio.to_thread(sync_search) == {"Paris"}


async def test_expires_at_is_written_updated_cleared_and_refused_when_past(client, tools_server):
    """Expiry (docs/expiry.md) through both clients: the time goes on the wire with its zone."""
    from datetime import timedelta

    when = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
    written = await client.memory_write(AGENT, content="The door code changes weekly.", namespace=f"agent:{AGENT}",
                                        kind="fact", expires_at=when)
    assert written.expires_at == when and (await client.memory_get(AGENT, written.id)).expires_at == when
    later = when + timedelta(days=1)
    assert (await client.memory_update(AGENT, written.id, expires_at=later)).expires_at == later
    assert (await client.memory_update(AGENT, written.id, expires_at=None)).expires_at is None
    with pytest.raises(InvalidRequest, match="has passed"):
        await client.memory_write(AGENT, content="Never stored.", namespace=f"agent:{AGENT}", kind="fact",
                                  expires_at=datetime.now(UTC) - timedelta(minutes=1))
    agent = await client.put_agent(AGENT, memory_ttl={"fact": "90d"})
    shard = await client.put_shard(AGENT, "travel", name="travel", memory_ttl="12h")
    assert (agent.memory_ttl, shard.memory_ttl) == ({"fact": 7_776_000}, 43_200)
    ttl = await client.memory_write(AGENT, content="The ferry leaves at noon.", namespace=f"shard:{AGENT}:travel",
                                    kind="fact")
    assert ttl.expires_at is not None and abs(ttl.expires_at - ttl.valid_at - timedelta(hours=12)) < timedelta(seconds=1)

    def sync() -> None:
        with MemoryClient(tools_server.base_url) as plain:
            mine = plain.memory_write(AGENT, content="Sync write.", namespace=f"agent:{AGENT}", kind="fact",
                                      expires_at=when)
            assert mine.expires_at == when

    await asyncio.to_thread(sync)
