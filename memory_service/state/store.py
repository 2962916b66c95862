"""Control state in Redis: agents, shards, per-session counters and the formation cursor.

Everything that more than one process may change at once is updated atomically, by a
single command or a Lua script; nothing here reads a whole document, edits it and writes
it back. Memories themselves live in a backend, not here.

Its keys (sessions' ledgers, agents' settings and shards, the sweep's and the recovery's
indexes, consolidation queues, metrics, the embedding locks) are built by
memory_service/state/keyspace.py, whose docstring maps them all; the generations and cached
memory blocks belong to memory_service/state/cache.py (``StateStore.cache``).

On a Redis Cluster a script may only name keys of one slot (keyspace.py, "Hash tags"). The
scripts here name a session's keys and its bucket's shards of the active set, the in-flight
index and the metrics, all under the session's tag. What a record also changes elsewhere
(the user's session indexes, the user's generation, the agent's embedding mark and lock, the
agent's session set) is written in separate commands, each idempotent, placed so that a
crash between two steps leaves something extra rather than something missing: the user's
indexes are written before the commit (an index naming a session is harmless, one missing
would hide it from an erasure), the generation and the embedding mark after it (and again
by a retry, whose commit is not ``first``).

Round trips: on a cluster those steps are sent apart (a node each). On one server (the
embedded default, or a plain Redis) a step's commands and scripts go in one pipeline,
which the server runs in the order sent: a record's reserve is one round trip and its
commit one (``reserve_messages``, ``commit_messages``; bench/record_layers.py counts them).
Scripts in a pipeline go by EVALSHA (``_with_scripts``): redis-py's own way asks the server
first whether it knows them, a round trip more.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from memory_service.config import Settings
from memory_service.domain.errors import session_taken
from memory_service.domain.models import AgentSettings, ShardIn
from memory_service.state import keyspace, metrics
from memory_service.state.cache import BlockCache, agent_wide, generation_key
from memory_service.state.embed_claims import EmbedClaims
from memory_service.state.pools import redis_client

# The store's client decodes responses (memory_service.state.pools.redis_client, decode_responses=True);
# redis-py types every reply as ``bytes | str`` whatever the client does, so the replies
# read below are cast to ``str`` where they come in.

# Reserve a sequence number for a message id, or return the one it already has (KEYS:
# meta, ids, committed, inflight, the bucket's in-flight index, participants). The caller
# read the agent's settings, which say which backend stores the message, just before.
# A reservation this call will act on (new, or known with the same digest ARGV[3] and not
# committed) is held in the session's in-flight hash (KEYS[4]): the holders count goes up
# and the time is ARGV[5]; the session joins the in-flight index (KEYS[5]) if it was not in.
# An id committed before (with the same digest) answers a third element, 'committed': nothing
# is held for it.
# Taking part, decided here, in the same step as the write that makes the message's user
# (ARGV[7]) a participant (KEYS[6]): with ARGV[8] = '1' (a caller limited to the users
# ARGV[10..], of an agent whose users do not join others' sessions) a session of the agent
# takes the message only if one of them is a participant already; else 'taken'. A session
# older than the participants set (no 'participants' mark in its meta) takes it if ARGV[9]
# is '1': one of them took part by the indexes kept before it (read by the caller; only a
# record that passed this check adds to them). A new session is the first caller's, marked.
_RESERVE = """
local owner = redis.call('HGET', KEYS[1], 'agent_id')
if owner and owner ~= ARGV[2] then return {'conflict', owner} end
if owner and ARGV[8] == '1' then
  local member = false
  for i = 10, #ARGV do
    if redis.call('SISMEMBER', KEYS[6], ARGV[i]) == 1 then member = true break end
  end
  if not member and (ARGV[9] ~= '1' or redis.call('HEXISTS', KEYS[1], 'participants') == 1) then
    return {'taken'}
  end
end
local status, value = 'known', redis.call('HGET', KEYS[2], ARGV[1])
local seq, holders = nil, 0
if value then
  local known_seq, known_digest = string.match(value, '^(%S+) (.*)$')
  if known_digest ~= ARGV[3] then return {status, value} end
  if ARGV[7] ~= '' then redis.call('SADD', KEYS[6], ARGV[7]) end
  if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return {status, value, 'committed'} end
  seq = known_seq
  local entry = redis.call('HGET', KEYS[4], ARGV[1])
  if entry then holders = tonumber(string.match(entry, '^%S+ %S+ (%d+)')) end
else
  if not owner then redis.call('HSET', KEYS[1], 'agent_id', ARGV[2], 'participants', '1') end
  if ARGV[7] ~= '' then redis.call('SADD', KEYS[6], ARGV[7]) end
  status = 'new'
  seq = tostring(redis.call('HINCRBY', KEYS[1], 'next_seq', 1))
  value = seq .. ' ' .. ARGV[3]
  redis.call('HSET', KEYS[2], ARGV[1], value)
