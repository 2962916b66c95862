"""Control state in Redis: agents, shards, per-session counters and the formation cursor.

Everything that more than one process may change at once is updated atomically, by a
single command or a Lua script; nothing here reads a whole document, edits it and writes
it back. Memories themselves live in a backend, not here.

Its keys (sessions' ledgers, agents' settings and shards, the sweep's and the recovery's
indexes, consolidation queues, metrics, the embedding locks) are built by
memory_service/state/keyspace.py, whose docstring maps them all; the generations and cached
memory blocks belong to memory_service/state/cache.py (``StateStore.cache``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from redis.asyncio import Redis

from memory_service.config import Settings
from memory_service.domain.errors import session_taken
from memory_service.domain.models import AgentSettings, ShardIn
from memory_service.state import keyspace, metrics
from memory_service.state.cache import BlockCache, agent_wide, generation_key
from memory_service.state.pools import redis_client

# The store's client decodes responses (memory_service.state.pools.redis_client, decode_responses=True);
# redis-py types every reply as ``bytes | str`` whatever the client does, so the replies
# read below are cast to ``str`` where they come in.

# Reserve a sequence number for a message id, or return the one it already has; with it,
# the agent's settings (KEYS[4]), which say which backend stores the message: one round trip.
# A reservation this call will act on (new, or known with the same digest ARGV[3] and not
# committed) is held in the session's in-flight hash (KEYS[6]): the holders count goes up
# and the time is ARGV[5]; the session joins the in-flight index (KEYS[7]) if it was not in.
_RESERVE = """
local owner = redis.call('HGET', KEYS[1], 'agent_id')
if owner and owner ~= ARGV[2] then return {'conflict', owner} end
local settings = redis.call('GET', KEYS[4])
local status, value = 'known', redis.call('HGET', KEYS[2], ARGV[1])
local seq, holders = nil, 0
if value then
  local known_seq, known_digest = string.match(value, '^(%S+) (.*)$')
  if known_digest ~= ARGV[3] or redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 1 then
    return {status, value, settings}
  end
  seq = known_seq
  local entry = redis.call('HGET', KEYS[6], ARGV[1])
  if entry then holders = tonumber(string.match(entry, '^%S+ %S+ (%d+)')) end
else
  if not owner then
    redis.call('HSET', KEYS[1], 'agent_id', ARGV[2])
    redis.call('SADD', KEYS[3], ARGV[4])
  end
  status = 'new'
  seq = tostring(redis.call('HINCRBY', KEYS[1], 'next_seq', 1))
  value = seq .. ' ' .. ARGV[3]
  redis.call('HSET', KEYS[2], ARGV[1], value)
end
redis.call('HSET', KEYS[6], ARGV[1], seq .. ' ' .. ARGV[5] .. ' ' .. (holders + 1) .. ' ' .. ARGV[6])
redis.call('ZADD', KEYS[7], 'NX', ARGV[5], ARGV[4])
return {status, value, settings}
"""

# Mark a stored message pending (once) and return whether this call did it. A new message
# is searchable at once, so it bumps the write generation of its session and of its
# speaker's user namespace: cached memory blocks that could show it are stale.
# A new message also waits for its embedding (ARGV[8] > 0: the lock's lifetime in ms): the
# agent's embedding is marked due (KEYS[10]) and, if no embedding job holds the agent's lock
# (KEYS[11]), this call takes it and answers 1: the caller enqueues the job. A job that
# holds it sees the mark before it lets go (_EMBED_RELEASE), so no message is left behind.
# The message leaves the session's in-flight hash (KEYS[13]), and the session the in-flight
# index (KEYS[14]) when nothing else of it is in flight.
# The answer also carries the session's counters, read as ``counters`` reads them.
_COMMIT = """
local first = redis.call('SADD', KEYS[5], ARGV[1]) == 1
if first then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  redis.call('HINCRBYFLOAT', KEYS[1], 'pending_tokens', ARGV[3])
  redis.call('INCR', KEYS[8])
  if ARGV[4] ~= '' then
    redis.call('SADD', KEYS[4], ARGV[4])
    redis.call('SADD', KEYS[7], ARGV[7])
    redis.call('INCR', KEYS[9])
  end
  if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'incognito', '1') end
  if ARGV[9] ~= '' then redis.call('SADD', KEYS[12], ARGV[7]) end
