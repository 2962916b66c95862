"""What is left to forget once memories leave the stores for good.

Two things remove memories for good: the erasure of a user
(memory_service/curation/erasure.py) and the daily purge
(memory_service/curation/retention.py). After the stores, the same traces stay behind in
both cases: the memories' ids on their namespaces' consolidation queues, the generations
of the namespaces they were in (a memory block built on them must not be served again),
the agent's cached and last good blocks (memory_service/state/cache.py), and the claims on
embedding them (memory_service/state/embed_claims.py: a key that names the memory, kept a
lease after its vector is written). ``Removal``
forgets them, one way for both, so that the two cannot drift apart.

What differs stays with each caller: which memories go and how they leave the stores, the
stores' own query logs (trimmed last, by the caller), and the keys an erasure deletes whole.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from memory_service.curation.erasure_state import ErasureState
from memory_service.domain.models import Memory
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.state import keyspace
from memory_service.state.store import StateStore


@dataclass(slots=True)
class Forgotten:
    consolidation_items: int = 0  # removed memories taken off consolidation queues
    cached_blocks: int = 0  # the agent's cached blocks deleted, in Redis and in this process


class Removal:
    def __init__(self, state: StateStore, redis_side: ErasureState):
        self.state, self.redis_side = state, redis_side

    async def forget(self, agent_id: str, memories: Iterable[Memory], dropped: Collection[str] = ()) -> Forgotten:
        """Forget the removed ``memories`` of ``agent_id`` everywhere but the stores.

        ``dropped``: namespaces whose Redis keys the caller deletes whole (an erasure's own
        user namespace, the sessions it removes): their queues are not trimmed and their
        generations not bumped (a bump would only write the key again)."""
        memories = list(memories)
        await self.state.embed_claims.forget(agent_id, [m.id for m in memories])
        memories = [m for m in memories if m.namespace not in dropped]
        queued: dict[str, list[str]] = {}
        for memory in memories:
            if Namespace.parse(memory.namespace).kind in (NamespaceKind.USER, NamespaceKind.SHARD):
                queued.setdefault(memory.namespace, []).append(memory.id)
        forgotten = Forgotten()
        for namespace, ids in sorted(queued.items()):
            forgotten.consolidation_items += await self.redis_side.forget_consolidation_items(namespace, ids)
        await self.state.cache.bump(*sorted({m.namespace for m in memories}))
        forgotten.cached_blocks = await self.state.cache.purge_agent(agent_id)
        await self._out_of_windows(memories)
        return forgotten

    async def _out_of_windows(self, memories: list[Memory]) -> None:
        """Removed memories' ids out of their sessions' formed-window entries (which name the
        memories each window made, memory_service/curation/reform.py)."""
        by_session: dict[str, set[str]] = {}
        for memory in memories:
            if memory.metadata.session_id is not None:
                by_session.setdefault(memory.metadata.session_id, set()).add(memory.id)
        for session_id, ids in sorted(by_session.items()):
            for stored, entry in await self.state.formed_windows(session_id):
                named = [f for f in ("memory_ids", "replaced") if isinstance(entry.get(f), list) and ids & set(entry[f])]
                if named:
                    kept = {**entry, **{f: [i for i in entry[f] if i not in ids] for f in named}}
                    await self.state.replace_formed_window(session_id, stored, kept,
                                                           int(entry.get("last_sequence", 0)))

    async def drop_forget_records(self, agent_id: str, memory_ids: Collection[str]) -> None:
        """The records of soft forgets of memories now gone for good (kept for an undo that
        can no longer be; memory_service/curation/forget.py): they name their ids."""
        if memory_ids:
            await self.state.redis.hdel(keyspace.forget_records(agent_id), *memory_ids)
