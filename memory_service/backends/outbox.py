"""A durable outbox in Redis: every write reaches every target store, at least once.

A write (an ``OutboxOp``: memories to store, a FIFO trim, a shard's settings, embeddings,
an erasure's or a purge's deletions and provenance changes, the memory tools' changes)
is recorded once and queued for each of its targets, in one atomic step (a Lua script),
before any store is touched. Each target's queue is delivered in order (a trim follows
the writes it trims) and independently: a store that is down keeps its queue, and the
others go on. An entry is dropped once every target has it.

Keys (``keyspace.OUTBOX_*`` and ``keyspace.outbox_*``, memory_service/state/keyspace.py;
every operation on them is O(1) or O(log n): nothing scans a queue): the entries (id -> the
operation, JSON) and their reference counts (how many targets still hold each), and per
target a queue (a sorted set, oldest first), the failed deliveries and last error of each
entry (an outage of the store is not a failed delivery), the dead letters (kept with their
operation), the lease of the process delivering the target now, and a list of the first
outbox, adopted on the next drain.

An entry that its store refuses ``max_attempts`` times is a dead letter: taken off the
queue, so that the entries behind it are delivered, and kept (operation, error, attempts)
for an operator to inspect, replay or drop (``memory-service outbox``). A queue longer
than ``alarm_pending`` alarms (log, /health, /metrics); at ``max_pending`` the outbox
refuses new entries (``OutboxFull``, a 503): Redis also holds the state and the job
queue, and a silently dropped mirror write would never be noticed.

Every operation is idempotent (memories are stored insert-if-absent by id, a trim keeps
the newest N, shard settings are upserted), so a delivery repeated after a crash or by a
second process writes nothing twice. One process at a time delivers a target (a lease),
so several API and worker processes do not deliver each entry several times. Redis keeps
the outbox on disk (the embedded server runs with appendonly).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal, cast

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from redis.asyncio import Redis

from memory_service.domain.errors import BackendUnavailable
from memory_service.domain.models import Memory, MemoryKind
from memory_service.domain.namespaces import Namespace
from memory_service.state.keyspace import (
    OUTBOX_ENTRIES,
    OUTBOX_LEGACY_SEQ,
    OUTBOX_METRICS,
    OUTBOX_REFS,
    OUTBOX_SEQ,
    outbox_attempts,
    outbox_dead,
    outbox_errors,
    outbox_legacy_queue,
    outbox_lock,
    outbox_queue,
)

if TYPE_CHECKING:
    from memory_service.backends.base import MemoryBackend

log = logging.getLogger(__name__)

# The outbox's targets: the stores every write of the mirrored backend goes to.
TARGETS = ("graph", "mongo")

# Adopted entries of a first-outbox queue sort before every new one.
LEGACY_BASE = -(10**12)  # Lua formats numbers with 14 significant digits: stay below 10**14
LEGACY_BATCH = 1000


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
    """Embeddings given to stored memories later (the backfill, a re-embed), with the model
    that made them: the process that drains the entry may run another one."""

    op: Literal["embeddings"] = "embeddings"
    agent_id: str
    vectors: dict[str, list[float]]
    model: str | None = None

    async def apply(self, store: MemoryBackend) -> None:
        await store.set_embeddings(self.agent_id, self.vectors, self.model)


class DescribeShardOp(BaseModel):
    op: Literal["describe_shard"] = "describe_shard"
    agent_id: str
    shard_id: str
    name: str
    extraction_focus: str
    active: bool

    async def apply(self, store: MemoryBackend) -> None:
        await store.describe_shard(self.agent_id, self.shard_id, self.name, self.extraction_focus, self.active)


class DeleteOp(BaseModel):
    """Memories removed for good (a user's erasure, memory_service/curation/erasure.py)."""

    op: Literal["delete"] = "delete"
    agent_id: str
    ids: list[str]

    async def apply(self, store: MemoryBackend) -> None:
        await store.delete(self.agent_id, self.ids)


class ProvenanceOp(BaseModel):
    """Stored memories' provenance replaced (an erased user's id taken out of it)."""

    op: Literal["provenance"] = "provenance"
    agent_id: str
    memories: list[Memory]

    async def apply(self, store: MemoryBackend) -> None:
        await store.set_provenance(self.agent_id, self.memories)


class ReplaceOp(BaseModel):
    """Stored memories changed by the memory tools: an update, a soft delete or undelete."""

    op: Literal["replace"] = "replace"
    agent_id: str
    memories: list[Memory]

    async def apply(self, store: MemoryBackend) -> None:
        await store.replace(self.agent_id, self.memories)


OutboxOp = WriteOp | TrimOp | DescribeShardOp | EmbeddingsOp | DeleteOp | ProvenanceOp | ReplaceOp
_OPS: TypeAdapter[OutboxOp] = TypeAdapter(Annotated[OutboxOp, Field(discriminator="op")])


def parse_op(payload: str) -> OutboxOp:
    """The operation of a stored entry; ValueError when it is not one (it can never be delivered)."""
    try:
        data = json.loads(payload)
        if isinstance(data, list):  # an entry written before the outbox carried operations: memories
            data = {"op": "write", "memories": data}
        return _OPS.validate_python(data)
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"not an outbox operation: {exc}") from None


