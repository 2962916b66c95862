"""The contract every memory backend passes: the graph backend on FalkorDB, and the Mongo
backend on MongoDB (a real server when MONGODB_URI is set, else the in-process stand-in;
the pytest header says which)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memory_service.models import Memory, MemoryKind, Provenance
from memory_service.namespaces import Namespace

T0 = datetime(2026, 5, 1, 9, 0, 0, 123456, tzinfo=UTC)
SESSION = Namespace.session("s-1")
USER = Namespace.user("a1", "alice")
SHARD = Namespace.shard("a1", "travel")


def memory(mid: str, kind: MemoryKind, ns: Namespace, content: str, minute: int, seq: int = 0, **meta) -> Memory:
    return Memory(id=mid, kind=kind, namespace=str(ns), content=content, valid_at=T0 + timedelta(minutes=minute),
                  metadata=Provenance(agent_id="a1", user_id="alice", session_id="s-1", message_ids=[f"m{seq}"],
                                      sequence=seq, **meta))


@pytest.fixture(params=["graph", "mongo"])
async def backend(request, settings, mongo_uri, mongo_database):
    if request.param == "graph":
        from backends.graph import GraphBackend

        instance = GraphBackend(settings.falkordb_url, settings)
    else:
        from backends.mongo import MongoBackend

        instance = MongoBackend(mongo_uri, mongo_database, timeout_ms=2000)
    await instance.start()
    yield instance
    await instance.close()


async def test_write_is_idempotent_by_id_and_round_trips_everything(backend):
    original = memory("e1", MemoryKind.EPISODE, SESSION, "Ünïcode <b>&</b> \"quoted\" 🧳", 1, seq=7,
                      user_ids=["alice", "bob"], memory_ids=["x"])
    assert await backend.write([original]) == 1
    assert await backend.write([original.model_copy(update={"content": "changed"})]) == 0
    [stored] = await backend.get(SESSION, ["e1"])
    assert stored == original


async def test_a_batch_with_known_and_new_ids_writes_only_the_new(backend):
    first = memory("d1", MemoryKind.DIRECTIVE, USER, "short answers", 1)
    assert await backend.write([first]) == 1
    second = memory("d2", MemoryKind.DIRECTIVE, USER, "no emojis", 2)
    assert await backend.write([first, second]) == 1
    assert await backend.count(USER) == 2


async def test_namespaces_are_isolated(backend):
    await backend.write([memory("f1", MemoryKind.FACT, SHARD, "Alice: flight at 9", 1)])
    other = Namespace.shard("a2", "travel")
    assert await backend.get(other, ["f1"]) == []
    assert await backend.count(other) == 0
    assert await backend.recent(other, [MemoryKind.FACT], 10) == []
    assert await backend.get(Namespace.shard("a1", "travel"), ["f1", "missing"]) != []


async def test_recent_is_chronological_oldest_first_and_filters_kinds(backend):
    # Written out of order; equal times are ordered by sequence.
    items = [
        memory("f3", MemoryKind.FACT, SHARD, "third", 5, seq=3),
        memory("f1", MemoryKind.FACT, SHARD, "first", 1, seq=1),
        memory("s1", MemoryKind.SUGGESTION, SHARD, "a suggestion", 2, seq=2),
        memory("f2", MemoryKind.FACT, SHARD, "second", 5, seq=2),
    ]
    assert await backend.write(items) == 4
    assert [m.content for m in await backend.recent(SHARD, [MemoryKind.FACT], 10)] == ["first", "second", "third"]
    assert [m.content for m in await backend.recent(SHARD, [MemoryKind.FACT], 2)] == ["second", "third"]
    assert [m.id for m in await backend.recent(SHARD, [MemoryKind.FACT, MemoryKind.SUGGESTION], 10)] == [
        "f1", "s1", "f2", "f3"]
    assert await backend.recent(SHARD, [MemoryKind.FACT], 0) == []
    assert await backend.count(SHARD, [MemoryKind.FACT]) == 3 and await backend.count(SHARD) == 4


async def test_trim_evicts_the_oldest_and_is_idempotent(backend):
    await backend.write([memory(f"f{i}", MemoryKind.FACT, SHARD, f"fact {i}", i, seq=i) for i in range(5)])
    await backend.write([memory("s1", MemoryKind.SUGGESTION, SHARD, "kept", 0)])
    assert await backend.trim(SHARD, MemoryKind.FACT, 2) == 3
    assert await backend.trim(SHARD, MemoryKind.FACT, 2) == 0
    assert [m.content for m in await backend.recent(SHARD, [MemoryKind.FACT], 10)] == ["fact 3", "fact 4"]
    assert await backend.count(SHARD, [MemoryKind.FACT]) == 2 and await backend.count(SHARD) == 3
    exported = await backend.export(SHARD)
    assert [(m.id, m.evicted) for m in exported if m.kind is MemoryKind.FACT] == [
        ("f0", True), ("f1", True), ("f2", True), ("f3", False), ("f4", False)]
    assert await backend.trim(SHARD, MemoryKind.FACT, 5) == 0  # a larger cap brings nothing back
    assert await backend.trim(SHARD, MemoryKind.FACT, 0) == 2
    assert await backend.count(SHARD, [MemoryKind.FACT]) == 0 and await backend.count(SHARD) == 1


async def test_export_returns_everything_and_an_evicted_memory_stays_evicted_when_copied(backend):
    items = [memory("e1", MemoryKind.EPISODE, SESSION, "what happened", 1, seq=1),
             memory("m1", MemoryKind.MESSAGE, SESSION, "hello", 0, seq=0, role="user"),
             memory("old", MemoryKind.FACT, SHARD, "evicted fact", 0).model_copy(update={"evicted": True})]
    await backend.write(items)
    assert [m.id for m in await backend.export(SESSION)] == ["m1", "e1"]
    [copied] = await backend.export(SHARD)
    assert copied.evicted and await backend.count(SHARD) == 0


async def test_health_reports_ok(backend):
    assert (await backend.health())["ok"] is True