end
redis.call('HSET', KEYS[4], ARGV[1], seq .. ' ' .. ARGV[5] .. ' ' .. (holders + 1) .. ' ' .. ARGV[6])
redis.call('ZADD', KEYS[5], 'NX', ARGV[5], ARGV[4])
return {status, value}
"""

# Mark a stored message pending (once) and return whether this call did it. A new message
# is searchable at once, so it bumps the write generation of its session (KEYS[7]): cached
# memory blocks that could show it are stale (its speaker's user namespace: the caller).
# The message leaves the session's in-flight hash (KEYS[8]), and the session the bucket's
# in-flight index (KEYS[9]) when nothing else of it is in flight; the session goes to the
# back of the bucket's active set (KEYS[6]).
# The answer also carries the session's counters, read as ``counters`` reads them.
_COMMIT = """
local first = redis.call('SADD', KEYS[5], ARGV[1]) == 1
if first then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  redis.call('HINCRBYFLOAT', KEYS[1], 'pending_tokens', ARGV[3])
  redis.call('INCR', KEYS[7])
  if ARGV[4] ~= '' then redis.call('SADD', KEYS[4], ARGV[4]) end
  if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'incognito', '1') end
end
redis.call('HSET', KEYS[1], 'last_activity', ARGV[5])
redis.call('ZADD', KEYS[6], ARGV[5], ARGV[7])
redis.call('HDEL', KEYS[8], ARGV[1])
if redis.call('HLEN', KEYS[8]) == 0 then redis.call('ZREM', KEYS[9], ARGV[7]) end
return {first and 1 or 0, redis.call('ZCARD', KEYS[2]), redis.call('HGETALL', KEYS[1])}
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

# After a cold sweep looked at sessions of one bucket (KEYS[1], its active set): ARGV[1] is
# now, ARGV[2] how many of the (session,
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


@dataclass(frozen=True, slots=True)
class Reservation:
    sequence: int
    digest: str
    is_new: bool
    agent_settings: AgentSettings | None = None  # the agent's settings, read in the same step
    committed: bool = False  # the id was committed before the call (nothing held)


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


@dataclass(frozen=True)
class BlockState:
    """What a memory block reads of the state store before its cache key (``block_state``)."""

    owner: str | None  # the agent the session belongs to (None: no such session)
    agent: AgentSettings | None
    shards: dict[str, ShardIn]
    speakers: list[str]


def _agent_settings(raw: str | None) -> AgentSettings | None:
    return AgentSettings.model_validate_json(raw) if raw else None


def _readable_settings(raw: object) -> AgentSettings | None:
    """An agent's settings as a pipeline read them (an error, or none: None)."""
    return _agent_settings(raw) if isinstance(raw, str) else None


def _shards(raw: dict[str, str]) -> dict[str, ShardIn]:
    return {sid: ShardIn.model_validate_json(v) for sid, v in sorted(raw.items())}


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
    created_at: float | None = None  # the first reservation's time (sessions recorded before it was kept: None)
    messages: int = 0  # sequence numbers given (recorded messages, and a few released reservations)
    claimed_windows: int = 0

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
            created_at=float(meta["created_at"]) if "created_at" in meta else None,
            messages=int(meta.get("next_seq", 0)),
            claimed_windows=int(meta.get("claimed_windows", 0)),
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

class ReserveCall(NamedTuple):
    """The arguments of one ``reserve_message``, for ``reserve_messages``."""

    session_id: str
    agent_id: str
    message_id: str
    digest: str
    incognito: bool = False
    user_id: str = ""  # the message's user: a participant of the session once reserved
    confined_to: tuple[str, ...] | None = None  # a caller limited to these users (None: all users)


class CommitCall(NamedTuple):
    """The arguments of one ``commit_message``, for ``commit_messages``."""

    session_id: str
    message_id: str
    sequence: int
    weighted_tokens: float
    speaker: str | None
    incognito: bool
    agent_id: str
    embed_lock_ms: int = 0
    user_id: str | None = None
    committed: bool = False  # its reservation found the id committed: this commit is not expected to be the first


def _reserve_call(call: ReserveCall, confined: bool, took_part: bool) -> tuple[list[str], list[str]]:
    """The keys and arguments of ``_RESERVE`` (all under the session's tag). ``confined``: the
    caller is limited to ``call.confined_to`` and the agent's users do not join others'
    sessions; ``took_part``: one of them took part by the indexes older than the
    participants set."""
    k = keyspace.session_keys(call.session_id)
    return ([k["meta"], k["ids"], k["committed"], k["inflight"], keyspace.in_flight(keyspace.session_tag(call.session_id)),
             k["participants"]],
            [call.message_id, call.agent_id, call.digest, call.session_id, _now_text(), "1" if call.incognito else "0",
             call.user_id, "1" if confined else "0", "1" if took_part else "0", *(call.confined_to or ())])


def _reservation(session_id: str, reply: list[str], settings: AgentSettings | None) -> Reservation:
    """``_RESERVE``'s answer read, with the agent's settings read before it; session_taken
    if another agent owns the session, or other users (for a caller limited to users)."""
    status, *rest = reply
    if status in ("conflict", "taken"):
        # Never the owner's name: ids of other tenants are not the caller's to learn. One
        # answer for both: a session of other users is answered as one of another agent.
        raise session_taken(session_id)
    value, *committed = rest
    seq_text, _, known_digest = value.partition(" ")
    return Reservation(sequence=int(seq_text), digest=known_digest, is_new=status == "new", agent_settings=settings,
                       committed=bool(committed))


def _commit_call(call: CommitCall) -> tuple[list[str], list[str | int]]:
    """The keys and arguments of ``_COMMIT`` (all under the session's tag)."""
    k, tag = keyspace.session_keys(call.session_id), keyspace.session_tag(call.session_id)
    return ([k["meta"], k["pending"], k["tokens"], k["users"], k["committed"], keyspace.active(tag),
             generation_key(f"session:{call.session_id}"), k["inflight"], keyspace.in_flight(tag)],
            [call.message_id, call.sequence, f"{call.weighted_tokens:.3f}", call.speaker or "", _now_text(),
             "1" if call.incognito else "0", call.session_id])


