"""POST /v1/agents/{agent_id}/writes/parse: a model's write blocks stored all or nothing,
with their provenance, behind the memory tools' rules (writes on per agent, the agent's own
namespaces and sessions). A real server, real Redis and FalkorDB (the memory tools' server)."""

from __future__ import annotations

import pytest

from .helpers import wait_embedding_idle
from .store_state import snapshot
from .test_memory_tools import AGENT, LOCKED, OTHER, WRITES_OFF, audit, http, record, search, tools_server  # noqa: F401

BLOCKS = (
    "Noted, I will remember that.\n"
    '<memory_write>{"observations": [{"text": "Alice is allergic to hazelnuts", "confidence": 0.9, '
    '"tags": ["health"]}]}</memory_write>\n'
    '<shadow_write>{"entities": [{"name": "Lyon", "type": "city"}], '
    '"edges": [{"source": "Alice", "target": "Lyon", "rel_type": "lives_in"}]}</shadow_write>'
)


async def parse(http, text: str, agent: str = AGENT, **extra):
    return await http.post(f"/v1/agents/{agent}/writes/parse",
                           json={"text": text, "namespace": f"user:{agent}:alice", **extra})


async def test_blocks_are_stored_with_their_provenance(http):
    await record(http, "s1", "I am allergic to hazelnuts and I live in Lyon.", mid="m1")
    answer = await parse(http, BLOCKS, session_id="s1", message_id="m1")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["blocks"] == 2
    stored = {(m["kind"], m["content"], tuple(m["tags"])) for m in body["written"]}
    assert stored == {("observation", "Alice is allergic to hazelnuts", ("health",)),
                      ("fact", "Lyon (city)", ("entity",)), ("fact", "Alice lives_in Lyon", ("relation",))}
    assert all(m["provenance"]["session_id"] == "s1" and m["provenance"]["message_ids"] == ["m1"]
               and m["provenance"]["user_id"] == "alice" for m in body["written"])
    assert [h["content"] for h in await search(http, "hazelnuts", tags=["health"])] == ["Alice is allergic to hazelnuts"]
    entry = (await audit(http, "memory.write_blocks"))[0]
    assert entry["after"]["blocks"] == 2 and "hazelnut" not in str(entry).lower()


@pytest.mark.parametrize("text,where", [
    (BLOCKS + '\n<memory_write>{"observations": [{"text": "x", "confidence": 7}]}</memory_write>',
     "block 3 (<memory_write> at line 4, column 1): observations[0].confidence"),
    (BLOCKS + "\n<memory_write>{", "line 4, column 1: <memory_write> is never closed"),
])
async def test_one_malformed_block_stores_nothing(http, falkordb_url, text, where):
    await record(http, "s1", "hello", mid="m1")
    await wait_embedding_idle(falkordb_url, AGENT)
    before = snapshot(falkordb_url, worker_running=True)
    answer = await parse(http, text, session_id="s1")
    assert answer.status_code == 422 and where in answer.json()["detail"], answer.text
    assert snapshot(falkordb_url, worker_running=True).contents == before.contents


async def test_writes_off_another_agents_namespace_or_session_store_nothing(http, falkordb_url):
    await record(http, "s1", "hello", mid="m1")
    await record(http, "other-s", "hello", agent=OTHER, mid="o1")
    for agent in (AGENT, OTHER):  # the records' embedding jobs write on their own: let them finish first
        await wait_embedding_idle(falkordb_url, agent)
    before = snapshot(falkordb_url, worker_running=True)
    off = await parse(http, BLOCKS, agent=LOCKED)
    assert off.status_code == 403 and off.json()["detail"] == WRITES_OFF
    foreign = await http.post(f"/v1/agents/{AGENT}/writes/parse", json={"text": BLOCKS, "namespace": f"user:{OTHER}:alice"})
    assert foreign.status_code == 404 and foreign.json()["detail"].startswith("namespace")
    other_session = await parse(http, BLOCKS, session_id="other-s")
    assert other_session.status_code == 404 and other_session.json()["detail"].startswith("session_id")
    for bad in ({"text": ""}, {"namespace": "nonsense"}, {"message_id": "a/b"}, {"extra": 1}):
        answer = await http.post(f"/v1/agents/{AGENT}/writes/parse",
                                 json={"text": BLOCKS, "namespace": f"user:{AGENT}:alice", **bad})
        assert answer.status_code in (404, 422), (bad, answer.text)
    assert snapshot(falkordb_url, worker_running=True).contents == before.contents


