"""Claims on embedding a stored memory: each vector made once, by whichever path claims first.

Three paths embed a message stored without its vector: the API process as it is recorded (a
live session's user message, memory_service/embedding/fresh.py), the agent's embedding job
and the backfill cron (memory_service/formation/pipeline.py), in as many processes as run.
Each reads memories marked ``needs_embedding`` and claims them here before it runs the model:
one key per memory (``keyspace.embed_claim``) holding the claimer's token, set only if absent,
with a lifetime (the lease, EMBEDDING_CLAIM_SECONDS). The claimer embeds what it got; the
others skip it.

- Before it writes the vectors (and between the embedder's calls of a long batch) the
  claimer renews its claims: only those still holding its token are renewed and written. A
  claim that expired meanwhile (a claimer slower than its lease) may be another's by now:
  its vector is dropped, not written a second time.
- After the write a claim is left to expire, not released: a reader that read the memory as
  unembedded just before the write (its read is stale) must find it claimed, not claim it
  again. A memory the claimer did not write (the embedder or the store failed) is released,
  claimable again at once.
- A claimer that dies between claim and write leaves its keys to expire: the memory is still
  marked ``needs_embedding``, and the next reader after the lease claims it. Nothing is lost.

No scan, whatever the number of agents and sessions: a claim is found by its memory id. An
agent's claims share its hash tag ``{embed:<agent>}`` (with its embedding mark and lock), so
each script names keys of one slot of a Redis Cluster; the agent's graph is one key on one
node anyway.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis

from memory_service.state import keyspace

# KEYS: claim keys; ARGV[1] the claimer's token, ARGV[2] the lease (ms). 1 for each key taken.
_CLAIM = """
local got = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2]) then got[i] = 1 else got[i] = 0 end
end
return got
"""

# KEYS: claim keys; ARGV[1] the claimer's token, ARGV[2] the lease (ms). Renews those still the
# claimer's; 1 for each.
_RENEW = """
local held = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    held[i] = 1
  else
    held[i] = 0
  end
end
return held
"""

# KEYS: claim keys; ARGV[1] the claimer's token. Deletes those still the claimer's.
_RELEASE = """
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then n = n + redis.call('DEL', key) end
end
return n
"""


@dataclass(frozen=True, slots=True)
class Claim:
    """What one claimer got: the memory ids it claimed (in the order asked), under its token."""

    agent_id: str
    token: str
    ids: tuple[str, ...]


class EmbedClaims:
    def __init__(self, redis: Redis, lease_seconds: float = 30.0):
        self.lease_ms = max(1, int(lease_seconds * 1000))
        self._redis = redis
        self._claim = redis.register_script(_CLAIM)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def claim(self, agent_id: str, memory_ids: Sequence[str]) -> Claim:
        """Claim the memories for this caller: those no one else holds now."""
        token = secrets.token_hex(8)
        ids = list(dict.fromkeys(memory_ids))
        if not ids:
            return Claim(agent_id, token, ())
        got = cast(list[Any], await self._claim(keys=self._keys(agent_id, ids), args=[token, self.lease_ms]))
        return Claim(agent_id, token, tuple(i for i, ok in zip(ids, got) if int(ok)))

    async def renew(self, claim: Claim, memory_ids: Sequence[str] | None = None) -> set[str]:
        """Renew the claim on ``memory_ids`` (all it holds by default) for a full lease; the ids
        still the caller's (one that expired may be another's now: do not write it)."""
        ids = list(claim.ids if memory_ids is None else memory_ids)
        if not ids:
            return set()
        held = cast(list[Any], await self._renew(keys=self._keys(claim.agent_id, ids), args=[claim.token, self.lease_ms]))
        return {i for i, ok in zip(ids, held) if int(ok)}

    async def release(self, claim: Claim, memory_ids: Sequence[str] | None = None) -> int:
        """Let go of the claim on ``memory_ids`` (all of it by default): memories it did not
        write, claimable again at once; how many it held."""
        ids = list(claim.ids if memory_ids is None else memory_ids)
        if not ids:
            return 0
        return int(await self._release(keys=self._keys(claim.agent_id, ids), args=[claim.token]))

    async def forget(self, agent_id: str, memory_ids: Sequence[str]) -> int:
        """Delete every claim on these memories, whoever holds it: they left the stores for
        good (a purge, an erasure), and a claim key names its memory. One slot (the agent's tag)."""
        ids = list(dict.fromkeys(memory_ids))
        return int(await self._redis.delete(*self._keys(agent_id, ids))) if ids else 0

    @staticmethod
    def _keys(agent_id: str, ids: Sequence[str]) -> list[str]:
        return [keyspace.embed_claim(agent_id, i) for i in ids]
