"""Expiry (docs/expiry.md): a memory written with ``expires_at``, or given one by its agent's
time to live for its kind or shard, is read until then and skipped by every read but
memory_get once it has passed (search agent-wide and scoped, the memory block, browse), then
purged by the retention job, audited; on the graph and on MongoDB, over HTTP."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from pydantic import SecretStr

from memory_service.access.reach import Reach
from memory_service.backends.loopback import LoopbackServer
from memory_service.curation.tools import MemoryUpdate, MemoryWrite
from memory_service.domain.errors import Conflict, InvalidInput
from memory_service.domain.models import AgentSettings, MemoryKind, ShardIn
from memory_service.domain.namespaces import Namespace
from memory_service.http.app import create_app
from memory_service.runtime import open_service

from .helpers import record_all

AGENT = "a1"
USER_NS = f"user:{AGENT}:alice"
WRITES = {"memory_write_agents": ["*"], "memory_expiry_max_days": 30}
CHAT = [
    ("alice", "user", "I prefer window seats on every flight."),
    ("alice", "assistant", "Noted, window seats it is."),
    ("alice", "user", "The flight to Lisbon leaves on June 3rd at 9am."),
    ("alice", "assistant", "Great, I will plan around that."),
]


def ahead(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


@pytest.fixture(params=["graph", "mongo"])
async def service(request, settings, mongo_uri, mongo_database):
    config = settings.model_copy(update=WRITES)
    if request.param == "mongo":
        config = config.model_copy(update={"mongodb_uri": SecretStr(mongo_uri), "mongodb_database": mongo_database})
    async with open_service(config, run_worker=True) as opened:
        if request.param == "mongo":
            await opened.put_agent(AGENT, AgentSettings(memory_backend="mongo"))
        yield opened


async def shown(service, word: str, memory_id: str) -> dict[str, bool]:
    """Whether each read shows the memory (by its word or its id)."""
    _, backend = await service.agents.backend_for(AGENT)
    browse = await service.list_memories(AGENT, Reach(service.state, AGENT))
    block = await service.assemble_memory_context(AGENT, "alice", "s1", query=f"{word} please")
    return {
        "search": any(r.id == memory_id for r in (await service.search(AGENT, word)).results),
        "scoped search": any(r.id == memory_id for r in (await service.search(AGENT, word, namespaces=[USER_NS])).results),
        "block": word in block.xml.lower(),
        "recent": any(m.id == memory_id for m in await backend.recent(AGENT, Namespace.parse(USER_NS),
                                                                      list(MemoryKind), 50)),
        "browse": any(m.id == memory_id for m in browse.memories),
    }


async def test_an_expired_memory_leaves_every_read_at_once_and_the_retention_job_purges_it(service):
    await record_all(service, "s1", AGENT, CHAT[:1])  # alice speaks in s1: the block is hers
    soon = await service.memory_write(AGENT, MemoryWrite(namespace=USER_NS, kind="fact", content="The narwhal key "
                                                         "hangs by the door.", expires_at=ahead(2.5)))
    kept = await service.memory_write(AGENT, MemoryWrite(namespace=USER_NS, kind="fact",
                                                         content="The otter key hangs by the window."))
    assert soon.expires_at is not None and kept.expires_at is None
    assert await shown(service, "narwhal", soon.id) == dict.fromkeys(
        ("search", "scoped search", "block", "recent", "browse"), True)  # the block is cached now, too
    await asyncio.sleep(max(0.0, (soon.expires_at - datetime.now(UTC)).total_seconds()) + 0.1)
    assert not any((await shown(service, "narwhal", soon.id)).values())
    assert (await shown(service, "otter", kept.id))["search"]
    # memory_get answers it by id, as it answers a soft-deleted one, saying when it expired.
    got = await service.memory_get(AGENT, soon.id)
    assert got.expires_at == soon.expires_at and got.deleted_at is None
    with pytest.raises(Conflict, match="expired"):
        await service.memory_update(AGENT, soon.id, MemoryUpdate(content="changed"))

    report = await service.retention.purge()
    assert report.expired == 1 and report.agents == {AGENT: 1}
    _, backend = await service.agents.backend_for(AGENT)
    assert await backend.find(AGENT, [soon.id]) == [] and await backend.find(AGENT, [kept.id])
    assert (await service.retention.purge()).expired == 0
    entries = (await service.audit_page(AGENT, action="memory.purge")).entries
    assert [(e.key_id, e.after["reason"], e.after["purged"], e.after["kinds"]) for e in entries] == [
        ("retention", "expired", 1, {"fact": 1})]
    # The one trace the purge leaves in the change events: an `expired` event naming it (docs/events.md).
    events, _ = await service.read_events(AGENT, "0-0", 100, None)
    assert [(e.type, e.memory_ids, e.reason) for e in events if soon.id in e.memory_ids] == [
        ("expired", [soon.id], "expired")]


async def test_times_to_live_per_kind_and_per_shard_give_formed_and_written_memories_their_expiry(service):
    settings = await service.state.get_agent(AGENT) or AgentSettings()
    await service.put_agent(AGENT, settings.model_copy(update={
        "memory_ttl": AgentSettings(memory_ttl={"episode": "2h", "fact": 86_400}).memory_ttl}))
    await service.put_shard(AGENT, "travel", ShardIn(name="travel", extraction_focus="flights, hotels, dates",
                                                     memory_ttl="1h"))
    before = datetime.now(UTC)
    await record_all(service, "s1", AGENT, CHAT)
    assert (await service.form_memories("s1")).formed
    after = datetime.now(UTC)
    _, backend = await service.agents.backend_for(AGENT)
    [episode] = await backend.recent(AGENT, Namespace.session("s1"), [MemoryKind.EPISODE], 5)
    assert episode.expires_at is not None and before + timedelta(hours=2) <= episode.expires_at <= after + timedelta(hours=2)
    directives = await backend.recent(AGENT, Namespace.parse(USER_NS), [MemoryKind.DIRECTIVE], 5)
    assert directives and all(d.expires_at is None for d in directives)  # no time to live for directives
    facts = await backend.recent(AGENT, Namespace.shard(AGENT, "travel"), [MemoryKind.FACT], 5)
    # A shard's fact: the sooner of the kind's day and the shard's hour.
    assert facts and all(before + timedelta(hours=1) <= f.expires_at <= after + timedelta(hours=1) for f in facts)

    written = await service.memory_write(AGENT, MemoryWrite(namespace=USER_NS, kind="fact", content="Alice owns a kayak."))
    assert written.expires_at is not None and abs(written.expires_at - written.valid_at - timedelta(days=1)) < timedelta(seconds=1)
    own = ahead(600)
    mine = await service.memory_write(AGENT, MemoryWrite(namespace=f"shard:{AGENT}:travel", kind="fact",
                                                         content="The ferry leaves at noon.", expires_at=own))
    assert mine.expires_at == own  # its own wins over the shard's hour
    cleared = await service.memory_update(AGENT, mine.id, MemoryUpdate(expires_at=None))
    assert cleared.expires_at is None


@pytest.mark.parametrize("expires_at, problem", [
    (lambda: datetime.now(UTC) - timedelta(seconds=1), "has passed"),
    (lambda: datetime.now(UTC) + timedelta(days=31), "MEMORY_EXPIRY_MAX_DAYS"),
])
async def test_a_past_or_too_distant_expiry_is_refused_and_nothing_is_stored(service, expires_at, problem):
    with pytest.raises(InvalidInput, match=problem):
        await service.memory_write(AGENT, MemoryWrite(namespace=USER_NS, kind="fact", content="Never stored.",
                                                      expires_at=expires_at()))
    browse = await service.list_memories(AGENT, Reach(service.state, AGENT))
    assert browse.memories == []


async def test_over_http_expiry_and_times_to_live_are_checked_and_answered(service):
    async with LoopbackServer(create_app(service=service)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            when = ahead(3600).isoformat()
            written = await http.post(f"/v1/agents/{AGENT}/memories", json={
                "namespace": USER_NS, "kind": "fact", "content": "Alice is in Oslo.", "expires_at": when})
            assert written.status_code == 201, written.text
            assert datetime.fromisoformat(written.json()["expires_at"]) == datetime.fromisoformat(when)
            got = await http.get(f"/v1/agents/{AGENT}/memories/{written.json()['id']}")
            assert got.json()["expires_at"] == written.json()["expires_at"]
            for bad in ({"expires_at": "2030-01-01T00:00:00"}, {"expires_at": "2001-01-01T00:00:00Z"},
                        {"expires_at": "soon"}):
                answer = await http.post(f"/v1/agents/{AGENT}/memories", json={
                    "namespace": USER_NS, "kind": "fact", "content": "Never stored.", **bad})
                assert answer.status_code == 422, (bad, answer.text)
            for bad_ttl in ({"fact": "90x"}, {"fact": 0}, {"fact": "31d"}, {"message": "1d"}, {"fact": True},
                            {"nokind": "1d"}):
                answer = await http.put(f"/v1/agents/{AGENT}", json={"memory_ttl": bad_ttl})
                assert answer.status_code == 422, (bad_ttl, answer.text)
            answer = await http.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "travel", "memory_ttl": "-1d"})
            assert answer.status_code == 422
            assert (await http.get(f"/v1/agents/{AGENT}/shards")).json() in ([], {"shards": []})
            backend = (await service.state.get_agent(AGENT) or AgentSettings()).memory_backend  # kept
            agent = await http.put(f"/v1/agents/{AGENT}", json={"memory_backend": backend,
                                                                "memory_ttl": {"fact": "20d", "episode": 3600}})
            assert agent.status_code == 200 and agent.json()["memory_ttl"] == {"fact": 1_728_000, "episode": 3600}
            shard = await http.put(f"/v1/agents/{AGENT}/shards/travel", json={"name": "travel", "memory_ttl": "12h"})
            assert shard.status_code in (200, 201) and shard.json()["memory_ttl"] == 43_200
            listed = (await http.get(f"/v1/agents/{AGENT}/memories")).json()
            assert [m["content"] for m in listed["memories"]] == ["Alice is in Oslo."]  # the bad writes stored nothing


async def test_the_docs_example_runs(settings, capsys):
    """docs/expiry.md's example, as written, against a real server (writes on for its agent)."""
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "expiry.md").read_text()
    start = page.index("```python\n") + len("```python\n")
    code = page[start:page.index("```", start)]
    placeholder = 'API, AGENT = "http://127.0.0.1:8080", "concierge"'
    assert placeholder in code
    config = settings.model_copy(update={"memory_write_agents": ["concierge"]})
    async with LoopbackServer(create_app(config, run_worker=True)) as server:
        code = code.replace(placeholder, f'API, AGENT = "{server.base_url}", "concierge"')
        await asyncio.to_thread(exec, compile(code, "docs/expiry.md", "exec"), {"__name__": "docs"})
    out = capsys.readouterr().out
    assert "door code expires at 20" in out and "hotel expires at 20" in out and "door code now expires: None" in out


