"""What a caller may see of one agent's memory: the one rule every route applies.

A caller for all of an agent's users (a key without ``users``, the operator, the CLI)
reaches all of the agent. A key limited to some users reaches what those users may see:

- the sessions one of its users took part in (spoke in, or had a message recorded under
  their id), with their messages and episodes;
- its users' own namespaces (``user:<agent>:<user>``: directives, consolidated memory,
  personal facts), never another user's;
- the agent's shared knowledge, to read: its shards' namespaces and its own namespace.
  Changing shared knowledge needs a key for all users.

Such a key records into a session of its agent only if one of its users took part in it
already, or the session is new (it is then theirs), or the agent's ``users_join_sessions``
lets users join others' sessions. That is decided by the reservation's script, in the same
step as the write that makes the message's user take part (``StateStore.reserve_messages``):
two keys of different users racing into a new session cannot both get in.

What it is shown of a memory it may see follows the same rule: a memory's provenance names
a session, the messages and the users of it only if the key sees that session; else (a
shard's memory formed in another user's session, say) the memory is shown with a
provenance naming none of them, and only the key's own users. Counts (the agents' list)
count what the key reaches: its users, the sessions they took part in.

Whatever such a key may not see is answered exactly as what does not exist: a session
none of its users took part in as an unknown session, a memory in another user's namespace
as an unknown memory. A session of another agent is answered as an unknown one for every
caller. So no answer tells a hidden thing from a missing one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memory_service.domain.models import Memory
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.state.store import StateStore


@dataclass(frozen=True)
class Reach:
    state: StateStore
    agent_id: str
    users: frozenset[str] | None = None  # None: every user of the agent

    @classmethod
    def of(cls, state: StateStore, agent_id: str, users: Iterable[str] | None) -> Reach:
        return cls(state, agent_id, None if users is None else frozenset(users))

    @property
    def confined(self) -> bool:
        """Whether this caller is limited to some users."""
        return self.users is not None

    @property
    def view(self) -> list[str] | None:
        """What a block or answer cached for this caller is kept under: its users (None: all)."""
        return None if self.users is None else sorted(self.users)

    def sees_user(self, user_id: str) -> bool:
        return self.users is None or user_id in self.users

    async def sees_session(self, session_id: str) -> bool:
        """The session is the agent's and, for a key limited to users, one of them took part in it."""
        return await self.sees_owned_session(session_id, (await self.state.counters(session_id)).agent_id)

    async def sees_owned_session(self, session_id: str, owner: str | None) -> bool:
        """``sees_session`` for a caller that has read the session's ``owner`` (its agent) already."""
        if owner != self.agent_id:
            return False
        return self.users is None or await self.state.took_part(self.agent_id, sorted(self.users), session_id)

    async def sees_namespace(self, namespace: Namespace) -> bool:
        if namespace.kind is NamespaceKind.SESSION:
            return await self.sees_session(namespace.fields[0])
        if namespace.fields[0] != self.agent_id:
            return False
        return namespace.kind is not NamespaceKind.USER or self.sees_user(namespace.fields[1])

    def may_change(self, namespace: Namespace) -> bool:
        """Beyond seeing it: a key limited to users changes no shared knowledge (shard, agent)."""
        return not self.confined or namespace.kind in (NamespaceKind.SESSION, NamespaceKind.USER)

    async def shown(self, memories: Sequence[Memory]) -> list[Memory]:
        """``memories`` as this caller is shown them (every answer that holds a memory's
        provenance: the memory tools, the browse API, search). For a key limited to users, a
        provenance names a session, its messages and its users only if the key sees that
        session; else it names no session and no message, and of users only the key's own.
        One round trip for the sessions named, whatever their number."""
        if self.users is None:
            return list(memories)
        named = sorted({m.metadata.session_id for m in memories if m.metadata.session_id})
        seen = await self.state.took_part_each(self.agent_id, sorted(self.users), named)
        return [m if m.metadata.session_id and seen[m.metadata.session_id] else self._redacted(m) for m in memories]

    def _redacted(self, memory: Memory) -> Memory:
        meta = memory.metadata
        users = self.users or frozenset()
        kept = meta.model_copy(update={
            "session_id": None, "message_ids": [], "sequence": 0,
            "user_id": meta.user_id if meta.user_id in users else None,
            "user_ids": [u for u in meta.user_ids if u in users]})
        if kept == meta:
            return memory
        return memory.model_copy(update={"metadata": kept})