end
redis.call('HSET', KEYS[1], 'last_activity', ARGV[5])
redis.call('ZADD', KEYS[6], ARGV[5], ARGV[7])
redis.call('HDEL', KEYS[13], ARGV[1])
if redis.call('HLEN', KEYS[13]) == 0 then redis.call('ZREM', KEYS[14], ARGV[7]) end
local embed = 0
if first and tonumber(ARGV[8]) > 0 then
  redis.call('SET', KEYS[10], '1')
  if redis.call('SET', KEYS[11], '1', 'NX', 'PX', ARGV[8]) then embed = 1 end
end
return {first and 1 or 0, embed, redis.call('ZCARD', KEYS[2]), redis.call('HGETALL', KEYS[1])}
"""

# A record whose store write failed lets go of its reservation (KEYS: ids, committed,
# inflight, in-flight index; ARGV: message id, sequence, session id, mode, entry).
# Nothing happens unless the in-flight entry is still the one of sequence ARGV[2] and the
# message is not committed (a concurrent retry of the id committed it: it stays). Modes:
# 'refused' (the store refused the message: nothing of it is stored) releases the id if
# no other call holds it, else counts this holder out; 'unhold' (an outage: the write may
# have landed) only counts this holder out and leaves the entry to the caller's retry or
# the recovery; 'expired' (the recovery found it old and not stored) releases it if the
# entry is still exactly ARGV[5], as the recovery read it. Released: the id's reservation
# and entry are deleted, the id is free for any content, its sequence number stays unused.
# 1 if released.
_RELEASE = """
local entry = redis.call('HGET', KEYS[3], ARGV[1])
if not entry then return 0 end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  redis.call('HDEL', KEYS[3], ARGV[1])
  if redis.call('HLEN', KEYS[3]) == 0 then redis.call('ZREM', KEYS[4], ARGV[3]) end
  return 0
end
local seq, at, holders, incognito = string.match(entry, '^(%S+) (%S+) (%d+) (%S+)$')
if seq ~= ARGV[2] then return 0 end
holders = tonumber(holders)
local release = (ARGV[4] == 'refused' and holders <= 1) or (ARGV[4] == 'expired' and entry == ARGV[5])
if not release then
  if ARGV[4] ~= 'expired' then
    redis.call('HSET', KEYS[3], ARGV[1], seq .. ' ' .. at .. ' ' .. math.max(holders - 1, 0) .. ' ' .. incognito)
  end
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[1])
local value = redis.call('HGET', KEYS[1], ARGV[1])
if value and string.match(value, '^(%S+) ') == seq then redis.call('HDEL', KEYS[1], ARGV[1]) end
if redis.call('HLEN', KEYS[3]) == 0 then redis.call('ZREM', KEYS[4], ARGV[3]) end
return 1
"""

# After the recovery looked at a session: it leaves the in-flight index if nothing of it is
# in flight, else its score is its oldest entry's time (when the recovery is due again).
_SETTLE_IN_FLIGHT = """
local oldest = nil
for _, entry in ipairs(redis.call('HVALS', KEYS[1])) do
  local at = tonumber(string.match(entry, '^%S+ (%S+) '))
  if oldest == nil or at < oldest then oldest = at end
end
if oldest == nil then
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[2], oldest, ARGV[1])
end
return 0
"""

# An embedding job about to stop: if messages were marked due since it cleared the mark,
# it keeps the agent's lock (renewed for ARGV[1] ms) and answers 1: go on. Else it lets go.
_EMBED_RELEASE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
  return 1
end
redis.call('DEL', KEYS[2])
return 0
"""

# After a cold sweep looked at sessions: ARGV[1] is now, ARGV[2] how many of the (session,
# score) pairs that follow it enqueued; those go to the back of the active set (due again
# after another idle period), the rest (that cannot form) leave it. Each only if its score
# is still the one the sweep read: a message recorded meanwhile moved it (and keeps it).
_SETTLE_SWEPT = """
local visited = tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    if (i - 3) / 2 < visited then
      redis.call('ZADD', KEYS[1], ARGV[1], ARGV[i])
    else
      redis.call('ZREM', KEYS[1], ARGV[i])
    end
  end
end
return 0
"""

