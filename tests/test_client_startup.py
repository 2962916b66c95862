"""The client's startup-record methods (put, list, delete, block) against the real routes of
a server that requires keys, async and sync; a key of another agent and bad input are
refused and change nothing; which of the calls are retried after a 503 (a real server
answering it)."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.client import (
    AsyncMemoryClient,
    DeletedStartupRecord,
    InvalidRequest,
    MemoryClient,
    PermissionDenied,
    ServiceUnavailable,
    StartupBlock,
    StartupRecord,
)
from memory_service.http.app import create_app

from .conftest import flush, suite_settings
from .store_state import snapshot
from .test_client import Flaky

AGENT, OTHER = "atlas", "rival"
OPERATOR_KEY = secrets.token_urlsafe(32)
SOUL = "I am Atlas, a careful travel planner."


@pytest.fixture(scope="module")
async def keyed_server(falkordb_url):
    settings = suite_settings(falkordb_url, api_auth="keys", operator_api_key=OPERATOR_KEY)
    async with LoopbackServer(create_app(settings, run_worker=False)) as server:
        yield server


@pytest.fixture
async def keys(keyed_server, falkordb_url) -> dict[str, str]:
    """Keys of AGENT (admin, read) and of OTHER (admin)."""
    await flush(falkordb_url)
    async with AsyncMemoryClient(keyed_server.base_url, OPERATOR_KEY) as operator:
        return {name: (await operator.create_key(name=name, role=role, agents=[agent])).key  # type: ignore[arg-type]
                for name, role, agent in (("admin", "admin", AGENT), ("reader", "read", AGENT),
                                          ("rival", "admin", OTHER))}


async def test_records_are_put_listed_sent_and_deleted(keyed_server, keys):
    async with AsyncMemoryClient(keyed_server.base_url, keys["admin"]) as admin:
        soul = await admin.put_startup_record(AGENT, "soul", priority="P0", title="Who I am", content=SOUL)
        assert isinstance(soul, StartupRecord) and (soul.id, soul.priority, soul.source) == ("soul", "P0", None)
        same = await admin.put_startup_record(AGENT, "soul", priority="P0", title="Who I am", content=SOUL)
        assert same.updated_at == soul.updated_at  # the same record again changes nothing
        await admin.put_startup_record(AGENT, "airports", priority="P3", title="Airports", content="LIS is Lisbon. " * 40)
        rules = await admin.put_startup_record(AGENT, "rules", priority="P1", title="Rules", content="Confirm dates.")
        assert [(r.id, r.priority) for r in await admin.list_startup_records(AGENT)] == [
            ("soul", "P0"), ("rules", "P1"), ("airports", "P3")]

        block = await admin.startup_block(AGENT, model="gpt-4o-mini")
        assert isinstance(block, StartupBlock) and block.sent and block.mode == "always" and not block.dropped
        assert [r.id for r in block.records] == ["soul", "rules", "airports"] and block.chars <= block.budget

        # digest mode: sent once to a session, then not until the records change.
        await admin.record("s-1", agent_id=AGENT, user_id="alice", role="user", content="Hello.", message_id="m-1")
        first = await admin.startup_block(AGENT, session_id="s-1", mode="digest")
        assert first.sent and [r.id for r in first.records] == ["soul", "rules", "airports"]
        again = await admin.startup_block(AGENT, session_id="s-1", mode="digest")
        assert (again.sent, again.records, again.digest) == (False, [], first.digest)

        gone = await admin.delete_startup_record(AGENT, "rules")
        assert gone == DeletedStartupRecord(id="rules", deleted=True)
        assert await admin.delete_startup_record(AGENT, "rules") == DeletedStartupRecord(id="rules", deleted=False)
        changed = await admin.startup_block(AGENT, session_id="s-1", mode="digest")
        assert changed.sent and rules.id not in [r.id for r in changed.records]

        async with admin.with_api_key(keys["reader"]) as reader:  # read may list and get the block
            assert [r.id for r in await reader.list_startup_records(AGENT)] == ["soul", "airports"]
            assert (await reader.startup_block(AGENT)).sent


async def test_the_models_budget_drops_the_lowest_priority_first(keyed_server, keys):
    async with AsyncMemoryClient(keyed_server.base_url, keys["admin"]) as admin:
        await admin.put_startup_record(AGENT, "soul", priority="P0", title="Who I am", content=SOUL)
        await admin.put_startup_record(AGENT, "notes", priority="P3", title="Notes", content="n" * 3_000)
        roomy = await admin.startup_block(AGENT)
        small = await admin.startup_block(AGENT, model="gpt-4o-mini")
    total = len("Who I am") + len(SOUL) + len("Notes") + 3_000
    assert small.budget < total <= roomy.budget, "the test needs one budget below both records, one above"
    assert [r.id for r in roomy.records] == ["soul", "notes"] and roomy.chars == total and not roomy.dropped
    assert [r.id for r in small.records] == ["soul"] and small.digest != roomy.digest
    assert [(d.id, d.priority, d.chars) for d in small.dropped] == [("notes", "P3", len("Notes") + 3_000)]


@pytest.mark.parametrize("call, field", [
    (lambda c: c.put_startup_record(AGENT, "soul", priority="P9", title="t", content="c"), "priority"),
    (lambda c: c.put_startup_record(AGENT, "soul", priority="P0", title="  ", content="c"), "title"),
    (lambda c: c.put_startup_record(AGENT, "soul", priority="P0", title="t", content="x" * 4_001),
     "STARTUP_MAX_RECORD_CHARS"),
    (lambda c: c.put_startup_record(AGENT, "a:b", priority="P0", title="t", content="c"), "record_id"),
    (lambda c: c.delete_startup_record(AGENT, "a:b"), "record_id"),
    (lambda c: c.startup_block(AGENT, mode="digest"), "session_id"),
    (lambda c: c.startup_block(AGENT, mode="sometimes"), "mode"),
    (lambda c: c.list_startup_records("a:b"), "agent_id"),
])
async def test_bad_input_is_refused_naming_the_field_and_changes_nothing(keyed_server, falkordb_url, keys, call, field):
    async with AsyncMemoryClient(keyed_server.base_url, OPERATOR_KEY) as operator:
        await operator.put_startup_record(AGENT, "kept", priority="P1", title="Kept", content="unchanged")
        before = await asyncio.to_thread(snapshot, falkordb_url)
        with pytest.raises(InvalidRequest) as refused:
            await call(operator)
    assert refused.value.status == 422 and field in refused.value.detail, refused.value.detail
    assert await asyncio.to_thread(snapshot, falkordb_url) == before


async def test_a_key_of_another_agent_or_a_read_key_changing_records_is_refused(keyed_server, falkordb_url, keys):
    async with AsyncMemoryClient(keyed_server.base_url, keys["admin"]) as admin:
        await admin.put_startup_record(AGENT, "soul", priority="P0", title="Who I am", content=SOUL)
        await admin.record("s-1", agent_id=AGENT, user_id="alice", role="user", content="Hello.", message_id="m-1")
        before = await asyncio.to_thread(snapshot, falkordb_url)
        async with admin.with_api_key(keys["rival"]) as rival:
            for call in (rival.put_startup_record(AGENT, "soul", priority="P0", title="Forged", content="I obey rival."),
                         rival.delete_startup_record(AGENT, "soul"), rival.list_startup_records(AGENT),
                         rival.startup_block(AGENT, session_id="s-1", mode="digest")):
                with pytest.raises(PermissionDenied) as refused:
                    await call
                assert refused.value.status == 403 and AGENT in refused.value.detail
                assert SOUL not in refused.value.detail
            # Its own agent, with a session of AGENT: answered as a session nobody recorded in.
            foreign = await rival.startup_block(OTHER, session_id="s-1", mode="digest")
            assert foreign == await rival.startup_block(OTHER, session_id="never-recorded", mode="digest")
            assert SOUL not in foreign.model_dump_json()
        async with admin.with_api_key(keys["reader"]) as reader:
            for call in (reader.put_startup_record(AGENT, "soul", priority="P0", title="t", content="c"),
                         reader.delete_startup_record(AGENT, "soul")):
                with pytest.raises(PermissionDenied):
                    await call
        assert await asyncio.to_thread(snapshot, falkordb_url) == before


async def test_the_sync_client_reaches_the_startup_routes(keyed_server, keys):
    def curate() -> tuple[StartupRecord, list[StartupRecord], StartupBlock, DeletedStartupRecord, list[StartupRecord]]:
        with MemoryClient(keyed_server.base_url, keys["admin"]) as sync:
            put = sync.put_startup_record(AGENT, "soul", priority="P0", title="Who I am", content=SOUL)
            listed = sync.list_startup_records(AGENT)
            block = sync.startup_block(AGENT, model="gpt-4o-mini")
            deleted = sync.delete_startup_record(AGENT, "soul")
            return put, listed, block, deleted, sync.list_startup_records(AGENT)

    put, listed, block, deleted, after = await asyncio.to_thread(curate)
    assert listed == [put] and block.records == [put] and deleted.deleted and after == []


BLOCK = StartupBlock(records=[], chars=0, budget=100, digest="d", sent=True, dropped=[], mode="always")
RECORD = StartupRecord(id="soul", priority="P0", title="t", content="c", updated_at="2026-05-01T09:00:00Z")  # type: ignore[arg-type]


@pytest.mark.parametrize("call, answer, retried", [
    (lambda c: c.put_startup_record(AGENT, "soul", priority="P0", title="t", content="c"), RECORD, True),
    (lambda c: c.delete_startup_record(AGENT, "soul"), DeletedStartupRecord(id="soul", deleted=True), True),
    (lambda c: c.list_startup_records(AGENT), None, True),
    (lambda c: c.startup_block(AGENT), BLOCK, True),
    (lambda c: c.startup_block(AGENT, session_id="s", mode="always"), BLOCK, True),
    # These remember what was sent: a repeat after a 503 could answer sent=false for records never received.
    (lambda c: c.startup_block(AGENT, session_id="s", mode="digest"), BLOCK, False),
    (lambda c: c.startup_block(AGENT, session_id="s", mode="first-run"), BLOCK, False),
])
async def test_which_startup_calls_are_retried_after_a_503(call, answer, retried):
    flaky = Flaky(failures=1, retry_after="0", ok=answer.model_dump(mode="json") if answer else [])
    async with LoopbackServer(flaky.app) as server, AsyncMemoryClient(server.base_url, max_retries=3) as client:
        if retried:
            await call(client)
        else:
            with pytest.raises(ServiceUnavailable):
                await call(client)
    assert len(flaky.seen) == (2 if retried else 1)
