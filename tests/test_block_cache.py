"""The memory block's cache (memory_service/state/cache.py) on a real Redis: a lookup reads
the generations and the cached entry in one round trip, serves an entry only under the
generations it was made with, and a block is stored after it is answered."""

import json
import logging

from memory_service.backends.embedded import EmbeddedFalkorDB
from memory_service.runtime import open_service
from memory_service.state import keyspace
from memory_service.state.cache import BlockCache, generation_key, identity

from .conftest import state_redis
from .helpers import record_all

REQUEST = ["a1", "alice", "s1", 4000, None]
DEPENDENCIES = ["agent:a1", "session:s1"]
IDENTITY = identity("a1", "alice", "s1", 4000, None)
BLOCK = {"xml": "<MemoryContext/>", "chars": 16}
CHAT = [("alice", "user", "I prefer window seats on every flight."),
        ("alice", "assistant", "Noted, window seats it is.")]


async def test_an_entry_is_served_only_under_the_generations_it_was_made_with(settings):
    redis = state_redis(settings.falkordb_url, decode_responses=True)
    cache = BlockCache(redis)
    try:
        missed = await cache.lookup(REQUEST, DEPENDENCIES)
        assert missed.block is None and missed.generations == [0, 0]
        await cache.put(missed, IDENTITY, BLOCK, 60, "a1")
        assert (await cache.lookup(REQUEST, DEPENDENCIES)).block == BLOCK
        # Another request, or the same one reading other namespaces: another key.
        assert (await cache.lookup([*REQUEST[:-1], "a query"], DEPENDENCIES)).block is None
        assert (await cache.lookup(REQUEST, DEPENDENCIES[:1])).block is None
        await cache.bump("session:s1")  # a write to what the block read
        stale = await cache.lookup(REQUEST, DEPENDENCIES)
        assert stale.block is None and stale.key == missed.key and stale.generations == [0, 1]
        await cache.put(stale, IDENTITY, {**BLOCK, "chars": 17}, 60, "a1")
        assert (await cache.lookup(REQUEST, DEPENDENCIES)).block == {**BLOCK, "chars": 17}
    finally:
        await redis.aclose()


async def test_an_entry_of_the_earlier_format_is_a_miss(settings):
    """Before, the key held the generations and the entry was the block alone: a process of
    the earlier version may still write one during a rolling upgrade."""
    redis = state_redis(settings.falkordb_url, decode_responses=True)
    cache = BlockCache(redis)
    try:
        key = (await cache.lookup(REQUEST, DEPENDENCIES)).key
        for entry in (BLOCK, {"a": 1, "b": 2}, [[0], BLOCK], "nonsense"):
            await redis.set(keyspace.cached_block(key), json.dumps(entry), ex=60)
            assert (await cache.lookup(REQUEST, DEPENDENCIES)).block is None, entry
    finally:
        await redis.aclose()


async def test_a_block_kept_is_served_at_once_then_stored(settings):
    """Served by the next lookup whether its write has reached Redis yet or not (the write
    runs in the background: which one wins the race is not fixed)."""
    redis = state_redis(settings.falkordb_url, decode_responses=True)
    cache = BlockCache(redis)
    try:
        found = await cache.lookup(REQUEST, DEPENDENCIES)
        cache.keep(found, IDENTITY, BLOCK, 60, "a1", timeout=5)
        assert (await cache.lookup(REQUEST, DEPENDENCIES)).block == BLOCK
        await cache.flush()
        assert json.loads(await redis.get(keyspace.cached_block(found.key))) == [[0, 0], BLOCK]
        # With the cache disabled (a TTL of 0) a block kept is never served, not even at once.
        other = await cache.lookup([*REQUEST[:-1], "another"], DEPENDENCIES)
        cache.keep(other, IDENTITY, BLOCK, 0, "a1", timeout=5)
        assert (await cache.lookup([*REQUEST[:-1], "another"], DEPENDENCIES)).block is None
        await cache.flush()
        assert json.loads(await redis.get(keyspace.last_good_block(IDENTITY))) == BLOCK
        # Held in the process no longer: a bump makes it a miss, as in Redis.
        await redis.incr(generation_key("agent:a1"))
        assert (await cache.lookup(REQUEST, DEPENDENCIES)).block is None
    finally:
        await redis.aclose()


