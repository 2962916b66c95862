"""Control state in Redis: agents, shards, per-session counters and the formation cursor.

Everything that more than one process may change at once is updated atomically, by a
single command or a Lua script; nothing here reads a whole document, edits it and writes
it back. Memories themselves live in a backend, not here.

Keys (all under ``ms:``; ids never contain ':' so keys are unambiguous):
  ms:agent:<agent>               JSON AgentSettings
  ms:agent:<agent>:sessions      set of the agent's session ids
  ms:shards:<agent>              hash shard_id -> JSON ShardIn
  ms:s:<session>:meta            hash: agent_id, next_seq, pending_tokens, cursor,
                                 formed_windows, formed_messages, incognito, last_activity
  ms:s:<session>:ids             hash message_id -> "<seq> <content digest>"
  ms:s:<session>:pending         zset message_id -> seq, recorded but not yet formed
  ms:s:<session>:tokens          hash message_id -> weighted tokens, while pending
  ms:s:<session>:users           set of user ids who spoke in the session
  ms:agent:<agent>:user:<user>:sessions
                                 set of the sessions the user spoke in (the "user" search scope)
  ms:s:<session>:claim           hash: the window being formed (window, ids)
  ms:active                      zset session_id -> last activity, while messages are pending
  ms:cons:<namespace>:pending    list of memory ids not yet consolidated (directives, suggestions)
  ms:cons:<namespace>:version    version of the namespace's consolidated memory
  ms:embedder                    hash: name and dimension of the embedder whose vectors are stored
  ms:embed:<agent>:due           set when a message of the agent was stored to be embedded later
  ms:embed:<agent>:job           the agent's embedding lock, with a lifetime: an embedding job is
                                 queued or running for the agent (or the embedder failed lately)
  ms:metrics                     hash of counters (formations, LLM calls, tokens, ...)
  ms:gen:<namespace>             write generation, for context cache invalidation
  ms:ctx:<digest>                cached memory context
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from .errors import Conflict
from .models import AgentSettings, ShardIn

# Reserve a sequence number for a message id, or return the one it already has; with it,
# the agent's settings (KEYS[4]), which say which backend stores the message: one round trip.
_RESERVE = """
local owner = redis.call('HGET', KEYS[1], 'agent_id')
if owner and owner ~= ARGV[2] then return {'conflict', owner} end
local settings = redis.call('GET', KEYS[4])
local known = redis.call('HGET', KEYS[2], ARGV[1])
if known then return {'known', known, settings} end
if not owner then
  redis.call('HSET', KEYS[1], 'agent_id', ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[4])
end
local seq = redis.call('HINCRBY', KEYS[1], 'next_seq', 1)
local value = seq .. ' ' .. ARGV[3]
redis.call('HSET', KEYS[2], ARGV[1], value)
return {'new', value, settings}
"""

# Mark a stored message pending (once) and return whether this call did it. A new message
# is searchable at once, so it bumps the write generation of its session and of its
# speaker's user namespace: cached memory blocks that could show it are stale.
# A new message also waits for its embedding (ARGV[8] > 0: the lock's lifetime in ms): the
# agent's embedding is marked due (KEYS[10]) and, if no embedding job holds the agent's lock
# (KEYS[11]), this call takes it and answers 1: the caller enqueues the job. A job that
# holds it sees the mark before it lets go (_EMBED_RELEASE), so no message is left behind.
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
end
redis.call('HSET', KEYS[1], 'last_activity', ARGV[5])
redis.call('ZADD', KEYS[6], ARGV[5], ARGV[7])
local embed = 0
if first and tonumber(ARGV[8]) > 0 then
  redis.call('SET', KEYS[10], '1')
  if redis.call('SET', KEYS[11], '1', 'NX', 'PX', ARGV[8]) then embed = 1 end
end
return {first and 1 or 0, embed, redis.call('ZCARD', KEYS[2]), redis.call('HGETALL', KEYS[1])}
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

# Claim the session's window: the one already claimed, or a snapshot of (up to ARGV[1])
# pending messages. The snapshot is what formation reads, however often it is retried;
# messages recorded later belong to the next window. A new claim needs at least ARGV[2]
# pending messages and, when ARGV[3] > 0, the message (ARGV[3]) or weighted token
# (ARGV[4]) interval: checked here, on what is pending now, because a window completed
# since the caller read the counters has taken its messages away.
_CLAIM = """
if redis.call('HGET', KEYS[1], 'incognito') == '1' then return false end
local window = redis.call('HGET', KEYS[3], 'window')
if not window then
  local pending = redis.call('ZCARD', KEYS[2])
  if pending < tonumber(ARGV[2]) then return false end
  if tonumber(ARGV[3]) > 0 and pending < tonumber(ARGV[3])
     and tonumber(redis.call('HGET', KEYS[1], 'pending_tokens') or '0') < tonumber(ARGV[4]) then
    return false
  end
  local rows = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
  if #rows == 0 then return false end
  local ids = {}
  for i = 1, #rows, 2 do ids[#ids + 1] = {rows[i], tonumber(rows[i + 1])} end
  window = tostring(redis.call('HINCRBY', KEYS[1], 'claimed_windows', 1))
  redis.call('HSET', KEYS[3], 'window', window, 'ids', cjson.encode(ids))