def _raise_first(replies: Sequence[Any]) -> None:
    """The first error among a pipeline's replies, raised (an index write failed)."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def _commit_of(reply: list[Any], enqueue_embedding: bool) -> Commit:
    """``_COMMIT``'s answer read."""
    first, pending, meta = reply
    counters = SessionCounters.of(dict(zip(meta[::2], meta[1::2])), pending)
    return Commit(first=bool(first), counters=counters, enqueue_embedding=enqueue_embedding)


class _AfterCommit:
    """The step after the commits: the generation of each speaker of a first commit bumped,
    and each agent's embedding marked due and its lock taken if free (by the first call
    that marks it). ``first``: per call, whether it is (or is expected to be) a first commit."""

    def __init__(self, first: Sequence[bool], calls: Sequence[CommitCall]):
        self.generations: dict[str, None] = {}
        self.locking: dict[str, tuple[int, int]] = {}  # agent -> (the first call marking it, its lock's ms)
        for i, (call, is_first) in enumerate(zip(calls, first, strict=True)):
            if not is_first:
                continue
            if call.speaker:
                self.generations.setdefault(generation_key(f"user:{call.agent_id}:{call.speaker}"))
            if call.embed_lock_ms > 0:
                self.locking.setdefault(call.agent_id, (i, int(call.embed_lock_ms)))

    def queue(self, pipe: Any) -> None:
        for key in self.generations:
            pipe.incr(key)
        for agent_id, (_, lock_ms) in self.locking.items():
            pipe.set(keyspace.embed_due(agent_id), "1")
            pipe.set(keyspace.embed_lock(agent_id), "1", nx=True, px=lock_ms)

    def locked(self, replies: Sequence[Any]) -> dict[int, bool]:
        """Call -> whether it took its agent's embedding lock (the second SET of its agent's pair)."""
        return {i: replies[len(self.generations) + 2 * place + 1] is True
                for place, (i, _) in enumerate(self.locking.values())}


