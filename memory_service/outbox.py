"""A durable outbox in Redis: every write reaches every target store, at least once.

A write is recorded once (``ms:outbox:entries``, id -> the memories as JSON) and queued
for each target (``ms:outbox:<target>``, a list of ids), in one transaction, before any
store is touched. Each target is then delivered to independently: a store that is down
keeps its queue, and the others go on. An entry is dropped once every target has it.
Stores write by memory id, insert-if-absent, so a delivery repeated after a crash or by a
second process writes nothing twice. Redis keeps the outbox on disk (the embedded server
runs with appendonly).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from redis.asyncio import Redis

from .models import Memory

ENTRIES = "ms:outbox:entries"

# Take an entry off one target's queue; forget it once no queue holds it.
_DELIVERED = """
redis.call('LREM', KEYS[2], 1, ARGV[1])
for i = 3, #KEYS do
  if redis.call('LPOS', KEYS[i], ARGV[1]) then return 0 end
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
"""


def _queue(target: str) -> str:
    return f"ms:outbox:{target}"


class Outbox:
    def __init__(self, redis: Redis, targets: Sequence[str]):
        self.redis = redis
        self.targets = list(targets)
        self._delivered = redis.register_script(_DELIVERED)

    async def append(self, memories: Sequence[Memory]) -> str:
        entry_id = uuid.uuid4().hex
        payload = json.dumps([m.model_dump(mode="json") for m in memories], ensure_ascii=False)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(ENTRIES, entry_id, payload)
            for target in self.targets:
                pipe.rpush(_queue(target), entry_id)
            await pipe.execute()
        return entry_id

    async def pending(self, target: str, limit: int) -> list[tuple[str, list[Memory]]]:
        """The oldest ``limit`` entries ``target`` has not acknowledged, with their memories."""
        ids = await self.redis.lrange(_queue(target), 0, limit - 1)
        if not ids:
            return []
        payloads = await self.redis.hmget(ENTRIES, ids)
        return [(i, [Memory.model_validate(m) for m in json.loads(p)]) for i, p in zip(ids, payloads) if p]

    async def delivered(self, target: str, entry_id: str) -> None:
        others = [_queue(t) for t in self.targets if t != target]
        await self._delivered(keys=[ENTRIES, _queue(target), *others], args=[entry_id])

    async def depth(self) -> dict[str, int]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for target in self.targets:
                pipe.llen(_queue(target))
            lengths = await pipe.execute()
        return dict(zip(self.targets, map(int, lengths)))
