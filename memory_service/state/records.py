"""Small JSON records in a Redis hash, each advanced by compare-and-set on its ``state``.

A forget (memory_service/curation/forget.py) and a window's re-formation
(memory_service/formation/reform.py) are multi-step changes that must finish exactly once
whatever crashes in between: each keeps its plan and the step it reached in a record, and
whoever finds the record (a retry, a later run) resumes at that step. Moving a record on
names the state it expects, so two processes racing on one record cannot both take a step:
the loser sees the record as the winner left it.
"""

from __future__ import annotations

import json
from typing import Any, cast

from redis.asyncio import Redis

# KEYS[1]: the hash; ARGV: field, expected state ('' = no record yet), new JSON ('' = delete).
# {1 if this call moved it, the record afterwards ('' if there is none)}.
_ADVANCE = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
local state = ''
if current then state = cjson.decode(current)['state'] or '' end
if state == ARGV[2] then
  if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
  return {1, ARGV[3]}
end
return {0, current or ''}
"""


class Records:
    """The records of one hash (one slot: the caller's key names its tag)."""

    def __init__(self, redis: Redis):
        self.redis = redis
        self._advance = redis.register_script(_ADVANCE)

    async def get(self, key: str, field: str) -> dict[str, Any] | None:
        raw = await self.redis.hget(key, field)
        return cast(dict[str, Any], json.loads(raw)) if raw else None

    async def all(self, key: str) -> dict[str, dict[str, Any]]:
        raw = cast(dict[str, str], await self.redis.hgetall(key))
        return {field: json.loads(value) for field, value in raw.items()}

    async def advance(self, key: str, field: str, expected: str,
                      record: dict[str, Any] | None) -> tuple[bool, dict[str, Any] | None]:
        """Store ``record`` (None: delete it) if the stored one is in state ``expected`` (""
        for none stored): (whether this call did, the record now: this call's, or the one
        it found)."""
        moved, raw = await self._advance(keys=[key], args=[field, expected,
                                                          json.dumps(record) if record is not None else ""])
        return bool(int(moved)), cast(dict[str, Any], json.loads(raw)) if raw else None
