"""Startup records: stored per agent, returned within the model's budget (lowest priority
dropped first, then the longest), in modes always / first-run / digest, shown in the
memory block; bad input changes nothing. A real server, Redis and FalkorDB."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from memory_service.domain.errors import InvalidInput
from memory_service.recall.startup import digest, fit
from memory_service.runtime import open_service
from memory_service.schemas.startup import Priority, StartupMode, StartupRecord, StartupRecordIn
from memory_service.state import keyspace

from .conftest import flush, state_redis, suite_settings
from .helpers import msg, wait_embedding_idle
from .store_state import snapshot

AGENT = "planner"


def record(rid: str, priority: str, content: str, title: str = "t") -> StartupRecord:
    return StartupRecord(id=rid, priority=Priority(priority), title=title, content=content,
                         updated_at=datetime(2026, 5, 1, tzinfo=UTC))


def test_fit_drops_the_lowest_priority_first_then_the_longest():
    records = [record("identity", "P0", "x" * 39), record("rules", "P1", "x" * 29), record("tone", "P2", "x" * 19),
               record("long-ref", "P3", "x" * 29), record("short-ref", "P3", "x" * 9)]
    # Each costs its title (1) + content: 40, 30, 20, 30, 10.
    kept, dropped = fit(records, 100)
    assert [r.id for r in kept] == ["identity", "rules", "tone", "short-ref"]
    assert [r.id for r in dropped] == ["long-ref"]
    kept, dropped = fit(records, 75)
    assert [r.id for r in kept] == ["identity", "rules"]
    assert [r.id for r in dropped] == ["long-ref", "short-ref", "tone"]  # lowest priority first, then longest
    kept, dropped = fit(records, 160)  # everything fits, exactly at the budget
    assert len(kept) == 5 and not dropped
    # A record too long for the budget leaves the room to the shorter ones after it.
    kept, _ = fit([record("huge", "P0", "x" * 500), record("small", "P2", "ok")], 100)
    assert [r.id for r in kept] == ["small"]


def test_the_digest_follows_what_is_sent():
    a, b = record("a", "P0", "one"), record("b", "P1", "two")
    assert digest([a, b]) == digest([record("a", "P0", "one"), record("b", "P1", "two")])
    assert digest([a, b]) != digest([a]) != digest([a, record("b", "P1", "two!")])
    assert digest([a]) != digest([record("a", "P1", "one")])  # a priority change is a change


async def put(http, rid: str, priority: str, title: str, content: str, agent: str = AGENT):
    return await http.put(f"/v1/agents/{agent}/startup/{rid}",
                          json={"priority": priority, "title": title, "content": content})


async def audit(http, action: str) -> list[dict]:
    page = (await http.get("/v1/audit", params={"agent_id": AGENT, "action": action})).json()
    return page["entries"]


async def test_records_are_created_replaced_listed_and_deleted_with_audit(http):
    created = await put(http, "soul", "P0", "Who I am", "I am Atlas, a careful travel planner.")
    assert created.status_code == 201, created.text
    assert created.json()["priority"] == "P0" and created.json()["id"] == "soul"
    same = await put(http, "soul", "P0", "Who I am", "I am Atlas, a careful travel planner.")
    assert same.status_code == 200 and same.json()["updated_at"] == created.json()["updated_at"]  # nothing changed
    assert (await put(http, "ref", "P3", "Airports", "LIS is Lisbon.")).status_code == 201
    replaced = await put(http, "soul", "P0", "Who I am", "I am Atlas.")
    assert replaced.status_code == 200 and replaced.json()["content"] == "I am Atlas."
    assert (await put(http, "rules", "P1", "Rules", "Confirm dates before booking.")).status_code == 201

    listed = (await http.get(f"/v1/agents/{AGENT}/startup")).json()
    assert [(r["id"], r["priority"]) for r in listed] == [("soul", "P0"), ("rules", "P1"), ("ref", "P3")]

    puts = await audit(http, "startup.put")
    assert len(puts) == 4  # the unchanged put is not a change
    assert puts[0]["target"] == "rules" and puts[0]["before"] is None
    assert puts[1]["before"]["content"].startswith("I am Atlas, a careful") and puts[1]["after"]["content"] == "I am Atlas."

    gone = await http.delete(f"/v1/agents/{AGENT}/startup/ref")
    assert gone.status_code == 200 and gone.json() == {"id": "ref", "deleted": True}
    again = await http.delete(f"/v1/agents/{AGENT}/startup/ref")
    assert again.status_code == 200 and again.json() == {"id": "ref", "deleted": False}
    deletes = await audit(http, "startup.delete")
    assert len(deletes) == 1 and deletes[0]["before"]["content"] == "LIS is Lisbon."
    assert [r["id"] for r in (await http.get(f"/v1/agents/{AGENT}/startup")).json()] == ["soul", "rules"]


@pytest.mark.parametrize("rid, body, field", [
    ("soul", {"priority": "P4", "title": "t", "content": "c"}, "priority"),
    ("soul", {"priority": "P0", "title": "   ", "content": "c"}, "title"),
    ("soul", {"priority": "P0", "title": "t" * 201, "content": "c"}, "title"),
    ("soul", {"priority": "P0", "title": "t", "content": ""}, "content"),
    ("soul", {"priority": "P0", "title": "t", "content": "x" * 4001}, "STARTUP_MAX_RECORD_CHARS"),
    ("soul", {"priority": "P0", "title": "t", "content": "c", "source": "/etc/passwd"}, "source"),
    ("soul", {"title": "t", "content": "c"}, "priority"),
    ("a:b", {"priority": "P0", "title": "t", "content": "c"}, "must not contain ':'"),
])
async def test_bad_records_are_refused_naming_the_field_and_change_nothing(http, falkordb_url, rid, body, field):
    assert (await put(http, "kept", "P1", "Kept", "unchanged")).status_code == 201
    before = await asyncio.to_thread(snapshot, falkordb_url, worker_running=True)
    answer = await http.put(f"/v1/agents/{AGENT}/startup/{rid}", json=body)
    assert answer.status_code == 422 and field in answer.text, answer.text
    assert await asyncio.to_thread(snapshot, falkordb_url, worker_running=True) == before


async def test_an_agent_holds_at_most_startup_max_records(falkordb_url):
    await flush(falkordb_url)
    async with open_service(suite_settings(falkordb_url, startup_max_records=2), run_worker=False) as service:
        body = StartupRecordIn(priority=Priority.P2, title="t", content="c")
        for rid in ("one", "two"):
            await service.put_startup_record(AGENT, rid, body)
        with pytest.raises(InvalidInput, match="STARTUP_MAX_RECORDS"):
            await service.put_startup_record(AGENT, "three", body)
        replaced, _, changed = await service.put_startup_record(AGENT, "two", body.model_copy(update={"content": "d"}))
        assert changed and replaced.content == "d"  # replacing one is not a new one
        assert [r.id for r in await service.list_startup_records(AGENT)] == ["one", "two"]


async def block(http, **params):
    answer = await http.get(f"/v1/agents/{AGENT}/startup/block", params=params)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def record_message(http, session: str, agent: str = AGENT, mid: str = "m1"):
    answer = await http.post(f"/v1/sessions/{session}/messages", json={
        "agent_id": agent, "user_id": "alice", "role": "user", "content": "Plan my trip to Lisbon.", "message_id": mid})
    assert answer.status_code == 200, answer.text


async def test_the_block_fits_the_models_budget_and_names_what_it_dropped(http):
    await put(http, "soul", "P0", "Identity", "I am Atlas. " * 40)  # 488 chars with its title
    await put(http, "rules", "P1", "Rules", "Confirm every date. " * 30)  # 605
    await put(http, "tone", "P2", "Tone", "Warm and brief. " * 20)  # 324
    await put(http, "ref", "P3", "Reference", "LIS is Lisbon. " * 60)  # 909
    full = await block(http)  # no model: STARTUP_BUDGET_CHARS, 4000
    assert full["budget"] == 4000 and [r["id"] for r in full["records"]] == ["soul", "rules", "tone", "ref"]
    assert full["chars"] == 488 + 605 + 324 + 909 and full["dropped"] == [] and full["sent"] is True
    small = await block(http, model="Llama-3.1-8B")  # "*llama*": 1500, case-insensitive
    assert small["budget"] == 1500
    assert [r["id"] for r in small["records"]] == ["soul", "rules", "tone"]
    assert small["dropped"] == [{"id": "ref", "priority": "P3", "chars": 909}]
    assert small["chars"] <= 1500 and small["digest"] != full["digest"]
    tiny = await block(http, model="phi-3")  # 1000: the P0 fits, the P1 no longer does, the P2 still does
    assert [r["id"] for r in tiny["records"]] == ["soul", "tone"]
    assert [d["id"] for d in tiny["dropped"]] == ["ref", "rules"]


async def test_first_run_sends_once_per_session(http, falkordb_url):
    await put(http, "soul", "P0", "Identity", "I am Atlas.")
    await record_message(http, "s1")
    await record_message(http, "s2")
    first = await block(http, session_id="s1", mode="first-run")
    assert first["sent"] is True and [r["id"] for r in first["records"]] == ["soul"]
    again = await block(http, session_id="s1", mode="first-run")
    assert again["sent"] is False and again["records"] == [] and again["digest"] == first["digest"]
    await put(http, "soul", "P0", "Identity", "I am Atlas, renamed.")
    assert (await block(http, session_id="s1", mode="first-run"))["sent"] is False  # first-run ignores changes
    assert (await block(http, session_id="s2", mode="first-run"))["sent"] is True  # another session
    assert (await block(http, session_id="s1", mode="always"))["sent"] is True  # always is always
    redis = state_redis(falkordb_url, decode_responses=True)
    try:
        ttl = await redis.ttl(keyspace.session_keys("s1")["startup"])
    finally:
        await redis.aclose()
    assert 0 < ttl <= 7 * 86400  # kept with a lifetime (STARTUP_SESSION_TTL_SECONDS)


async def test_digest_sends_again_only_when_the_records_change(http):
    await put(http, "soul", "P0", "Identity", "I am Atlas.")
    await record_message(http, "s1")
    first = await block(http, session_id="s1", mode="digest")
    assert first["sent"] is True
    assert (await block(http, session_id="s1", mode="digest"))["sent"] is False
    await put(http, "soul", "P0", "Identity", "I am Atlas.")  # the same record: no change
    assert (await block(http, session_id="s1", mode="digest"))["sent"] is False
    await put(http, "rules", "P1", "Rules", "Confirm dates.")
    changed = await block(http, session_id="s1", mode="digest")
    assert changed["sent"] is True and [r["id"] for r in changed["records"]] == ["soul", "rules"]
    assert changed["digest"] != first["digest"]
    assert (await block(http, session_id="s1", mode="digest"))["sent"] is False
    # Another model's budget keeps other records: that is another block, sent again.
    await put(http, "ref", "P3", "Reference", "x" * 1490)
    assert (await block(http, session_id="s1", mode="digest"))["sent"] is True
    small = await block(http, session_id="s1", mode="digest", model="phi-3")
    assert small["sent"] is True and [d["id"] for d in small["dropped"]] == ["ref"]
    await http.delete(f"/v1/agents/{AGENT}/startup/ref")
    assert (await block(http, session_id="s1", mode="digest", model="phi-3"))["sent"] is False  # same records kept


async def test_a_session_nobody_recorded_in_is_sent_every_time_and_nothing_is_written(http, falkordb_url):
    await put(http, "soul", "P0", "Identity", "I am Atlas.")
    before = await asyncio.to_thread(snapshot, falkordb_url, worker_running=True)
    for mode in ("first-run", "first-run", "digest", "digest"):
        assert (await block(http, session_id="fresh", mode=mode))["sent"] is True
    nobody = await http.get("/v1/agents/nobody/startup/block", params={"session_id": "fresh", "mode": "digest"})
    assert nobody.status_code == 200 and nobody.json()["records"] == []
    assert (await http.get("/v1/agents/nobody/startup")).json() == []
    assert await asyncio.to_thread(snapshot, falkordb_url, worker_running=True) == before


async def test_bad_block_requests(http):
    await record_message(http, "theirs", agent="rival")
    for params, status, detail in [
        ({"mode": "first-run"}, 422, "session_id"),
        ({"mode": "digest"}, 422, "session_id"),
        ({"mode": "sometimes", "session_id": "s1"}, 422, "mode"),
        ({"session_id": "a:b", "mode": "digest"}, 422, "must not contain ':'"),
        ({"model": "m" * 201}, 422, "model"),
    ]:
        answer = await http.get(f"/v1/agents/{AGENT}/startup/block", params=params)
        assert answer.status_code == status and detail in answer.text, (params, answer.text)
        assert "rival" not in answer.text


async def test_a_session_of_another_agent_is_answered_as_an_unknown_one(http, falkordb_url):
    await put(http, "soul", "P0", "Identity", "I am Atlas.")
    await record_message(http, "theirs", agent="rival")
    await wait_embedding_idle(falkordb_url, "rival")  # its writes are not the block's
    before = await asyncio.to_thread(snapshot, falkordb_url, worker_running=True)
    for mode in ("first-run", "first-run", "digest", "always"):
        answers = [await http.get(f"/v1/agents/{AGENT}/startup/block", params={"session_id": session, "mode": mode})
                   for session in ("theirs", "never-recorded")]
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        assert answers[0].json() == answers[1].json() and answers[0].json()["sent"] is True
        assert "rival" not in answers[0].text
    assert await asyncio.to_thread(snapshot, falkordb_url, worker_running=True) == before  # no digest kept for either


async def test_the_service_refuses_a_mode_without_its_session(service):
    with pytest.raises(InvalidInput, match="session_id"):
        await service.startup_block(AGENT, mode=StartupMode.FIRST_RUN)
    await service.record_message("theirs", msg("rival", "carol", "hello", mid="r1"))
    foreign = await service.startup_block(AGENT, session_id="theirs", mode=StartupMode.DIGEST)
    assert foreign == await service.startup_block(AGENT, session_id="unknown", mode=StartupMode.DIGEST)


async def test_the_memory_block_shows_the_records_escaped_and_first(http):
    await record_message(http, "s1")
    params = {"agent_id": AGENT, "user_id": "alice", "session_id": "s1"}
    empty = (await http.get("/v1/context", params=params)).json()
    assert "<StartupRecords>" not in empty["xml"] and empty["sections"]["startup"] == 0
    await put(http, "soul", "P0", 'Atlas "the" <planner>', "I am Atlas & I plan </Record> trips.")
    await put(http, "ref", "P3", "Airports", "LIS is Lisbon.")
    shown = (await http.get("/v1/context", params=params)).json()  # the put invalidated the cached block
    xml = shown["xml"]
    assert shown["sections"]["startup"] == 2
    assert ('<Record priority="P0" title="Atlas &quot;the&quot; &lt;planner&gt;">I am Atlas &amp; I plan '
            '&lt;/Record&gt; trips.</Record>') in xml
    assert xml.startswith("<MemoryContext>\n  <StartupRecords>\n")  # first: who the agent is comes first
    assert xml.index('priority="P0"') < xml.index('priority="P3"')
    # On a small budget the identity stays and the reference goes first.
    small = (await http.get("/v1/context", params={**params, "budget": 200})).json()
    assert 'priority="P0"' in small["xml"] and 'priority="P3"' not in small["xml"] and small["chars"] <= 200
    await http.delete(f"/v1/agents/{AGENT}/startup/soul")
    after = (await http.get("/v1/context", params=params)).json()
    assert "Atlas" not in after["xml"] and after["sections"]["startup"] == 1


async def test_erasing_the_sessions_only_user_forgets_what_was_sent(http, falkordb_url):
    await put(http, "soul", "P0", "Identity", "I am Atlas.")
    await record_message(http, "s1")
    assert (await block(http, session_id="s1", mode="first-run"))["sent"] is True
    redis = state_redis(falkordb_url)
    try:
        assert await redis.exists(keyspace.session_keys("s1")["startup"])
        erased = await http.delete(f"/v1/agents/{AGENT}/users/alice")
        assert erased.status_code == 200, erased.text
        assert not await redis.exists(keyspace.session_keys("s1")["startup"])
    finally:
        await redis.aclose()
