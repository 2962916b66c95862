"""Each agent's change events: appended where memories change, read by hosts as a stream.

One Redis Stream per agent (``keyspace.event_stream``, on the agent's ``{ev:<agent>}``
slot), capped at about EVENTS_STREAM_MAXLEN entries (``XADD MAXLEN ~``: Redis trims whole
nodes, cheaply). The entry id is the event's id: Redis makes it increase within the stream,
so an agent's events are totally ordered and a reader resumes after the last id it saw.

Emitted by the facade's memory tools (memory_service/service.py), formation's write step
(memory_service/formation/steps.py), the knowledge graph's closing of facts
(memory_service/formation/graph_update.py), the retention job and the erasure. A change is
emitted after the store took it, before the step is marked done where a step can be retried
(formation): so an event may be emitted twice (a window's write step retried after a
crash), never lost. A host de-duplicates on the event id, and on (type, memory id) for a
retried window.

One event per namespace and kind a change touched: what a reader may see is decided per
namespace (``visible``), as everywhere (memory_service/access/reach.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import WatchError

from memory_service.access.reach import Reach
from memory_service.domain.models import Memory
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.schemas.events import Event, EventType
from memory_service.state import keyspace


@dataclass(frozen=True)
class Cause:
    """What made a change: an API key, a formed window (session and window number), a job's reason."""

    key_id: str | None = None
    session_id: str | None = None
    window: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Changed:
    """Things of one namespace and kind that changed (memories, or facts for superseded)."""

    namespace: str | None
    kind: str | None
    ids: tuple[str, ...]


def grouped(memories: Sequence[Memory]) -> list[Changed]:
    """``memories`` by namespace and kind, in the order first seen."""
    groups: dict[tuple[str, str], list[str]] = {}
    for memory in memories:
        groups.setdefault((memory.namespace, memory.kind.value), []).append(memory.id)
    return [Changed(ns, kind, tuple(dict.fromkeys(ids))) for (ns, kind), ids in groups.items()]


def _user_of(namespace: str | None) -> str | None:
    if not namespace:
        return None
    try:
        parsed = Namespace.parse(namespace)
    except Exception:  # written by the service: always parses; a bad one names no user
        return None
    return parsed.fields[1] if parsed.kind is NamespaceKind.USER else None


