"""A formation window's life: a state machine persisted in Redis, advanced by compare-and-set.

::

    claim ─▶ claimed ─extract─▶ extracted ─write─▶ written ─complete─▶ completed ─post-process─▶ (gone)

One hash per session holds the window being formed (``keyspace.window``; under the
session's hash tag, with its counters and its bucket's shards of the active set and the
metrics, so that every transition is one script on one slot of a Redis Cluster):

- ``claimed``: a snapshot of the session's pending messages (``ids``). Formation reads
  exactly those, however often it is retried; messages recorded later belong to the
  next window.
- ``extracted``: the memories extracted from them (``extraction``, JSON, with their ids),
  stored BEFORE anything is written. A retry never calls the extractor again, so two
  extractions (an LLM answers differently each time) can never be mixed in the store.
- ``written``: the backend holds those memories (``written``: how many were new).
- ``completed``: the session's counters moved on, in one atomic step: the messages left
  the pending set, the cursor advanced, the metrics counted the formation, and the window
  recorded its effects elsewhere (``effects``: memories to queue for consolidation,
  generations to bump; those keys are on other slots). ``apply_effects`` then applies them
  and marks the window ``applied``; a crash between the two applies them again: a
  generation bumped twice is only an extra cache miss, and consolidation reads its queue
  without duplicates (memory_service/formation/consolidation.py).
- gone: the post-completion work (FIFO trims, consolidation triggers) ran; the hash is
  deleted and the session may claim its next window.

A session holding a window is in its bucket's index of held windows (``keyspace.windows``)
from the claim until the window is gone; the worker's ``recover_windows`` cron enqueues the
job of each window held longer than a minute again (a no-op while its job is queued or
running), so a window whose job was lost (a crash between its claim and its enqueue) is
formed without waiting for a message, a sweep or ``POST /form``.

Every transition names the window number and the state it expects, so a late duplicate
of a job (two workers racing on one window) cannot advance it twice: it finds the state
the winner left and carries on from there, doing only idempotent work. A window that
exists in any state blocks a new claim, so a completed window's post-processing is
never skipped: whatever finds it (the job's retry, the next gate, the sweep, POST /form)
enqueues its job again, and the job resumes at the step the state names.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum
from typing import cast

from pydantic import TypeAdapter

from memory_service.domain.graph import ExtractedEntity, ExtractedFact, Mention
from memory_service.domain.models import Memory
from memory_service.formation.extractor import ExtractionUsage
from memory_service.state import keyspace
from memory_service.state import metrics as process_metrics
from memory_service.state.cache import generation_key
from memory_service.state.store import StateStore


class WindowState(StrEnum):
    CLAIMED = "claimed"
    EXTRACTED = "extracted"
    WRITTEN = "written"
    COMPLETED = "completed"


# Claim the session's window: the one it holds, in whatever state, or a snapshot of (up to
# ARGV[1]) pending messages if at least ARGV[2] are pending. With ARGV[3], the caller
# evaluated the gate on counters it read when formed_windows was ARGV[3]: if a window
# completed since, its messages left the pending set, the gate's verdict is stale and the
# answer is {'stale'} (the caller reads again). Nothing else can make a gate that was open
# close (messages and tokens only grow until a window completes), so the gate's rule lives
# in Python alone (memory_service.formation.gates) and this script never re-evaluates it.
# The session (ARGV[4]) is in its bucket's index of held windows (KEYS[5]) from its claim
# (time ARGV[5]) until its window is gone: where ``recover_windows`` looks.
_CLAIM = """
local window = redis.call('HGET', KEYS[3], 'window')
if not window then
  local legacy = redis.call('HMGET', KEYS[4], 'window', 'ids')
  if legacy[1] then
    redis.call('HSET', KEYS[3], 'window', legacy[1], 'ids', legacy[2], 'state', 'claimed')
    redis.call('DEL', KEYS[4])
  else
    if redis.call('HGET', KEYS[1], 'incognito') == '1' then return false end
    if ARGV[3] ~= '' and tonumber(redis.call('HGET', KEYS[1], 'formed_windows') or '0') ~= tonumber(ARGV[3]) then
      return {'stale'}
    end
    if redis.call('ZCARD', KEYS[2]) < tonumber(ARGV[2]) then return false end
    local rows = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
    if #rows == 0 then return false end
    local ids = {}
    for i = 1, #rows, 2 do ids[#ids + 1] = {rows[i], tonumber(rows[i + 1])} end
    window = tostring(redis.call('HINCRBY', KEYS[1], 'claimed_windows', 1))
    redis.call('HSET', KEYS[3], 'window', window, 'ids', cjson.encode(ids), 'state', 'claimed')
  end