class OutboxFull(BackendUnavailable):
    """A target's queue is at its bound: its store has been down or refusing for long."""


@dataclass(frozen=True, slots=True)
class Pending:
    """An undelivered entry: its operation, or why it has none (a dead letter at once)."""

    entry_id: str
    op: OutboxOp | None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    entry_id: str
    target: str
    dead_at: float
    attempts: int
    error: str
    op: str  # the stored operation, as JSON


# KEYS: entries, refs, seq, queue of each target; ARGV: id, operation, max pending.
# Refuses (returning the 1-based index of the full target) before changing anything.
_APPEND = """
local limit = tonumber(ARGV[3])
for i = 4, #KEYS do
  if redis.call('ZCARD', KEYS[i]) >= limit then return i - 3 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], #KEYS - 3)
local seq = redis.call('INCR', KEYS[3])
for i = 4, #KEYS do redis.call('ZADD', KEYS[i], seq, ARGV[1]) end
return 0
"""

# Take an entry off one of a target's sets (its queue once delivered, its dead letters
# once dropped), if it is still there, and forget the operation once no target holds it.
# KEYS: the set, attempts, errors, refs, entries; ARGV: id.
_FORGET = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('HINCRBY', KEYS[4], ARGV[1], -1) <= 0 then
  redis.call('HDEL', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
end
return 1
"""

# Count a failed delivery; at ARGV[3] attempts (or at once with ARGV[3] = 0) move the entry
# to the dead letters. KEYS: queue, attempts, errors, dead, metrics; ARGV: id, error,
# max attempts, now, metric name. Returns {attempts, 1 if dead-lettered}; {-1, 0} when
# the entry was not queued (delivered or dead-lettered by another process meanwhile).
_FAILED = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {-1, 0} end
local n = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
if n >= tonumber(ARGV[3]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
  redis.call('HINCRBYFLOAT', KEYS[5], ARGV[5], 1)
  return {n, 1}
end
return {n, 0}
"""

# A dead letter back to the end of its queue, its attempts reset. KEYS: dead, queue,
# attempts, seq; ARGV: id.
_REPLAY = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), ARGV[1])
return 1
"""

# Move up to ARGV[1] ids of a first-outbox queue (a list) into the target's queue, ahead
# of every new entry, in their order. KEYS: legacy list, queue, refs, legacy seq.
_ADOPT = """
local ids = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
for _, id in ipairs(ids) do
  local seq = redis.call('INCR', KEYS[4]) + tonumber(ARGV[2])
  if redis.call('ZADD', KEYS[2], 'NX', seq, id) == 1 then redis.call('HINCRBY', KEYS[3], id, 1) end
