"""Startup records: what an agent must know from its first token, in priority order.

An agent keeps a few records (P0 identity, P1 operating rules, P2 behaviour, P3
reference). A *startup block* returns them within a character budget chosen by the model
name (STARTUP_MODEL_BUDGETS, matched as CONTEXT_MODEL_BUDGETS is), in one of three modes:

- ``always``: every call returns them;
- ``first-run``: only a session's first call does;
- ``digest``: a call returns them when what it would return differs from what was last
  returned to the session (the digest of the records kept).

Storage (Redis; the keys in memory_service/state/keyspace.py), and what grows with what:

- the agent's records (``keyspace.startup_records``): at most STARTUP_MAX_RECORDS records
  of at most STARTUP_MAX_RECORD_CHARS each, per agent;
- the digest last sent to a session (the session's ``startup`` key; first-run and digest
  modes only, ~70 bytes), expiring STARTUP_SESSION_TTL_SECONDS after the session's last
  block; deleted with the session.

A change of the records bumps the agent's generation, so every cached memory block of
the agent (which shows them in ``<StartupRecords>``) is read again.

Only a session some agent recorded messages in gets a remembered digest: a block for a
session nobody recorded in yet is sent every time and nothing is written, so callers
guessing ids cannot fill the store (as with the memory block's cache). A session of
another agent, or (for a key limited to some users) one none of them took part in, is
answered exactly as a session nobody recorded in (memory_service/access/reach.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Annotated, cast

from pydantic import AfterValidator
from redis.asyncio import Redis

from memory_service.access.reach import Reach
from memory_service.config import Settings
from memory_service.domain.errors import InvalidInput
from memory_service.domain.models import utcnow
from memory_service.domain.namespaces import validate_id
from memory_service.recall.render import budget_for_model
from memory_service.schemas.startup import DroppedRecord, StartupBlock, StartupMode, StartupRecord, StartupRecordIn
from memory_service.state import keyspace
from memory_service.state.cache import agent_wide, generation_key
from memory_service.state.store import StateStore

RecordId = Annotated[str, AfterValidator(lambda v: validate_id(v, "record_id"))]


# Put a record unless the agent is at its limit; bump the agent's generation (cached blocks).
_PUT = """
local known = redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
if not known and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('INCR', KEYS[2])
return known and 0 or 1
"""

# Whether to send the block to a session, remembering what was sent. ARGV: digest, mode,
# ttl seconds. first-run: send when nothing was sent; digest: when another digest was.
_SEND = """
local last = redis.call('GET', KEYS[1])
local send
if ARGV[2] == 'first-run' then send = not last else send = last ~= ARGV[1] end
if send then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
  return 1
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 0
"""


def fit(records: Sequence[StartupRecord], budget: int) -> tuple[list[StartupRecord], list[StartupRecord]]:
    """The records kept within ``budget`` and those dropped.

    Kept in priority order (P0 first), shortest first within a priority, each if it fits
    the room left: so records are dropped lowest priority first, then longest first. The
    kept ones come back ordered by priority, then id.
    """
    kept, dropped, used = [], [], 0
    for record in sorted(records, key=lambda r: (r.priority.rank, r.chars, r.id)):
        if used + record.chars <= budget:
            kept.append(record)
            used += record.chars
        else:
            dropped.append(record)
    dropped.sort(key=lambda r: (-r.priority.rank, -r.chars, r.id))
    return sorted(kept, key=_order), dropped


def _order(record: StartupRecord) -> tuple[int, str]:
    return record.priority.rank, record.id


def digest(records: Sequence[StartupRecord]) -> str:
    payload = [[r.id, r.priority.value, r.title, r.content] for r in records]
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()[:32]


class StartupRecords:
    """An agent's startup records in Redis, and the startup block of one call."""

    def __init__(self, settings: Settings, state: StateStore):
        self.settings, self.state = settings, state
        self.redis: Redis = state.redis
        self._put = self.redis.register_script(_PUT)
        self._send = self.redis.register_script(_SEND)

    def check(self, record: StartupRecordIn) -> None:
        limit = self.settings.startup_max_record_chars
        if len(record.content) > limit:
            raise InvalidInput(f"content is {len(record.content)} characters long; the limit is {limit} "
                               "(STARTUP_MAX_RECORD_CHARS)")

    async def list(self, agent_id: str) -> list[StartupRecord]:
        raw = cast(dict[str, str], await self.redis.hgetall(keyspace.startup_records(agent_id)))
        return sorted((StartupRecord.model_validate_json(v) for v in raw.values()), key=_order)

    async def get(self, agent_id: str, record_id: str) -> StartupRecord | None:
        raw = await self.redis.hget(keyspace.startup_records(agent_id), record_id)
        return StartupRecord.model_validate_json(cast(str, raw)) if raw else None

    async def put(self, agent_id: str, record_id: str, body: StartupRecordIn,
                  source: str | None = None) -> tuple[StartupRecord, StartupRecord | None, bool]:
        """Create or replace a record: (the record, the one it replaced, whether anything changed).

        The same record again changes nothing (not even its date): an import run twice is a no-op.
        """
        self.check(body)
        before = await self.get(agent_id, record_id)
        record = StartupRecord(**body.model_dump(), id=record_id, source=source, updated_at=utcnow())
        if before is not None and before.same_as(record):
            return before, before, False
        limit = self.settings.startup_max_records
        outcome = await self._put(keys=[keyspace.startup_records(agent_id), generation_key(agent_wide(agent_id))],
                                  args=[record_id, record.model_dump_json(), limit])
        if int(outcome) < 0:
            raise InvalidInput(f"agent {agent_id!r} already holds {limit} startup records, the limit "
                               "(STARTUP_MAX_RECORDS); delete one first")
        return record, before, True

    async def delete(self, agent_id: str, record_id: str) -> StartupRecord | None:
        """Remove a record; the one removed (None: there was none, and nothing changed)."""
        before = await self.get(agent_id, record_id)
        if before is not None and await self.redis.hdel(keyspace.startup_records(agent_id), record_id):
            await self.state.cache.bump(agent_wide(agent_id))
        return before

    async def room(self, agent_id: str) -> int:
        """How many more records the agent may hold."""
        return self.settings.startup_max_records - int(await self.redis.hlen(keyspace.startup_records(agent_id)))

    async def block(self, agent_id: str, model: str | None = None, session_id: str | None = None,
                    mode: StartupMode = StartupMode.ALWAYS, reach: Reach | None = None) -> StartupBlock:
        """The records for one call within the model's budget, and whether to send them (see the
        module doc). ``reach``: the caller's (default: all of the agent); a session it does not
        see is answered as an unknown one."""
        if session_id is None and mode is not StartupMode.ALWAYS:
            raise InvalidInput(f"session_id: mode {mode.value} needs the session the block is for")
        budget = budget_for_model(model, self.settings.startup_budget_chars, self.settings.startup_model_budgets)
        kept, dropped = fit(await self.list(agent_id), budget)
        current = digest(kept)
        sent = True
        if session_id is not None and mode is not StartupMode.ALWAYS:
            # Only a session the caller sees keeps a digest; any other is a session nobody recorded in.
            if await (reach or Reach(self.state, agent_id)).sees_session(session_id):
                key = keyspace.session_keys(session_id)["startup"]
                sent = bool(await self._send(keys=[key], args=[current, mode.value,
                                                               self.settings.startup_session_ttl_seconds]))
        shown = kept if sent else []
        return StartupBlock(
            records=shown, chars=sum(r.chars for r in shown), budget=budget, digest=current, sent=sent,
            dropped=[DroppedRecord(id=r.id, priority=r.priority, chars=r.chars) for r in dropped] if sent else [],
            mode=mode)
