"""Control state in Redis: agents, shards, per-session counters and the formation cursor.

Everything that more than one process may change at once is updated atomically, by a
single command or a Lua script; nothing here reads a whole document, edits it and writes
it back. Memories themselves live in a backend, not here.

Keys (all under ``ms:``; ids never contain ':' so keys are unambiguous):
  ms:agent:<agent>               JSON AgentSettings
  ms:shards:<agent>              hash shard_id -> JSON ShardIn
  ms:s:<session>:meta            hash: agent_id, next_seq, pending_tokens, cursor,
                                 formed_windows, formed_messages, incognito, last_activity
  ms:s:<session>:ids             hash message_id -> "<seq> <content digest>"
  ms:s:<session>:pending         zset message_id -> seq, recorded but not yet formed
  ms:s:<session>:tokens          hash message_id -> weighted tokens, while pending
  ms:s:<session>:users           set of user ids who spoke in the session
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

# Reserve a sequence number for a message id, or return the one it already has.
_RESERVE = """
local owner = redis.call('HGET', KEYS[1], 'agent_id')
if owner and owner ~= ARGV[2] then return {'conflict', owner} end
local known = redis.call('HGET', KEYS[2], ARGV[1])
if known then return {'known', known} end
if not owner then redis.call('HSET', KEYS[1], 'agent_id', ARGV[2]) end
local seq = redis.call('HINCRBY', KEYS[1], 'next_seq', 1)
local value = seq .. ' ' .. ARGV[3]
redis.call('HSET', KEYS[2], ARGV[1], value)
return {'new', value}
"""

# Mark a stored message pending (once) and return the gate counters.
_COMMIT = """
local first = redis.call('SADD', KEYS[5], ARGV[1]) == 1
if first then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  redis.call('HINCRBYFLOAT', KEYS[1], 'pending_tokens', ARGV[3])
  if ARGV[4] ~= '' then redis.call('SADD', KEYS[4], ARGV[4]) end
  if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'incognito', '1') end
end
redis.call('HSET', KEYS[1], 'last_activity', ARGV[5])
return first and 1 or 0
"""

# Finish a window: take its messages off the pending set exactly once, advance the cursor.
_COMPLETE = """
local removed, tokens = 0, 0
for i = 2, #ARGV do
  if redis.call('ZREM', KEYS[2], ARGV[i]) == 1 then
    removed = removed + 1
    tokens = tokens + tonumber(redis.call('HGET', KEYS[3], ARGV[i]) or '0')
    redis.call('HDEL', KEYS[3], ARGV[i])
  end
end
if removed > 0 then
  redis.call('HINCRBYFLOAT', KEYS[1], 'pending_tokens', -tokens)
  redis.call('HINCRBY', KEYS[1], 'formed_windows', 1)
  redis.call('HINCRBY', KEYS[1], 'formed_messages', removed)
  local cursor = tonumber(redis.call('HGET', KEYS[1], 'cursor') or '0')
  if tonumber(ARGV[1]) > cursor then redis.call('HSET', KEYS[1], 'cursor', ARGV[1]) end
end
return removed
"""


@dataclass(frozen=True, slots=True)
class Reservation:
    sequence: int
    digest: str
    is_new: bool


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


class StateStore:
    def __init__(self, redis: Redis):
        self.redis = redis
        self._reserve = redis.register_script(_RESERVE)
        self._commit = redis.register_script(_COMMIT)
        self._complete = redis.register_script(_COMPLETE)

    @classmethod
    def from_url(cls, url: str) -> StateStore:
        return cls(Redis.from_url(url, decode_responses=True))

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    # Agents and shards -------------------------------------------------------------

    async def put_agent(self, agent_id: str, settings: AgentSettings) -> None:
        await self.redis.set(f"ms:agent:{agent_id}", settings.model_dump_json())
        await self.bump(f"agent:{agent_id}")

    async def get_agent(self, agent_id: str) -> AgentSettings | None:
        raw = await self.redis.get(f"ms:agent:{agent_id}")
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
        return {n: f"{base}:{n}" for n in ("meta", "ids", "pending", "tokens", "users", "committed")}

    async def reserve_message(self, session_id: str, agent_id: str, message_id: str, digest: str) -> Reservation:
        """Give a message id its sequence number in the session (the same one on a retry)."""
        k = self._keys(session_id)
        status, value = await self._reserve(keys=[k["meta"], k["ids"]], args=[message_id, agent_id, digest])
        if status == "conflict":
            raise Conflict(f"session {session_id!r} belongs to agent {value!r}, not {agent_id!r}")
        seq_text, _, known_digest = value.partition(" ")
        return Reservation(sequence=int(seq_text), digest=known_digest, is_new=status == "new")

    async def commit_message(
        self, session_id: str, message_id: str, sequence: int, weighted_tokens: float,
        speaker: str | None, incognito: bool,
    ) -> bool:
        """Make a stored message pending for formation; False if it already was (a retry)."""
        k = self._keys(session_id)
        first = await self._commit(
            keys=[k["meta"], k["pending"], k["tokens"], k["users"], k["committed"]],
            args=[message_id, sequence, f"{weighted_tokens:.3f}", speaker or "", f"{time.time():.3f}", "1" if incognito else "0"],
        )
        return bool(first)

    async def counters(self, session_id: str) -> SessionCounters:
        k = self._keys(session_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(k["meta"])
            pipe.zcard(k["pending"])
            meta, pending = await pipe.execute()
        return SessionCounters(
            agent_id=meta.get("agent_id"),
            pending_messages=int(pending),
            pending_tokens=max(0.0, float(meta.get("pending_tokens", 0))),
            cursor=int(meta.get("cursor", 0)),
            formed_windows=int(meta.get("formed_windows", 0)),
            formed_messages=int(meta.get("formed_messages", 0)),
            incognito=meta.get("incognito") == "1",
            last_activity=float(meta["last_activity"]) if "last_activity" in meta else None,
        )

    async def pending_window(self, session_id: str, limit: int) -> list[tuple[str, int]]:
        """The oldest ``limit`` pending message ids with their sequence numbers."""
        rows = await self.redis.zrange(self._keys(session_id)["pending"], 0, limit - 1, withscores=True)
        return [(mid, int(score)) for mid, score in rows]

    async def complete_window(self, session_id: str, last_sequence: int, message_ids: Sequence[str]) -> int:
        """Take a formed window off the pending set; returns how many messages this call removed."""
        k = self._keys(session_id)
        return int(await self._complete(keys=[k["meta"], k["pending"], k["tokens"]], args=[last_sequence, *message_ids]))

    async def session_users(self, session_id: str) -> list[str]:
        return sorted(await self.redis.smembers(self._keys(session_id)["users"]))

    # Context cache -----------------------------------------------------------------

    async def bump(self, *namespaces: str) -> None:
        if namespaces:
            async with self.redis.pipeline(transaction=False) as pipe:
                for ns in namespaces:
                    pipe.incr(f"ms:gen:{ns}")
                await pipe.execute()

    async def generations(self, namespaces: Sequence[str]) -> list[int]:
        if not namespaces:
            return []
        return [int(v or 0) for v in await self.redis.mget([f"ms:gen:{ns}" for ns in namespaces])]

    async def cache_get(self, key: str) -> dict | None:
        raw = await self.redis.get(f"ms:ctx:{key}")
        return json.loads(raw) if raw else None

    async def cache_put(self, key: str, value: dict, ttl_seconds: int) -> None:
        if ttl_seconds > 0:
            await self.redis.set(f"ms:ctx:{key}", json.dumps(value), ex=ttl_seconds)
