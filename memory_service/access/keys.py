"""API keys: created, listed, revoked and checked, stored hashed in Redis.

A key reads ``msk_<key id>_<secret>``. Only the SHA-256 of the secret is stored (the secret
is 256 random bits, so a fast hash is as safe as a slow one here, and checking costs
nothing); the whole key is shown once, when it is created.

A key has a role (``read`` < ``write`` < ``admin``) over a scope: the agents it names
(optionally only some users of its one agent), or every agent (an operator key). Checking
a key and counting the request against the key's rate limit is one script, one round trip:
a wrong secret is refused before it counts, so nobody can spend another key's budget by
guessing at it.

Layout (memory_service/state/keyspace.py; it grows with the number of keys, never with
traffic): a hash per key (its record; ``hash`` is the secret's SHA-256), the set of every
key id (an operator's list), a set per agent of the keys naming it (its admins' list), and
request and token counters per key and minute, expiring after two. The key id is the hash
tag of a key's record and counters, so they are on one cluster slot.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from redis.asyncio import Redis

from memory_service.access.pseudonyms import name_without
from memory_service.domain.errors import NotFound, RateLimited
from memory_service.schemas.keys import ApiKey, KeyIn, NewKey, Role
from memory_service.state import keyspace

KEY_PREFIX = "msk_"
KEY_ID_BYTES = 8  # 16 hex digits: unique among keys, shown in lists and the audit log
SECRET_BYTES = 32
LOCAL_KEY_ID = "local"  # the keyless caller of a development server on loopback
OPERATOR_KEY_ID = "operator"  # the key of OPERATOR_API_KEY


@dataclass(frozen=True)
class Principal:
    """Who is calling: a key's id, role and scope."""

    key_id: str
    role: Role
    agents: frozenset[str] | None  # None: every agent
    users: frozenset[str] | None = None  # None: every user of its agents
    # The key's recorded tokens per minute as its check read them (its own, else the
    # default; 0: no limit), so that a record with no limit to count against skips the
    # charge's round trip; None: not read (``charge_tokens`` asks Redis).
    token_limit: int | None = field(default=None, compare=False)

    @property
    def is_operator(self) -> bool:
        return self.agents is None and self.role is Role.ADMIN

    def reaches(self, agent_id: str) -> bool:
        return self.agents is None or agent_id in self.agents

    def allows(self, role: Role, agent_id: str, user_id: str | None = None) -> bool:
        """Whether this key may act as ``role`` on ``agent_id`` (for ``user_id``, if given)."""
        if role.rank > self.role.rank or not self.reaches(agent_id):
            return False
        return self.users is None or (user_id is not None and user_id in self.users)

    def covers(self, scope: KeyIn) -> bool:
        """Whether this key may create a key of ``scope``: never more than it holds itself."""
        if self.role is not Role.ADMIN or scope.role.rank > self.role.rank:
            return False
        if self.agents is not None and (scope.agents is None or not set(scope.agents) <= self.agents):
            return False
        return self.users is None or (scope.users is not None and set(scope.users) <= self.users)


LOCAL = Principal(LOCAL_KEY_ID, Role.ADMIN, None)
OPERATOR = Principal(OPERATOR_KEY_ID, Role.ADMIN, None)

# A sliding window over two fixed minutes: the previous minute counts in proportion to how
# much of it is still inside the last 60 s. Answers {allowed, retry-after seconds}. Also the
# agents' limits' (memory_service/access/agent_limits.py).
CHARGE = """
local function charge(current, previous, limit, amount, now_ms)
  if limit <= 0 then return {1, 0} end
  local elapsed = (now_ms % 60000) / 60000
  local cur = tonumber(redis.call('GET', current) or '0')
  local prev = tonumber(redis.call('GET', previous) or '0')
  local used = prev * (1 - elapsed) + cur
  if used + amount > limit then
    local wait
    if cur + amount > limit then
      wait = (1 - elapsed) * 60
    else
      wait = ((1 - (limit - cur - amount) / prev) - elapsed) * 60
    end
    return {0, math.max(1, math.ceil(wait))}
  end
  redis.call('INCRBY', current, amount)
  redis.call('PEXPIRE', current, 120000)
  return {1, 0}
end
"""

# KEYS: record, this minute's and the previous minute's request counters.
# ARGV: secret hash, now (ms), default requests per minute.
# Answers {status, allowed, retry_after, record...}: status "ok", "unknown" (no such key
# or a wrong secret: the same answer) or "revoked".
_AUTHENTICATE = CHARGE + """
local record = redis.call('HGETALL', KEYS[1])
if #record == 0 then return {'unknown'} end
local fields = {}
for i = 1, #record, 2 do fields[record[i]] = record[i + 1] end
if fields['hash'] ~= ARGV[1] then return {'unknown'} end
if fields['revoked_at'] and fields['revoked_at'] ~= '' then return {'revoked'} end
local limit = tonumber(ARGV[3])
if fields['requests_per_minute'] and fields['requests_per_minute'] ~= '' then
  limit = tonumber(fields['requests_per_minute'])
end
local decision = charge(KEYS[2], KEYS[3], limit, 1, tonumber(ARGV[2]))
return {'ok', decision[1], decision[2], fields['role'], fields['agents'] or '', fields['users'] or '',
        fields['tokens_per_minute'] or ''}
"""

