"""Corrections (docs/corrections.md): a memory found wrong is replaced by the right one, kept
as history, its graph facts closed as wrong; undone; refused on bad input. On the graph and
on MongoDB through the service, and over HTTP with keys, the Python client and the event
stream against a real server (real FalkorDB/Redis, a real worker)."""

from __future__ import annotations

import json
import secrets

import httpx
import pytest
from pydantic import SecretStr

from memory_service.access.reach import Reach
from memory_service.backends.base import MemoryState
from memory_service.backends.loopback import LoopbackServer
from memory_service.client import AsyncMemoryClient, ConflictError, InvalidRequest, NotFoundError, PermissionDenied
from memory_service.curation.corrections import MemoryCorrection
from memory_service.curation.tools import MemoryUpdate, MemoryWrite
from memory_service.domain.errors import Conflict, InvalidInput, NotFound
from memory_service.domain.models import AgentSettings, MemoryKind
from memory_service.domain.namespaces import Namespace
from memory_service.http.app import create_app
from memory_service.runtime import open_service

from .helpers import record_all

AGENT = "fixer"
USER_NS = f"user:{AGENT}:alice"
WRITES = {"memory_write_agents": ["*"]}


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
    """Whether each read shows the memory (by its word in the block, by its id elsewhere)."""
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


async def test_a_correction_replaces_the_memory_in_every_read_keeps_it_as_history_and_is_undone(service):
    await record_all(service, "s1", AGENT, [("alice", "user", "Hello there.")])  # the block is alice's in s1
    wrong = await service.memory_write(AGENT, MemoryWrite(namespace=USER_NS, kind="fact", title="Allergy",
                                                          tags=["health"], content="Alice is allergic to walnuts."))
    assert all((await shown(service, "walnuts", wrong.id)).values())  # and the block is cached now

    done = await service.memory_correct(AGENT, wrong.id, MemoryCorrection(content="Alice is allergic to pecans."),
                                        actor="k1")
    old, new = done.corrected, done.correction
    assert (old.id, old.corrected_by, new.corrects) == (wrong.id, new.id, wrong.id)
    assert old.content == "Alice is allergic to walnuts." and old.corrected_at is not None
    assert (new.content, new.kind, new.namespace, new.title, new.tags) == (
        "Alice is allergic to pecans.", wrong.kind, wrong.namespace, "Allergy", ["health"])
    assert new.valid_at == wrong.valid_at and new.corrected_by is None  # it takes the old one's place
    gone = await shown(service, "walnuts", wrong.id)
    assert not any(gone.values()), gone
    now = await shown(service, "pecans", new.id)
    assert all(now.values()), now
    # History keeps it: read by id, listed as corrected, its audit entries say correction.
    got = await service.memory_get(AGENT, wrong.id)
    assert got.content == "Alice is allergic to walnuts." and got.corrected_by == new.id
    listed = await service.list_memories(AGENT, Reach(service.state, AGENT), state=MemoryState.CORRECTED)
    assert [m.id for m in listed.memories] == [wrong.id]
    detail = await service.memory_detail(AGENT, wrong.id)
    assert [(e.action, e.after["reason"], e.after["corrected_by"]) for e in detail.history
            if e.action == "memory.correct"] == [("memory.correct", "correction", new.id)]
    assert "walnuts" not in json.dumps([e.model_dump(mode="json") for e in detail.history])  # never the words
    written = (await service.memory_detail(AGENT, new.id)).history
    assert [(e.action, e.after["reason"], e.after["corrects"]) for e in written] == [
        ("memory.write", "correction", wrong.id)]
    # An update is told apart: its audit entry says update, the record has no correction.
    updated = await service.memory_update(AGENT, new.id, MemoryUpdate(confidence=0.9), actor="k1")
    assert updated.corrects == wrong.id and updated.corrected_at is None
    assert [e.after["reason"] for e in (await service.memory_detail(AGENT, new.id)).history
            if e.action == "memory.update"] == ["update"]
    # The change events: corrected, naming the old memory and its correction.
    events, _ = await service.read_events(AGENT, "0-0", 100, None)
    assert [(e.type, e.memory_ids, e.key_id) for e in events if e.type == "corrected"] == [
        ("corrected", [wrong.id, new.id], "k1")]

    undone = await service.memory_uncorrect(AGENT, wrong.id, actor="k1")
    assert undone.memory.corrected_by is None and undone.memory.corrected_at is None
    assert undone.correction is not None and undone.correction.deleted_at is not None
    back = await shown(service, "walnuts", wrong.id)
    assert all(back.values()), back
    assert not (await shown(service, "pecans", new.id))["search"]
    events, _ = await service.read_events(AGENT, "0-0", 100, None)
    assert [e.memory_ids for e in events if e.type == "uncorrected"] == [[wrong.id, new.id]]
    with pytest.raises(Conflict, match="not corrected"):
        await service.memory_uncorrect(AGENT, wrong.id)
    # Corrected again with the same words after the undo: the same correction, live again.
    again = await service.memory_correct(AGENT, wrong.id, MemoryCorrection(content="Alice is allergic to pecans."))
    assert again.correction.id == new.id and again.correction.deleted_at is None
    assert (await shown(service, "pecans", new.id))["search"]