async def test_a_block_whose_caching_fails_is_answered_and_kept_as_last_good(settings, tmp_path, caplog):
    """The state store stops between the answer and its write: the write is logged, never
    raised; the block stays this process's last good one, served while the store is down."""
    state = EmbeddedFalkorDB(tmp_path / "state-only")
    url = state.start()
    try:
        settings = settings.model_copy(update={"redis_url": url, "context_deadline_seconds": 0.5})
        async with open_service(settings, run_worker=False) as service:
            await record_all(service, "k1", "a1", CHAT)
            answered = await service.assemble_memory_context("a1", "alice", "k1")
            assert answered.source == "graph" and "window seats" in answered.xml
            state.stop()  # before the block's write has run
            with caplog.at_level(logging.WARNING):
                await service.state.cache.flush()
            assert any("caching a block of agent a1 failed" in r.getMessage() for r in caplog.records)
            again = await service.assemble_memory_context("a1", "alice", "k1")
            assert again.source == "last-good" and again.xml == answered.xml
    finally:
        state.stop()


async def test_a_block_read_before_a_purge_and_written_after_it_does_not_outlive_it(settings):
    """An erasure purges the agent's blocks while a block read before it is on its way to
    Redis: the write that lands after the purge deletes itself (neither the cached block nor
    its last good copy, in Redis or in this process, may show what the erasure removed)."""
    redis = state_redis(settings.falkordb_url, decode_responses=True)
    cache = BlockCache(redis)
    try:
        found = await cache.lookup(REQUEST, DEPENDENCIES)
        cache.keep(found, IDENTITY, BLOCK, 60, "a1", timeout=5)
        await cache.purge_agent("a1")  # runs before the write (which waits for this task to yield)
        await cache.flush()
        assert not await redis.exists(keyspace.cached_block(found.key), keyspace.last_good_block(IDENTITY))
        assert await redis.zcard(keyspace.cache_index("a1")) == 0
        assert cache.last_good_in_process(IDENTITY) is None
        assert (await cache.lookup(REQUEST, DEPENDENCIES)).block is None
        # A block read after the purge is cached as usual.
        again = await cache.lookup(REQUEST, DEPENDENCIES)
        await cache.put(again, IDENTITY, BLOCK, 60, "a1")
        assert (await cache.lookup(REQUEST, DEPENDENCIES)).block == BLOCK
        assert await redis.exists(keyspace.last_good_block(IDENTITY))
    finally:
        await redis.aclose()


async def test_with_the_cache_disabled_a_block_is_never_served_from_it(settings):
    """CONTEXT_CACHE_TTL_SECONDS=0: every block is assembled again, even right after the
    same one (none is held in the process on its way to Redis); the last good one is kept."""
    settings = settings.model_copy(update={"context_cache_ttl_seconds": 0})
    async with open_service(settings, run_worker=False) as service:
        await record_all(service, "k2", "a1", CHAT)
        first = await service.assemble_memory_context("a1", "alice", "k2")
        again = await service.assemble_memory_context("a1", "alice", "k2")
        assert first.source == again.source == "graph" and again.xml == first.xml
        await service.state.cache.flush()
        redis = state_redis(settings.falkordb_url, decode_responses=True)
        try:
            assert not [k async for k in redis.scan_iter("ms:ctx:*") if not k.startswith("ms:ctx:last:")]
            assert await redis.exists(keyspace.last_good_block(identity("a1", "alice", "k2", first.budget, None)))
        finally:
            await redis.aclose()
