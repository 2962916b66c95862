"""Retention (memory_service/curation/retention.py): soft-deleted memories are purged after
PURGE_AFTER_DAYS from every store, index, embedding, cache and outbox, on the graph and
with MongoDB beside it; the counts reach /metrics and the audit log.

Each purged memory is then looked for everywhere: through every read path, and in the
stores directly (every graph node and its full-text index, every Redis key with FalkorDB's
query log, every MongoDB collection), with the helpers of the erasure tests."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from memory_service.backends.loopback import LoopbackServer
from memory_service.curation.tools import MemoryUpdate, MemoryWrite
from memory_service.domain.errors import NotFound
from memory_service.domain.models import MemoryKind
from memory_service.domain.namespaces import Namespace
from memory_service.http.app import create_app
from memory_service.runtime import open_service
from memory_service.state.metrics import REGISTRY
from memory_service.workers.worker import retention

from .helpers import mirrored_service, msg, outbox_drained
from .test_erasure import graph_findings, mongo_findings, redis_findings


async def purge_findings(service, needles) -> list[str]:
    """``redis_findings`` but the one trace a purge leaves on purpose: the ``purged`` change
    event naming the memory's id (a host needs it to drop its copy; docs/events.md), which is
    checked to be the only event naming it and to hold none of its words."""
    from memory_service.schemas.events import EventType

    naming = [e for e in await service.events.read(AGENT, "0-0", 10_000) if set(needles) & set(e.memory_ids)]
    assert naming and {e.type for e in naming} == {EventType.PURGED}  # the earlier events went
    assert not any(n in e.model_dump_json() for e in naming for n in needles if n not in e.memory_ids)
    return [hit for hit in await redis_findings(service.settings.job_queue_url(), needles) if "ms:ev:{ev:" not in hit]

AGENT = "keeper"
WRITES = {"memory_write_agents": ["*"], "purge_after_days": 30}


def later(days: float) -> datetime:
    return datetime.now(UTC) + timedelta(days=days)


@pytest.fixture
async def service(settings):
    async with open_service(settings.model_copy(update=WRITES), run_worker=True) as opened:
        yield opened


async def write(service, content: str, namespace: str = f"user:{AGENT}:alice", kind: str = "observation", **extra):
    return await service.memory_write(AGENT, MemoryWrite(namespace=namespace, kind=kind, content=content, **extra))


async def reads(service, word: str, memory_id: str, namespace: str = f"user:{AGENT}:alice") -> dict[str, bool]:
    """Whether each read path still shows the memory (by its word or its id)."""
    _, backend = await service.agents.backend_for(AGENT)
    ns = Namespace.parse(namespace)
    context = await service.assemble_memory_context(AGENT, "alice", "s1", query=f"{word} please")
    try:
        await service.memory_get(AGENT, memory_id)
        got = True
    except NotFound:
        got = False
    return {
        "memory_get": got,
        "search": any(r.id == memory_id for r in (await service.search(AGENT, word)).results),
        "context": word in context.xml.lower(),
        "recent": any(m.id == memory_id for m in await backend.recent(AGENT, ns, list(MemoryKind), 100)),
        "export": any(m.id == memory_id for m in await backend.export(AGENT, ns)),
        "find": bool(await backend.find(AGENT, [memory_id])),
    }


async def test_a_purge_leaves_no_trace_anywhere_and_is_counted(service):
    await service.record_message("s1", msg(AGENT, "alice", "Hello, planning my week.", mid="m1"))
    doomed = await write(service, "The narwhal password is under the mat.", title="narwhal note", tags=["narwhal"])
    kept = await write(service, "The otter stays in the pond.")
    await service.memory_get(AGENT, doomed.id)  # an access to forget too
    assert (await reads(service, "narwhal", doomed.id))["context"]  # and a cached block showing it
    await service.memory_delete(AGENT, doomed.id)
    assert await reads(service, "narwhal", doomed.id) == {
        "memory_get": True, "search": False, "context": False, "recent": False, "export": True, "find": True}

    early = await service.retention.purge(now=later(29))
    assert early.purged == 0 and (await service.memory_get(AGENT, doomed.id)).deleted_at is not None

    report = await service.retention.purge(now=later(31))
    assert (report.purged, report.agents) == (1, {AGENT: 1})
    assert not any((await reads(service, "narwhal", doomed.id)).values())
    needles = ("narwhal", doomed.id)
    assert await graph_findings(service.settings.falkordb_url, needles) == []
    assert await purge_findings(service, needles) == []  # indexes, caches, query log, audit
    assert kept.id in [r.id for r in (await service.search(AGENT, "otter")).results]  # the rest stays
    assert (await service.retention.purge(now=later(31))).purged == 0  # nothing more to do

    async with LoopbackServer(create_app(service=service)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            metrics = (await http.get("/metrics")).text
            assert "memory_service_purged_memories_total 1.0\n" in metrics  # this process's counter
            entries = (await http.get("/v1/audit", params={"agent_id": AGENT, "action": "memory.purge"})).json()["entries"]
    assert [(e["key_id"], e["after"]["purged"], e["after"]["kinds"]) for e in entries] == [
        ("retention", 1, {"observation": 1})]


async def backdate(service, memory_id: str, days: int) -> None:
    """A soft delete ``days`` ago, as if made then (in the store and the deletion index)."""
    _, backend = await service.agents.backend_for(AGENT)
    [memory] = await backend.find(AGENT, [memory_id])
    when = datetime.now(UTC).replace(microsecond=0) - timedelta(days=days)
    await backend.replace(AGENT, [memory.model_copy(update={"deleted_at": when})])
    await service.retention_index.mark_deleted(AGENT, memory_id, when)


async def test_the_workers_daily_job_purges_what_is_due(service):
    due = await write(service, "A walrus sighting last spring.")
    fresh = await write(service, "A walrus sighting this morning.")
    for memory in (due, fresh):
        await service.memory_delete(AGENT, memory.id)
    await backdate(service, due.id, 31)
    assert await retention({"service": service}) == {"purged": 1, "agents": 1, "skipped": 0, "stale": 0, "expired": 0}
    _, backend = await service.agents.backend_for(AGENT)
    assert [m.id for m in await backend.find(AGENT, [due.id, fresh.id])] == [fresh.id]


async def test_an_undeleted_memory_is_never_purged(service):
    undone = await write(service, "The heron nests by the bridge.")
    await service.memory_delete(AGENT, undone.id)
    await backdate(service, undone.id, 40)
    await service.memory_undelete(AGENT, undone.id)
    raced = await write(service, "The heron flies at dawn.")
    # An index entry whose memory is live (a crash between an undelete's two steps).
    await service.retention_index.mark_deleted(AGENT, raced.id, datetime.now(UTC) - timedelta(days=40))
    report = await service.retention.purge(now=later(1))
    assert report.purged == 0 and report.skipped == 1
    assert {r.id for r in (await service.search(AGENT, "heron")).results} == {undone.id, raced.id}
    assert await service.retention_index.due(later(100), 10) == []  # the stale entry left the index


async def test_purge_after_zero_days_keeps_deleted_memories(settings):
    config = settings.model_copy(update={**WRITES, "purge_after_days": 0})
    async with open_service(config, run_worker=False) as service:
        kept = await write(service, "The lynx prefers snow.")
        deleted = await service.memory_delete(AGENT, kept.id)
        assert deleted.purge_at is None
        await backdate(service, kept.id, 400)
        assert (await service.retention.purge(now=later(1000))).purged == 0
        assert (await service.memory_undelete(AGENT, kept.id)).content == "The lynx prefers snow."


# MongoDB beside the graph: every change and the purge reach it through the outbox.


@pytest.fixture
async def mongo_service(settings, mongo_uri, mongo_database, tmp_path):
    async with mirrored_service(settings, mongo_uri, mongo_database, tmp_path / "graph", **WRITES) as (service, _):
        yield service


async def test_a_purge_reaches_mongodb_and_leaves_no_trace_there(mongo_service, mongo_proxy):
    service = mongo_service
    _, backend = await service.agents.backend_for(AGENT)
    mongo, ns = backend.mirror, Namespace.user(AGENT, "alice")
    doomed = await write(service, "Alice always orders the quokka special.", kind="directive", tags=["quokka"])
    kept = await write(service, "Alice always orders tea.", kind="directive")
    await service.memory_get(AGENT, doomed.id)
    await service.memory_delete(AGENT, doomed.id)
    await outbox_drained(backend)
    # MongoDB's every read path skips it while it is soft-deleted; find shows it, deleted.
    [stored] = await mongo.find(AGENT, [doomed.id])
    assert stored.deleted_at is not None and stored.tags == ["quokka"]
    assert [m.id for m in await mongo.recent(AGENT, ns, [MemoryKind.DIRECTIVE], 10)] == [kept.id]
    assert await mongo.get(AGENT, ns, [doomed.id]) == [] and await mongo.count(AGENT, ns) == 1
    from memory_service.domain.models import StoreQuery
    hits = await mongo.search(AGENT, StoreQuery(terms=["quokka"], namespaces=[ns]))
    assert hits == {"fulltext": []}
    tagged = await mongo.search(AGENT, StoreQuery(terms=["orders"], tags=["quokka"]))
    assert tagged == {"fulltext": []}

    # Cut MongoDB: the purge reaches it through the outbox when it is back.
    await mongo_proxy.stop()
    report = await service.retention.purge(now=later(31))
    assert report.purged == 1
    needles = ("quokka", doomed.id)
    assert await graph_findings(service.settings.falkordb_url, needles) == []
    await mongo_proxy.start()
    await outbox_drained(backend)
    assert await mongo_findings(mongo.db, needles) == []  # memories, summaries (user_memory), every collection
    assert await purge_findings(service, needles) == []  # outbox entries delivered and gone
    assert await mongo.find(AGENT, [doomed.id]) == []
    assert [m.id for m in await mongo.find(AGENT, [kept.id])] == [kept.id]


async def test_an_index_entry_older_than_its_stores_deletion_is_kept_and_the_run_ends(service):
    memory = await write(service, "The puffin returned.")
    await service.memory_delete(AGENT, memory.id)  # deleted now in the store
    await service.retention_index.mark_deleted(AGENT, memory.id, datetime.now(UTC) - timedelta(days=40))
    report = await asyncio.wait_for(service.retention.purge(now=later(1)), 30)  # a bound, not a speed check
    assert (report.purged, report.skipped) == (0, 1)
    assert (await service.memory_get(AGENT, memory.id)).deleted_at is not None
    assert len(await service.retention_index.due(later(1) - timedelta(days=30), 10)) == 1


# STALE_PURGE_DAYS: memories nobody wrote, updated or read (memory_get) for that long. A
# conversation recorded with its own past dates (created_at, 2026-05-01) forms memories that
# old, so the purge runs at the real time, and reads and updates made now count as recent.

STALE = {**WRITES, "stale_purge_days": 30, "consolidate_directives_after": 1}
WINDOWS = [  # one formed window each: a directive (consolidated at once) and a remark
    ["Please always answer me in French.", "The narwhal migrates north in spring."],
    ["From now on never use emojis.", "The otter sleeps by the river."],
    ["Please always keep answers short.", "The heron fishes at dawn."],
]


async def old_conversation(service) -> dict[str, str]:
    """Three formed windows of session s-old and one message pending after them; memory ids
    by a name: m<i> (messages), e<window>, d<window> (directives), v<version> (consolidated)."""
    user = Namespace.user(AGENT, "alice")
    i = 0
    for lines in WINDOWS:
        for line in lines:
            await service.record_message("s-old", msg(AGENT, "alice", line, mid=f"m{i}", minute=i))
            i += 1
        assert (await service.form_memories("s-old", wait=True)).formed
        for _ in range(600):  # the worker consolidates each window's directive
            if not await service.state.consolidation_pending(str(user)):
                break
            await asyncio.sleep(0.05)
    await service.record_message("s-old", msg(AGENT, "alice", "The walrus waits on the ice.", mid="m6", minute=6))
    _, backend = await service.agents.backend_for(AGENT)
    named: dict[str, str] = {}
    for memory in await backend.export(AGENT, Namespace.session("s-old")):
        if memory.kind is MemoryKind.MESSAGE:
            named[memory.metadata.message_ids[0]] = memory.id
        else:
            named[f"e{len([n for n in named if n.startswith('e')])}"] = memory.id
    for memory in await backend.export(AGENT, user):
        prefix = "v" if memory.kind is MemoryKind.CONSOLIDATED else "d"
        key = f"v{memory.metadata.sequence}" if prefix == "v" else f"d{len([n for n in named if n.startswith('d')])}"
        named[key] = memory.id
    assert sorted(named) == ["d0", "d1", "d2", "e0", "e1", "e2", *(f"m{i}" for i in range(7)), "v1", "v2", "v3"]
    return named


@pytest.fixture
async def stale_service(settings):
    async with open_service(settings.model_copy(update=STALE), run_worker=True) as opened:
        yield opened


async def test_a_stale_memory_is_purged_everywhere_and_what_was_read_updated_or_is_still_needed_stays(stale_service):
    service = stale_service
    named = await old_conversation(service)
    _, backend = await service.agents.backend_for(AGENT)
    await service.memory_get(AGENT, named["m3"])  # read now: kept
    await service.memory_get(AGENT, named["d1"])  # read now: kept, and so is v2, which merged it
    await service.memory_update(AGENT, named["e1"], MemoryUpdate(tags=["river"]))  # updated now: kept
    await service.memory_delete(AGENT, named["e2"])  # soft-deleted: PURGE_AFTER_DAYS decides, not staleness
    fresh = await write(service, "The lynx hunts in winter.")  # written now: kept
    # Shown before (search and the memory block are not accesses: memory_get would be).
    assert named["m1"] in [r.id for r in (await service.search(AGENT, "narwhal")).results]
    assert "narwhal" in (await service.assemble_memory_context(AGENT, "alice", "s1", query="narwhal please")).xml.lower()

    # This process's counters (one registry for the whole test run): what this test adds.
    counted_before = {name: REGISTRY.get_sample_value(f"memory_service_{name}_total") or 0.0
                      for name in ("stale_purged_memories", "purged_memories")}
    report = await service.retention.purge()
    purged = {"m0", "m1", "m2", "m4", "m5", "e0", "d0", "d2", "v1"}
    assert (report.stale, report.purged, report.agents) == (len(purged), 0, {AGENT: len(purged)})
    assert {n for n, i in named.items() if not await backend.find(AGENT, [i])} == purged
    # Kept: read (m3, d1), updated (e1), deleted (e2), pending formation (m6), the latest
    # consolidated memory (v3) and one that merged a live memory (v2: d1), the fresh write.
    assert {m.id for m in await backend.find(AGENT, [*named.values(), fresh.id])} == {
        named[n] for n in ("m3", "m6", "d1", "e1", "e2", "v2", "v3")} | {fresh.id}
    # The pending message still forms; formed, it is as old as its date says, and the next
    # run takes it with its episode (docs/memory-tools.md: a backdated conversation).
    assert (await service.form_memories("s-old", wait=True)).message_ids == ["m6"]
    assert (await service.retention.purge()).stale == 2

    # The narwhal (its message and the episode quoting it) through every read path, and in every store.
    assert not any((await reads(service, "narwhal", named["m1"], "session:s-old")).values())
    assert not any((await reads(service, "narwhal", named["e0"], "session:s-old")).values())
    needles = ("narwhal", named["m1"], named["e0"], named["m0"], named["v1"])
    assert await graph_findings(service.settings.falkordb_url, needles) == []
    assert await purge_findings(service, needles) == []  # access, caches, query log, audit
    assert (await service.memory_get(AGENT, named["m3"])).content == "The otter sleeps by the river."

    async with LoopbackServer(create_app(service=service)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            metrics = (await http.get("/metrics")).text
            entries = (await http.get("/v1/audit", params={"agent_id": AGENT, "action": "memory.purge"})).json()["entries"]
    stale_total = counted_before["stale_purged_memories"] + len(purged) + 2
    assert f"memory_service_stale_purged_memories_total {stale_total}\n" in metrics
    purged_total = REGISTRY.get_sample_value("memory_service_purged_memories_total") or 0.0
    assert purged_total == counted_before["purged_memories"]  # no retention purge
    assert [(e["key_id"], e["after"]["reason"], e["after"]["purged"], e["after"]["kinds"]) for e in entries] == [
        ("retention", "stale", 2, {"message": 1, "episode": 1}),  # newest first
        ("retention", "stale", len(purged), {"message": 5, "episode": 1, "directive": 2, "consolidated": 1})]


async def test_stale_purge_days_zero_purges_nothing(settings):
    async with open_service(settings.model_copy(update={**STALE, "stale_purge_days": 0}), run_worker=True) as service:
        named = await old_conversation(service)
        _, backend = await service.agents.backend_for(AGENT)
        report = await service.retention.purge(now=later(1000))
        assert report.counts() == {"purged": 0, "agents": 0, "skipped": 0, "stale": 0, "expired": 0}
        assert len(await backend.find(AGENT, list(named.values()))) == len(named)


@pytest.mark.parametrize("value", ["-1", "36501", "soon", "1.5"])
def test_bad_stale_purge_days_are_refused(monkeypatch, value):
    from pydantic import ValidationError

    from memory_service.config import Settings

    monkeypatch.setenv("STALE_PURGE_DAYS", value)
    with pytest.raises(ValidationError, match="stale_purge_days"):
        Settings(_env_file=None)
    monkeypatch.setenv("STALE_PURGE_DAYS", "90")
    assert Settings(_env_file=None).stale_purge_days == 90


async def test_a_stale_purge_reaches_mongodb_and_leaves_no_trace_there(settings, mongo_uri, mongo_database, tmp_path):
    async with mirrored_service(settings, mongo_uri, mongo_database, tmp_path / "graph", **STALE) as (service, graph_url):
        named = await old_conversation(service)
        _, backend = await service.agents.backend_for(AGENT)
        mongo = backend.mirror
        await service.memory_get(AGENT, named["m3"])
        await outbox_drained(backend)
        assert len(await mongo.find(AGENT, list(named.values()))) == len(named)
        # The worker's daily job, as cron runs it: all but the three kept below.
        assert await retention({"service": service}) == {"purged": 0, "agents": 1, "skipped": 0, "stale": 13, "expired": 0}
        await outbox_drained(backend)
        needles = ("narwhal", named["m1"], named["e0"], named["d0"])
        assert await mongo_findings(mongo.db, needles) == []  # memories, user_memory summaries, every collection
        assert await graph_findings(graph_url, needles) == []
        assert await purge_findings(service, needles) == []  # outbox entries delivered and gone
        kept = {"m3", "m6", "v3"}  # read, pending formation, the latest consolidated memory
        assert {m.id for m in await mongo.find(AGENT, list(named.values()))} == {named[n] for n in kept}
        ns = Namespace.session("s-old")
        assert named["m1"] not in [m.id for m in await mongo.recent(AGENT, ns, [MemoryKind.MESSAGE], 10)]