async def test_graph_facts_of_expired_memories_alone_end_as_facts_do_at_the_purge(settings):
    """A fact the graph formed from memories that all expired is closed by the purge (its
    ``invalid_at`` their expiry, the edge and its history kept), audited; the graph backend."""
    async with open_service(settings.model_copy(update=WRITES), run_worker=True) as service:
        await service.put_agent(AGENT, AgentSettings(memory_ttl=dict.fromkeys(
            ("episode", "directive", "fact", "suggestion", "observation"), 2)))
        await record_all(service, "s1", AGENT, [
            ("alice", "user", "I live in Porto and I work at Sonae."), ("alice", "assistant", "Noted."),
            ("alice", "user", "I prefer window seats on every flight."), ("alice", "assistant", "Window seats it is.")])
        formed = await service.form_memories("s1")
        assert formed.formed
        _, backend = await service.agents.backend_for(AGENT)
        facts = await backend.facts_citing(AGENT, [m.id for m in await backend.export(AGENT, Namespace.session("s1"))
                                                   if m.kind is MemoryKind.EPISODE])
        assert facts and all(f.current_at() for f in facts)
        memories = await backend.find(AGENT, sorted({i for f in facts for i in f.memory_ids}))
        end = max(m.expires_at for m in memories)
        await asyncio.sleep(max(0.0, (end - datetime.now(UTC)).total_seconds()) + 0.1)
        report = await service.retention.purge()
        assert report.expired == len(memories)
        closed = [await backend.get_fact(AGENT, f.id) for f in facts]
        assert all(not f.current_at() and f.invalid_at == end and f.expired_at is not None for f in closed)
        assert [f.memory_ids for f in closed] == [f.memory_ids for f in facts]  # the history stays
        entries = (await service.audit_page(AGENT, action="fact.invalidate")).entries
        assert sorted(e.target for e in entries) == sorted(f.id for f in facts)
        assert all(e.key_id == "retention" and e.after["reason"] == "expired" for e in entries)