# Finish a consolidation: compare-and-set on the version, then drop exactly the items it
# merged from the head of the list. Items pushed meanwhile are behind them and survive.
_CONSOLIDATED = """
local version = tonumber(redis.call('GET', KEYS[2]) or '0')
if version ~= tonumber(ARGV[1]) then return -1 end
redis.call('LTRIM', KEYS[1], tonumber(ARGV[2]), -1)
redis.call('INCR', KEYS[3])
return redis.call('INCR', KEYS[2])
"""


def key_index(keys: list[str], key: str) -> int:
    """``key``'s 1-based index in ``keys`` (a Lua script's KEYS), appending it if new."""
    if key not in keys:
        keys.append(key)
    return keys.index(key) + 1


@dataclass(frozen=True, slots=True)
class Reservation:
    sequence: int
    digest: str
    is_new: bool
    agent_settings: AgentSettings | None = None  # the agent's settings, read in the same step


@dataclass(frozen=True, slots=True)
class InFlight:
    """A reservation not committed yet, as the session's in-flight hash holds it."""

    message_id: str
    sequence: int
    reserved_at: float  # the last reserve of the id (a retry renews it)
    holders: int  # calls between their reserve and their commit or release (a crash leaves its own)
    incognito: bool
    entry: str  # the hash's value, as read: the recovery releases only what it read

    @classmethod
    def of(cls, message_id: str, entry: str) -> InFlight:
        seq, at, holders, incognito = entry.split(" ")
        return cls(message_id, int(seq), float(at), int(holders), incognito == "1", entry)


@dataclass(frozen=True, slots=True)
class SessionCounters:
    agent_id: str | None
    pending_messages: int
    pending_tokens: float
    cursor: int
    formed_windows: int
    formed_messages: int
    incognito: bool
    last_activity: float | None

    @classmethod
    def of(cls, meta: dict[str, str], pending: int) -> SessionCounters:
        """The counters from the session's meta hash and the size of its pending set."""
        return cls(
            agent_id=meta.get("agent_id"),
            pending_messages=int(pending),
            pending_tokens=max(0.0, float(meta.get("pending_tokens", 0))),
            cursor=int(meta.get("cursor", 0)),
            formed_windows=int(meta.get("formed_windows", 0)),
            formed_messages=int(meta.get("formed_messages", 0)),
            incognito=meta.get("incognito") == "1",
            last_activity=float(meta["last_activity"]) if "last_activity" in meta else None,
        )


@dataclass(frozen=True, slots=True)
class Commit:
    first: bool  # False: the message was committed before (a retry)
    counters: SessionCounters  # the session's counters right after
    enqueue_embedding: bool  # this call took the agent's embedding lock: enqueue the job


def _now_text() -> str:
    """Now, in seconds to the millisecond, rounded down: a time written to the store is never
    later than a reader's time.time() taken after it (rounding to nearest made a session
    recorded in the last half millisecond not yet idle to a sweep with no idle time)."""
    return f"{math.floor(time.time() * 1000) / 1000:.3f}"

