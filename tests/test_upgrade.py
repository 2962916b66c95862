"""Keys of the first keyspace (version 1, untagged) move to version 2's names: the upgrade
renames them, splits the single global keys, and the service reads what it moved."""

from __future__ import annotations

from redis.asyncio import Redis

from memory_service.runtime import open_service
from memory_service.state import keyspace, upgrade

from .helpers import msg

# Version 1's keys as the first releases wrote them, and version 2's names of them.
V1 = {
    "ms:s:s1:meta": keyspace.session_keys("s1")["meta"],
    "ms:s:s1:pending": keyspace.session_keys("s1")["pending"],
    "ms:s:{s1}:window": keyspace.window("s1"),
    "ms:agent:a1:user:alice:sessions": keyspace.user_sessions("a1", "alice"),
    "ms:embed:a1:job": keyspace.embed_lock("a1"),
    "ms:startup:a1": keyspace.startup_records("a1"),
    "ms:cons:user:a1:alice:pending": keyspace.cons_pending("user:a1:alice"),
    "ms:gen:session:s1": keyspace.generation("session:s1"),
    "ms:outbox:queue:mongo": keyspace.outbox_queue("mongo"),
    "ms:outbox:mongo": keyspace.outbox_legacy_queue("mongo"),
}


def test_each_version_1_name_has_its_version_2_name():
    for old, new in V1.items():
        assert upgrade.new_name(old) == new, old
    for current in V1.values():  # a second run renames nothing
        assert upgrade.new_name(current) is None, current
    assert upgrade.new_name("ms:agent:a1") is None and upgrade.new_name("ms:key:{k1}") is None


async def test_an_upgraded_store_is_read_by_the_service(settings):
    redis = Redis.from_url(settings.falkordb_url, decode_responses=True)
    try:
        await redis.hset("ms:s:s1:meta", mapping={"agent_id": "a1", "next_seq": 3, "formed_windows": 2})
        await redis.zadd("ms:s:s1:pending", {"m1": 1, "m2": 2})
        await redis.zadd("ms:active", {"s1": 100.0, "s2": 200.0})
        await redis.hset("ms:metrics", mapping={"formations": 5})
        await redis.zadd("ms:retention:deleted", {"a1\x00mem1": 10.0, "a2\x00mem2": 20.0})
        await redis.sadd("ms:agent:a1:user:alice:sessions", "s1")
        await redis.set(keyspace.generation("session:s1"), 7)  # written by the new release already
        await redis.set("ms:gen:session:s1", 3)
        assert await upgrade.stale_layout(redis)

        report = await upgrade.upgrade(redis)
        assert report["renamed"] >= 3 and report["merged"] == 1 and report["split"] == 5
        assert not await upgrade.stale_layout(redis)
        assert await redis.get(keyspace.generation("session:s1")) == "7"  # the newer kept
        assert await redis.zrange(keyspace.retention_deleted("a2"), 0, -1) == ["mem2"]
        assert await upgrade.upgrade(redis) == {"renamed": 0, "merged": 0, "split": 0}  # idempotent
    finally:
        await redis.aclose()
    if settings.redis_url:  # the suite on a cluster: the upgrade runs on a plain Redis only
        return
    async with open_service(settings, run_worker=False) as service:
        counters = await service.state.counters("s1")
        assert (counters.agent_id, counters.pending_messages, counters.formed_windows) == ("a1", 2, 2)
        assert await service.state.active_sessions() == {"s1": 100.0, "s2": 200.0}
        assert (await service.state.metrics())["formations"] == 5
        assert await service.state.user_sessions("a1", "alice") == ["s1"]
        commit = await service.record_message("s1", msg("a1", "alice", "one more", mid="m3"))
        assert commit.sequence == 4  # the ledger went on from the upgraded counters
