"""The memory block's caches and their invalidation: where a cached block becomes stale.

A memory block (memory_service/recall/assembler.py) is cached with the *generations* of
everything it read: one counter per namespace it shows (``keyspace.generation``, in
memory_service/state/keyspace.py), and the agent-wide one (``agent_wide``: the agent
namespace's own) for what every block of the agent shows (settings, shards, startup
records, memories found by search in sessions the block does not list). The cache key is a
digest of the block's request and of the namespaces it reads; the cached entry holds the
generations it was made under, and ``BlockCache.lookup`` reads it and the generations now
in one round trip: a write that bumps one generation makes every block that read it miss,
nothing has to find the stale blocks (they expire, or the next block of the same request
replaces them), and a bump is one INCR however many blocks it invalidates.

A block is stored after it is answered (``BlockCache.keep``: the prompt does not wait for
the write); until it is stored, this process serves it from memory to the same lookup.

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

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis

from memory_service.state import keyspace

# The last complete memory block per identity: in Redis for a day, and the most recent
# ones in this process's memory.
LAST_GOOD_TTL_SECONDS = 86_400
LAST_GOOD_IN_PROCESS = 1_000
PURGE_BATCH = 500  # cached blocks deleted per round trip

log = logging.getLogger(__name__)


def agent_wide(agent_id: str) -> str:
    """The namespace whose generation every block of the agent reads (the agent namespace's)."""
    return f"agent:{agent_id}"


def generation_key(namespace: str) -> str:
    """The key a Lua script INCRs to bump ``namespace``'s generation in the step of its write."""
    return keyspace.generation(namespace)


def identity(agent_id: str, *rest: Any) -> str:
    """A block's identity, for its last good block: the agent first (``forget_agent`` reads it)."""
    return json.dumps([agent_id, *rest])


@dataclass(frozen=True)
class Lookup:
    """A block's cache key, the namespaces it reads and their generations now, and the block
    cached under both (None: a miss)."""

    key: str
    dependencies: list[str]
    generations: list[int]
    block: dict[str, Any] | None


class BlockCache:
    """Generations, cached blocks and last good blocks; ``redis`` decodes responses."""

    def __init__(self, redis: Redis):
        self.redis = redis
        self._last_good: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # Blocks answered and on their way to Redis: (generations, block) by key.
        self._storing: dict[str, tuple[list[int], dict[str, Any]]] = {}
        self._writes: set[asyncio.Task[None]] = set()

    # Generations -------------------------------------------------------------------

    async def bump(self, *namespaces: str) -> None:
        """Invalidate every cached block that read one of ``namespaces`` (one round trip)."""
        if namespaces:
            async with self.redis.pipeline(transaction=False) as pipe:
                for ns in namespaces:
                    pipe.incr(generation_key(ns))
                await pipe.execute()

    async def lookup(self, request: Sequence[Any], dependencies: list[str]) -> Lookup:
        """The block asked by ``request`` (JSON-able) that reads the ``dependencies``
        namespaces, if one is cached under their generations now: the generations and the
        cached entry in one round trip (a pipeline: they are on several slots of a cluster)."""
        key = hashlib.sha256(json.dumps([*request, dependencies]).encode()).hexdigest()
        async with self.redis.pipeline(transaction=False) as pipe:
            for ns in dependencies:
                pipe.get(generation_key(ns))
            pipe.get(keyspace.cached_block(key))
            *found, raw = await pipe.execute()
        generations = [int(v or 0) for v in found]
        # [generations then, block]: this process's block on its way to Redis, else Redis's.
        for entry in (self._storing.get(key), json.loads(raw) if raw else None):
            if isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] == generations:
                return Lookup(key, list(dependencies), generations, entry[1])
        return Lookup(key, list(dependencies), generations, None)

    # Cached blocks -----------------------------------------------------------------

    def keep(self, found: Lookup, identity: str, block: dict[str, Any], ttl_seconds: int, agent_id: str,
             timeout: float) -> None:
        """``put`` in the background (the caller answers meanwhile); with a cache (a positive
        ``ttl_seconds``) this process serves the block to the same lookup until it is
        stored. A failed write is logged: the block was answered, only its caching failed."""
        if ttl_seconds > 0:
            self._storing[found.key] = (found.generations, block)
        self._last_good_here(identity, block)

        async def store() -> None:
            try:
                async with asyncio.timeout(timeout):
                    await self.put(found, identity, block, ttl_seconds, agent_id)
            except Exception as exc:
                log.warning("memory context: caching a block of agent %s failed: %s", agent_id,
                            f"no answer within {timeout:g}s" if isinstance(exc, TimeoutError) else exc)
            finally:
                if (held := self._storing.get(found.key)) is not None and held[1] is block:
                    del self._storing[found.key]

        write = asyncio.create_task(store())
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)

    async def flush(self) -> None:
        """Let the blocks already answered reach Redis."""
        await asyncio.gather(*self._writes, return_exceptions=True)

    async def put(self, found: Lookup, identity: str, block: dict[str, Any], ttl_seconds: int, agent_id: str) -> None:
        """Cache a complete ``block`` under its lookup's key and generations, and keep it as its
        identity's last good one in Redis (for a day), both listed among the agent's cached
        blocks (an erasure deletes them), in one round trip.

        Then, when the block read the agent-wide generation, it is read again: a purge of the
        agent's blocks (an erasure) that ran since the block's reads bumped it, and what this
        wrote is deleted again (``purge_agent`` says why that closes the race)."""
        now, index = time.time(), keyspace.cache_index(agent_id)
        writes = {keyspace.last_good_block(identity): (json.dumps(block), LAST_GOOD_TTL_SECONDS),
                  **({keyspace.cached_block(found.key): (json.dumps([found.generations, block]), ttl_seconds)}
                     if ttl_seconds > 0 else {})}
        async with self.redis.pipeline(transaction=False) as pipe:
            for k, (body, ttl) in writes.items():
                pipe.set(k, body, ex=ttl)
            pipe.zadd(index, {k: now + ttl for k, (_, ttl) in writes.items()})
            pipe.zremrangebyscore(index, "-inf", now)  # expired blocks leave the list as others arrive
            pipe.expire(index, LAST_GOOD_TTL_SECONDS, gt=True)
            pipe.expire(index, LAST_GOOD_TTL_SECONDS, nx=True)
            await pipe.execute()
        wide = agent_wide(agent_id)
        if wide in found.dependencies:
            then = found.generations[found.dependencies.index(wide)]
            if int(await self.redis.get(generation_key(wide)) or 0) != then:
                await self.redis.delete(*writes)
                await self.redis.zrem(index, *writes)
                if self._last_good.get(identity) is block:
                    del self._last_good[identity]

    def _last_good_here(self, identity: str, block: dict[str, Any]) -> None:
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
        or a purge removes), and invalidate the blocks being assembled meanwhile. How many went.

        The blocks listed, then a bump of the agent-wide generation, then the blocks listed
        since: a block whose reads came before the bump and whose write lands during the purge
        is either listed by the second pass (its write came before that pass read the list)
        or written after the bump, which ``put``'s check after its write sees (it deletes
        what it wrote). No block read before the purge outlives it."""
        deleted = await self._delete_listed(agent_id)
        await self.bump(agent_wide(agent_id))  # blocks being stored meanwhile are served no more
        deleted += await self._delete_listed(agent_id)
        return deleted + self._forget_agent(agent_id)

    async def _delete_listed(self, agent_id: str) -> int:
        index, deleted = keyspace.cache_index(agent_id), 0
        while keys := await self.redis.zrange(index, 0, PURGE_BATCH - 1):
            # The blocks, then their entries (they are on many slots of a cluster: no
            # transaction): a crash between leaves entries naming gone blocks, deleted again.
            deleted += int(await self.redis.delete(*keys))
            await self.redis.zrem(index, *keys)
        return deleted

    def _forget_agent(self, agent_id: str) -> int:
        """Drop this process's last good blocks of ``agent_id``; how many."""
        keys = [k for k in self._last_good if json.loads(k)[0] == agent_id]
        for k in keys:
            del self._last_good[k]
        return len(keys)
