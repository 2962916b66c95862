"""Rate limits per agent, across every key of the agent and every API replica.

A key's limits (memory_service/access/keys.py) bound what one key sends; an agent with ten
keys, or a client that makes itself more keys, sends ten times that, and the admission
share (memory_service/http/overload.py) is per process. So an agent also has limits of its
own: AGENT_REQUESTS_PER_MINUTE requests and AGENT_TOKENS_PER_MINUTE recorded tokens per
minute, whichever key and replica they come through (0: no limit). They are counted in
Redis with the keys' sliding window (one script a charge, ``keys.CHARGE``) and answered
429 with Retry-After, like a key's:

- a request is counted to an agent when admission has put it in that agent's lane (its
  key's one agent, or the agent its path or query names that the key reaches), before it
  takes a slot, so a refused request holds nothing and did nothing;
- recorded tokens are counted with the key's, before anything is recorded (the agent's
  first: a request the agent's limit refuses spends nothing of the key's).

Every caller is counted, keyless ones and the operator's key too; a request without an
agent (listing agents, the keys' routes, a key of several agents naming none) is counted to
no agent.
"""

from __future__ import annotations

import time

from redis.asyncio import Redis

from memory_service.access.keys import CHARGE
from memory_service.domain.errors import RateLimited
from memory_service.state import keyspace

# KEYS: this and the previous minute's counters. ARGV: amount, now (ms), limit.
_CHARGE_AGENT = CHARGE + """
return charge(KEYS[1], KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[1]), tonumber(ARGV[2]))
"""

WHAT = {"r": "requests", "t": "recorded tokens"}


class AgentLimits:
    """Requests and recorded tokens per minute per agent, shared by every replica."""

    def __init__(self, redis: Redis, requests_per_minute: int = 0, tokens_per_minute: int = 0):
        self.redis = redis
        self.limits = {"r": requests_per_minute, "t": tokens_per_minute}
        self._charge = redis.register_script(_CHARGE_AGENT)

    @property
    def counts_requests(self) -> bool:
        return self.limits["r"] > 0

    async def charge_request(self, agent_id: str) -> None:
        """Count one request of ``agent_id``; RateLimited when its minute's are spent."""
        await self._charge_kind(agent_id, "r", 1)

    async def charge_tokens(self, agent_id: str, tokens: int) -> None:
        """Count ``tokens`` recorded for ``agent_id``; RateLimited when its minute's are spent."""
        await self._charge_kind(agent_id, "t", tokens)

    async def _charge_kind(self, agent_id: str, kind: str, amount: int) -> None:
        limit = self.limits[kind]
        if limit <= 0 or amount <= 0:
            return
        now_ms = int(time.time() * 1000)
        minute = now_ms // 60_000
        allowed, retry_after = await self._charge(
            keys=[keyspace.agent_rate_counter(agent_id, kind, minute),
                  keyspace.agent_rate_counter(agent_id, kind, minute - 1)],
            args=[amount, now_ms, limit])
        if not int(allowed):
            raise RateLimited(f"agent {agent_id[:100]} is over its {WHAT[kind]} per minute (AGENT_"
                              f"{'REQUESTS' if kind == 'r' else 'TOKENS'}_PER_MINUTE, every key of the agent "
                              "counted)", int(retry_after))
