"""Forgetting a message or a memory with everything formed from it (memory_service/curation/forget.py,
docs/forget.md), against the embedded store and the real worker: one distinctive sentence is
forgotten and then looked for everywhere (every Redis key and value, every node and edge of
the graph, search, the memory block, the export); soft forgets are undone; bad input changes
nothing.
"""

from __future__ import annotations

import pytest

from memory_service.domain.errors import Conflict, Forbidden, InvalidInput, NotFound
from memory_service.domain.models import MemoryKind, ShardIn
from memory_service.domain.namespaces import Namespace
from memory_service.formation.steps import message_memory_id
from memory_service.schemas.events import EventType
from memory_service.schemas.lifecycle import ForgetMode

from .helpers import msg, wait_embedded
from .test_erasure import graph_findings, redis_findings

AGENT, ADA, SESSION = "family", "ada", "kitchen"
SECRET = "My grandmother's maiden name is Quillfeather, and she was born in Dundee."
LINES = [
    "I am planning a trip to Lisbon next month with my sister.",
    SECRET,
    "I prefer window seats on long flights.",
    "Please always answer me in short sentences.",
]
NEEDLES = ("quillfeather", "dundee")


async def converse(service, session: str = SESSION, lines=LINES) -> None:
    await service.put_shard(AGENT, "travel", ShardIn(name="travel", extraction_focus="trips, flights, hotels"))
    for i, line in enumerate(lines):
        await service.record_message(session, msg(AGENT, ADA, line, mid=f"{session}-{i}", minute=i))
    assert (await service.form_memories(session)).formed
    await wait_embedded(service, AGENT)


def secret_id(session: str = SESSION) -> str:
    return message_memory_id(session, f"{session}-1")


def shows(text: str) -> list[str]:
    return [n for n in NEEDLES if n in text.lower()]


async def everywhere(service) -> dict[str, list[str]]:
    """Where the forgotten words are still found: the stores, search, the block, the export."""
    url = service.settings.falkordb_url
    found = {"redis": await redis_findings(url, NEEDLES), "graph": await graph_findings(url, NEEDLES)}
    # The reads quote the query in FalkorDB's query log: read after the stores were scanned.
    hits = (await service.search(AGENT, "Quillfeather grandmother maiden name Dundee", scope="agent")).results
    found["search"] = [h.id for h in hits if shows(h.content)]
    block = await service.assemble_memory_context(AGENT, ADA, SESSION, query="what was my grandmother's maiden name?")
    found["block"] = shows(block.xml)
    found["export"] = shows((await service.export_user(AGENT, ADA)).model_dump_json())
    return found


async def test_the_sentence_is_found_everywhere_before_it_is_forgotten(service):
    """The control: the checks below can fail (they find the sentence while it is held)."""
    await converse(service)
    found = await everywhere(service)
    assert found["redis"] and found["graph"] and found["search"] and found["block"] and found["export"]


async def test_a_hard_forget_of_a_message_leaves_it_nowhere(service):
    await converse(service)
    block = await service.assemble_memory_context(AGENT, ADA, SESSION, query="grandmother maiden name")
    assert shows(block.xml)  # cached now: the forget must take the cached block too
    windows = await service.state.formed_windows(SESSION)
    before = windows[0][1]["memory_ids"]
    report = await service.memory_forget(AGENT, secret_id(), ForgetMode.HARD, actor="k_test")
    assert report.mode is ForgetMode.HARD and not report.undoable
    assert report.memories["message"] == 1 and len(report.reformed) == 1
    window = report.reformed[0]
    assert window.messages == len(LINES) - 1 and sorted(window.removed) == sorted(set(before) - set(window.formed))
    assert report.cached_blocks >= 1 and report.query_log_entries >= 1 and report.persistence
    assert await everywhere(service) == {"redis": [], "graph": [], "search": [], "block": [], "export": []}
    # The window is formed again from its other messages: Lisbon is still remembered, once.
    entry = (await service.state.formed_windows(SESSION))[0][1]
    assert entry["reforms"] == 1 and entry["memory_ids"] == window.formed and entry["messages"] == len(LINES) - 1
    _, backend = await service.agents.backend_for(AGENT)
    episodes = [m for m in await backend.export(AGENT, Namespace.session(SESSION)) if m.kind is MemoryKind.EPISODE]
    assert len(episodes) == 1 and "lisbon" in episodes[0].content.lower() and episodes[0].id in window.formed
    assert not await backend.find(AGENT, [secret_id(), *window.removed])
    # Audited with what went (ids and counts), announced as forgotten.
    audit = (await service.audit_page(AGENT, action="memory.forget")).entries
    assert len(audit) == 1 and set(audit[0].after["memory_ids"]) == set(report.memory_ids)
    assert not shows(str(audit[0].model_dump()))
    events, _ = await service.read_events(AGENT, "0-0", 1000, None)
    forgotten = {i for e in events if e.type is EventType.FORGOTTEN for i in e.memory_ids}
    assert secret_id() in forgotten and set(window.removed) <= forgotten
    # Hard is for good: nothing to undo, and the message is gone.
    assert not await service.forgetter.soft_forgotten(AGENT, secret_id())
    with pytest.raises(NotFound):
        await service.memory_get(AGENT, secret_id())