class EventLog:
    """``redis``: the state store's client (decoding responses); ``maxlen``: EVENTS_STREAM_MAXLEN."""

    def __init__(self, redis: Redis, maxlen: int):
        self.redis, self.maxlen = redis, maxlen

    async def emit(self, agent_id: str, type_: EventType, changes: Sequence[Changed], cause: Cause = Cause()) -> list[str]:
        """Append one event per group of ``changes`` (none for no changes); their ids, in order."""
        changes = [c for c in changes if c.ids or type_ is EventType.ERASED]
        if not changes:
            return []
        key = keyspace.event_stream(agent_id)
        async with self.redis.pipeline(transaction=True) as pipe:  # one key: one slot
            for change in changes:
                fields = {"type": type_.value, "ids": json.dumps(list(change.ids)), "kind": change.kind or "",
                          "namespace": change.namespace or "", "user_id": _user_of(change.namespace) or "",
                          "session_id": cause.session_id or "", "window": "" if cause.window is None else str(cause.window),
                          "key_id": cause.key_id or "", "reason": cause.reason or ""}
                pipe.xadd(key, fields, maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            return [str(i) for i in await pipe.execute()]

    async def emit_memories(self, agent_id: str, type_: EventType, memories: Sequence[Memory],
                            cause: Cause = Cause()) -> list[str]:
        return await self.emit(agent_id, type_, grouped(memories), cause)

    async def read(self, agent_id: str, after: str, count: int, client: Redis | None = None,
                   block_ms: int | None = None) -> list[Event]:
        """Up to ``count`` events after ``after`` ("0": from the oldest kept), oldest first;
        ``block_ms``: wait that long for one (XREAD BLOCK, on ``client``: a connection held
        while waiting, so the caller's own pool)."""
        redis = client or self.redis
        key = keyspace.event_stream(agent_id)
        if block_ms is None:
            raw = cast(list[tuple[str, dict[str, str]]], await redis.xrange(key, f"({after}" if after != "0" else "-",
                                                                             "+", count=count))
        else:
            answer = cast(list[Any], await redis.xread({key: after}, count=count, block=block_ms))
            raw = answer[0][1] if answer else []
        return [event_of(agent_id, str(entry_id), fields) for entry_id, fields in raw]

    async def remove(self, agent_id: str, doomed: Callable[[Event], bool]) -> int:
        """Delete the events ``doomed`` judges (an erasure's, a purge's), rewriting the stream:
        XDEL only flags an entry, whose fields stay in the stream's nodes (and in a snapshot of
        the store) until its whole node goes. The kept entries keep their ids and the stream its
        last id (XSETID), so a reader resumes as before. One read: the stream is bounded."""
        key = keyspace.event_stream(agent_id)
        for _ in range(5):  # an event appended meanwhile: read again
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    raw = cast(list[tuple[str, dict[str, str]]], await pipe.xrange(key))
                    gone = {str(i) for i, f in raw if doomed(event_of(agent_id, str(i), f))}
                    if not gone:
                        return 0
                    last = str((await pipe.xinfo_stream(key))["last-generated-id"])
                    kept = [(str(i), f) for i, f in raw if str(i) not in gone]
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.delete(key)
                    for entry_id, fields in kept:
                        pipe.xadd(key, fields, id=entry_id)  # type: ignore[arg-type]
                    if kept:
                        pipe.execute_command("XSETID", key, last)
                    await pipe.execute()
                    return len(gone)
                except WatchError:
                    continue
        raise RuntimeError(f"the events of agent {agent_id!r} kept changing while being rewritten")

    async def remove_user(self, agent_id: str, user_id: str, sessions: Sequence[str] = ()) -> int:
        """Delete the events naming ``user_id``, its namespace or the ``sessions`` an erasure removed whole."""
        return await self.remove(agent_id, lambda event: names_user(event, agent_id, user_id, sessions))


def names_user(event: Event, agent_id: str, user_id: str, sessions: Sequence[str] = ()) -> bool:
    """Whether ``event`` names the user, its namespace or one of ``sessions``."""
    names = {str(Namespace.user(agent_id, user_id)), *(str(Namespace.session(s)) for s in sessions)}
    return event.user_id == user_id or event.namespace in names or event.session_id in sessions


def event_of(agent_id: str, entry_id: str, fields: dict[str, str]) -> Event:
    return Event(
        id=entry_id, agent_id=agent_id, type=EventType(fields["type"]),
        at=datetime.fromtimestamp(int(entry_id.split("-")[0]) / 1000, UTC), memory_ids=json.loads(fields["ids"]),
        kind=fields.get("kind") or None, namespace=fields.get("namespace") or None,
        user_id=fields.get("user_id") or None, session_id=fields.get("session_id") or None,
        window=int(fields["window"]) if fields.get("window") else None, key_id=fields.get("key_id") or None,
        reason=fields.get("reason") or None)


class Visibility:
    """What one reader may see of the events (memory_service/access/reach.py): a caller for every
    user sees them all; a key limited to some users sees the events of the namespaces it may
    read (its users', the sessions they took part in, the shared ones), with a cause naming a
    session only if it sees that session and no key id (another key's). Events naming no
    namespace (an erasure) are for callers of every user only. Sessions' answers are kept for
    the reader's life (one stream)."""

    def __init__(self, reach: Reach | None):
        self.reach = reach
        self._sessions: dict[str, bool] = {}

    async def _sees_session(self, session_id: str) -> bool:
        if session_id not in self._sessions:
            assert self.reach is not None
            self._sessions[session_id] = await self.reach.sees_session(session_id)
        return self._sessions[session_id]

    async def shown(self, events: Sequence[Event]) -> list[Event]:
        if self.reach is None or not self.reach.confined:
            return list(events)
        kept: list[Event] = []
        for event in events:
            if event.namespace is None:
                continue
            namespace = Namespace.parse(event.namespace)
            if namespace.kind is NamespaceKind.SESSION:
                if not await self._sees_session(namespace.fields[0]):
                    continue
            elif not await self.reach.sees_namespace(namespace):
                continue
            cause_seen = event.session_id is not None and await self._sees_session(event.session_id)
            kept.append(event.model_copy(update={
                "key_id": None, "session_id": event.session_id if cause_seen else None,
                "window": event.window if cause_seen else None}))
        return kept
