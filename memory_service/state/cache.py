"""The memory block's caches and their invalidation: where a cached block becomes stale.

A memory block (memory_service/recall/assembler.py) is cached under the *generations* of
everything it read: one counter per namespace it shows (``keyspace.generation``, in
memory_service/state/keyspace.py), and the agent-wide one (``agent_wide``: the agent
namespace's own) for what every block of the agent shows (settings, shards, startup
records, memories found by search in sessions the block does not list). The cache key is a
digest of the block's request and of those generations (``BlockCache.key_for``), so a
write that bumps one generation makes every block that read it miss: nothing has to find
the stale blocks (they expire), and a bump is one INCR however many blocks it invalidates.

Every bump goes through this module, in one of two ways:

- ``BlockCache.bump``, after a write made in Python: the memory tools, an import, the
  retention purge, an erasure, an agent's settings and shards, a deleted startup record;
- atomically with the write, inside the Lua script that makes it, which INCRs the keys its
  caller takes from ``generation_key`` (under the same hash tag as what the script writes,
  memory_service/state/keyspace.py): a recorded message (its session,
  memory_service/state/store.py), a consolidation (its namespace,
  memory_service/state/store.py), a stored startup record (memory_service/recall/startup.py);
- right after the step that made the write, where the generation is on another slot of a
  Redis Cluster: a recorded message's speaker's user namespace (memory_service/state/store.py),
  a formed window's namespaces (its effects, memory_service/formation/window.py).

An erasure or a purge, which must not leave a block showing what it removed even within its
lifetime, also deletes the agent's cached and last good blocks (``purge_agent``): each is
listed in the agent's cache index (``keyspace.cache_index``) as it is written, so no
keyspace scan is needed. An erasure deletes the generations of a session it drops and of
the erased user (memory_service/curation/erasure_state.py, by ``generation_key``).

The *last good* block of an identity (agent, user, session, budget, the caller's users) is
the last complete block made for it, served when every store fails to answer: from Redis
(for a day), or, when Redis fails too, from this process's memory (the latest
LAST_GOOD_IN_PROCESS identities). Both hold a block as the JSON-able dict the cache stores.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, cast

from redis.asyncio import Redis

from memory_service.state import keyspace

# The last complete memory block per identity: in Redis for a day, and the most recent
# ones in this process's memory.
LAST_GOOD_TTL_SECONDS = 86_400
LAST_GOOD_IN_PROCESS = 1_000
PURGE_BATCH = 500  # cached blocks deleted per round trip


def agent_wide(agent_id: str) -> str:
    """The namespace whose generation every block of the agent reads (the agent namespace's)."""
    return f"agent:{agent_id}"


def generation_key(namespace: str) -> str:
    """The key a Lua script INCRs to bump ``namespace``'s generation in the step of its write."""
    return keyspace.generation(namespace)


def identity(agent_id: str, *rest: Any) -> str:
    """A block's identity, for its last good block: the agent first (``forget_agent`` reads it)."""
    return json.dumps([agent_id, *rest])


class BlockCache:
    """Generations, cached blocks and last good blocks; ``redis`` decodes responses."""

    def __init__(self, redis: Redis):
        self.redis = redis
        self._last_good: OrderedDict[str, dict[str, Any]] = OrderedDict()

    # Generations -------------------------------------------------------------------

    async def bump(self, *namespaces: str) -> None:
        """Invalidate every cached block that read one of ``namespaces`` (one round trip)."""
        if namespaces:
            async with self.redis.pipeline(transaction=False) as pipe:
                for ns in namespaces:
                    pipe.incr(generation_key(ns))
                await pipe.execute()

    async def generations(self, namespaces: Sequence[str]) -> list[int]:
        if not namespaces:
            return []
        # One pipeline of GETs, not an MGET: the generations are on several slots of a cluster.
        async with self.redis.pipeline(transaction=False) as pipe:
            for ns in namespaces:
                pipe.get(generation_key(ns))
            return [int(v or 0) for v in await pipe.execute()]

    async def key_for(self, request: Sequence[Any], dependencies: list[str]) -> str:
        """The cache key of the block asked by ``request`` (JSON-able) that reads the
        ``dependencies`` namespaces: a digest of both and of their generations now."""
        generations = await self.generations(dependencies)
        return hashlib.sha256(json.dumps([*request, dependencies, generations]).encode()).hexdigest()

    # Cached blocks -----------------------------------------------------------------

    async def get(self, key: str) -> dict[str, Any] | None:
        raw = await self.redis.get(keyspace.cached_block(key))
        return cast(dict[str, Any], json.loads(raw)) if raw else None

    async def put(self, key: str, identity: str, block: dict[str, Any], ttl_seconds: int, agent_id: str) -> None:
        """Cache a complete ``block`` under ``key`` and keep it as its identity's last good
        one (in Redis for a day, and in this process), both listed among the agent's cached
        blocks (an erasure deletes them), in one round trip."""
        now, index, body = time.time(), keyspace.cache_index(agent_id), json.dumps(block)
        writes = {keyspace.last_good_block(identity): LAST_GOOD_TTL_SECONDS,
                  **({keyspace.cached_block(key): ttl_seconds} if ttl_seconds > 0 else {})}
        async with self.redis.pipeline(transaction=False) as pipe:
            for k, ttl in writes.items():
                pipe.set(k, body, ex=ttl)
            pipe.zadd(index, {k: now + ttl for k, ttl in writes.items()})
            pipe.zremrangebyscore(index, "-inf", now)  # expired blocks leave the list as others arrive
            pipe.expire(index, LAST_GOOD_TTL_SECONDS, gt=True)
            pipe.expire(index, LAST_GOOD_TTL_SECONDS, nx=True)
            await pipe.execute()
        self._last_good[identity] = block
        self._last_good.move_to_end(identity)
        while len(self._last_good) > LAST_GOOD_IN_PROCESS:
            self._last_good.popitem(last=False)

    # Last good blocks --------------------------------------------------------------

    async def last_good(self, identity: str) -> dict[str, Any] | None:
        """The identity's last good block in Redis (the stores failed)."""
        raw = await self.redis.get(keyspace.last_good_block(identity))
        return cast(dict[str, Any], json.loads(raw)) if raw else None

    def last_good_in_process(self, identity: str) -> dict[str, Any] | None:
        """The identity's last good block this process served (Redis failed too)."""
        return self._last_good.get(identity)

    # An agent's blocks all at once ---------------------------------------------------

    async def purge_agent(self, agent_id: str) -> int:
        """Delete every cached and last good block of the agent (any may show what an erasure
        or a purge removes), and invalidate the blocks being assembled meanwhile. How many went."""
        index, deleted = keyspace.cache_index(agent_id), 0
        while keys := await self.redis.zrange(index, 0, PURGE_BATCH - 1):
            # The blocks, then their entries (they are on many slots of a cluster: no
            # transaction): a crash between leaves entries naming gone blocks, deleted again.
            deleted += int(await self.redis.delete(*keys))
            await self.redis.zrem(index, *keys)
        await self.bump(agent_wide(agent_id))
        return deleted + self._forget_agent(agent_id)

    def _forget_agent(self, agent_id: str) -> int:
        """Drop this process's last good blocks of ``agent_id``; how many."""
        keys = [k for k in self._last_good if json.loads(k)[0] == agent_id]
        for k in keys:
            del self._last_good[k]
        return len(keys)
