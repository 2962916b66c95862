"""The graph backend with MongoDB beside it: writes mirrored through a durable outbox,
reads falling back to MongoDB.

Writes: the memories go into the outbox (memory_service.outbox) first, then to the graph
at once; MongoDB gets them from the drain loop, so a slow or absent MongoDB never slows a
request. The graph's FIFO trims and the shards' settings reach MongoDB the same way. A
store that is down keeps its queue until it returns; the other is not held back. (The
proof of concept wrote to the graph, then to Mongo: a graph failure lost the Mongo copy.)

Reads come from the graph. When the graph fails, or holds nothing for a namespace (an
agent that has just opted in), they come from MongoDB. Which store served each read is
recorded in ``read_sources`` (a context variable), so the memory context can say where it
came from.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from memory_service.models import Memory, MemoryKind, StoreQuery
from memory_service.namespaces import Namespace
from memory_service.outbox import DescribeShardOp, EmbeddingsOp, Outbox, TrimOp, WriteOp

from memory_service.backend import MemoryBackend, SignalHits, served_by

log = logging.getLogger(__name__)
T = TypeVar("T")


class MirroredBackend(MemoryBackend):
    name = "graph"

    def __init__(self, primary: MemoryBackend, mirror: MemoryBackend, outbox: Outbox, drain_seconds: float = 1.0,
                 batch: int = 100):
        self.primary, self.mirror, self.outbox = primary, mirror, outbox
        self.drain_seconds = drain_seconds
        self.batch = batch
        self.fallback_reads = 0
        self._stores = {"graph": primary, "mongo": mirror}
        self._down: dict[str, str] = {}  # store -> last error, while its deliveries fail
        self._mirror_started = False
        self._drainer: asyncio.Task | None = None

    async def start(self) -> None:
        await self.primary.start()
        await self._start_mirror()
        self._drainer = asyncio.create_task(self._drain_forever(), name="outbox-drain")

    async def _start_mirror(self) -> bool:
        if not self._mirror_started:
            try:
                await self.mirror.start()
                self._mirror_started = True
            except Exception as exc:  # MongoDB down at start: writes wait in the outbox
                self._mark_down("mongo", exc)
        return self._mirror_started

    async def close(self) -> None:
        if self._drainer:
            self._drainer.cancel()
            await asyncio.gather(self._drainer, return_exceptions=True)
        await self.primary.close()
        await self.mirror.close()

    async def health(self) -> dict:
        graph, mongo = await asyncio.gather(self.primary.health(), self.mirror.health())
        try:
            depth = await self.outbox.depth()
        except Exception as exc:
            depth = {"error": str(exc)}
        return {"ok": bool(graph.get("ok")), "graph": graph, "mongo": mongo, "outbox": depth,
                "undelivered": dict(self._down), "fallback_reads": self.fallback_reads}

    # Writes ----------------------------------------------------------------------------

    async def write(self, memories: Sequence[Memory]) -> int:
        if not memories:
            return 0
        entry = await self.outbox.append(WriteOp(memories=list(memories)))
        try:
            written = await self.primary.write(memories)
        except Exception as exc:
            self._mark_down("graph", exc)
            return 0  # kept in the outbox: delivered when the graph is back
        await self.outbox.delivered("graph", entry)
        return written

    async def drain(self) -> dict[str, int]:
        """Deliver what the outbox holds for each store; how many entries each got."""
        delivered = {}
        for target, store in self._stores.items():
            delivered[target] = 0
            if target == "mongo" and not await self._start_mirror():
                continue
            for entry, op in await self.outbox.pending(target, self.batch):
                try:
                    await op.apply(store)
                except Exception as exc:
                    self._mark_down(target, exc)
                    break
                await self.outbox.delivered(target, entry)
                delivered[target] += 1
            if delivered[target] and self._down.pop(target, None):
                log.warning("outbox: %s is back; delivered %d held write(s)", target, delivered[target])
        return delivered

    async def _drain_forever(self) -> None:
        while True:
            try:
                await self.drain()
            except Exception as exc:  # Redis itself unreachable: try again later
                log.warning("outbox drain failed: %s", exc)
            await asyncio.sleep(self.drain_seconds)

    def _mark_down(self, target: str, exc: Exception) -> None:
        if target not in self._down:
            log.warning("%s unreachable, writes wait in the outbox: %s", target, exc)
        self._down[target] = f"{type(exc).__name__}: {exc}"

    async def describe_shard(self, agent_id: str, shard_id: str, name: str, extraction_focus: str, active: bool) -> None:
        await self.outbox.append(DescribeShardOp(agent_id=agent_id, shard_id=shard_id, name=name,
                                                 extraction_focus=extraction_focus, active=active), ["mongo"])
        await self.primary.describe_shard(agent_id, shard_id, name, extraction_focus, active)

    async def trim(self, agent_id: str, namespace: Namespace, kind: MemoryKind, keep: int) -> int:
        # Queued behind the writes it trims; the graph is trimmed at once, as the caller waits.
        await self.outbox.append(TrimOp(agent_id=agent_id, namespace=str(namespace), kind=kind, keep=keep), ["mongo"])
        return await self.primary.trim(agent_id, namespace, kind, keep)

    async def set_embeddings(self, agent_id: str, vectors: Mapping[str, Sequence[float]]) -> int:
        await self.outbox.append(EmbeddingsOp(agent_id=agent_id, vectors={k: list(v) for k, v in vectors.items()}),
                                 ["mongo"])
        return await self.primary.set_embeddings(agent_id, vectors)

    # Reads: the graph, else MongoDB ---------------------------------------------------------

    async def _read(self, read: Callable[[MemoryBackend], Awaitable[T]], what: str,
                    empty_falls_back: bool = False, empty: Callable[[T], bool] = lambda result: not result) -> T:
        """``read`` from the graph; from MongoDB when the graph fails, or (with
        ``empty_falls_back``) answers ``empty`` and MongoDB has more."""
        primary_failed = None
        try:
            result = await read(self.primary)
            if not (empty_falls_back and empty(result)):
                served_by("graph")
                return result
        except Exception as exc:
            primary_failed = exc
            log.warning("graph read of %s failed, reading mongo: %s", what, exc)
        try:
            fallback = await read(self.mirror)
        except Exception:
            if primary_failed:
                raise
            served_by("graph")
            return result  # the graph's (empty) answer stands
        if primary_failed or not empty(fallback):
            self.fallback_reads += 1
            served_by("mongo")
            return fallback
        served_by("graph")
        return result

    async def get(self, agent_id: str, namespace: Namespace, ids: Sequence[str]) -> list[Memory]:
        return await self._read(lambda b: b.get(agent_id, namespace, ids), str(namespace), empty_falls_back=bool(ids))

    async def recent(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind], limit: int) -> list[Memory]:
        return await self._read(lambda b: b.recent(agent_id, namespace, kinds, limit), str(namespace),
                                empty_falls_back=limit > 0)

    async def count(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind] = ()) -> int:
        return await self._read(lambda b: b.count(agent_id, namespace, kinds), str(namespace))

    async def search(self, agent_id: str, query: StoreQuery) -> SignalHits:
        # Like the namespace reads: MongoDB answers when the graph fails, or finds nothing
        # at all (an agent that has just opted in to the graph without migrating).
        return await self._read(lambda b: b.search(agent_id, query), f"agent {agent_id}", empty_falls_back=True,
                                empty=lambda hits: not any(hits.values()))

    async def export(self, agent_id: str, namespace: Namespace) -> list[Memory]:
        return await self.primary.export(agent_id, namespace)

    async def agents(self) -> list[str]:
        return await self.primary.agents()

    async def unembedded(self, agent_id: str, limit: int) -> list[Memory]:
        return await self.primary.unembedded(agent_id, limit)
