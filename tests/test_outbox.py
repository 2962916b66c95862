"""The outbox's bookkeeping on a real Redis (the shared embedded store): queues in order,
entries forgotten once every target has them, dead letters, the bound, the delivery
lease, and queues of the first outbox (lists) adopted ahead of new entries.

Delivery to real stores, outages and dead letters end to end: tests/test_mongo.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memory_service.backends.outbox import Outbox, OutboxFull, TrimOp, WriteOp
from memory_service.domain.models import Memory, MemoryKind, Provenance
from memory_service.domain.namespaces import Namespace
from memory_service.state import keyspace
from memory_service.state.keyspace import OUTBOX_ENTRIES, OUTBOX_REFS

from .conftest import clean_env, state_redis
from .helpers import T0

CLI = str(Path(sys.executable).parent / "memory-service")


@pytest.fixture
async def redis(settings):
    client = state_redis(settings.falkordb_url, decode_responses=True)  # the cluster, on one
    yield client
    await client.aclose()


def write(i: int) -> WriteOp:
    memory = Memory(id=f"m{i}", kind=MemoryKind.MESSAGE, namespace=str(Namespace.session("s1")), content=f"text {i}",
                    metadata=Provenance(agent_id="a1", session_id="s1"), valid_at=T0)
    return WriteOp(memories=[memory])


async def ids(outbox: Outbox, target: str) -> list[str]:
    return [p.entry_id for p in await outbox.pending(target, 100)]


async def test_each_target_is_delivered_in_order_and_an_entry_is_forgotten_once_all_have_it(redis):
    outbox = Outbox(redis, ["graph", "mongo"])
    first = await outbox.append(write(1))
    trim = await outbox.append(TrimOp(agent_id="a1", namespace="session:s1", kind=MemoryKind.MESSAGE, keep=1), ["mongo"])
    second = await outbox.append(write(2))
    assert await ids(outbox, "graph") == [first, second]
    assert await ids(outbox, "mongo") == [first, trim, second]
    [pending] = (await outbox.pending("mongo", 1))
    assert pending.op == write(1)
    await outbox.delivered("graph", first)
    await outbox.delivered("graph", first)  # again (a second process): nothing more happens
    assert await redis.hexists(OUTBOX_ENTRIES, first) and int(await redis.hget(OUTBOX_REFS, first)) == 1
    await outbox.delivered("mongo", first)
    assert not await redis.hexists(OUTBOX_ENTRIES, first) and not await redis.hexists(OUTBOX_REFS, first)
    assert await outbox.depth() == {"graph": 1, "mongo": 2}
    with pytest.raises(ValueError, match="unknown outbox target"):
        await outbox.append(write(3), ["cassandra"])
    with pytest.raises(ValueError, match="at least one target"):
        await outbox.append(write(3), [])


async def test_a_failing_entry_is_dead_lettered_after_its_attempts_and_can_be_replayed_or_dropped(redis):
    outbox = Outbox(redis, ["graph", "mongo"], max_attempts=2)
    bad, good = await outbox.append(write(1)), await outbox.append(write(2))
    assert await outbox.failed("mongo", bad, "ValueError: refused") == (1, False)
    assert await ids(outbox, "mongo") == [bad, good]  # still first in line
    assert await outbox.failed("mongo", bad, "ValueError: refused again") == (2, True)
    assert await ids(outbox, "mongo") == [good] and await ids(outbox, "graph") == [bad, good]
    [dead] = await outbox.dead_letters("mongo")
    assert (dead.entry_id, dead.attempts, dead.error) == (bad, 2, "ValueError: refused again")
    assert json.loads(dead.op)["memories"][0]["id"] == "m1"
    assert await outbox.dead_letter_counts() == {"graph": 0, "mongo": 1}
    assert await outbox.failed("mongo", bad, "late") == (-1, False)  # no longer queued: nothing counted
    assert float(await redis.hget(keyspace.OUTBOX_METRICS, "outbox_dead_lettered_mongo")) == 1

    assert await outbox.replay("mongo", [bad]) == 1
    assert await ids(outbox, "mongo") == [good, bad]  # at the end, attempts reset
    assert await outbox.failed("mongo", bad, "once more") == (1, False)
    await outbox.failed("mongo", bad, "and again")
    assert await outbox.replay("mongo", ["unknown"]) == 0
    await outbox.delivered("graph", bad)
    assert await outbox.drop("mongo", [bad]) == 1  # the last target holding it: its operation goes
    assert not await redis.hexists(OUTBOX_ENTRIES, bad) and await outbox.dead_letters("mongo") == []
    with pytest.raises(ValueError, match="unknown outbox target 'x'"):
        await outbox.replay("x", [bad])


async def test_an_unreadable_entry_is_reported_and_dead_lettered_at_once(redis):
    outbox = Outbox(redis, ["mongo"], max_attempts=5)
    entry = await outbox.append(write(1))
    await redis.hset(OUTBOX_ENTRIES, entry, '{"op": "teleport"}')
    [pending] = await outbox.pending("mongo", 10)
    assert pending.op is None and "not an outbox operation" in pending.problem
    assert await outbox.failed("mongo", entry, pending.problem, hopeless=True) == (1, True)
    assert await outbox.depth() == {"mongo": 0}


async def test_a_full_queue_refuses_new_entries_and_records_nothing(redis):
    outbox = Outbox(redis, ["graph", "mongo"], alarm_pending=1, max_pending=2)
    first = await outbox.append(write(1), ["mongo"])
    await outbox.append(write(2))
    assert outbox.alarms(await outbox.depth(), await outbox.dead_letter_counts()) == [
        "1 writes wait undelivered for graph (alarm at 1, refused at 2)",
        "2 writes wait undelivered for mongo and refuses new writes (alarm at 1, refused at 2)",
    ]
    entries = await redis.hlen(OUTBOX_ENTRIES)
    with pytest.raises(OutboxFull, match="2 writes wait undelivered for the mongo store"):
        await outbox.append(write(3))
    assert await redis.hlen(OUTBOX_ENTRIES) == entries and await outbox.depth() == {"graph": 1, "mongo": 2}
    assert await outbox.append(write(3), ["graph"])  # the graph's queue had room
    await outbox.delivered("mongo", first)
    assert await outbox.append(write(4), ["mongo"])  # delivered: room again


async def test_one_process_at_a_time_holds_a_targets_delivery_lease(redis):
    outbox = Outbox(redis, ["mongo"])
    token = await outbox.lease("mongo", 30)
    assert token and await outbox.lease("mongo", 30) is None
    await outbox.release("mongo", "someone else's")
    assert await outbox.lease("mongo", 30) is None
    await outbox.release("mongo", token)
    assert await outbox.lease("mongo", 30)


async def test_queues_of_the_first_outbox_are_adopted_ahead_of_new_entries(redis):
    outbox = Outbox(redis, ["graph", "mongo"])
    new = await outbox.append(write(9))
    for i in (1, 2):  # as the first outbox queued them: the operation, and the id on a list
        await redis.hset(OUTBOX_ENTRIES, f"old{i}", write(i).model_dump_json())
        await redis.rpush(keyspace.outbox_legacy_queue("mongo"), f"old{i}")
    assert await outbox.depth() == {"graph": 1, "mongo": 3}
    assert await ids(outbox, "mongo") == ["old1", "old2", new]
    assert not await redis.exists(keyspace.outbox_legacy_queue("mongo"))
    await outbox.delivered("mongo", "old1")
    assert not await redis.hexists(OUTBOX_ENTRIES, "old1")  # its only target had it


def cli(settings, *args: str) -> subprocess.CompletedProcess:
    env = {**clean_env(), "FALKORDB_URL": settings.falkordb_url, "COLUMNS": "200",
           **({"REDIS_URL": settings.redis_url} if settings.redis_url else {})}  # the cluster, on one
    return subprocess.run([CLI, "outbox", *args], capture_output=True, text=True, timeout=120, env=env)


async def test_the_outbox_command_lists_replays_and_drops_dead_letters(settings, redis):
    outbox = Outbox(redis, ["graph", "mongo"], max_attempts=1)
    first, second = await outbox.append(write(1), ["mongo"]), await outbox.append(write(2), ["mongo"])
    for entry in (first, second):
        await outbox.failed("mongo", entry, f"ValueError: {entry} refused")

    listed = cli(settings, "dead", "--target", "mongo", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]  # oldest first; the same millisecond: any order
    assert sorted((r["id"], r["attempts"], r["error"], r["op"]["op"]) for r in rows) == sorted([
        (first, 1, f"ValueError: {first} refused", "write"), (second, 1, f"ValueError: {second} refused", "write")])
    table = cli(settings, "dead", "--target", "mongo")
    assert table.returncode == 0 and first in table.stdout and "2 shown" in table.stdout

    replayed = cli(settings, "replay", "--target", "mongo", "--id", first)
    assert replayed.returncode == 0 and "1 dead letter(s) queued again for mongo" in replayed.stdout
    assert await ids(outbox, "mongo") == [first]
    dropped = cli(settings, "drop", "--target", "mongo", "--all")
    assert dropped.returncode == 0 and "1 dead letter(s) dropped for mongo" in dropped.stdout
    assert await outbox.dead_letter_counts() == {"graph": 0, "mongo": 0} and not await redis.hexists(OUTBOX_ENTRIES, second)

    unnamed = cli(settings, "replay", "--target", "mongo")
    assert unnamed.returncode == 2 and "name dead letters with --id, or give --all" in unnamed.stdout
    unknown = cli(settings, "dead", "--target", "cassandra")
    assert unknown.returncode == 2 and "unknown target 'cassandra'" in unknown.stdout