async def test_a_fact_whose_memories_all_expired_is_no_longer_current_at_once_before_the_purge(settings):
    """Reads hold a graph fact closed from its source memories' latest ``expires_at`` on (as
    they skip the memories), not from the next daily purge; ``as_of`` before the end still
    finds it; a source's expiry moved by memory_update moves the fact's end with it."""
    async with open_service(settings.model_copy(update=WRITES), run_worker=True) as service:
        await service.put_agent(AGENT, AgentSettings(memory_ttl=dict.fromkeys(
            ("episode", "directive", "fact", "suggestion", "observation"), 3)))
        await record_all(service, "s1", AGENT, [
            ("alice", "user", "I live in Porto and I work at Sonae."), ("alice", "assistant", "Noted.")])
        assert (await service.form_memories("s1")).formed
        _, backend = await service.agents.backend_for(AGENT)
        memories = [m for ns in (Namespace.session("s1"), Namespace.parse(USER_NS))
                    for m in await backend.export(AGENT, ns) if m.kind is not MemoryKind.MESSAGE]
        facts = await backend.facts_citing(AGENT, [m.id for m in memories])
        assert facts and all(f.expires_at is not None for f in facts)
        subject = facts[0].subject_id
        before = await service.get_entity(AGENT, subject)
        assert before.facts and all(f.current and f.expires_at for f in before.facts)
        end = max(m.expires_at for m in memories)
        assert all(abs(f.expires_at - end) < timedelta(milliseconds=1) for f in facts), (end, facts)
        await asyncio.sleep(max(0.0, (end - datetime.now(UTC)).total_seconds()) + 0.2)
        after = await service.get_entity(AGENT, subject)
        assert after.facts == []  # no longer current, though the purge has not run
        history = await service.get_entity(AGENT, subject, include_superseded=True)
        assert history.facts and not any(f.current for f in history.facts)
        held = await service.get_entity(AGENT, subject, as_of=end - timedelta(seconds=1))
        assert {f.id for f in held.facts} == {f.id for f in before.facts}
        assert await backend.current_facts(AGENT, USER_NS, [subject]) == []

        # A source's expiry moved: the fact's end moves with it.
        await record_all(service, "s2", AGENT, [
            ("alice", "user", "I work at Efacec and I live in Braga."), ("alice", "assistant", "Noted.")])
        assert (await service.form_memories("s2")).formed
        fresh = [m for ns in (Namespace.session("s2"), Namespace.parse(USER_NS))
                 for m in await backend.export(AGENT, ns) if m.kind is not MemoryKind.MESSAGE and m.live]
        cited = await backend.facts_citing(AGENT, [m.id for m in fresh])
        assert cited
        for memory in fresh:
            await service.memory_update(AGENT, memory.id, MemoryUpdate(expires_at=None))
        moved = [await backend.get_fact(AGENT, f.id) for f in cited]
        assert all(f.expires_at is None for f in moved)
        await asyncio.sleep(3.2)
        assert {f.id for f in await backend.current_facts(AGENT, USER_NS, [f.subject_id for f in cited])} >= {
            f.id for f in cited}