class StateStore:
    def __init__(self, redis: Redis, embed_claim_seconds: float = 30.0):
        self.redis = redis
        self.cache = BlockCache(redis)  # generations, cached and last good memory blocks
        self.embed_claims = EmbedClaims(redis, embed_claim_seconds)  # who embeds a stored memory
        # A cluster client runs what a record writes on other slots as steps of their own
        # (the module's docstring); one server takes them in one pipeline with the scripts.
        self.cluster = isinstance(redis, RedisCluster)
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
        settings = settings or Settings()
        return cls(redis_client(url, settings), settings.embedding_claim_seconds)

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
        await self.redis.zadd(keyspace.AGENTS, {agent_id: 0})
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
        return _agent_settings(cast(str | None, await self.redis.get(keyspace.agent_settings(agent_id))))

    async def block_state(self, agent_id: str, session_id: str) -> BlockState:
        """What a memory block reads here before its cache key, in one round trip (one
        pipeline; on a cluster, one per node): the session's agent, the agent's settings and
        shards, the session's speakers."""
        session = keyspace.session_keys(session_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(session["meta"], "agent_id")
            pipe.get(keyspace.agent_settings(agent_id))
            pipe.hgetall(keyspace.shards(agent_id))
            pipe.smembers(session["users"])
            owner, settings, shards, speakers = await pipe.execute()
        return BlockState(owner, _agent_settings(cast(str | None, settings)), _shards(shards), sorted(speakers))

    async def put_shard(self, agent_id: str, shard_id: str, shard: ShardIn) -> ShardIn | None:
        """Create or replace a shard's settings; the ones they replaced (None: it was created)."""
        async with self.redis.pipeline(transaction=True) as pipe:  # the read and the write at once
            pipe.hget(keyspace.shards(agent_id), shard_id)
            pipe.hset(keyspace.shards(agent_id), shard_id, shard.model_dump_json())
            stored, _ = await pipe.execute()
        await self.cache.bump(agent_wide(agent_id))
        return ShardIn.model_validate_json(cast(str, stored)) if stored else None

    async def shards(self, agent_id: str) -> dict[str, ShardIn]:
        return _shards(cast(dict[str, str], await self.redis.hgetall(keyspace.shards(agent_id))))

    # Sessions ----------------------------------------------------------------------

    async def reserve_message(self, session_id: str, agent_id: str, message_id: str, digest: str,
                              incognito: bool = False, user_id: str = "",
                              confined_to: Sequence[str] | None = None) -> Reservation:
        """Give a message id its sequence number in the session (the same one on a retry),
        with the agent's settings read just before, and make ``user_id`` a participant of
        the session. Unless the id is committed or was reserved with another digest, the
        call holds the reservation (in flight) until its ``commit_message`` or
        ``release_message``. ``confined_to``: the caller is limited to these users
        (``reserve_messages``). Raises session_taken for a session of another agent, or
        of other users."""
        call = ReserveCall(session_id, agent_id, message_id, digest, incognito, user_id,
                           None if confined_to is None else tuple(sorted(confined_to)))
        (answer,) = await self.reserve_messages([call])
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def _index_new_session(self, agent_id: str, session_id: str) -> None:
        """A new session in the agent's set of sessions and in the browse API's indexes: its
        agent among the agents, itself in the agent's sessions by creation number (kept on a
        retry: ZADD NX), its creation time. Each key under its own tag: separate, repeatable."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.sadd(keyspace.agent_sessions(agent_id), session_id)
            pipe.zadd(keyspace.AGENTS, {agent_id: 0})
            pipe.hsetnx(keyspace.session_keys(session_id)["meta"], "created_at", _now_text())
            pipe.zscore(keyspace.agent_session_order(agent_id), session_id)
            *_, numbered = await pipe.execute()
        if numbered is None:
            number = int(await self.redis.incr(keyspace.agent_session_count(agent_id)))
            await self.redis.zadd(keyspace.agent_session_order(agent_id), {session_id: number}, nx=True)

    async def commit_message(
        self, session_id: str, message_id: str, sequence: int, weighted_tokens: float,
        speaker: str | None, incognito: bool, agent_id: str, embed_lock_ms: int = 0, user_id: str | None = None,
        committed: bool = False,
    ) -> Commit:
        """Make a stored message pending for formation, once; the session's counters after.

        With ``embed_lock_ms`` > 0 the message waits for its embedding: the agent's embedding
        is marked due and, if no embedding job holds the agent's lock, this call takes it
        (``enqueue_embedding``: the caller enqueues the job). A job that holds it sees the
        mark before it lets go (``finish_embedding``), so no message is left behind.

        Three steps (see the module's docstring): the user's indexes, the session's atomic
        commit (``_COMMIT``), then the user's generation and the embedding mark; one round
        trip on one server, three on a cluster (``commit_messages``). ``committed``: the
        id's reservation found it committed already (a retry).
        """
        (answer,) = await self.commit_messages([CommitCall(session_id, message_id, sequence, weighted_tokens, speaker,
                                                           incognito, agent_id, embed_lock_ms, user_id, committed)])
        if isinstance(answer, Exception):
            raise answer
        return answer

    # A batch of messages (memory_service/ingest/batch.py): the same scripts, many calls in
    # one round trip each step. A pipeline runs its commands in order, so a session's
    # messages get their sequence numbers in the batch's order.

    async def reserve_messages(self, calls: Sequence[ReserveCall]) -> list[Reservation | Exception]:
        """``reserve_message`` for each call, in two round trips (the agents' settings with
        what the scripts need read or written first, then the reservations; and one for the
        new sessions' indexes), or in one on a single server when no caller is limited to
        users (the scripts then need nothing read first); each answer is a Reservation (``committed`` set if the id was
        committed before the call: nothing is held for it) or the error that call raised
        (e.g. session_taken).

        Whether a caller limited to users may record into a session is decided by the
        reservation's script (``_RESERVE``), atomically with making the message's user a
        participant: two such callers racing into a new session cannot both get in. Before
        it, in the first round trip: each user's index of the sessions they are made a
        participant of (written first, so that an erasure finds every session whose
        participants name the user; taken out again where the call was refused), and for a
        limited caller whether its users took part by the indexes older than the
        participants set (a session recorded before it)."""
        agents = list(dict.fromkeys(call.agent_id for call in calls))
        joined: dict[str, set[str]] = {}
        legacy = list(dict.fromkeys((c.agent_id, c.session_id, c.confined_to) for c in calls if c.confined_to))
        for call in calls:
            if call.user_id:
                joined.setdefault(keyspace.user_joined(call.agent_id, call.user_id), set()).add(call.session_id)
        if not self.cluster and all(call.confined_to is None for call in calls):
            # No caller limited to users: the scripts need nothing the first step reads, and
            # one server runs the pipeline in order (the indexes first): one round trip.
            scripts = [_reserve_call(call, False, False) for call in calls]
            async with self.redis.pipeline(transaction=False) as pipe:
                for agent_id in agents:
                    pipe.get(keyspace.agent_settings(agent_id))
                for key, members in joined.items():
                    pipe.sadd(key, *sorted(members))
                head = len(agents) + len(joined)
                raw = await self._with_scripts(pipe, self._reserve, scripts)
            settings = {agent_id: _readable_settings(value) for agent_id, value in zip(agents, raw, strict=False)}
            return await self._reserved(calls, raw[head:], settings)
        async with self.redis.pipeline(transaction=False) as pipe:
            for agent_id in agents:
                pipe.get(keyspace.agent_settings(agent_id))
            for agent_id, session_id, users in legacy:
                pipe.smismember(keyspace.session_keys(session_id)["users"], list(users or ()))
                for user in users or ():
                    pipe.sismember(keyspace.user_recorded(agent_id, user), session_id)
            for key, members in joined.items():
                pipe.sadd(key, *sorted(members))
            raw = await pipe.execute(raise_on_error=False)
        settings = {agent_id: _readable_settings(value) for agent_id, value in zip(agents, raw, strict=False)}
        took_part: dict[tuple[str, str, tuple[str, ...] | None], bool] = {}
        at = len(agents)
        for agent_id, session_id, users in legacy:
            reads = raw[at : at + 1 + len(users or ())]
            at += len(reads)
            took_part[agent_id, session_id, users] = any(
                any(value) if isinstance(value, list) else value is True or value == 1 for value in reads)
        scripts = []
        for call in calls:
            agent = settings.get(call.agent_id)
            confined = call.confined_to is not None and not (agent is not None and agent.users_join_sessions)
            scripts.append(_reserve_call(call, confined, took_part.get((call.agent_id, call.session_id,
                                                                         call.confined_to), False)))
        return await self._reserved(calls, await self._run_script(self._reserve, scripts), settings)

    async def _reserved(self, calls: Sequence[ReserveCall], reserved: Sequence[Any],
                        settings: dict[str, AgentSettings | None]) -> list[Reservation | Exception]:
        """The reservations' answers read; what a refusal wrote taken out, new sessions indexed."""
        answers: list[Reservation | Exception] = []
        new_sessions: dict[str, str] = {}
        refused: dict[str, set[str]] = {}  # the users' indexes naming a session their call was refused
        for call, reply in zip(calls, reserved, strict=True):
            if isinstance(reply, Exception):
                answers.append(reply)
                continue
            try:
                reservation = _reservation(call.session_id, reply, settings.get(call.agent_id))
            except Exception as exc:
                if call.user_id and reply and reply[0] in ("conflict", "taken"):
                    refused.setdefault(keyspace.user_joined(call.agent_id, call.user_id), set()).add(call.session_id)
                answers.append(exc)
                continue
            if reservation.sequence == 1:
                new_sessions[call.session_id] = call.agent_id
            answers.append(reservation)
        if refused:  # a refusal leaves nothing behind (a crash before this: an index entry erasure skips)
            async with self.redis.pipeline(transaction=False) as pipe:
                for key, members in refused.items():
                    pipe.srem(key, *sorted(members))
                await pipe.execute()
        for session_id, agent_id in new_sessions.items():
            await self._index_new_session(agent_id, session_id)
        return answers

    async def _run_script(self, script: AsyncScript, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
                          ) -> list[Any]:
        """``script`` run for each (keys, args), in order; each answer its reply or the error it
        raised. One pipeline on a plain Redis; one call after the other on a cluster, whose
        client refuses scripts in a pipeline (each call names one slot, the calls many)."""
        if self.cluster or len(calls) == 1:
            replies: list[Any] = []
            for keys, args in calls:
                try:
                    replies.append(await script(keys=keys, args=args))
                except Exception as exc:
                    replies.append(exc)
            return replies
        async with self.redis.pipeline(transaction=False) as pipe:
            return await self._with_scripts(pipe, script, calls)

    async def _with_scripts(self, pipe: Any, script: AsyncScript, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]],
                            after: Callable[[Any], None] | None = None) -> list[Any]:
        """Run ``pipe`` (commands queued already) with ``script`` for each (keys, args) after
        them, then what ``after`` queues: every reply, an error in place of a failed one.

        By EVALSHA: a script run through a pipeline (``script(client=pipe)``) first asks the
        server whether it knows the script, a round trip of its own. A server that does not
        (restarted, flushed) answers NOSCRIPT for every call: they are run again in order, each
        loading it, after the rest of the pipeline ran."""
        head = len(pipe)
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        if after is not None:
            after(pipe)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        ran = replies[head : head + len(calls)]
        if any(isinstance(reply, NoScriptError) for reply in ran):
            again = [await self._run_script(script, [call]) for call in calls]  # in order, each loading it
            replies[head : head + len(calls)] = [reply for (reply,) in again]
        return replies

    async def commit_messages(self, calls: Sequence[CommitCall]) -> list[Commit | Exception]:
        """``commit_message`` for each call, in order: the users' indexes, the sessions' atomic
        commits, then the users' generations and the embedding marks (see the module's
        docstring). Each answer is a Commit or the error that call raised. A batch's many
        messages of one session and speaker touch the same index members, generation and
        marks: each is written once for the batch, not per message.

        On a cluster, three round trips: the last step only for the calls that committed
        first (a duplicate changes nothing, so it invalidates no cached block). On one server,
        one pipeline, in that order: the last step for the calls whose reservation did not
        find their id committed (``CommitCall.committed``), as it expects of their commits; a
        retry racing its original to the commit (the one case it does not foresee) bumps a
        generation and marks an embedding once more, which only costs a cached block and an
        embedding job that finds nothing to do."""
        sessions: dict[str, set[str]] = {}  # index key -> the sessions it gains
        users: dict[str, set[str]] = {}  # the agent's users index -> the users it gains
        for call in calls:
            if call.speaker:
                sessions.setdefault(keyspace.user_sessions(call.agent_id, call.speaker), set()).add(call.session_id)
            if call.user_id:
                sessions.setdefault(keyspace.user_recorded(call.agent_id, call.user_id), set()).add(call.session_id)
            if speaking := [u for u in (call.speaker, call.user_id) if u]:  # the browse API's index of users
                users.setdefault(keyspace.agent_users(call.agent_id), set()).update(speaking)

        def indexes(pipe: Any) -> None:
            for key, members in sessions.items():
                pipe.sadd(key, *sorted(members))
            for key, members in users.items():
                pipe.zadd(key, dict.fromkeys(sorted(members), 0))

        scripts = [_commit_call(call) for call in calls]
        if not self.cluster:
            after = _AfterCommit([not call.committed for call in calls], calls)
            async with self.redis.pipeline(transaction=False) as pipe:
                indexes(pipe)
                head = len(pipe)
                raw = await self._with_scripts(pipe, self._commit, scripts, after.queue)
            _raise_first(raw[:head])  # as the cluster's first step would
            _raise_first(raw[head + len(calls):])  # as its last step would
            replies, locked = raw[head : head + len(calls)], after.locked(raw[head + len(calls):])
        else:
            async with self.redis.pipeline(transaction=False) as pipe:
                indexes(pipe)
                await pipe.execute()
            replies = await self._run_script(self._commit, scripts)
            # Only a first commit (a crash between the commit and this step leaves the speaker's
            # other sessions' blocks without the message until their next write or
            # CONTEXT_CACHE_TTL; this session's blocks were invalidated by the commit itself).
            after = _AfterCommit([not isinstance(r, Exception) and bool(r[0]) for r in replies], calls)
            async with self.redis.pipeline(transaction=False) as pipe:
                after.queue(pipe)
                locked = after.locked(await pipe.execute())
        return [reply if isinstance(reply, Exception) else _commit_of(reply, locked.get(i, False))
                for i, reply in enumerate(replies)]

    async def release_message(self, session_id: str, message_id: str, sequence: int, mode: str,
                              entry: str = "") -> bool:
        """Let go of a reservation whose store write failed; True if the id was released
        (free again for any content). ``mode``: refused, unhold or expired (see ``_RELEASE``)."""
        k = keyspace.session_keys(session_id)
        index = keyspace.in_flight(keyspace.session_tag(session_id))
        return bool(await self._release(keys=[k["ids"], k["committed"], k["inflight"], index],
                                        args=[message_id, sequence, session_id, mode, entry]))

    async def _due(self, index: Callable[[str], str], before: float, limit: int) -> list[tuple[str, float]]:
        """The ``limit`` members of every bucket's shard of ``index`` with the lowest scores,
        if below ``before``: (member, score), lowest first. One pipeline over the buckets."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for tag in keyspace.bucket_tags():
                pipe.zrangebyscore(index(tag), "-inf", before, start=0, num=limit, withscores=True)
            shards = cast(list[list[tuple[str, float]]], await pipe.execute())
        rows = sorted(((member, float(score)) for shard in shards for member, score in shard), key=lambda r: r[1])
        return rows[:limit]

    async def held_windows(self, claimed_before: float, limit: int) -> list[str]:
        """Up to ``limit`` sessions holding a window claimed (or last looked at by the
        recovery) before ``claimed_before``, longest first."""
        return [sid for sid, _ in await self._due(keyspace.windows, claimed_before, limit)]

    async def looked_at_window(self, session_id: str, now: float, held: bool) -> None:
        """The recovery looked at the session's window: to the back of the index, or out of it
        if the session holds none any more."""
        index = keyspace.windows(keyspace.session_tag(session_id))
        if held:
            await self.redis.zadd(index, {session_id: now}, xx=True)
        else:
            await self.redis.zrem(index, session_id)

    async def sessions_in_flight(self, reserved_before: float, limit: int) -> list[str]:
        """Up to ``limit`` sessions holding a reservation made before ``reserved_before``
        (or that the recovery has not looked at since one was)."""
        return [sid for sid, _ in await self._due(keyspace.in_flight, reserved_before, limit)]

    async def active_sessions(self) -> dict[str, float]:
        """Every session of the active set (every bucket's share) with its score; for
        operators and tests: it reads the whole set."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for tag in keyspace.bucket_tags():
                pipe.zrange(keyspace.active(tag), 0, -1, withscores=True)
            shards = cast(list[list[tuple[str, float]]], await pipe.execute())
        return {sid: float(score) for shard in shards for sid, score in shard}

    async def in_flight_count(self) -> int:
        """How many sessions the in-flight index holds (every bucket's)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for tag in keyspace.bucket_tags():
                pipe.zcard(keyspace.in_flight(tag))
            return sum(int(n) for n in await pipe.execute())

    async def in_flight(self, session_id: str) -> list[InFlight]:
        """The session's reservations not committed yet, in sequence order."""
        raw = cast(dict[str, str], await self.redis.hgetall(keyspace.session_keys(session_id)["inflight"]))
        return sorted((InFlight.of(mid, entry) for mid, entry in raw.items()), key=lambda e: e.sequence)

    async def settle_in_flight(self, session_id: str) -> None:
        """After the recovery looked at the session: see ``_SETTLE_IN_FLIGHT``."""
        await self._settle_in_flight(keys=[keyspace.session_keys(session_id)["inflight"],
                                           keyspace.in_flight(keyspace.session_tag(session_id))],
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
        return await self._due(keyspace.active, idle_before, limit)

    async def settle_swept(self, visited: Sequence[tuple[str, float]], unformable: Sequence[tuple[str, float]],
                           now: float) -> None:
        """After a sweep looked at sessions (as ``idle_sessions`` gave them): those it
        enqueued go to the back of the active set, those that cannot form leave it, each
        only if no message arrived meanwhile (a message re-adds its session)."""
        by_bucket: dict[str, tuple[list[tuple[str, float]], list[tuple[str, float]]]] = defaultdict(lambda: ([], []))
        for rows, which in ((visited, 0), (unformable, 1)):
            for sid, score in rows:
                by_bucket[keyspace.session_tag(sid)][which].append((sid, score))
        for tag, (seen, cannot) in by_bucket.items():  # one script per bucket: its keys share a slot
            args: list[str | int] = [repr(now), len(seen),
                                     *(v for sid, score in (*seen, *cannot) for v in (sid, repr(score)))]
            await self._settle_swept(keys=[keyspace.active(tag)], args=args)

    # Consolidation -----------------------------------------------------------------

    async def consolidation_pending(self, namespace: str, limit: int = -1) -> list[str]:
        return cast(list[str], await self.redis.lrange(keyspace.cons_pending(namespace), 0, limit - 1 if limit > 0 else -1))

    async def consolidation_pending_many(self, namespaces: Sequence[str]) -> list[list[str]]:
        """Every item of each namespace waiting for consolidation, in one round trip (a
        pipeline: the namespaces' queues are on several slots of a cluster)."""
        if not namespaces:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for namespace in namespaces:
                pipe.lrange(keyspace.cons_pending(namespace), 0, -1)
            return cast(list[list[str]], await pipe.execute())

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
        totals in Redis (served as gauges), in one of their shards (any: ``metrics`` sums them)."""
        metrics.count_all(counters)
        key = keyspace.metrics(random.choice(keyspace.bucket_tags()))
        async with self.redis.pipeline(transaction=False) as pipe:
            for name, value in counters.items():
                pipe.hincrbyfloat(key, name, value)
            await pipe.execute()

    async def metrics(self) -> dict[str, float]:
        """The service's counters: the sum of their shards (one pipeline)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for tag in keyspace.metric_tags():
                pipe.hgetall(keyspace.metrics(tag))
            shards = cast(list[dict[str, str]], await pipe.execute())
        totals: dict[str, float] = defaultdict(float)
        for shard in shards:
            for name, value in shard.items():
                totals[name] += float(value)
        return dict(totals)

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
        """Whether one of ``users`` took part in the session: is among its participants (a
        message reserved under their id, ``_RESERVE``), or, for a session recorded before the
        participants were kept, spoke in it or had a message recorded under their id. One
        round trip, whatever the number of users."""
        return (await self.took_part_each(agent_id, users, [session_id]))[session_id]

    async def took_part_each(self, agent_id: str, users: Sequence[str], session_ids: Sequence[str]) -> dict[str, bool]:
        """``took_part`` for each of the sessions, in one round trip (one pipeline)."""
        if not session_ids or not users:
            return dict.fromkeys(session_ids, False)
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id in session_ids:
                k = keyspace.session_keys(session_id)
                pipe.smismember(k["participants"], list(users))
                pipe.smismember(k["users"], list(users))
                for user_id in users:
                    pipe.sismember(keyspace.user_recorded(agent_id, user_id), session_id)
            raw = await pipe.execute()
        width = 2 + len(users)
        return {session_id: any(any(v) if isinstance(v, list) else bool(v) for v in raw[i * width : (i + 1) * width])
                for i, session_id in enumerate(session_ids)}

    async def has_message(self, session_id: str, message_id: str) -> bool:
        """Whether ``message_id`` was recorded in the session."""
        return bool(await self.redis.hexists(keyspace.session_keys(session_id)["ids"], message_id))

    # Browsing (memory_service/recall/browse.py): the indexes of agents, users and sessions ----
    # Every list is a keyset page of a sorted set: ZRANGE from the cursor, one command, whatever
    # the page's depth.

    async def index_agent(self, agent_id: str, user_id: str | None = None) -> None:
        """Put the agent (and ``user_id`` among its users) in the browse indexes: for what is
        written without a recorded message (a memory the agent writes itself)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(keyspace.AGENTS, {agent_id: 0})
            if user_id is not None:
                pipe.zadd(keyspace.agent_users(agent_id), {user_id: 0})
            await pipe.execute()

    async def agents_after(self, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` agent ids in id order, after ``after``."""
        start = f"({after}" if after is not None else "-"
        return cast(list[str], await self.redis.zrange(keyspace.AGENTS, start, "+", bylex=True, offset=0, num=limit))

    async def agents_known(self, agent_ids: Sequence[str]) -> list[bool]:
        """Whether each agent is in the agents' index."""
        if not agent_ids:
            return []
        scores = await self.redis.zmscore(keyspace.AGENTS, list(agent_ids))
        return [score is not None for score in scores]

    async def agent_sizes(self, agent_ids: Sequence[str]) -> list[tuple[int, int, bool]]:
        """(users, sessions, has settings) of each agent: one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for agent_id in agent_ids:
                pipe.zcard(keyspace.agent_users(agent_id))
                pipe.zcard(keyspace.agent_session_order(agent_id))
                pipe.exists(keyspace.agent_settings(agent_id))
            raw = await pipe.execute()
        return [(int(raw[i]), int(raw[i + 1]), bool(raw[i + 2])) for i in range(0, len(raw), 3)]

    async def known_users(self, agent_id: str, users: Sequence[str]) -> list[str]:
        """Those of ``users`` in the agent's index of users."""
        if not users:
            return []
        scores = await self.redis.zmscore(keyspace.agent_users(agent_id), list(users))
        return [u for u, score in zip(users, scores) if score is not None]

    async def users_after(self, agent_id: str, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` of the agent's user ids in id order, after ``after``."""
        start = f"({after}" if after is not None else "-"
        return cast(list[str], await self.redis.zrange(keyspace.agent_users(agent_id), start, "+", bylex=True,
                                                       offset=0, num=limit))

    async def sessions_before(self, agent_id: str, before: int | None, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` of the agent's sessions, newest first: (id, creation number), those
        created before number ``before`` if given."""
        top = f"({before}" if before is not None else "+inf"
        rows = await self.redis.zrange(keyspace.agent_session_order(agent_id), top, "-inf", byscore=True, desc=True,
                                       offset=0, num=limit, withscores=True)
        return [(sid, int(score)) for sid, score in cast(list[tuple[str, float]], rows)]

    async def session_numbers(self, agent_id: str, session_ids: Sequence[str]) -> dict[str, int]:
        """The creation numbers of these sessions of the agent (those not indexed are left out)."""
        if not session_ids:
            return {}
        scores = await self.redis.zmscore(keyspace.agent_session_order(agent_id), list(session_ids))
        return {sid: int(score) for sid, score in zip(session_ids, scores) if score is not None}

    async def sessions_of_users(self, agent_id: str, users: Sequence[str]) -> list[str]:
        """The sessions any of ``users`` took part in (spoke in, or had a message recorded under
        their id): what a key limited to them may see. Cost: their sessions."""
        keys = [k for u in users for k in (keyspace.user_sessions(agent_id, u), keyspace.user_recorded(agent_id, u))]
        return sorted(cast(set[str], await self.redis.sunion(keys))) if keys else []

    async def counters_of(self, session_ids: Sequence[str]) -> list[SessionCounters]:
        """``counters`` of each session, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for session_id in session_ids:
                k = keyspace.session_keys(session_id)
                pipe.hgetall(k["meta"])
                pipe.zcard(k["pending"])
            raw = await pipe.execute()
        return [SessionCounters.of(raw[i], raw[i + 1]) for i in range(0, len(raw), 2)]

    async def message_sequences(self, session_id: str, message_ids: Sequence[str]) -> dict[str, int]:
        """The sequence numbers of these messages of the session (unknown ids are left out)."""
        if not message_ids:
            return {}
        values = await self.redis.hmget(keyspace.session_keys(session_id)["ids"], list(message_ids))
        return {mid: int(str(v).split(" ", 1)[0]) for mid, v in zip(message_ids, values) if v}

    async def record_formed_window(self, session_id: str, entry: dict[str, object], last_sequence: int) -> None:
        """Remember a formed window (its number, extractor, sequences): see ``formed_window``."""
        await self.redis.zadd(keyspace.session_keys(session_id)["formed"],
                              {json.dumps(entry, sort_keys=True): last_sequence})

    async def formed_windows(self, session_id: str) -> list[tuple[str, dict[str, Any]]]:
        """Every formed window the session keeps, oldest first: (the stored JSON, its entry)."""
        rows = cast(list[str], await self.redis.zrange(keyspace.session_keys(session_id)["formed"], 0, -1))
        return [(raw, cast(dict[str, Any], json.loads(raw))) for raw in rows]

    async def replace_formed_window(self, session_id: str, stored: str, entry: dict[str, object],
                                    last_sequence: int) -> None:
        """A formed window's entry (as ``formed_windows`` read it) replaced by ``entry``, in one step."""
        key = keyspace.session_keys(session_id)["formed"]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(key, stored)
            pipe.zadd(key, {json.dumps(entry, sort_keys=True): last_sequence})
            await pipe.execute()

    async def formed_window(self, session_id: str, sequence: int) -> dict[str, object] | None:
        """The formed window that held the message of ``sequence``, as ``record_formed_window``
        kept it; None if none did (not formed yet, or formed before windows were kept)."""
        rows = await self.redis.zrange(keyspace.session_keys(session_id)["formed"], sequence, "+inf", byscore=True,
                                       offset=0, num=1)
        if not rows:
            return None
        entry = cast(dict[str, object], json.loads(cast(list[str], rows)[0]))
        first = entry.get("first_sequence")
        return entry if isinstance(first, int) and first <= sequence else None

    async def index_stored_data(self, version: int) -> bool:
        """Index for browsing what a release before the browse indexes stored, once per
        ``version``: agents (their settings and their sessions' sets), their sessions (in
        the order of their last activity) and users (the per-user session sets). A SCAN of
        the keyspace, run at start-up until it completes. True if this call did it."""
        if int(await self.redis.get(keyspace.BROWSE_INDEX) or 0) >= version:
            return False
        agents: set[str] = set()
        async for key in self.redis.scan_iter(match=keyspace.agent_settings("*"), count=1000):
            rest = str(key)[len(keyspace.agent_settings("")):]
            if ":" not in rest:
                agents.add(rest)
        async for key in self.redis.scan_iter(match=keyspace.agent_sessions("*"), count=1000):
            agent_id = str(key)[len(keyspace.agent_settings("")):].rsplit(":", 1)[0]
            if ":" not in agent_id:  # not the sessions of one of its users (keyspace.user_sessions)
                agents.add(agent_id)
        for agent_id in sorted(agents):
            await self.redis.zadd(keyspace.AGENTS, {agent_id: 0})
            sessions = await self.agent_sessions(agent_id)
            unindexed = [s for s in sessions if s not in await self.session_numbers(agent_id, [s])]
            if unindexed:
                counters = await self.counters_of(unindexed)
                for session_id, c in sorted(zip(unindexed, counters), key=lambda p: (p[1].last_activity or 0, p[0])):
                    number = int(await self.redis.incr(keyspace.agent_session_count(agent_id)))
                    await self.redis.zadd(keyspace.agent_session_order(agent_id), {session_id: number}, nx=True)
            for pattern in (keyspace.user_sessions(agent_id, "*"), keyspace.user_recorded(agent_id, "*")):
                async for key in self.redis.scan_iter(match=pattern, count=1000):
                    user = keyspace.user_of(agent_id, str(key))
                    if user and user != "-" and ":" not in user:
                        await self.redis.zadd(keyspace.agent_users(agent_id), {user: 0})
        await self.redis.set(keyspace.BROWSE_INDEX, version)
        return True