async def test_bad_corrections_are_refused_and_change_nothing(service):
    await record_all(service, "s1", AGENT, [("alice", "user", "I prefer aisle seats.")])
    memory = await service.memory_write(AGENT, MemoryWrite(namespace=USER_NS, kind="fact", content="Alice owns a red kayak."))
    _, backend = await service.agents.backend_for(AGENT)
    [message] = await backend.recent(AGENT, Namespace.session("s1"), [MemoryKind.MESSAGE], 1)
    before = await backend.export(AGENT, Namespace.parse(USER_NS))
    with pytest.raises(NotFound):
        await service.memory_correct(AGENT, "no-such-memory", MemoryCorrection(content="x"))
    with pytest.raises(InvalidInput, match="same"):
        await service.memory_correct(AGENT, memory.id, MemoryCorrection(content="Alice owns a red kayak."))
    with pytest.raises(InvalidInput, match="recorded message"):
        await service.memory_correct(AGENT, message.id, MemoryCorrection(content="I prefer window seats."))
    for blank in ("", "   "):
        with pytest.raises(ValueError, match="content"):
            MemoryCorrection(content=blank)
    done = await service.memory_correct(AGENT, memory.id, MemoryCorrection(content="Alice owns a blue kayak."))
    with pytest.raises(Conflict, match="corrected already"):
        await service.memory_correct(AGENT, memory.id, MemoryCorrection(content="Alice owns a green kayak."))
    with pytest.raises(Conflict, match="corrected"):
        await service.memory_update(AGENT, memory.id, MemoryUpdate(content="Alice owns a green kayak."))
    # A correction corrected in turn: undoing the first is refused until the second is undone.
    second = await service.memory_correct(AGENT, done.correction.id, MemoryCorrection(content="Alice owns a teal kayak."))
    with pytest.raises(Conflict, match="undo that correction first"):
        await service.memory_uncorrect(AGENT, memory.id)
    with pytest.raises(Conflict, match="not corrected"):
        await service.memory_uncorrect(AGENT, second.correction.id)
    await service.memory_uncorrect(AGENT, done.correction.id)
    await service.memory_uncorrect(AGENT, memory.id)
    deleted = await service.memory_write(AGENT, MemoryWrite(namespace=USER_NS, kind="fact", content="Alice owns a canoe."))
    await service.memory_delete(AGENT, deleted.id)
    with pytest.raises(Conflict, match="deleted"):
        await service.memory_correct(AGENT, deleted.id, MemoryCorrection(content="Alice owns two canoes."))
    live = {m.id: m.content for m in await backend.export(AGENT, Namespace.parse(USER_NS)) if m.live}
    assert live == {memory.id: "Alice owns a red kayak."} | {m.id: m.content for m in before if m.id != memory.id}


