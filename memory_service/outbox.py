"""A durable outbox in Redis: every write reaches every target store, at least once.

A write (an ``OutboxOp``: memories to store, a FIFO trim, a shard's settings) is recorded
once (``ms:outbox:entries``, id -> the operation as JSON) and queued for each of its
targets (``ms:outbox:<target>``, a list of ids), in one transaction, before any store is
touched. Each target's queue is delivered in order (a trim follows the writes it trims)
and independently: a store that is down keeps its queue, and the others go on. An entry
is dropped once every target has it.
Every operation is idempotent (memories are stored insert-if-absent by id, a trim keeps
the newest N, shard settings are upserted), so a delivery repeated after a crash or by a
second process writes nothing twice. Redis keeps the outbox on disk (the embedded server
runs with appendonly).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter
from redis.asyncio import Redis

from .models import Memory, MemoryKind
from .namespaces import Namespace

if TYPE_CHECKING:
    from .backend import MemoryBackend

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


class WriteOp(BaseModel):
    op: Literal["write"] = "write"
    memories: list[Memory]

    async def apply(self, store: MemoryBackend) -> None:
        await store.write(self.memories)


class TrimOp(BaseModel):
    op: Literal["trim"] = "trim"
    agent_id: str | None = None  # None in entries queued before reads named the agent
    namespace: str
    kind: MemoryKind
    keep: int

    async def apply(self, store: MemoryBackend) -> None:
        namespace = Namespace.parse(self.namespace)
        await store.trim(self.agent_id or namespace.fields[0], namespace, self.kind, self.keep)


class EmbeddingsOp(BaseModel):
    """Embeddings given to stored memories later (the backfill)."""

    op: Literal["embeddings"] = "embeddings"
    agent_id: str
    vectors: dict[str, list[float]]

    async def apply(self, store: MemoryBackend) -> None:
        await store.set_embeddings(self.agent_id, self.vectors)


class DescribeShardOp(BaseModel):
    op: Literal["describe_shard"] = "describe_shard"
    agent_id: str
    shard_id: str
    name: str
    extraction_focus: str
    active: bool

    async def apply(self, store: MemoryBackend) -> None:
        await store.describe_shard(self.agent_id, self.shard_id, self.name, self.extraction_focus, self.active)


OutboxOp = WriteOp | TrimOp | DescribeShardOp | EmbeddingsOp
_OPS: TypeAdapter[OutboxOp] = TypeAdapter(Annotated[OutboxOp, Field(discriminator="op")])


def _op(payload: str) -> OutboxOp:
    data = json.loads(payload)
    if isinstance(data, list):  # an entry written before the outbox carried operations: memories
        data = {"op": "write", "memories": data}
    return _OPS.validate_python(data)


def _queue(target: str) -> str:
    return f"ms:outbox:{target}"


class Outbox:
    def __init__(self, redis: Redis, targets: Sequence[str]):
        self.redis = redis
        self.targets = list(targets)
        self._delivered = redis.register_script(_DELIVERED)

    async def append(self, op: OutboxOp, targets: Sequence[str] | None = None) -> str:
        """Record ``op`` for ``targets`` (default: every target); its entry id."""
        targets = self.targets if targets is None else targets
        if unknown := set(targets) - set(self.targets):
            raise ValueError(f"unknown outbox target(s): {sorted(unknown)}")
        entry_id = uuid.uuid4().hex
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(ENTRIES, entry_id, op.model_dump_json())
            for target in targets:
                pipe.rpush(_queue(target), entry_id)
            await pipe.execute()
        return entry_id

    async def pending(self, target: str, limit: int) -> list[tuple[str, OutboxOp]]:
        """The oldest ``limit`` entries ``target`` has not acknowledged, with their operations."""
        ids = await self.redis.lrange(_queue(target), 0, limit - 1)
        if not ids:
            return []
        payloads = await self.redis.hmget(ENTRIES, ids)
        return [(i, _op(p)) for i, p in zip(ids, payloads) if p]

    async def delivered(self, target: str, entry_id: str) -> None:
        others = [_queue(t) for t in self.targets if t != target]
        await self._delivered(keys=[ENTRIES, _queue(target), *others], args=[entry_id])

    async def depth(self) -> dict[str, int]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for target in self.targets:
                pipe.llen(_queue(target))
            lengths = await pipe.execute()
        return dict(zip(self.targets, map(int, lengths)))