end
redis.call('ZADD', KEYS[5], 'NX', ARGV[5], ARGV[4])
return {'claim', redis.call('HGET', KEYS[3], 'window'), redis.call('HGET', KEYS[3], 'ids')}
"""

# Advance window ARGV[1] from state ARGV[2] to ARGV[3], setting the field/value pairs that
# follow; the window as it is afterwards (advanced by this call or by a racing one), or
# nil if the session holds no window of that number any more.
_ADVANCE = """
local current = redis.call('HMGET', KEYS[1], 'window', 'state')
if current[1] ~= ARGV[1] then return false end
if current[2] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'state', ARGV[3], unpack(ARGV, 4))
end
return redis.call('HGETALL', KEYS[1])
"""

# Complete window ARGV[1], if it is written: take its messages off the pending set, advance
# the cursor, leave the bucket's active set if nothing is pending, add ARGV[2] (JSON
# [[name, value], ...]) to the bucket's metrics, and store the effects ARGV[4] (JSON, applied
# by ``apply_effects``) in the window. Returns how many messages left the pending set, -1
# if the window is not (or no longer) in the written state.
_COMPLETE = """
local current = redis.call('HMGET', KEYS[4], 'window', 'state', 'ids')
if current[1] ~= ARGV[1] or current[2] ~= 'written' then return -1 end
local ids = cjson.decode(current[3])
local removed, tokens, last = 0, 0, 0
for _, row in ipairs(ids) do
  if redis.call('ZREM', KEYS[2], row[1]) == 1 then
    removed = removed + 1
    tokens = tokens + tonumber(redis.call('HGET', KEYS[3], row[1]) or '0')
    redis.call('HDEL', KEYS[3], row[1])
  end
  if row[2] > last then last = row[2] end
end
redis.call('HINCRBYFLOAT', KEYS[1], 'pending_tokens', -tokens)
redis.call('HINCRBY', KEYS[1], 'formed_windows', 1)
redis.call('HINCRBY', KEYS[1], 'formed_messages', removed)
local cursor = tonumber(redis.call('HGET', KEYS[1], 'cursor') or '0')
if last > cursor then redis.call('HSET', KEYS[1], 'cursor', last) end
redis.call('HSET', KEYS[4], 'state', 'completed', 'effects', ARGV[4])
if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('ZREM', KEYS[5], ARGV[3]) end
for _, metric in ipairs(cjson.decode(ARGV[2])) do redis.call('HINCRBYFLOAT', KEYS[6], metric[1], metric[2]) end
return removed
"""

# The last step: forget window ARGV[1] once its post-processing ran, and take the session
# (ARGV[2]) out of its bucket's index of held windows (KEYS[2]). 1 if this call did.
_FINISH = """
local current = redis.call('HMGET', KEYS[1], 'window', 'state')
if current[1] == ARGV[1] and current[2] == 'completed' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 1
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Claim:
    """The window a formation job forms: exactly these messages, in sequence order."""

    session_id: str
    window: int
    messages: tuple[tuple[str, int], ...]  # (message_id, sequence)

    @classmethod
    def of(cls, session_id: str, window: str, ids_json: str) -> Claim:
        """A claim as the window hash stores it: the window number and ``[[id, seq], ...]``."""
        return cls(session_id, int(window), tuple((mid, int(seq)) for mid, seq in json.loads(ids_json)))

    @property
    def message_ids(self) -> list[str]:
        return [mid for mid, _ in self.messages]


_MEMORIES = TypeAdapter(list[Memory])