async def test_graph_facts_formed_from_a_corrected_memory_close_as_wrong_and_come_back_on_undo(settings):
    """The write block's fact cites its memory; correcting the memory closes the fact as wrong
    (``corrected_by``, ``invalid_at`` = its ``valid_at``: it never held), audited; undo restores it."""
    async with open_service(settings.model_copy(update=WRITES), run_worker=True) as service:
        block = ('<memory_write>{"observations": [{"text": "Alice works at Globex.", "name": "Alice"}], '
                 '"entities": [{"name": "Alice", "type": "person"}, {"name": "Globex", "type": "organisation"}], '
                 '"edges": [{"source": "Alice", "target": "Globex", "rel_type": "works at"}]}</memory_write>')
        written = await service.parse_writes(AGENT, block, USER_NS, actor="k1")
        (memory,) = written.written
        (fact,) = written.facts
        assert fact.current and memory.id in fact.memory_ids
        _, backend = await service.agents.backend_for(AGENT)
        done = await service.memory_correct(AGENT, memory.id, MemoryCorrection(content="Alice works at Initech."),
                                            actor="k1")
        assert done.facts_closed == [fact.id]
        closed = await backend.get_fact(AGENT, fact.id)
        assert closed.corrected_by == done.correction.id and closed.superseded_by is None
        assert not closed.current_at() and closed.invalid_at == closed.valid_at and closed.expired_at is not None
        assert not closed.current_at(closed.valid_at)  # an as_of read finds it at no time
        assert fact.id not in [f.id for f in await backend.facts_citing(AGENT, [memory.id])]
        entity = await service.get_entity(AGENT, fact.subject_id)
        assert fact.id not in [f.id for f in entity.facts]
        entries = (await service.audit_page(AGENT, action="fact.invalidate")).entries
        assert [(e.target, e.after["reason"], e.after["corrected_by"]) for e in entries] == [
            (fact.id, "correction", done.correction.id)]
        events, _ = await service.read_events(AGENT, "0-0", 100, None)
        assert [(e.memory_ids, e.kind) for e in events if e.type == "corrected"] == [
            ([memory.id, done.correction.id], "observation"), ([fact.id], "graph_fact")]

        undone = await service.memory_uncorrect(AGENT, memory.id, actor="k1")
        assert undone.facts_restored == [fact.id]
        restored = await backend.get_fact(AGENT, fact.id)
        assert restored.current_at() and restored.corrected_by is None
        assert [e.target for e in (await service.audit_page(AGENT, action="fact.restore")).entries] == [fact.id]


async def test_only_the_facts_the_memory_stated_close_when_its_window_holds_others(settings):
    """A formed window's facts name all its memories: correcting one closes the facts whose two
    ends it mentions; a fact another live memory of the window holds stays current."""
    async with open_service(settings.model_copy(update=WRITES), run_worker=True) as service:
        await record_all(service, "s1", AGENT, [
            ("alice", "user", "I live in Porto and I work at Sonae."), ("alice", "assistant", "Noted."),
            ("alice", "user", "I prefer window seats on every flight."), ("alice", "assistant", "Window seats it is.")])
        assert (await service.form_memories("s1")).formed
        _, backend = await service.agents.backend_for(AGENT)
        memories = [m for ns in (Namespace.session("s1"), Namespace.parse(USER_NS))
                    for m in await backend.export(AGENT, ns) if m.kind is not MemoryKind.MESSAGE]
        facts = await backend.facts_citing(AGENT, [m.id for m in memories])
        assert facts, memories
        directive = next(m for m in memories if m.kind is MemoryKind.DIRECTIVE and "window" in m.content.lower())
        done = await service.memory_correct(AGENT, directive.id, MemoryCorrection(content="Alice prefers aisle seats."))
        # The window's other memories (the episode quoting Porto and Sonae) still hold its facts.
        assert done.facts_closed == []
        assert all([(await backend.get_fact(AGENT, f.id)).current_at() for f in facts])
        episode = next(m for m in memories if m.kind is MemoryKind.EPISODE)
        closed = await service.memory_correct(AGENT, episode.id, MemoryCorrection(
            content="Alice lives in Braga and works at Sonae; she prefers window seats."))
        stated = {f.id for f in facts if episode.id in f.memory_ids}
        assert stated and set(closed.facts_closed) <= stated and closed.facts_closed