end
if #ids > 0 then redis.call('LTRIM', KEYS[1], #ids, -1) end
return #ids
"""

# Replace an entry's operation, only if it is still the one read (not delivered and
# forgotten, nor changed, meanwhile). KEYS: entries; ARGV: id, operation read, new one.
_REWRITE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""

REWRITE_SCAN = 200  # entries read per step when rewriting held operations

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Outbox:
    def __init__(self, redis: Redis, targets: Sequence[str], *, max_attempts: int = 5, alarm_pending: int = 10_000,
                 max_pending: int = 100_000):
        self.redis = redis
        self.targets = list(targets)
        self.max_attempts = max_attempts
        self.alarm_pending = alarm_pending
        self.max_pending = max_pending
        self._append = redis.register_script(_APPEND)
        self._forget = redis.register_script(_FORGET)
        self._failed = redis.register_script(_FAILED)
        self._replay = redis.register_script(_REPLAY)
        self._adopt = redis.register_script(_ADOPT)
        self._release = redis.register_script(_RELEASE)
        self._rewrite = redis.register_script(_REWRITE)

    async def append(self, op: OutboxOp, targets: Sequence[str] | None = None) -> str:
        """Record ``op`` for ``targets`` (default: every target); its entry id.

        Raises OutboxFull, recording nothing, when a target's queue is at ``max_pending``.
        """
        targets = self.targets if targets is None else list(targets)
        if unknown := set(targets) - set(self.targets):
            raise ValueError(f"unknown outbox target(s): {sorted(unknown)}")
        if not targets:
            raise ValueError("an outbox entry needs at least one target")
        entry_id = uuid.uuid4().hex
        full = await self._append(keys=[OUTBOX_ENTRIES, OUTBOX_REFS, OUTBOX_SEQ, *map(outbox_queue, targets)],
                                  args=[entry_id, op.model_dump_json(), self.max_pending])
        if full:
            target = targets[int(full) - 1]
            log.error("outbox: %d writes for %s wait undelivered (OUTBOX_MAX_PENDING); refusing new writes until it "
                      "drains", self.max_pending, target)
            raise OutboxFull(f"{self.max_pending} writes wait undelivered for the {target} store; "
                             "no more are accepted until it is back and catches up")
        return entry_id

    async def pending(self, target: str, limit: int) -> list[Pending]:
        """The oldest ``limit`` entries ``target`` has not acknowledged, oldest first."""
        await self._adopt_first_outbox(target)
        # The client decodes responses (redis_client's default): ids are str.
        ids = cast(list[str], await self.redis.zrange(outbox_queue(target), 0, limit - 1))
        if not ids:
            return []
        payloads = cast(list[str | None], await self.redis.hmget(OUTBOX_ENTRIES, ids))
        out = []
        for entry_id, payload in zip(ids, payloads):
            if payload is None:
                out.append(Pending(entry_id, None, "the entry's operation is missing"))
                continue
            try:
                out.append(Pending(entry_id, parse_op(payload)))
            except ValueError as exc:
                out.append(Pending(entry_id, None, str(exc)))
        return out

    async def _adopt_first_outbox(self, target: str) -> None:
        while await self._adopt(keys=[outbox_legacy_queue(target), outbox_queue(target), OUTBOX_REFS, OUTBOX_LEGACY_SEQ],
                                args=[LEGACY_BATCH, LEGACY_BASE]) == LEGACY_BATCH:
            pass

    async def delivered(self, target: str, entry_id: str) -> None:
        await self._forget(keys=[outbox_queue(target), outbox_attempts(target), outbox_errors(target), OUTBOX_REFS,
                                 OUTBOX_ENTRIES], args=[entry_id])

    async def failed(self, target: str, entry_id: str, error: str, *, hopeless: bool = False) -> tuple[int, bool]:
        """Count a failed delivery of ``entry_id`` to ``target``; (attempts, dead-lettered).

        ``hopeless``: no attempt can succeed (the entry is unreadable): dead-letter it now.
        """
        attempts, dead = await self._failed(
            keys=[outbox_queue(target), outbox_attempts(target), outbox_errors(target), outbox_dead(target), OUTBOX_METRICS],
            args=[entry_id, error[:2000], 0 if hopeless else self.max_attempts, f"{time.time():.3f}",
                  f"outbox_dead_lettered_{target}"])
        if dead:
            log.error("outbox: entry %s dead-lettered for %s after %d failed deliveries: %s", entry_id, target,
                      attempts, error)
        return int(attempts), bool(dead)

    # Several processes drain: one at a time delivers a target, in order.

    async def lease(self, target: str, seconds: float) -> str | None:
        token = uuid.uuid4().hex
        return token if await self.redis.set(outbox_lock(target), token, nx=True, px=max(1, int(seconds * 1000))) else None

    async def release(self, target: str, token: str) -> None:
        await self._release(keys=[outbox_lock(target)], args=[token])

    # For /health, /metrics and the operator -------------------------------------------------

    async def depth(self) -> dict[str, int]:
        """Undelivered entries per target (a first-outbox queue not adopted yet included)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for target in self.targets:
                pipe.zcard(outbox_queue(target))
                pipe.llen(outbox_legacy_queue(target))
            counts = await pipe.execute()
        return {t: int(counts[2 * i]) + int(counts[2 * i + 1]) for i, t in enumerate(self.targets)}

    async def dead_letter_counts(self) -> dict[str, int]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for target in self.targets:
                pipe.zcard(outbox_dead(target))
            counts = await pipe.execute()
        return dict(zip(self.targets, map(int, counts)))

    def alarms(self, depth: dict[str, int], dead: dict[str, int]) -> list[str]:
        """What an operator must look at, one sentence each (empty: nothing)."""
        out = []
        for target in self.targets:
            if depth.get(target, 0) >= self.alarm_pending:
                refusing = " and refuses new writes" if depth[target] >= self.max_pending else ""
                out.append(f"{depth[target]} writes wait undelivered for {target}{refusing} "
                           f"(alarm at {self.alarm_pending}, refused at {self.max_pending})")
            if dead.get(target, 0):
                out.append(f"{dead[target]} dead letter(s) for {target}: `memory-service outbox dead --target {target}`")
        return out

    async def dead_letters(self, target: str, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` dead letters of ``target``, with their error and operation."""
        self._check(target)
        rows = cast(list[tuple[str, float]], await self.redis.zrange(outbox_dead(target), 0, limit - 1, withscores=True))
        if not rows:
            return []
        ids = [entry_id for entry_id, _ in rows]
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(outbox_attempts(target), ids)
            pipe.hmget(outbox_errors(target), ids)
            pipe.hmget(OUTBOX_ENTRIES, ids)
            attempts, errors, ops = await pipe.execute()
        return [DeadLetter(i, target, at, int(n or 0), e or "", op or "")
                for (i, at), n, e, op in zip(rows, attempts, errors, ops)]

    async def replay(self, target: str, entry_ids: Sequence[str]) -> int:
        """Queue dead letters for ``target`` again (at the end, attempts reset); how many were."""
        self._check(target)
        keys = [outbox_dead(target), outbox_queue(target), outbox_attempts(target), OUTBOX_SEQ]
        return sum([int(await self._replay(keys=keys, args=[i])) for i in entry_ids])

    async def drop(self, target: str, entry_ids: Sequence[str]) -> int:
        """Give dead letters up for ``target`` (the operation is deleted once no target holds it)."""
        self._check(target)
        keys = [outbox_dead(target), outbox_attempts(target), outbox_errors(target), OUTBOX_REFS, OUTBOX_ENTRIES]
        return sum([int(await self._forget(keys=keys, args=[i])) for i in entry_ids])

    async def rewrite(self, edit: Callable[[OutboxOp], OutboxOp | None]) -> int:
        """Replace every held operation (queued for a target, or a dead letter) that
        ``edit`` changes (None: unchanged); how many were replaced.

        For erasure: data held here must not reach a store after it was erased there, nor
        outlive the erasure in Redis. Reads every held entry, in steps of REWRITE_SCAN: the
        cost is the outbox's depth, which is near zero while the stores are up and bounded
        by ``max_pending`` per target. An entry delivered meanwhile is left alone.
        """
        changed, cursor = 0, 0
        while True:
            cursor, rows = await self.redis.hscan(OUTBOX_ENTRIES, cursor, count=REWRITE_SCAN)
            for entry_id, payload in cast(dict[str, str], rows).items():  # a decoding client: text
                try:
                    op = parse_op(payload)
                except ValueError:
                    continue  # a dead letter already: it is never delivered
                if (new := edit(op)) is not None:
                    changed += int(await self._rewrite(keys=[OUTBOX_ENTRIES], args=[entry_id, payload, new.model_dump_json()]))
            if not cursor:
                return changed

    def _check(self, target: str) -> None:
        if target not in self.targets:
            raise ValueError(f"unknown outbox target {target!r}; targets: {', '.join(self.targets)}")