@dataclass(frozen=True, slots=True)
class StoredExtraction:
    """What the extractor made of a window, as memories with their final ids, and the
    entities, facts and mentions it states for the knowledge graph (written in the same
    write step, memory_service/formation/graph_update.py)."""

    memories: tuple[Memory, ...]
    usage: ExtractionUsage | None = None
    entities: tuple[ExtractedEntity, ...] = ()
    facts: tuple[ExtractedFact, ...] = ()
    mentions: tuple[Mention, ...] = ()
    supersedes: tuple[str, ...] = ()  # ids of stored facts the window makes no longer true (the LLM says)
    observed_at: datetime | None = None  # the window's time: its latest message's
    extractor: str | None = None  # who made it, when not the configured extractor (an LLM budget was spent)
    fallback: str | None = None  # why not (memory_service/formation/budgets.py)

    def to_json(self) -> str:
        # Vectors are not stored: the write step embeds (a failing embedder never fails it).
        memories = [m.model_dump(mode="json", exclude={"embedding"}) for m in self.memories]
        return json.dumps({
            "memories": memories, "usage": asdict(self.usage) if self.usage else None,
            "entities": [e.model_dump(mode="json") for e in self.entities],
            "facts": [f.model_dump(mode="json") for f in self.facts],
            "mentions": [[m.memory_id, list(m.names)] for m in self.mentions],
            "supersedes": list(self.supersedes),
            "observed_at": self.observed_at.isoformat() if self.observed_at else None,
            "extractor": self.extractor, "fallback": self.fallback,
        })

    @classmethod
    def from_json(cls, raw: str) -> StoredExtraction:
        data = json.loads(raw)  # windows stored before the graph existed hold no entities
        usage = ExtractionUsage(**data["usage"]) if data.get("usage") else None
        return cls(tuple(_MEMORIES.validate_python(data["memories"])), usage,
                   tuple(ExtractedEntity.model_validate(e) for e in data.get("entities", ())),
                   tuple(ExtractedFact.model_validate(f) for f in data.get("facts", ())),
                   tuple(Mention(memory_id, tuple(names)) for memory_id, names in data.get("mentions", ())),
                   tuple(str(fact_id) for fact_id in data.get("supersedes", ())),
                   datetime.fromisoformat(data["observed_at"]) if data.get("observed_at") else None,
                   data.get("extractor"), data.get("fallback"))


@dataclass(frozen=True, slots=True)
class WindowRecord:
    """A window as Redis holds it."""

    claim: Claim
    state: WindowState
    extraction: StoredExtraction | None = None
    written: int = 0  # memories the write step stored new
    effects: str | None = None  # once completed: JSON {"push": [[namespace, memory id]...], "bump": [namespace...]}
    applied: bool = False  # the effects were applied

    @classmethod
    def of(cls, session_id: str, raw: dict[str, str]) -> WindowRecord:
        extraction = StoredExtraction.from_json(raw["extraction"]) if raw.get("extraction") else None
        return cls(Claim.of(session_id, raw["window"], raw["ids"]), WindowState(raw.get("state", "claimed")),
                   extraction, int(raw.get("written", 0)), raw.get("effects"), raw.get("applied") == "1")


class StaleGate(Exception):
    """A window completed after the gate was evaluated: evaluate it again."""