async def test_a_soft_forget_hides_everything_and_undelete_brings_it_back(service):
    await converse(service)
    _, backend = await service.agents.backend_for(AGENT)
    before = {m.id for m in await backend.export(AGENT, Namespace.session(SESSION)) if m.live}
    report = await service.memory_forget(AGENT, secret_id(), ForgetMode.SOFT, actor="k_test")
    assert report.undoable and len(report.reformed) == 1
    hits = (await service.search(AGENT, "Quillfeather grandmother maiden name Dundee", scope="agent")).results
    assert not [h for h in hits if shows(h.content)]
    assert not shows((await service.assemble_memory_context(AGENT, ADA, SESSION, query="maiden name")).xml)
    # Kept, soft-deleted, until the purge: read by id it is there, deleted.
    assert (await service.memory_get(AGENT, secret_id())).deleted_at is not None
    # The same forget again answers the same report, changing nothing.
    again = await service.memory_forget(AGENT, secret_id(), ForgetMode.SOFT)
    assert again.memory_ids == report.memory_ids
    # Undone: the message and the window's memories as they were, the re-formed ones gone.
    record = await service.memory_undelete(AGENT, secret_id(), actor="k_test")
    assert record.deleted_at is None
    after = {m.id for m in await backend.export(AGENT, Namespace.session(SESSION)) if m.live}
    assert after == before
    assert not await backend.find(AGENT, [i for i in report.reformed[0].formed if i not in before])
    hits = (await service.search(AGENT, "Quillfeather grandmother maiden name", scope="agent")).results
    assert [h for h in hits if shows(h.content)]


async def test_a_soft_forget_made_hard_later_leaves_it_nowhere(service):
    await converse(service)
    await service.memory_forget(AGENT, secret_id(), ForgetMode.SOFT)
    report = await service.memory_forget(AGENT, secret_id(), ForgetMode.HARD)
    assert not report.undoable
    assert await everywhere(service) == {"redis": [], "graph": [], "search": [], "block": [], "export": []}


async def test_forgetting_a_formed_memory_takes_what_merged_it(service):
    """A directive forgotten: its consolidated version goes too; the message stays."""
    await converse(service)
    _, backend = await service.agents.backend_for(AGENT)
    user_ns = Namespace.user(AGENT, ADA)
    directive = next(m for m in await backend.export(AGENT, user_ns) if m.kind is MemoryKind.DIRECTIVE)
    report = await service.memory_forget(AGENT, directive.id, ForgetMode.HARD)
    assert report.memories.get("directive") == 1 and not report.reformed
    assert not await backend.find(AGENT, [directive.id])
    merged = [m for m in await backend.export(AGENT, user_ns)
              if m.kind is MemoryKind.CONSOLIDATED and directive.id in m.metadata.memory_ids]
    assert not merged
    assert await backend.find(AGENT, [message_memory_id(SESSION, f"{SESSION}-3")])  # its message is not forgotten


async def test_memories_written_by_tools_citing_nothing_stay_when_a_window_is_re_formed(service):
    await converse(service)
    from memory_service.curation.tools import MemoryWrite

    service.settings.memory_write_agents = ["*"]
    kept = await service.memory_write(AGENT, MemoryWrite(content="Ada keeps bees on her roof.",
                                                         namespace=f"user:{AGENT}:{ADA}", kind=MemoryKind.FACT))
    await service.memory_forget(AGENT, secret_id(), ForgetMode.HARD)
    _, backend = await service.agents.backend_for(AGENT)
    assert [m.live for m in await backend.find(AGENT, [kept.id])] == [True]


async def test_bad_input_is_refused_and_changes_nothing(service):
    await converse(service)
    _, backend = await service.agents.backend_for(AGENT)
    before = sorted((m.id, m.deleted_at) for m in await backend.export(AGENT, Namespace.session(SESSION)))
    with pytest.raises(NotFound):
        await service.memory_forget(AGENT, "no-such-memory", ForgetMode.HARD)
    with pytest.raises(NotFound):  # another agent's memory is answered as an unknown one
        await service.memory_forget("other-agent", secret_id(), ForgetMode.HARD)
    with pytest.raises(InvalidInput):
        await service.memory_forget(AGENT, "x" * 65, ForgetMode.SOFT)
    with pytest.raises(InvalidInput):  # nothing was soft-forgotten
        await service.forgetter.undo(AGENT, secret_id())
    limited = service.reach(_principal(["someone-else"]), AGENT)
    with pytest.raises(NotFound):  # a key for other users does not see Ada's session
        await service.memory_forget(AGENT, secret_id(), ForgetMode.SOFT, limited)
    after = sorted((m.id, m.deleted_at) for m in await backend.export(AGENT, Namespace.session(SESSION)))
    assert after == before and not await service.forgetter.unfinished(AGENT)


async def test_a_message_in_the_window_being_formed_is_refused(service):
    await converse(service)
    await service.record_message(SESSION, msg(AGENT, ADA, "My cat is called Quillfeather too.", mid="late", minute=9))
    claim = await service.formation.windows.claim(SESSION, 10)
    assert claim is not None
    record = await service.formation.windows.load(SESSION)
    from memory_service.formation.window import StoredExtraction

    await service.formation.windows.store_extraction(record, StoredExtraction(()))
    with pytest.raises(Conflict):
        await service.memory_forget(AGENT, message_memory_id(SESSION, "late"), ForgetMode.SOFT)


def _principal(users):
    from memory_service.access.keys import Principal
    from memory_service.schemas.keys import Role

    return Principal(key_id="k_limited", role=Role.ADMIN, agents=[AGENT], users=users)


_ = Forbidden  # the HTTP tests check a key without the role (tests/test_forget_api.py)