# KEYS: record, this and the previous minute's token counters. ARGV: tokens, now (ms), default.
_CHARGE_TOKENS = CHARGE + """
local limit = tonumber(ARGV[3])
local own = redis.call('HGET', KEYS[1], 'tokens_per_minute')
if own and own ~= '' then limit = tonumber(own) end
return charge(KEYS[2], KEYS[3], limit, tonumber(ARGV[1]), tonumber(ARGV[2]))
"""


def _window_keys(key_id: str, kind: str, now_ms: int) -> list[str]:
    """The counters of this minute and the previous one."""
    minute = now_ms // 60_000
    return [keyspace.rate_counter(key_id, kind, minute), keyspace.rate_counter(key_id, kind, minute - 1)]


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_key(token: str) -> tuple[str, str] | None:
    """``(key id, secret)`` of a well-formed key, else None."""
    if not token.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = token[len(KEY_PREFIX):].partition("_")
    if not sep or len(key_id) != 2 * KEY_ID_BYTES or not secret or len(secret) > 100:
        return None
    if any(c not in "0123456789abcdef" for c in key_id):
        return None
    return key_id, secret


class KeyStore:
    """Keys in Redis; ``redis`` decodes responses (the state store's client)."""

    def __init__(self, redis: Redis, requests_per_minute: int = 0, tokens_per_minute: int = 0,
                 operator_key: str | None = None):
        self.redis = redis
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self._operator_digest = _digest(operator_key) if operator_key else None
        self._authenticate = redis.register_script(_AUTHENTICATE)
        self._charge_tokens = redis.register_script(_CHARGE_TOKENS)

    async def create(self, spec: KeyIn, created_by: str) -> NewKey:
        key_id = secrets.token_hex(KEY_ID_BYTES)
        secret = secrets.token_urlsafe(SECRET_BYTES)
        stored = ApiKey(key_id=key_id, created_at=datetime.now(UTC), created_by=created_by, **spec.model_dump())
        record: dict[str | bytes, str] = {
            "hash": _digest(secret), "name": stored.name, "role": stored.role.value,
            "agents": json.dumps(stored.agents) if stored.agents is not None else "",
            "users": json.dumps(stored.users) if stored.users is not None else "",
            "requests_per_minute": "" if stored.requests_per_minute is None else str(stored.requests_per_minute),
            "tokens_per_minute": "" if stored.tokens_per_minute is None else str(stored.tokens_per_minute),
            "created_at": stored.created_at.isoformat(), "created_by": created_by, "revoked_at": "",
        }
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(keyspace.api_key(key_id), mapping=cast(dict[Any, Any], record))  # redis-py's mapping type is invariant
            pipe.sadd(keyspace.API_KEYS, key_id)
            for agent_id in stored.agents or ():
                pipe.sadd(keyspace.agent_api_keys(agent_id), key_id)
            await pipe.execute()
        return NewKey(**stored.model_dump(), key=f"{KEY_PREFIX}{key_id}_{secret}")

    async def get(self, key_id: str) -> ApiKey:
        raw = cast(dict[str, str], await self.redis.hgetall(keyspace.api_key(key_id))) if _is_key_id(key_id) else {}
        if not raw:
            raise NotFound(f"no key {key_id!r}")
        return _parse(key_id, raw)

    async def list(self, principal: Principal) -> list[ApiKey]:
        """The keys whose whole scope lies within ``principal``'s, newest first: every key for
        an operator, else the keys of its agents (read from their index, not from all keys)."""
        if principal.agents is None:
            ids = cast(set[str], await self.redis.smembers(keyspace.API_KEYS))
        else:
            ids = cast(set[str], await self.redis.sunion([keyspace.agent_api_keys(a) for a in sorted(principal.agents)]))
        async with self.redis.pipeline(transaction=False) as pipe:
            for key_id in sorted(ids):
                pipe.hgetall(keyspace.api_key(key_id))
            records = cast(list[dict[str, str]], await pipe.execute())
        keys = [_parse(key_id, raw)
                for key_id, raw in zip(sorted(ids), records, strict=True) if raw]
        return sorted((k for k in keys if principal.covers(k)), key=lambda k: k.created_at, reverse=True)

    async def revoke(self, key_id: str) -> tuple[ApiKey, bool]:
        """Revoke a key (idempotent): ``(the key, whether this call revoked it)``."""
        key = await self.get(key_id)
        if key.revoked_at is not None:
            return key, False
        now = datetime.now(UTC)
        await self.redis.hset(keyspace.api_key(key_id), "revoked_at", now.isoformat())
        return key.model_copy(update={"revoked_at": now}), True

    async def forget_user(self, agent_id: str, user_id: str, digest: str) -> Sequence[tuple[ApiKey, ApiKey]]:
        """An erasure's part: every key of the agent limited to ``user_id`` no longer names it.
        A key for that user alone is revoked and keeps ``digest`` in its place (its record
        still says it was one user's); a key for others too loses the user. The user's id
        also leaves the keys' names. ``(before, after)`` of each key changed."""
        ids = sorted(cast(set[str], await self.redis.smembers(keyspace.agent_api_keys(agent_id))))
        async with self.redis.pipeline(transaction=False) as pipe:
            for key_id in ids:
                pipe.hgetall(keyspace.api_key(key_id))
            records = cast(list[dict[str, str]], await pipe.execute())
        changed: list[tuple[ApiKey, ApiKey]] = []
        for key_id, raw in zip(ids, records, strict=True):
            if not raw or user_id not in (json.loads(raw["users"]) if raw.get("users") else []):
                continue
            key = _parse(key_id, raw)
            others = [u for u in key.users or () if u != user_id]
            name = name_without(key.name, [user_id], "[erased user]")[:120]
            update: dict[str | bytes, str] = {"users": json.dumps(others or [digest]), "name": name}
            if not others and key.revoked_at is None:
                update["revoked_at"] = datetime.now(UTC).isoformat()
            await self.redis.hset(keyspace.api_key(key_id), mapping=cast(dict[Any, Any], update))
            changed.append((key, await self.get(key_id)))
        return changed

    async def any_key(self) -> bool:
        return bool(self._operator_digest) or bool(await self.redis.scard(keyspace.API_KEYS))

    async def authenticate(self, token: str) -> Principal | str:
        """The key's principal, counting one request against its rate limit; else why not
        (a sentence the same for an unknown key and a wrong secret). Raises RateLimited."""
        if self._operator_digest and hmac.compare_digest(_digest(token), self._operator_digest):
            return OPERATOR
        parts = split_key(token)
        if parts is None:
            return "malformed API key: expected 'msk_<key id>_<secret>'"
        key_id, secret = parts
        now_ms = int(time.time() * 1000)
        answer = await self._authenticate(keys=[keyspace.api_key(key_id), *_window_keys(key_id, "r", now_ms)],
                                          args=[_digest(secret), now_ms, self.requests_per_minute])
        status = answer[0]
        if status == "unknown":
            return "unknown API key"
        if status == "revoked":
            return "this API key was revoked"
        if not int(answer[1]):
            raise RateLimited(f"key {key_id} is over its requests per minute", int(answer[2]))
        agents, users, tokens = answer[4], answer[5], answer[6]
        return Principal(key_id, Role(answer[3]),
                         frozenset(json.loads(agents)) if agents else None,
                         frozenset(json.loads(users)) if users else None,
                         token_limit=int(tokens) if tokens else self.tokens_per_minute)

    async def charge_tokens(self, principal: Principal, tokens: int) -> None:
        """Count recorded tokens against the key's limit; RateLimited when they are spent.
        Nothing is counted for a key without a limit (``Principal.token_limit`` 0)."""
        if principal.key_id in (LOCAL_KEY_ID, OPERATOR_KEY_ID) or tokens <= 0 or principal.token_limit == 0:
            return
        now_ms = int(time.time() * 1000)
        allowed, retry_after = await self._charge_tokens(
            keys=[keyspace.api_key(principal.key_id), *_window_keys(principal.key_id, "t", now_ms)],
            args=[tokens, now_ms, self.tokens_per_minute])
        if not int(allowed):
            raise RateLimited(f"key {principal.key_id} is over its recorded tokens per minute", int(retry_after))


def _is_key_id(key_id: str) -> bool:
    return len(key_id) == 2 * KEY_ID_BYTES and all(c in "0123456789abcdef" for c in key_id)


def _parse(key_id: str, raw: dict[str, str]) -> ApiKey:
    def number(field: str) -> int | None:
        return int(raw[field]) if raw.get(field) else None

    def listed(field: str) -> Sequence[str] | None:
        return json.loads(raw[field]) if raw.get(field) else None

    data: dict[str, Any] = {
        "key_id": key_id, "name": raw["name"], "role": raw["role"], "agents": listed("agents"),
        "users": listed("users"), "requests_per_minute": number("requests_per_minute"),
        "tokens_per_minute": number("tokens_per_minute"), "created_at": raw["created_at"],
        "created_by": raw["created_by"], "revoked_at": raw.get("revoked_at") or None,
    }
    return ApiKey.model_validate(data)