async def test_text_without_blocks_stores_nothing(http):
    answer = await parse(http, "Just an answer, <b>no</b> blocks.")
    assert answer.status_code == 200 and answer.json() == {"blocks": 0, "written": [], "already_stored": []}
    assert await audit(http, "memory.write_blocks") == []


async def test_the_same_block_of_the_same_message_is_stored_once(http, falkordb_url):
    await record(http, "s1", "I am allergic to hazelnuts and I live in Lyon.", mid="m1")
    first = await parse(http, BLOCKS, session_id="s1", message_id="m1")
    assert first.status_code == 200 and first.json()["already_stored"] == [], first.text
    ids = [m["id"] for m in first.json()["written"]]
    assert len(set(ids)) == 3
    await wait_embedding_idle(falkordb_url, AGENT)
    before = snapshot(falkordb_url, worker_running=True)

    again = await parse(http, BLOCKS, session_id="s1", message_id="m1")
    assert again.status_code == 200, again.text
    assert [m["id"] for m in again.json()["written"]] == ids and again.json()["already_stored"] == ids
    def stored(answer) -> list[dict]:  # served_by says which store answered: only a read has one
        return [{k: v for k, v in m.items() if k != "served_by"} for m in answer.json()["written"]]
    assert stored(again) == stored(first)  # the memories as stored then, not new copies
    assert snapshot(falkordb_url, worker_running=True).contents == before.contents
    assert [h["content"] for h in await search(http, "hazelnuts", tags=["health"])] == ["Alice is allergic to hazelnuts"]
    assert len(await audit(http, "memory.write_blocks")) == 1  # the repeat changed nothing, so audits nothing


async def test_another_message_block_or_namespace_stores_new_memories(http):
    await record(http, "s1", "I am allergic to hazelnuts.", mid="m1")
    await record(http, "s1", "I said it again.", mid="m2")
    first = (await parse(http, BLOCKS, session_id="s1", message_id="m1")).json()
    other_message = (await parse(http, BLOCKS, session_id="s1", message_id="m2")).json()
    moved = (await parse(http, '<memory_write>{"entities": ["Oslo"]}</memory_write>' + BLOCKS,
                         session_id="s1", message_id="m1")).json()
    elsewhere = (await http.post(f"/v1/agents/{AGENT}/writes/parse", json={
        "text": BLOCKS, "namespace": f"agent:{AGENT}", "session_id": "s1", "message_id": "m1"})).json()
    seen: set[str] = set()
    for answer in (first, other_message, moved, elsewhere):
        ids = {m["id"] for m in answer["written"]}
        assert answer["already_stored"] == [] and not ids & seen, answer
        seen |= ids
    assert len(seen) == 3 + 3 + 4 + 3
    hits = await search(http, "hazelnuts", tags=["health"])
    assert len(hits) == 4  # one copy per message, block position and namespace


async def test_a_bad_block_after_a_good_parse_changes_nothing(http, falkordb_url):
    await record(http, "s1", "hello", mid="m1")
    first = await parse(http, BLOCKS, session_id="s1", message_id="m1")
    assert first.status_code == 200, first.text
    await wait_embedding_idle(falkordb_url, AGENT)
    before = snapshot(falkordb_url, worker_running=True)
    bad = await parse(http, BLOCKS + '\n<memory_write>{"observations": [{"text": ""}]}</memory_write>',
                      session_id="s1", message_id="m1")
    assert bad.status_code == 422 and "block 3" in bad.json()["detail"], bad.text
    assert snapshot(falkordb_url, worker_running=True).contents == before.contents