class StateStore:
    def __init__(self, redis: Redis):
        self.redis = redis
        self.cache = BlockCache(redis)  # generations, cached and last good memory blocks
        self._reserve = redis.register_script(_RESERVE)
        self._commit = redis.register_script(_COMMIT)
        self._settle_swept = redis.register_script(_SETTLE_SWEPT)
        self._consolidated = redis.register_script(_CONSOLIDATED)
        self._embed_release = redis.register_script(_EMBED_RELEASE)
        self._release = redis.register_script(_RELEASE)
        self._settle_in_flight = redis.register_script(_SETTLE_IN_FLIGHT)

    @classmethod
    def from_url(cls, url: str, settings: Settings | None = None) -> StateStore:
        """On a bounded pool with the settings' timeouts (memory_service/state/pools.py)."""
        return cls(redis_client(url, settings or Settings()))

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    # Agents and shards -------------------------------------------------------------

    async def put_agent(self, agent_id: str, settings: AgentSettings) -> AgentSettings | None:
        """Store the agent's settings; the ones they replaced (None: none, or unreadable)."""
        stored = await self.redis.set(keyspace.agent_settings(agent_id), settings.model_dump_json(), get=True)
        previous = None
        if stored:
            try:
                previous = AgentSettings.model_validate_json(cast(str, stored))
            except ValueError:
                pass
        # Every backend the agent's settings named (the replaced ones too: settings stored
        # before this set existed) may hold memories the others lack, until a migration.
        named = {settings.requested_backend(), previous.requested_backend() if previous else None}
        backends = sorted(name for name in named if name is not None)
        if backends:
            await self.redis.sadd(keyspace.agent_backends(agent_id), *backends)
        await self.cache.bump(agent_wide(agent_id))
        return previous

    async def named_backend(self, agent_id: str, backend: str) -> bool:
        """Whether the agent's settings named ``backend`` since its last migration."""
        return bool(await self.redis.sismember(keyspace.agent_backends(agent_id), backend))

    async def migrated(self, agent_id: str, backend: str) -> None:
        """Every memory of the agent is in ``backend`` now: forget the other backends it named."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(keyspace.agent_backends(agent_id))
            pipe.sadd(keyspace.agent_backends(agent_id), backend)
            await pipe.execute()

    async def get_agent(self, agent_id: str) -> AgentSettings | None:
        raw = await self.redis.get(keyspace.agent_settings(agent_id))
        return AgentSettings.model_validate_json(raw) if raw else None

    async def put_shard(self, agent_id: str, shard_id: str, shard: ShardIn) -> ShardIn | None:
        """Create or replace a shard's settings; the ones they replaced (None: it was created)."""
        async with self.redis.pipeline(transaction=True) as pipe:  # the read and the write at once
            pipe.hget(keyspace.shards(agent_id), shard_id)
            pipe.hset(keyspace.shards(agent_id), shard_id, shard.model_dump_json())
            stored, _ = await pipe.execute()
        await self.cache.bump(agent_wide(agent_id))
        return ShardIn.model_validate_json(cast(str, stored)) if stored else None

    async def shards(self, agent_id: str) -> dict[str, ShardIn]:
        raw = cast(dict[str, str], await self.redis.hgetall(keyspace.shards(agent_id)))
        return {sid: ShardIn.model_validate_json(v) for sid, v in sorted(raw.items())}

    # Sessions ----------------------------------------------------------------------

    async def reserve_message(self, session_id: str, agent_id: str, message_id: str, digest: str,
                              incognito: bool = False) -> Reservation:
        """Give a message id its sequence number in the session (the same one on a retry),
        and read the agent's settings in the same step. Unless the id is committed or was
        reserved with another digest, the call holds the reservation (in flight) until its
        ``commit_message`` or ``release_message``."""
        k = keyspace.session_keys(session_id)
        status, value, *rest = await self._reserve(
            keys=[k["meta"], k["ids"], keyspace.agent_sessions(agent_id), keyspace.agent_settings(agent_id), k["committed"],
                  k["inflight"], keyspace.IN_FLIGHT],
            args=[message_id, agent_id, digest, session_id, _now_text(), "1" if incognito else "0"])
        if status == "conflict":
            # Never the owner's name: ids of other tenants are not the caller's to learn.
            raise session_taken(session_id)
        seq_text, _, known_digest = value.partition(" ")
        settings = AgentSettings.model_validate_json(rest[0]) if rest and rest[0] else None
        return Reservation(sequence=int(seq_text), digest=known_digest, is_new=status == "new", agent_settings=settings)

    async def commit_message(
        self, session_id: str, message_id: str, sequence: int, weighted_tokens: float,
        speaker: str | None, incognito: bool, agent_id: str, embed_lock_ms: int = 0, user_id: str | None = None,
    ) -> Commit:
        """Make a stored message pending for formation, once; the session's counters after.

        With ``embed_lock_ms`` > 0 the message waits for its embedding: see ``_COMMIT``.
        """
        k = keyspace.session_keys(session_id)
        first, embed, pending, meta = await self._commit(
            keys=[k["meta"], k["pending"], k["tokens"], k["users"], k["committed"], keyspace.ACTIVE,
                  keyspace.user_sessions(agent_id, speaker or "-"), generation_key(f"session:{session_id}"),
                  generation_key(f"user:{agent_id}:{speaker or '-'}"), keyspace.embed_due(agent_id),
                  keyspace.embed_lock(agent_id), keyspace.user_recorded(agent_id, user_id or "-"), k["inflight"],
                  keyspace.IN_FLIGHT],
            args=[message_id, sequence, f"{weighted_tokens:.3f}", speaker or "", _now_text(),
                  "1" if incognito else "0", session_id, int(embed_lock_ms), user_id or ""],
        )
        counters = SessionCounters.of(dict(zip(meta[::2], meta[1::2])), pending)
        return Commit(first=bool(first), counters=counters, enqueue_embedding=bool(embed))

    async def release_message(self, session_id: str, message_id: str, sequence: int, mode: str,
                              entry: str = "") -> bool:
        """Let go of a reservation whose store write failed; True if the id was released
        (free again for any content). ``mode``: refused, unhold or expired (see ``_RELEASE``)."""
        k = keyspace.session_keys(session_id)
        return bool(await self._release(keys=[k["ids"], k["committed"], k["inflight"], keyspace.IN_FLIGHT],
                                        args=[message_id, sequence, session_id, mode, entry]))

    async def sessions_in_flight(self, reserved_before: float, limit: int) -> list[str]:
        """Up to ``limit`` sessions holding a reservation made before ``reserved_before``
        (or that the recovery has not looked at since one was)."""
        return cast(list[str], await self.redis.zrangebyscore(keyspace.IN_FLIGHT, "-inf", reserved_before,
                                                              start=0, num=limit))

    async def in_flight(self, session_id: str) -> list[InFlight]:
        """The session's reservations not committed yet, in sequence order."""
        raw = cast(dict[str, str], await self.redis.hgetall(keyspace.session_keys(session_id)["inflight"]))
        return sorted((InFlight.of(mid, entry) for mid, entry in raw.items()), key=lambda e: e.sequence)

    async def settle_in_flight(self, session_id: str) -> None:
        """After the recovery looked at the session: see ``_SETTLE_IN_FLIGHT``."""
        await self._settle_in_flight(keys=[keyspace.session_keys(session_id)["inflight"], keyspace.IN_FLIGHT],
                                     args=[session_id])

    async def counters(self, session_id: str) -> SessionCounters:
        # commit_message answers with the same reads (its script's last line): keep them in step.
        k = keyspace.session_keys(session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(k["meta"])
            pipe.zcard(k["pending"])
            meta, pending = await pipe.execute()
        return SessionCounters.of(meta, pending)

    # Embedding messages after they are recorded ------------------------------------

    async def start_embedding(self, agent_id: str) -> None:
        """An embedding job begins a pass: what is marked due from now on, it sees later."""
        await self.redis.delete(keyspace.embed_due(agent_id))

    async def renew_embedding_lock(self, agent_id: str, lock_ms: int) -> None:
        """Hold the agent's lock ``lock_ms`` more: a job still at work, or a failed embedder
        that the next record must not call again before then."""
        await self.redis.pexpire(keyspace.embed_lock(agent_id), lock_ms)

    async def finish_embedding(self, agent_id: str, lock_ms: int) -> bool:
        """Let go of the agent's embedding lock, unless messages were marked due meanwhile:
        then keep it (renewed) and answer True, and the job makes another pass."""
        return bool(await self._embed_release(keys=[keyspace.embed_due(agent_id), keyspace.embed_lock(agent_id)],
                                              args=[lock_ms]))


    async def idle_sessions(self, idle_before: float, limit: int) -> list[tuple[str, float]]:
        """The ``limit`` active sessions due longest, if due before ``idle_before``: (id, score).

        A session's score is its last activity, or the cold sweep's last visit if later.
        """
        due = await self.redis.zrangebyscore(keyspace.ACTIVE, "-inf", idle_before, start=0, num=limit, withscores=True)
        return [(sid, float(score)) for sid, score in cast(list[tuple[str, float]], due)]

    async def settle_swept(self, visited: Sequence[tuple[str, float]], unformable: Sequence[tuple[str, float]],
                           now: float) -> None:
        """After a sweep looked at sessions (as ``idle_sessions`` gave them): those it
        enqueued go to the back of the active set, those that cannot form leave it, each
        only if no message arrived meanwhile (a message re-adds its session)."""
        if visited or unformable:
            args: list[str | int] = [repr(now), len(visited),
                                     *(v for sid, score in (*visited, *unformable) for v in (sid, repr(score)))]
            await self._settle_swept(keys=[keyspace.ACTIVE], args=args)

    # Consolidation -----------------------------------------------------------------

    async def consolidation_pending(self, namespace: str, limit: int = -1) -> list[str]:
        return cast(list[str], await self.redis.lrange(keyspace.cons_pending(namespace), 0, limit - 1 if limit > 0 else -1))

    async def consolidation_backlog(self, namespace: str) -> int:
        """How many items of ``namespace`` wait for consolidation."""
        return int(await self.redis.llen(keyspace.cons_pending(namespace)))

    async def consolidation_version(self, namespace: str) -> int:
        return int(await self.redis.get(keyspace.cons_version(namespace)) or 0)

    async def finish_consolidation(self, namespace: str, version: int, merged: int) -> int:
        """Drop the ``merged`` oldest pending items and bump the version; -1 if another run did."""
        keys = [keyspace.cons_pending(namespace), keyspace.cons_version(namespace), generation_key(namespace)]
        return int(await self._consolidated(keys=keys, args=[version, merged]))

    # Metrics -----------------------------------------------------------------------

    async def add_metrics(self, **counters: float) -> None:
        """Add to this process's series (memory_service/state/metrics.py) and to the deployment's
        totals in Redis (``ms:metrics``, served as gauges)."""
        metrics.count_all(counters)
        async with self.redis.pipeline(transaction=False) as pipe:
            for name, value in counters.items():
                pipe.hincrbyfloat(keyspace.METRICS, name, value)
            await pipe.execute()

    async def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in cast(dict[str, str], await self.redis.hgetall(keyspace.METRICS)).items()}

    async def agent_sessions(self, agent_id: str) -> list[str]:
        """Every session the agent has recorded in (for migration)."""
        return sorted(cast(set[str], await self.redis.smembers(keyspace.agent_sessions(agent_id))))

    async def record_embedder(self, name: str, dimension: int) -> tuple[str, int] | None:
        """Remember which embedder filled the store; the one remembered before, if any.

        The first name remembered is also kept as ``untagged``: the model of the vectors
        stored before each vector carried its model's name (``untagged_model``)."""
        key = keyspace.EMBEDDER
        if await self.redis.hsetnx(key, "dimension", dimension):
            await self.redis.hset(key, "name", name)
            await self.redis.hsetnx(key, "untagged", name)
            return None
        stored = cast(dict[str, str], await self.redis.hgetall(key))
        await self.redis.hsetnx(key, "untagged", stored.get("name", name))
        return stored.get("name", "?"), int(stored["dimension"])

    async def untagged_model(self) -> str | None:
        """The model of vectors stored without their model's name (``record_embedder``)."""
        return cast(str | None, await self.redis.hget(keyspace.EMBEDDER, "untagged"))

    async def switch_embedder(self, name: str) -> None:
        """Every agent's vectors are of ``name`` now (a re-embed switched the last one)."""
        await self.redis.hset(keyspace.EMBEDDER, "name", name)

    async def reembed_state(self, agent_id: str) -> dict[str, str]:
        """The agent's re-embed record (memory_service/embedding/reembed.py): empty if none."""
        return cast(dict[str, str], await self.redis.hgetall(keyspace.reembed(agent_id)))

    async def set_reembed_state(self, agent_id: str, **fields: str | int | float | None) -> None:
        """Set fields of the agent's re-embed record; a None removes the field."""
        key = keyspace.reembed(agent_id)
        if drop := [name for name, value in fields.items() if value is None]:
            await self.redis.hdel(key, *drop)
        if keep := {name: str(value) for name, value in fields.items() if value is not None}:
            await self.redis.hset(key, items=[part for pair in keep.items() for part in pair])

    async def user_sessions(self, agent_id: str, user_id: str) -> list[str]:
        """The sessions of ``agent_id`` in which ``user_id`` spoke (as role user)."""
        return sorted(cast(set[str], await self.redis.smembers(keyspace.user_sessions(agent_id, user_id))))

    async def session_users(self, session_id: str) -> list[str]:
        return sorted(cast(set[str], await self.redis.smembers(keyspace.session_keys(session_id)["users"])))

    async def took_part(self, agent_id: str, users: Sequence[str], session_id: str) -> bool:
        """Whether one of ``users`` took part in the session: spoke in it, or had a message
        (of any role) recorded under their id. One round trip, whatever the number of users."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.smismember(keyspace.session_keys(session_id)["users"], list(users))
            for user_id in users:
                pipe.sismember(keyspace.user_recorded(agent_id, user_id), session_id)
            spoke, *recorded = await pipe.execute()
        return any(spoke) or any(recorded)

    async def has_message(self, session_id: str, message_id: str) -> bool:
        """Whether ``message_id`` was recorded in the session."""
        return bool(await self.redis.hexists(keyspace.session_keys(session_id)["ids"], message_id))