end
return {window, redis.call('HGET', KEYS[3], 'ids')}
"""

# Finish a window, exactly once: compare-and-set on the claimed window number, then take
# its messages off the pending set, advance the cursor, queue the formed directives and
# suggestions for consolidation (ARGV "key index|memory id" pushes onto KEYS[index]), and
# bump the write generation of every namespace written (ARGV "+key index").
_COMPLETE = """
if redis.call('HGET', KEYS[4], 'window') ~= ARGV[1] then return -1 end
local ids = cjson.decode(redis.call('HGET', KEYS[4], 'ids'))
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
redis.call('DEL', KEYS[4])
if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('ZREM', KEYS[5], ARGV[#ARGV]) end
for i = 2, #ARGV - 1 do
  if string.sub(ARGV[i], 1, 1) == '+' then
    redis.call('INCR', KEYS[tonumber(string.sub(ARGV[i], 2))])
  else
    local sep = string.find(ARGV[i], '|', 1, true)
    redis.call('RPUSH', KEYS[tonumber(string.sub(ARGV[i], 1, sep - 1))], string.sub(ARGV[i], sep + 1))
  end
end
return removed
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
class Claim:
    """The window a formation job forms: exactly these messages, in sequence order."""

    session_id: str
    window: int
    messages: tuple[tuple[str, int], ...]  # (message_id, sequence)

    @classmethod
    def of(cls, session_id: str, window: str, ids_json: str) -> Claim:
        """A claim as the claim hash stores it: the window number and ``[[id, seq], ...]``."""
        return cls(session_id, int(window), tuple((mid, int(seq)) for mid, seq in json.loads(ids_json)))

    @property
    def message_ids(self) -> list[str]:
        return [mid for mid, _ in self.messages]


ACTIVE = "ms:active"
METRICS = "ms:metrics"


def _cons_list(namespace: str) -> str:
    return f"ms:cons:{namespace}:pending"


def _cons_version(namespace: str) -> str:
    return f"ms:cons:{namespace}:version"


def _agent_settings(agent_id: str) -> str:
    return f"ms:agent:{agent_id}"


def _agent_sessions(agent_id: str) -> str:
    return f"ms:agent:{agent_id}:sessions"


def _user_sessions(agent_id: str, user_id: str) -> str:
    return f"ms:agent:{agent_id}:user:{user_id}:sessions"


def _generation(namespace: str) -> str:
    return f"ms:gen:{namespace}"


def _key_index(keys: list[str], key: str) -> int:
    """``key``'s 1-based index in ``keys`` (a Lua script's KEYS), appending it if new."""
    if key not in keys:
        keys.append(key)
    return keys.index(key) + 1


def _embed_due(agent_id: str) -> str:
    return f"ms:embed:{agent_id}:due"


def _embed_lock(agent_id: str) -> str:
    return f"ms:embed:{agent_id}:job"


@dataclass(frozen=True, slots=True)
class Reservation:
    sequence: int
    digest: str
    is_new: bool
    agent_settings: AgentSettings | None = None  # the agent's settings, read in the same step


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


class StateStore:
    def __init__(self, redis: Redis):
        self.redis = redis
        self._reserve = redis.register_script(_RESERVE)
        self._commit = redis.register_script(_COMMIT)
        self._complete = redis.register_script(_COMPLETE)
        self._claim = redis.register_script(_CLAIM)
        self._consolidated = redis.register_script(_CONSOLIDATED)
        self._embed_release = redis.register_script(_EMBED_RELEASE)

    @classmethod
    def from_url(cls, url: str) -> StateStore:
        return cls(Redis.from_url(url, decode_responses=True))

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    # Agents and shards -------------------------------------------------------------

    async def put_agent(self, agent_id: str, settings: AgentSettings) -> None:
        await self.redis.set(_agent_settings(agent_id), settings.model_dump_json())
        await self.bump(f"agent:{agent_id}")

    async def get_agent(self, agent_id: str) -> AgentSettings | None:
        raw = await self.redis.get(_agent_settings(agent_id))
        return AgentSettings.model_validate_json(raw) if raw else None

    async def put_shard(self, agent_id: str, shard_id: str, shard: ShardIn) -> bool:
        """Create or replace a shard's settings; True when it was created."""
        created = await self.redis.hset(f"ms:shards:{agent_id}", shard_id, shard.model_dump_json())
        await self.bump(f"agent:{agent_id}")
        return bool(created)

    async def shards(self, agent_id: str) -> dict[str, ShardIn]:
        raw = await self.redis.hgetall(f"ms:shards:{agent_id}")
        return {sid: ShardIn.model_validate_json(v) for sid, v in sorted(raw.items())}

    # Sessions ----------------------------------------------------------------------

    @staticmethod
    def _keys(session_id: str) -> dict[str, str]:
        base = f"ms:s:{session_id}"
        return {n: f"{base}:{n}" for n in ("meta", "ids", "pending", "tokens", "users", "committed", "claim")}

    async def reserve_message(self, session_id: str, agent_id: str, message_id: str, digest: str) -> Reservation:
        """Give a message id its sequence number in the session (the same one on a retry),
        and read the agent's settings in the same step."""
        k = self._keys(session_id)
        status, value, *rest = await self._reserve(
            keys=[k["meta"], k["ids"], _agent_sessions(agent_id), _agent_settings(agent_id)],
            args=[message_id, agent_id, digest, session_id])
        if status == "conflict":
            raise Conflict(f"session {session_id!r} belongs to agent {value!r}, not {agent_id!r}")
        seq_text, _, known_digest = value.partition(" ")
        settings = AgentSettings.model_validate_json(rest[0]) if rest and rest[0] else None
        return Reservation(sequence=int(seq_text), digest=known_digest, is_new=status == "new", agent_settings=settings)

    async def commit_message(
        self, session_id: str, message_id: str, sequence: int, weighted_tokens: float,
        speaker: str | None, incognito: bool, agent_id: str, embed_lock_ms: int = 0,
    ) -> Commit:
        """Make a stored message pending for formation, once; the session's counters after.

        With ``embed_lock_ms`` > 0 the message waits for its embedding: see ``_COMMIT``.
        """
        k = self._keys(session_id)
        first, embed, pending, meta = await self._commit(
            keys=[k["meta"], k["pending"], k["tokens"], k["users"], k["committed"], ACTIVE,
                  _user_sessions(agent_id, speaker or "-"), _generation(f"session:{session_id}"),
                  _generation(f"user:{agent_id}:{speaker or '-'}"), _embed_due(agent_id), _embed_lock(agent_id)],
            args=[message_id, sequence, f"{weighted_tokens:.3f}", speaker or "", f"{time.time():.3f}",
                  "1" if incognito else "0", session_id, int(embed_lock_ms)],
        )
        counters = SessionCounters.of(dict(zip(meta[::2], meta[1::2])), pending)
        return Commit(first=bool(first), counters=counters, enqueue_embedding=bool(embed))

    async def counters(self, session_id: str) -> SessionCounters:
        # commit_message answers with the same reads (its script's last line): keep them in step.
        k = self._keys(session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(k["meta"])
            pipe.zcard(k["pending"])
            meta, pending = await pipe.execute()
        return SessionCounters.of(meta, pending)

    # Embedding messages after they are recorded ------------------------------------

    async def start_embedding(self, agent_id: str) -> None:
        """An embedding job begins a pass: what is marked due from now on, it sees later."""
        await self.redis.delete(_embed_due(agent_id))

    async def renew_embedding_lock(self, agent_id: str, lock_ms: int) -> None:
        """Hold the agent's lock ``lock_ms`` more: a job still at work, or a failed embedder
        that the next record must not call again before then."""
        await self.redis.pexpire(_embed_lock(agent_id), lock_ms)

    async def finish_embedding(self, agent_id: str, lock_ms: int) -> bool:
        """Let go of the agent's embedding lock, unless messages were marked due meanwhile:
        then keep it (renewed) and answer True, and the job makes another pass."""
        return bool(await self._embed_release(keys=[_embed_due(agent_id), _embed_lock(agent_id)], args=[lock_ms]))


    async def claim_window(
        self, session_id: str, limit: int, min_messages: int = 1, message_interval: int = 0, token_interval: float = 0
    ) -> Claim | None:
        """The session's claimed window, or a new claim if none is and enough is pending.

        A new claim needs ``min_messages`` pending and, with a ``message_interval``, that
        many messages or ``token_interval`` weighted tokens. None if no window qualifies.
        """
        k = self._keys(session_id)
        row = await self._claim(keys=[k["meta"], k["pending"], k["claim"]],
                                args=[limit, min_messages, message_interval, token_interval])
        return Claim.of(session_id, *row) if row else None

    async def current_claim(self, session_id: str) -> Claim | None:
        raw = await self.redis.hgetall(self._keys(session_id)["claim"])
        return Claim.of(session_id, raw["window"], raw["ids"]) if raw else None

    async def complete_window(
        self, claim: Claim, consolidate: Sequence[tuple[str, str]] = (), written: Sequence[str] = ()
    ) -> int:
        """Finish ``claim`` if it is still the session's claim; -1 if it was finished before.

        In the same atomic step, ``consolidate`` (namespace, memory id) pairs are queued for
        consolidation, so that a retried window never queues an item twice, and the cached
        memory contexts reading the ``written`` namespaces are invalidated.
        """
        k = self._keys(claim.session_id)
        keys = [k["meta"], k["pending"], k["tokens"], k["claim"], ACTIVE]
        lists = {ns: _key_index(keys, _cons_list(ns)) for ns, _ in consolidate}
        args = [f"{lists[ns]}|{mid}" for ns, mid in consolidate]
        args += [f"+{_key_index(keys, _generation(ns))}" for ns in sorted(set(written))]
        return int(await self._complete(keys=keys, args=[claim.window, *args, claim.session_id]))

    async def idle_sessions(self, idle_before: float, limit: int = 1000) -> list[str]:
        """Sessions with pending messages whose last activity is older than ``idle_before``."""
        return list(await self.redis.zrangebyscore(ACTIVE, "-inf", idle_before, start=0, num=limit))

    # Consolidation -----------------------------------------------------------------

    async def consolidation_pending(self, namespace: str, limit: int = -1) -> list[str]:
        return list(await self.redis.lrange(_cons_list(namespace), 0, limit - 1 if limit > 0 else -1))

    async def consolidation_backlog(self, namespace: str) -> int:
        """How many items of ``namespace`` wait for consolidation."""
        return int(await self.redis.llen(_cons_list(namespace)))

    async def consolidation_version(self, namespace: str) -> int:
        return int(await self.redis.get(_cons_version(namespace)) or 0)

    async def finish_consolidation(self, namespace: str, version: int, merged: int) -> int:
        """Drop the ``merged`` oldest pending items and bump the version; -1 if another run did."""
        keys = [_cons_list(namespace), _cons_version(namespace), _generation(namespace)]
        return int(await self._consolidated(keys=keys, args=[version, merged]))

    # Metrics -----------------------------------------------------------------------

    async def add_metrics(self, **counters: float) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for name, value in counters.items():
                pipe.hincrbyfloat(METRICS, name, value)
            await pipe.execute()

    async def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in (await self.redis.hgetall(METRICS)).items()}

    async def agent_sessions(self, agent_id: str) -> list[str]:
        """Every session the agent has recorded in (for migration)."""
        return sorted(await self.redis.smembers(_agent_sessions(agent_id)))

    async def record_embedder(self, name: str, dimension: int) -> tuple[str, int] | None:
        """Remember which embedder filled the store; the one remembered before, if any."""
        key = "ms:embedder"
        if await self.redis.hsetnx(key, "dimension", dimension):
            await self.redis.hset(key, "name", name)
            return None
        stored = await self.redis.hgetall(key)
        return stored.get("name", "?"), int(stored["dimension"])

    async def user_sessions(self, agent_id: str, user_id: str) -> list[str]:
        """The sessions of ``agent_id`` in which ``user_id`` spoke (as role user)."""
        return sorted(await self.redis.smembers(_user_sessions(agent_id, user_id)))

    async def session_users(self, session_id: str) -> list[str]:
        return sorted(await self.redis.smembers(self._keys(session_id)["users"]))

    # Context cache -----------------------------------------------------------------

    async def bump(self, *namespaces: str) -> None:
        if namespaces:
            async with self.redis.pipeline(transaction=False) as pipe:
                for ns in namespaces:
                    pipe.incr(_generation(ns))
                await pipe.execute()

    async def generations(self, namespaces: Sequence[str]) -> list[int]:
        if not namespaces:
            return []
        return [int(v or 0) for v in await self.redis.mget([_generation(ns) for ns in namespaces])]

    async def cache_get(self, key: str) -> dict | None:
        raw = await self.redis.get(f"ms:ctx:{key}")
        return json.loads(raw) if raw else None

    async def cache_put(self, key: str, value: dict, ttl_seconds: int) -> None:
        if ttl_seconds > 0:
            await self.redis.set(f"ms:ctx:{key}", json.dumps(value), ex=ttl_seconds)
