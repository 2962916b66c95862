"""Browsing what the service holds (issue 20): agents, an agent's users and sessions, its
memories page by page, one memory with where it came from and what happened to it.

Reading only: nothing here changes what is held, and listing a memory does not count an
access (``memory_get`` does). It lives with the curation layer because it answers with the
memory tools' records (``MemoryTools.record``) and their access counts.

Every list is a keyset page: the cursor names the last item's position in the list's
order, never an offset, so a page deep in a list costs what the first does. Agents and
users are sorted sets in Redis read by id (ZRANGE BYLEX), sessions a sorted set by
creation number (memory_service/state/keyspace.py says how each grows); memories come from
the agent's store through its index on time (``MemoryBackend.list_memories``). A cursor
is opaque to callers and signed (memory_service/access/cursors.py) for the list, the agent,
its filters and the caller's reach: a cursor of another list, of another agent or reach, or
used with other filters, is refused with a 422 saying so, as is a damaged or forged one.

A caller limited to some users (``Reach``) sees their users, the sessions they took part
in, and the memories of what they may see (their namespaces, those sessions, the shards
and the agent's own): the same rule as every other route (memory_service/access/reach.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from memory_service.access.audit import AUDIT_SCAN_LIMIT, AuditLog
from memory_service.access.cursors import Cursors, position_field
from memory_service.access.reach import Reach
from memory_service.backends.agents import AgentDirectory
from memory_service.backends.base import MemoryListing, MemoryState
from memory_service.config import Settings
from memory_service.curation.retention import RetentionIndex
from memory_service.curation.tools import MemoryTools
from memory_service.domain.errors import InvalidInput
from memory_service.domain.models import Memory, MemoryKind
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.formation import gates
from memory_service.formation.steps import message_memory_id
from memory_service.formation.window import WindowStore
from memory_service.schemas.browse import (
    AgentPage,
    AgentSummary,
    FormedWindow,
    MemoryDetail,
    MemoryPage,
    PendingWindow,
    SessionPage,
    SessionSummary,
    UserPage,
    UserSummary,
)
from memory_service.state.store import StateStore

CURSOR_VERSION = 1
BROWSE_INDEX_VERSION = 1  # of the indexes in Redis: a start-up indexes older data once per version
# A key limited to some users lists memories in the namespaces they may see, sessions among
# them: past this many sessions it must name one (session_id) or a user (user_id).
MAX_CONFINED_SESSIONS = 1000
HISTORY_ENTRIES = 100
# Audit entries written this long before a memory's time still count as its history (clocks).
HISTORY_SLACK = timedelta(minutes=5)


def _digest(filters: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(filters, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _when(timestamp: float | None) -> datetime | None:
    return datetime.fromtimestamp(timestamp, UTC) if timestamp is not None else None


class Browser:
    def __init__(self, settings: Settings, state: StateStore, agents: AgentDirectory, tools: MemoryTools,
                 index: RetentionIndex, audit: AuditLog, cursors: Cursors):
        self.settings, self.state, self.agents, self.tools = settings, state, agents, tools
        self.index, self.audit, self.cursors = index, audit, cursors
        self.windows = WindowStore(state)

    # Cursors: signed for the list (kind and agent) and the caller's reach; the filters'
    # digest rides inside, so that other filters get a message of their own.

    async def _seal(self, kind: str, agent_id: str | None, scope: Any, filters: dict[str, Any],
                    position: dict[str, Any]) -> str:
        return await self.cursors.seal(f"{kind}|{agent_id or ''}", scope,
                                       {"v": CURSOR_VERSION, "f": _digest(filters), **position})

    async def _open(self, cursor: str, kind: str, agent_id: str | None, scope: Any,
                    filters: dict[str, Any]) -> dict[str, Any]:
        body = await self.cursors.open(cursor, f"{kind}|{agent_id or ''}", scope)
        if body.get("v") != CURSOR_VERSION:
            raise InvalidInput(f"cursor: not a cursor of this list ({kind}); pass the `next` of a page of it")
        if body.get("f") != _digest(filters):
            raise InvalidInput("cursor: it was made for other filters; pass the same filters as the page it came "
                               "from, or start again without a cursor")
        return body

    # Agents and users ----------------------------------------------------------------------

    async def agents_page(self, reachable: frozenset[str] | None, cursor: str | None, limit: int,
                          users: frozenset[str] | None = None) -> AgentPage:
        """The agents, by id: every indexed one (``reachable`` None), else those named. For a
        key limited to ``users``, each agent's counts are of what the key reaches: those of its
        users the agent knows, the sessions they took part in (what ``users_page`` and
        ``sessions_page`` list), never the agent's own totals."""
        scope = None if reachable is None and users is None else [sorted(reachable or ()), sorted(users or ())]
        after = position_field(await self._open(cursor, "agents", None, scope, {}), "a", str) if cursor else None
        if reachable is None:
            ids = await self.state.agents_after(after, limit + 1)
        else:
            ids = [a for a in sorted(reachable) if after is None or a > after][: limit + 1]
        ids, more = ids[:limit], len(ids) > limit
        sizes = await self.state.agent_sizes(ids)
        if users is not None:
            sizes = [(len(await self.state.known_users(a, sorted(users))),
                      len(await self.state.session_numbers(a, await self.state.sessions_of_users(a, sorted(users)))),
                      configured) for a, (_, _, configured) in zip(ids, sizes)]
        return AgentPage(agents=[AgentSummary(agent_id=a, users=u, sessions=s, configured=c)
                                 for a, (u, s, c) in zip(ids, sizes)],
                         next=await self._seal("agents", None, scope, {}, {"a": ids[-1]}) if more else None)

    async def users_page(self, agent_id: str, reach: Reach, cursor: str | None, limit: int) -> UserPage:
        filters = {"agent": agent_id}
        after = position_field(await self._open(cursor, "users", agent_id, reach.view, filters), "u", str) if cursor else None
        if reach.users is None:
            ids = await self.state.users_after(agent_id, after, limit + 1)
        else:
            ids = [u for u in sorted(reach.users) if after is None or u > after][: limit + 1]
        ids, more = ids[:limit], len(ids) > limit
        counts = [len(await self.state.sessions_of_users(agent_id, [u])) for u in ids]
        return UserPage(users=[UserSummary(user_id=u, sessions=n) for u, n in zip(ids, counts)],
                        next=await self._seal("users", agent_id, reach.view, filters, {"u": ids[-1]}) if more else None)

    # Sessions ------------------------------------------------------------------------------

    async def sessions_page(self, agent_id: str, reach: Reach, user_id: str | None, cursor: str | None,
                            limit: int) -> SessionPage:
        """The agent's sessions, newest first (by creation); ``user_id``: those the user took
        part in. For a user, or a key limited to users, the cost is their sessions'."""
        filters = {"agent": agent_id, "user": user_id}
        before = position_field(await self._open(cursor, "sessions", agent_id, reach.view, filters), "n", int) if cursor else None
        users = [user_id] if user_id is not None else sorted(reach.users) if reach.users is not None else None
        if users is None:
            rows = await self.state.sessions_before(agent_id, before, limit + 1)
        else:
            numbers = await self.state.session_numbers(agent_id, await self.state.sessions_of_users(agent_id, users))
            ranked = sorted(((n, s) for s, n in numbers.items() if before is None or n < before), reverse=True)
            rows = [(s, n) for n, s in ranked[: limit + 1]]
        rows, more = rows[:limit], len(rows) > limit
        sessions = await self.session_summaries([s for s, _ in rows])
        next_cursor = await self._seal("sessions", agent_id, reach.view, filters, {"n": rows[-1][1]}) if more else None
        return SessionPage(sessions=sessions, next=next_cursor)

    async def session_summaries(self, session_ids: Sequence[str]) -> list[SessionSummary]:
        """Each session's gate, cursor, counters and pending window: one round trip for the
        counters, one more per session with a window being formed."""
        summaries = []
        for session_id, c in zip(session_ids, await self.state.counters_of(session_ids)):
            pending = None
            if c.claimed_windows > c.formed_windows and (record := await self.windows.load(session_id)) is not None:
                pending = PendingWindow(window=record.claim.window, messages=len(record.claim.messages),
                                        state=record.state.value)
            summaries.append(SessionSummary(
                session_id=session_id, agent_id=c.agent_id or "", created_at=_when(c.created_at),
                last_activity=_when(c.last_activity), messages=c.messages, cursor=c.cursor,
                formed_windows=c.formed_windows, formed_messages=c.formed_messages, incognito=c.incognito,
                gate=gates.evaluate(c, self.settings), pending_window=pending))
        return summaries

    # Memories ------------------------------------------------------------------------------

    async def memories_page(self, agent_id: str, reach: Reach, *, namespace: str | None = None,
                            user_id: str | None = None, session_id: str | None = None,
                            kinds: Sequence[MemoryKind] = (), tags: Sequence[str] = (),
                            since: datetime | None = None, until: datetime | None = None,
                            state: MemoryState = MemoryState.LIVE, cursor: str | None = None,
                            limit: int = 50) -> MemoryPage:
        """A page of the agent's memories, newest first, filtered (see ``MemoryListing``)."""
        if sum(x is not None for x in (namespace, user_id, session_id)) > 1:
            raise InvalidInput("give one of namespace, user_id and session_id (user_id names 'user:<agent>:<user>', "
                               "session_id 'session:<session>')")
        if since is not None and until is not None and since > until:
            raise InvalidInput("since: later than until; nothing can be in that range")
        kinds = sorted(set(kinds))
        tags = sorted(set(tags))
        filters = {"agent": agent_id, "namespace": namespace, "user": user_id, "session": session_id,
                   "kinds": [k.value for k in kinds], "tags": tags, "since": since.timestamp() if since else None,
                   "until": until.timestamp() if until else None, "state": state.value}
        after, hint = None, None
        if cursor:
            body = await self._open(cursor, "memories", agent_id, reach.view, filters)
            after = (float(position_field(body, "t", (int, float))), position_field(body, "i", str))
            hint = body.get("h") if isinstance(body.get("h"), (int, float)) else None
        chosen = await self._namespaces(agent_id, reach, namespace, user_id, session_id)
        if chosen == []:
            return MemoryPage(memories=[], next=None)  # a namespace it may not see reads as an empty one
        _, backend = await self.agents.backend_for(agent_id)
        page = await backend.list_memories(agent_id, MemoryListing(
            namespaces=chosen, kinds=kinds, tags=tags, since=since, until=until, state=state, after=after,
            limit=limit, hint=hint))
        mine = [m for m in page.memories if m.metadata.agent_id == agent_id]
        records = await self._records(agent_id, mine, reach)
        next_cursor = None
        if page.resume is not None:
            position: dict[str, Any] = {"t": page.resume[0], "i": page.resume[1]}
            if page.hint is not None:
                position["h"] = page.hint
            next_cursor = await self._seal("memories", agent_id, reach.view, filters, position)
        return MemoryPage(memories=records, next=next_cursor)

    async def _namespaces(self, agent_id: str, reach: Reach, namespace: str | None, user_id: str | None,
                          session_id: str | None) -> list[Namespace] | None:
        """The namespaces a listing reads: the one named (empty if it is not the agent's, or
        not one the caller sees), else all of the agent's (None), or those a key limited to
        some users sees."""
        chosen = Namespace.user(agent_id, user_id) if user_id is not None else \
            Namespace.session(session_id) if session_id is not None else \
            Namespace.parse(namespace) if namespace is not None else None
        if chosen is not None:
            if chosen.kind is NamespaceKind.SESSION:
                owner = (await self.state.counters(chosen.fields[0])).agent_id
                visible = await reach.sees_owned_session(chosen.fields[0], owner)
            else:
                visible = await reach.sees_namespace(chosen)
            return [chosen] if visible else []
        if reach.users is None:
            return None
        users = sorted(reach.users)
        sessions = await self.state.sessions_of_users(agent_id, users)
        if len(sessions) > MAX_CONFINED_SESSIONS:
            raise InvalidInput(f"this key's users took part in {len(sessions)} sessions (more than "
                               f"{MAX_CONFINED_SESSIONS}): name one with session_id, or a user with user_id")
        shards = await self.agents.list_shards(agent_id)
        return [*(Namespace.user(agent_id, u) for u in users), *(Namespace.session(s) for s in sessions),
                *(Namespace.shard(agent_id, s.shard_id) for s in shards), Namespace.agent(agent_id)]

    async def _records(self, agent_id: str, memories: Sequence[Memory], reach: Reach | None) -> list[Any]:
        """The memories' records, with their access counts, as ``reach`` is shown them."""
        if reach is not None:
            memories = await reach.shown(memories)
        access = await self.index.accesses(agent_id, [m.id for m in memories])
        return [self.tools.record(m, access[m.id].count, access[m.id].last) for m in memories]

    async def memory_detail(self, agent_id: str, memory_id: str, reach: Reach | None) -> MemoryDetail:
        """One memory (not counted as an access), the messages it was formed from, the window
        and extractor that formed it, and its audit entries."""
        memory = await self.tools.peek(agent_id, memory_id, reach)
        (record,) = await self._records(agent_id, [memory], reach)
        messages: list[Any] = []
        window = None
        session_id, message_ids = memory.metadata.session_id, memory.metadata.message_ids
        if session_id and message_ids and memory.kind is not MemoryKind.MESSAGE:
            session = Namespace.session(session_id)
            if reach is None or await reach.sees_namespace(session):
                _, backend = await self.agents.backend_for(agent_id)
                found = await backend.get(agent_id, session, [message_memory_id(session_id, m) for m in message_ids])
                messages = await self._records(agent_id, sorted(found, key=lambda m: m.metadata.sequence), reach)
                sequences = await self.state.message_sequences(session_id, message_ids)
                if sequences and (kept := await self.state.formed_window(session_id, max(sequences.values()))):
                    window = FormedWindow.model_validate({**kept, "formed_at": _when(float(str(kept["formed_at"])))})
        since = memory.valid_at - HISTORY_SLACK
        history = await self.audit.read(agent_id, target=memory.id, since=since, limit=HISTORY_ENTRIES)
        return MemoryDetail(memory=record, messages=messages, window=window, history=history.entries,
                            history_complete=history.scanned < AUDIT_SCAN_LIMIT)