async def test_over_http_and_the_client_with_keys_and_the_event_stream(settings):
    operator = secrets.token_urlsafe(32)
    config = settings.model_copy(update={**WRITES, "api_auth": "keys", "operator_api_key": SecretStr(operator)})
    async with LoopbackServer(create_app(config, run_worker=True)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30,
                                     headers={"Authorization": f"Bearer {operator}"}) as http:
            read_key = (await http.post("/v1/keys", json={"name": "r", "role": "read", "agents": [AGENT]})).json()["key"]
            write_key = (await http.post("/v1/keys", json={"name": "w", "role": "write", "agents": [AGENT]})).json()["key"]
            wrong = await http.post(f"/v1/agents/{AGENT}/memories", json={
                "namespace": USER_NS, "kind": "fact", "content": "The gate code is 1234."})
            assert wrong.status_code == 201, wrong.text
            wrong_id = wrong.json()["id"]
            path = f"/v1/agents/{AGENT}/memories/{wrong_id}"
            for body, status in (({"content": ""}, 422), ({"content": "  "}, 422), ({}, 422),
                                 ({"content": "x", "kind": "fact"}, 422), ({"content": 5}, 422)):
                answer = await http.post(f"{path}/correct", json=body)
                assert answer.status_code == status, (body, answer.text)
                assert answer.json()["detail"]
            unknown = await http.post(f"/v1/agents/{AGENT}/memories/nope/correct", json={"content": "x"})
            assert unknown.status_code == 404 and "no such memory" in unknown.json()["detail"]
            refused = await http.post(f"{path}/correct", json={"content": "The gate code is 4321."},
                                      headers={"Authorization": f"Bearer {read_key}"})
            assert refused.status_code == 403 and "read" in refused.json()["detail"]
            assert (await http.get(path)).json()["corrected_by"] is None  # nothing changed

            async with AsyncMemoryClient(server.base_url, api_key=write_key) as client:
                done = await client.memory_correct(AGENT, wrong_id, "The gate code is 4321.")
                assert done.corrected.corrected_by == done.correction.id
                with pytest.raises(ConflictError):
                    await client.memory_correct(AGENT, wrong_id, "The gate code is 0000.")
                with pytest.raises(NotFoundError):
                    await client.memory_uncorrect(AGENT, "nope")
                with pytest.raises(InvalidRequest):
                    await client.memory_correct(AGENT, wrong_id, " ")
                async with AsyncMemoryClient(server.base_url, api_key=read_key) as reader:
                    with pytest.raises(PermissionDenied):
                        await reader.memory_uncorrect(AGENT, wrong_id)
                found = await client.search(AGENT, "gate code")
                assert [r.id for r in found.results] == [done.correction.id]
                undone = await client.memory_uncorrect(AGENT, wrong_id)
                assert undone.memory.corrected_by is None and undone.correction.deleted_at is not None

            events = []
            async with http.stream("GET", f"/v1/agents/{AGENT}/events", params={"after": "0-0", "timeout": 1}) as sse:
                async for line in sse.aiter_lines():
                    if line.startswith("event: "):
                        events.append(line[7:])
            assert events == ["written", "corrected", "uncorrected"]


async def test_the_docs_example_runs(settings, capsys):
    """docs/corrections.md's example, as written, against a real server (writes on for its agent)."""
    import asyncio
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "corrections.md").read_text()
    start = page.index("```python\n") + len("```python\n")
    code = page[start:page.index("```", start)]
    placeholder = 'API, AGENT = "http://127.0.0.1:8080", "concierge"'
    assert placeholder in code
    config = settings.model_copy(update={"memory_write_agents": ["concierge"]})
    async with LoopbackServer(create_app(config, run_worker=True)) as server:
        code = code.replace(placeholder, f'API, AGENT = "{server.base_url}", "concierge"')
        await asyncio.to_thread(exec, compile(code, "docs/corrections.md", "exec"), {"__name__": "docs"})
    out = capsys.readouterr().out
    assert "corrected by True" in out and "search finds ['Alice is allergic to pecans.']" in out
    assert "kept as history: Alice is allergic to walnuts." in out and "the correction deleted: True" in out


async def test_a_consolidated_memory_corrected_is_its_namespaces_latest_version(service):
    """The block shows a namespace's latest consolidated memory: its correction takes its place."""
    from memory_service.domain.models import Memory, Provenance

    await record_all(service, "s1", AGENT, [("alice", "user", "Hello there.")])
    _, backend = await service.agents.backend_for(AGENT)
    merged = Memory(id="cons-1", kind=MemoryKind.CONSOLIDATED, namespace=USER_NS,
                    content="Alice wants replies in French, always.", metadata=Provenance(agent_id=AGENT, user_id="alice"))
    await backend.write([merged])
    done = await service.memory_correct(AGENT, merged.id, MemoryCorrection(content="Alice wants replies in Spanish."))
    [latest] = await backend.recent(AGENT, Namespace.parse(USER_NS), [MemoryKind.CONSOLIDATED], 1)
    assert latest.id == done.correction.id and latest.kind is MemoryKind.CONSOLIDATED
    block = await service.assemble_memory_context(AGENT, "alice", "s1", query="which language")
    assert "Spanish" in block.xml and "French" not in block.xml