class WindowStore:
    """The only code that changes a window's state."""

    def __init__(self, state: StateStore):
        self.state = state
        redis = state.redis
        self._claim = redis.register_script(_CLAIM)
        self._advance = redis.register_script(_ADVANCE)
        self._complete = redis.register_script(_COMPLETE)
        self._finish = redis.register_script(_FINISH)

    async def claim(self, session_id: str, limit: int, min_messages: int = 1,
                    formed_windows: int | None = None) -> Claim | None:
        """The session's window (in any state), or a new claim of up to ``limit`` pending
        messages if at least ``min_messages`` are pending. None if there is nothing to claim
        (or the session is incognito).

        ``formed_windows``: the counter as read with the counters the caller's gate was
        evaluated on; raises StaleGate if a window completed since.
        """
        k = keyspace.session_keys(session_id)
        row = await self._claim(keys=[k["meta"], k["pending"], keyspace.window(session_id),
                                      keyspace.legacy_claim(session_id),
                                      keyspace.windows(keyspace.session_tag(session_id))],
                                args=[limit, min_messages, "" if formed_windows is None else formed_windows,
                                      session_id, repr(time.time())])
        if not row:
            return None
        if row[0] == "stale":
            raise StaleGate(session_id)
        return Claim.of(session_id, row[1], row[2])

    async def load(self, session_id: str) -> WindowRecord | None:
        # The state store's client decodes responses (see memory_service.state.store).
        raw = cast(dict[str, str], await self.state.redis.hgetall(keyspace.window(session_id)))
        return WindowRecord.of(session_id, raw) if raw else None

    async def current_claim(self, session_id: str) -> Claim | None:
        record = await self.load(session_id)
        return record.claim if record else None

    async def _advance_to(self, record: WindowRecord, to: WindowState, **fields: str) -> WindowRecord | None:
        pairs = [str(v) for item in fields.items() for v in item]
        raw = await self._advance(keys=[keyspace.window(record.claim.session_id)],
                                  args=[record.claim.window, record.state.value, to.value, *pairs])
        if not raw:
            return None
        return WindowRecord.of(record.claim.session_id, dict(zip(raw[::2], raw[1::2], strict=True)))

    async def store_extraction(self, record: WindowRecord, extraction: StoredExtraction) -> WindowRecord | None:
        """claimed → extracted. The window afterwards: with the extraction stored first, by
        whichever run stored one; None if the window is gone (formed by another run)."""
        return await self._advance_to(record, WindowState.EXTRACTED, extraction=extraction.to_json())

    async def mark_written(self, record: WindowRecord, written: int) -> WindowRecord | None:
        """extracted → written: the backend holds the stored extraction's memories."""
        return await self._advance_to(record, WindowState.WRITTEN, written=str(written))

    async def complete(self, record: WindowRecord, consolidate: Sequence[tuple[str, str]] = (),
                       written: Sequence[str] = (), metrics: dict[str, float] | None = None) -> int:
        """written → completed, with the session's counters, in one atomic step.

        ``consolidate`` (namespace, memory id) pairs are queued for consolidation, the cached
        memory contexts reading the ``written`` namespaces invalidated, ``metrics`` added.
        How many messages left the pending set; -1 if the window is not in the written state
        (another run completed it, or it is gone).
        """
        claim = record.claim
        k, tag = keyspace.session_keys(claim.session_id), keyspace.session_tag(claim.session_id)
        keys = [k["meta"], k["pending"], k["tokens"], keyspace.window(claim.session_id), keyspace.active(tag),
                keyspace.metrics(tag)]
        effects = {"push": [[ns, mid] for ns, mid in consolidate], "bump": sorted(set(written))}
        counted = [[name, repr(float(value))] for name, value in (metrics or {}).items()]
        completed = int(await self._complete(keys=keys, args=[claim.window, json.dumps(counted), claim.session_id,
                                                              json.dumps(effects)]))
        if completed >= 0:  # this run completed it: this process's series too (memory_service/state/metrics.py)
            process_metrics.count_all(metrics or {})
        return completed

    async def apply_effects(self, record: WindowRecord) -> WindowRecord:
        """Apply a completed window's effects (consolidation queues, generations), once
        unless a crash comes between applying them and marking them applied; the window after."""
        if record.state is not WindowState.COMPLETED or record.applied or not record.effects:
            return record
        effects = json.loads(record.effects)
        async with self.state.redis.pipeline(transaction=False) as pipe:
            for namespace, memory_id in effects["push"]:
                pipe.rpush(keyspace.cons_pending(namespace), memory_id)
            for namespace in effects["bump"]:
                pipe.incr(generation_key(namespace))
            await pipe.execute()
        return await self._advance_to(record, WindowState.COMPLETED, applied="1") or record

    async def finish(self, record: WindowRecord) -> bool:
        """completed → gone, once the post-completion work ran. True if this call did it."""
        session_id = record.claim.session_id
        return bool(await self._finish(keys=[keyspace.window(session_id), keyspace.windows(keyspace.session_tag(session_id))],
                                       args=[record.claim.window, session_id]))
