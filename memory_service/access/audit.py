"""The audit log: who changed what, when, with the state before and after.

Append-only: entries are added to Redis streams and no route, command or job edits,
trims or deletes them (an operator with direct access to Redis can; the threat model in
docs/security.md says so). One stream per agent, so an agent's history is one range read, and a
system stream for changes that name no agent (operator keys): ``keyspace.audit_stream``
(memory_service/state/keyspace.py).

A stream id is its entry's time in milliseconds, so a time filter is a range read; the
other filters (action, key) are applied to what the range holds, scanning at most
AUDIT_SCAN_LIMIT entries per read. What grows: one entry per change of settings, shards,
keys, memories (curation, erasure) and migrations; recording messages is not a change of
this kind (each message is stored with its provenance) and is not logged here.

User ids are written as keyed digests (memory_service/access/pseudonyms.py), as they are
appended: in ``before``/``after`` (``user_id``, ``users``, ``user_ids``, user namespaces,
the users in a key's name) and in ``target`` (a user namespace; the erasure's target is
the digest itself). So an erasure has nothing to rewrite here, and the log still finds a
user's entries: ``read(user_id=...)`` digests the id and matches it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

from redis.asyncio import Redis

from memory_service.access.pseudonyms import Pseudonyms
from memory_service.domain.errors import InvalidInput, preview
from memory_service.domain.graph import Fact
from memory_service.schemas.audit import AuditEntry, AuditPage
from memory_service.state import keyspace

AUDIT_SCAN_LIMIT = 10_000  # entries one read looks at, whatever its filters
MAX_AUDIT_VALUE_CHARS = 20_000  # of a before/after value: an audit entry never carries a whole store


def audited_fact(fact: Fact) -> dict[str, Any]:
    """What the log keeps of a knowledge-graph fact (``fact.invalidate``, ``fact.restore``): its
    statement by ids and its times, never its words (the text stays in the graph, which the
    erasure of a user clears; the log is never rewritten)."""
    def iso(when: datetime | None) -> str | None:
        return when.isoformat() if when else None

    return {"id": fact.id, "namespace": fact.namespace, "subject_id": fact.subject_id, "predicate": fact.predicate,
            "object_id": fact.object_id, "valid_at": iso(fact.valid_at), "invalid_at": iso(fact.invalid_at),
            "expired_at": iso(fact.expired_at), "superseded_by": fact.superseded_by,
            **({"corrected_by": fact.corrected_by} if fact.corrected_by else {})}


def _bounded(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    if len(text) > MAX_AUDIT_VALUE_CHARS:  # keep it valid JSON: a cut string says it was cut
        text = json.dumps({"truncated": text[:MAX_AUDIT_VALUE_CHARS]}, ensure_ascii=False)
    return text


class AuditLog:
    """The log in Redis; ``redis`` decodes responses (the state store's client)."""

    def __init__(self, redis: Redis, pseudonyms: Pseudonyms | None = None):
        self.redis = redis
        self.pseudonyms = pseudonyms or Pseudonyms(redis)

    async def user_digest(self, agent_id: str, user_id: str) -> str:
        """How this log names user ``user_id`` of ``agent_id``."""
        return await self.pseudonyms.user(agent_id, user_id)

    async def append(self, key_id: str, action: str, agent_id: str | None = None, target: str | None = None,
                     before: Any = None, after: Any = None) -> str:
        scrub = self.pseudonyms.scrub
        fields = {"key_id": key_id, "action": action, "agent_id": agent_id or "",
                  "target": await scrub(agent_id, target or ""),
                  "before": _bounded(await scrub(agent_id, before)), "after": _bounded(await scrub(agent_id, after))}
        return str(await self.redis.xadd(keyspace.audit_stream(agent_id), fields))  # type: ignore[arg-type]

    async def append_each(self, key_id: str, action: str, agents: list[str] | None, target: str | None = None,
                          before: Any = None, after: Any = None) -> None:
        """The same change in the log of each agent it concerns (the system's for None: every agent)."""
        concerned: list[str | None] = list(agents) if agents else [None]
        for agent_id in concerned:
            await self.append(key_id, action, agent_id, target, before, after)

    async def read(self, agent_id: str | None, *, action: str | None = None, key_id: str | None = None,
                   user_id: str | None = None, since: datetime | None = None, until: datetime | None = None,
                   before: str | None = None, limit: int = 100, target: str | None = None) -> AuditPage:
        """Entries of ``agent_id`` (None: the system stream), newest first, filtered;
        ``user_id``: the entries naming that user (by its digest: the agent's log only);
        ``target``: the entries about that target (a memory's id: its history)."""
        if user_id is not None and agent_id is None:
            raise InvalidInput("user_id: a user is named per agent; give agent_id too")
        digest = await self.user_digest(agent_id, user_id) if user_id is not None and agent_id else None
        high = _older_than(before) if before else (_ms(until) if until else "+")
        low = _ms(since) if since else "-"
        if high is None:  # nothing is older than the first possible entry
            return AuditPage(entries=[], next=None, scanned=0)
        entries: list[AuditEntry] = []
        scanned, cursor, next_id = 0, high, cast(str | None, None)
        while len(entries) < limit and scanned < AUDIT_SCAN_LIMIT:
            wanted = min(500, AUDIT_SCAN_LIMIT - scanned)
            batch = cast(list[tuple[str, dict[str, str]]],
                         await self.redis.xrevrange(keyspace.audit_stream(agent_id), cursor, low, count=wanted))
            if not batch:
                next_id = None
                break
            for raw_id, raw in batch:
                scanned += 1
                entry = _entry(raw_id, raw)
                next_id = entry.id
                if ((action is None or entry.action == action) and (key_id is None or entry.key_id == key_id)
                        and (target is None or entry.target == target)
                        and (digest is None or any(digest in raw[f] for f in ("target", "before", "after")))):
                    entries.append(entry)
                    if len(entries) == limit:
                        break
            older = _older_than(next_id) if next_id else None
            if older is None:
                next_id = None
                break
            cursor = older
            if len(batch) < wanted and len(entries) < limit:  # the range is read to its end
                next_id = None
                break
        return AuditPage(entries=entries, next=next_id, scanned=scanned)


_MAX_ID_PART = 2**64 - 1


def _older_than(entry_id: str) -> str | None:
    """The newest stream id before ``entry_id`` (None: there is none): Redis refuses an
    exclusive bound of 0-0, and one past 64 bits."""
    ms_text, _, seq_text = entry_id.partition("-")
    try:
        ms, seq = int(ms_text), int(seq_text or 0)
    except ValueError:
        raise InvalidInput(f"before: not an audit entry id: {preview(entry_id)}") from None
    if not (0 <= ms <= _MAX_ID_PART and 0 <= seq <= _MAX_ID_PART):
        raise InvalidInput(f"before: not an audit entry id: {preview(entry_id)}")
    if seq > 0:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{_MAX_ID_PART}" if ms > 0 else None


def _ms(moment: datetime) -> str:
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return str(max(0, int(aware.timestamp() * 1000)))


def _entry(entry_id: str, raw: dict[str, str]) -> AuditEntry:
    return AuditEntry(
        id=entry_id, at=datetime.fromtimestamp(int(entry_id.split("-")[0]) / 1000, UTC), key_id=raw["key_id"],
        action=raw["action"], agent_id=raw["agent_id"] or None, target=raw["target"] or None,
        before=json.loads(raw["before"]), after=json.loads(raw["after"]),
    )
