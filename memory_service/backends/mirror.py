"""The graph backend with MongoDB beside it: writes mirrored through a durable outbox,
reads falling back to MongoDB.

Writes: the memories go into the outbox (memory_service.backends.outbox) first, then to the graph
at once; MongoDB gets them from the drain loop, so a slow or absent MongoDB never slows a
request. The graph's FIFO trims and the shards' settings reach MongoDB the same way. A
store that is down keeps its queue until it returns; the other is not held back. An entry
a store keeps refusing is dead-lettered after OUTBOX_MAX_ATTEMPTS, so the entries behind
it are delivered. (The proof of concept wrote to the graph, then to Mongo: a graph
failure lost the Mongo copy.)

The knowledge graph (entities, facts, mentions: memory_service/backends/graph_entities.py) is
the graph's alone: its calls go to the graph, nothing of it is queued for or read from
MongoDB, which keeps no graph. A graph that is down fails them as it fails any graph call,
with no fallback: MongoDB has no copy to fall back on.

Reads come from the graph, and from MongoDB only:
* when the graph read fails (raises);
* when the graph answers empty and the agent's memories may live in MongoDB only: its
  settings named the mongo backend and it was not migrated since (``mongo_only``, e.g. an
  agent that opted in to the graph without ``memory-service migrate``);
* for ``get`` by ids the graph does not hold: the callers know those ids were stored (a
  claimed window's messages, pending consolidation items), so the graph's delivery of
  them is still queued, and MongoDB may have them.
An empty answer is otherwise the answer: MongoDB mirrors the graph, it has nothing more.
(Falling back on every empty answer made a context wait out MongoDB's server-selection
timeout whenever MongoDB was down.) Every MongoDB read is bounded by ``fallback_timeout``
and goes through a circuit breaker: after repeated failures MongoDB is skipped for a
cool-off, and the outbox's deliveries to it pause with it. Which store served each
read is in the answer itself: every memory's ``served_by`` names the store it came from,
so the memory context can say where it came from.

The memory block's reads keep the graph's own paths behind the mirror: its recent reads in
one call (``recent_many``; a read answered empty falls back as ``recent`` does), the briefs
of what it shows and the graph signal's candidates (``briefs``, ``admitted``) as the graph
answers them, not whole memories.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from memory_service.access.pseudonyms import namespace_for_log
from memory_service.backends.base import (
    Brief,
    Candidate,
    Facet,
    ListedPage,
    MemoryBackend,
    MemoryListing,
    Page,
    RecentRead,
    SignalHits,
)
from memory_service.backends.breaker import OPEN, CircuitBreaker
from memory_service.backends.outages import is_unavailable
from memory_service.backends.outbox import (
    TARGETS,
    DeleteOp,
    DescribeShardOp,
    EmbeddingsOp,
    Outbox,
    OutboxOp,
    ProvenanceOp,
    ReplaceOp,
    TrimOp,
    WriteOp,
)
from memory_service.domain.graph import (
    Closing,
    Entity,
    EntityDetail,
    EntityMentions,
    EntitySplit,
    EntityType,
    Fact,
    MentionedEntity,
)
from memory_service.domain.models import Memory, MemoryKind, StoreQuery
from memory_service.domain.namespaces import Namespace

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long one process may hold a target's delivery lease; it stops taking new entries
# at half of it, so a slow delivery does not overlap the next holder's.
LEASE_SECONDS = 60.0


async def _never(agent_id: str) -> bool:
    return False


class MirroredBackend(MemoryBackend):
    name = "graph"

    def __init__(self, primary: MemoryBackend, mirror: MemoryBackend, outbox: Outbox, drain_seconds: float = 1.0,
                 batch: int = 100, *, breaker: CircuitBreaker | None = None, fallback_timeout: float = 1.0,
                 mongo_only: Callable[[str], Awaitable[bool]] = _never):
        self.primary, self.mirror, self.outbox = primary, mirror, outbox
        self.drain_seconds = drain_seconds
        self.batch = batch
        self.breaker = breaker or CircuitBreaker("mongo", failures=3, window=30, cooloff=30)
        self.fallback_timeout = fallback_timeout
        self.mongo_only = mongo_only
        self.fallback_reads = 0  # reads MongoDB served
        self.mongo_reads = 0  # reads sent to MongoDB (served, failed or timed out)
        self.skipped_reads = 0  # reads the open breaker kept from MongoDB
        self._stores = dict(zip(TARGETS, (primary, mirror)))
        self._down: dict[str, str] = {}  # store -> last error, while its deliveries fail
        self._alarmed: set[str] = set()
        self._mirror_started = False
        self._drainer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.primary.start()
        await self._start_mirror()
        self._drainer = asyncio.create_task(self._drain_forever(), name="outbox-drain")

    async def _start_mirror(self) -> bool:
        if not self._mirror_started and self.breaker.state != OPEN:
            try:
                await self.mirror.start()
                self._mirror_started = True
            except Exception as exc:  # MongoDB down at start: writes wait in the outbox
                self._mark_down("mongo", exc)
                self.breaker.failure(exc)
        return self._mirror_started

    async def close(self) -> None:
        if self._drainer:
            self._drainer.cancel()
            await asyncio.gather(self._drainer, return_exceptions=True)
        await self.primary.close()
        await self.mirror.close()

    async def health(self) -> dict[str, Any]:
        graph, mongo = await asyncio.gather(self.primary.health(), self._mongo_health())
        depth: Mapping[str, int | str]  # what waits per target, or why the outbox cannot say
        dead: Mapping[str, int]
        try:
            pending, dead_letters = await asyncio.gather(self.outbox.depth(), self.outbox.dead_letter_counts())
            depth, dead, alarms = pending, dead_letters, self.outbox.alarms(pending, dead_letters)
        except Exception as exc:
            depth, dead, alarms = {"error": str(exc)}, {}, [f"the outbox cannot be read: {exc}"]
        return {"ok": bool(graph.get("ok")), "graph": graph, "mongo": mongo, "outbox": depth, "dead_letters": dead,
                "alarms": alarms, "undelivered": dict(self._down), "fallback_reads": self.fallback_reads,
                "mongo_reads": self.mongo_reads, "skipped_reads": self.skipped_reads,
                "mongo_breaker": self.breaker.snapshot()}

    async def _mongo_health(self) -> dict[str, Any]:
        if self.breaker.state == OPEN:  # no ping while it cools off: it would wait out the timeouts
            return {"ok": False, "error": f"circuit breaker open: {self.breaker.last_error}"}
        try:
            async with asyncio.timeout(self.fallback_timeout):
                return await self.mirror.health()
        except TimeoutError:
            return {"ok": False, "error": f"no answer within {self.fallback_timeout:g} s"}

    async def gauges(self) -> dict[str, float]:
        depth, dead = await asyncio.gather(self.outbox.depth(), self.outbox.dead_letter_counts())
        out: dict[str, float] = {}
        for target in self.outbox.targets:
            label = f'{{target="{target}"}}'
            out[f"outbox_pending{label}"] = depth[target]
            out[f"outbox_dead_letters{label}"] = dead[target]
            out[f"outbox_alarm{label}"] = float(depth[target] >= self.outbox.alarm_pending or dead[target] > 0)
        out['circuit_breaker_open{store="mongo"}'] = float(self.breaker.state == OPEN)
        try:
            out.update(await self.primary.gauges())
        except Exception:  # the graph is down: the outbox's gauges above matter most then
            pass
        if self.breaker.state != OPEN:  # no call while it cools off: it would wait out the timeouts
            try:
                async with asyncio.timeout(self.fallback_timeout):
                    out.update(await self.mirror.gauges())
            except Exception:  # MongoDB down: the breaker and /health say so
                pass
        return out

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
        """Deliver what the outbox holds for each store, the stores side by side; how many
        entries each got."""
        counts = await asyncio.gather(*(self._drain_target(t, s) for t, s in self._stores.items()))
        return dict(zip(self._stores, counts))

    async def _drain_target(self, target: str, store: MemoryBackend) -> int:
        if target == "mongo" and not await self._start_mirror():
            return 0
        if target == "mongo" and self.breaker.state == OPEN:
            return 0
        token = await self.outbox.lease(target, LEASE_SECONDS)
        if token is None:
            return 0  # another process delivers this target now
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + LEASE_SECONDS / 2
        delivered = 0
        try:
            for entry in await self.outbox.pending(target, self.batch):
                if entry.op is None:
                    await self.outbox.failed(target, entry.entry_id, entry.problem, hopeless=True)
                    continue
                try:
                    await entry.op.apply(store)
                except Exception as exc:
                    if is_unavailable(exc):  # the store is down: the entry waits, uncounted
                        self._mark_down(target, exc)
                        if target == "mongo":
                            self.breaker.failure(exc)
                        break
                    attempts, dead = await self.outbox.failed(target, entry.entry_id, f"{type(exc).__name__}: {exc}")
                    if dead:
                        continue  # the entries behind it go on
                    log.warning("outbox: delivering %s to %s failed (attempt %d of %d): %s", entry.entry_id, target,
                                attempts, self.outbox.max_attempts, exc)
                    break  # in order: it is tried again first
                await self.outbox.delivered(target, entry.entry_id)
                delivered += 1
                if loop.time() > stop_at:
                    break
        finally:
            await self.outbox.release(target, token)
        # Deliveries open the breaker when MongoDB is down; only reads close it: a read must
        # also answer within the (shorter) fallback timeout.
        if delivered and target in self._down:
            del self._down[target]
            log.warning("outbox: %s is back; delivered %d held write(s)", target, delivered)
        return delivered

    async def _drain_forever(self) -> None:
        while True:
            try:
                await self.drain()
                await self._check_alarms()
            except Exception as exc:  # Redis itself unreachable: try again later
                log.warning("outbox drain failed: %s", exc)
            await asyncio.sleep(self.drain_seconds)

    async def _check_alarms(self) -> None:
        """Log once when a target's queue reaches the alarm, and once when it is back under."""
        for target, depth in (await self.outbox.depth()).items():
            if depth >= self.outbox.alarm_pending and target not in self._alarmed:
                self._alarmed.add(target)
                log.error("outbox alarm: %d writes wait undelivered for %s (OUTBOX_ALARM_PENDING %d; at %d new writes "
                          "are refused)", depth, target, self.outbox.alarm_pending, self.outbox.max_pending)
            elif depth < self.outbox.alarm_pending and target in self._alarmed:
                self._alarmed.discard(target)
                log.warning("outbox: %s is under the alarm again (%d undelivered)", target, depth)

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

    async def set_embeddings(self, agent_id: str, vectors: Mapping[str, Sequence[float]],
                             model: str | None = None) -> int:
        await self.outbox.append(EmbeddingsOp(agent_id=agent_id, vectors={k: list(v) for k, v in vectors.items()},
                                              model=model), ["mongo"])
        return await self.primary.set_embeddings(agent_id, vectors, model)

    # A re-embed: staged and promoted on the graph; MongoDB, which serves reads only while the
    # graph fails, takes the new model's vectors as they are staged (through the outbox, like
    # the backfill's), tagged with their model, so its searches compare like with like too.

    async def reembed_candidates(self, agent_id: str, model: str, after: str | None,
                                 limit: int) -> tuple[list[tuple[str, str]], str | None]:
        return await self.primary.reembed_candidates(agent_id, model, after, limit)

    async def stage_embeddings(self, agent_id: str, model: str, vectors: Mapping[str, tuple[str, Sequence[float]]]) -> int:
        staged = await self.primary.stage_embeddings(agent_id, model, vectors)
        if vectors:
            await self.outbox.append(EmbeddingsOp(agent_id=agent_id, vectors={k: list(v) for k, (_, v) in vectors.items()},
                                                  model=model), ["mongo"])
        return staged

    async def promote_embeddings(self, agent_id: str, model: str, limit: int) -> int:
        return await self.primary.promote_embeddings(agent_id, model, limit)

    # Erasure: through the outbox to both stores, in order behind the writes it undoes ----------

    async def delete(self, agent_id: str, ids: Sequence[str]) -> int:
        if not ids:
            return 0
        return await self._to_both(DeleteOp(agent_id=agent_id, ids=list(ids)),
                                   lambda store: store.delete(agent_id, ids))

    async def set_provenance(self, agent_id: str, memories: Sequence[Memory]) -> int:
        if not memories:
            return 0
        return await self._to_both(ProvenanceOp(agent_id=agent_id, memories=list(memories)),
                                   lambda store: store.set_provenance(agent_id, memories))

    async def _to_both(self, op: OutboxOp, apply: Callable[[MemoryBackend], Awaitable[int]]) -> int:
        """Queued for both stores, applied to the graph at once (as the caller waits for it);
        MongoDB gets it from the drain, after every write queued before it. Unlike a write,
        a graph that fails raises: the caller must not report an erasure the graph lacks
        (the entry stays queued and reaches the graph when it is back, and a retry is a no-op)."""
        entry = await self.outbox.append(op)
        done = await apply(self.primary)
        await self.outbox.delivered("graph", entry)
        return done

    async def replace(self, agent_id: str, memories: Sequence[Memory]) -> int:
        # Like an erasure's: in order behind the write it changes, and a failing graph raises
        # (the tool must not answer a change the graph lacks; the queued entry still reaches it).
        if not memories:
            return 0
        return await self._to_both(ReplaceOp(agent_id=agent_id, memories=list(memories)),
                                   lambda store: store.replace(agent_id, memories))

    async def purge_query_log(self, agent_id: str) -> int:
        return await self.primary.purge_query_log(agent_id)

    def redis_servers(self) -> list[Any]:
        return self.primary.redis_servers()

    async def scrub_pending(self, agent_id: str, judge: Callable[[Memory], Memory | None],
                            removed_ids: Collection[str]) -> int:
        removed = set(removed_ids)

        def edit(op: OutboxOp) -> OutboxOp | None:
            if isinstance(op, WriteOp):
                kept = [judge(m) if m.metadata.agent_id == agent_id else m for m in op.memories]
                if kept == op.memories:
                    return None
                return WriteOp(memories=[m for m in kept if m is not None])
            if isinstance(op, ReplaceOp) and op.agent_id == agent_id:
                changed = [judge(m) for m in op.memories]
                if changed == op.memories:
                    return None
                return ReplaceOp(agent_id=agent_id, memories=[m for m in changed if m is not None])
            if isinstance(op, EmbeddingsOp) and op.agent_id == agent_id and removed & op.vectors.keys():
                return EmbeddingsOp(agent_id=agent_id, vectors={k: v for k, v in op.vectors.items() if k not in removed})
            return None

        return await self.outbox.rewrite(edit)

    # Reads: the graph, else MongoDB ---------------------------------------------------------

    async def _read(self, agent_id: str, read: Callable[[MemoryBackend], Awaitable[T]], what: str,
                    empty: Callable[[T], bool] | None = None) -> tuple[T, str]:
        """``read`` from the graph, and which store answered. From MongoDB when the graph
        fails, or (given ``empty``) answers empty for an agent whose memories may live in
        MongoDB only."""
        try:
            result = await read(self.primary)
        except Exception as exc:
            log.warning("graph read of %s failed, reading mongo: %s", namespace_for_log(what), exc)
            fallback = await self._from_mongo(read, what)
            if fallback is None:
                raise exc
            return fallback[0], "mongo"
        if empty is not None and empty(result) and await self._mongo_only(agent_id):
            fallback = await self._from_mongo(read, what)
            if fallback is not None and not empty(fallback[0]):
                return fallback[0], "mongo"
        return result, "graph"

    async def _from_mongo(self, read: Callable[[MemoryBackend], Awaitable[T]], what: str) -> tuple[T] | None:
        """(MongoDB's answer,), or None when it failed, took longer than the fallback
        timeout, or the breaker is open."""
        if not self.breaker.allow():
            self.skipped_reads += 1
            return None
        self.mongo_reads += 1
        try:
            async with asyncio.timeout(self.fallback_timeout):
                result = await read(self.mirror)
        except Exception as exc:
            self.breaker.failure(exc)
            log.warning("mongo read of %s failed: %s: %s", namespace_for_log(what), type(exc).__name__, exc)
            return None
        self.breaker.success()
        self.fallback_reads += 1
        return (result,)

    async def _mongo_only(self, agent_id: str) -> bool:
        try:
            return await self.mongo_only(agent_id)
        except Exception as exc:  # the state store is failing: read the graph alone
            log.warning("could not tell whether agent %s has memories in mongo only: %s", agent_id, exc)
            return False

    async def get(self, agent_id: str, namespace: Namespace, ids: Sequence[str]) -> list[Memory]:
        found, source = await self._read(agent_id, lambda b: b.get(agent_id, namespace, ids), str(namespace))
        held = {m.id for m in found}
        missing = [i for i in dict.fromkeys(ids) if i not in held]
        if source == "graph" and missing:
            more = await self._from_mongo(lambda b: b.get(agent_id, namespace, missing), str(namespace))
            if more is not None and more[0]:
                found = [*found, *more[0]]
        return found

    async def recent(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind], limit: int) -> list[Memory]:
        found, _ = await self._read(agent_id, lambda b: b.recent(agent_id, namespace, kinds, limit), str(namespace),
                                    empty=lambda result: limit > 0 and not result)
        return found

    async def recent_many(self, agent_id: str, reads: Sequence[RecentRead]) -> list[list[Memory]]:
        """The graph's reads in one call (one round trip on the graph, as the memory block
        expects); each read the graph answers empty falls back as ``recent`` does (for an agent
        whose memories may live in MongoDB only), and a failing graph sends them all there."""
        what = f"agent {agent_id}"
        found, served = await self._read(agent_id, lambda b: b.recent_many(agent_id, reads), what)
        if served != "graph":
            return found
        empty = [at for at, (read, got) in enumerate(zip(reads, found, strict=True)) if read.limit > 0 and not got]
        if empty and await self._mongo_only(agent_id):
            more = await self._from_mongo(lambda b: b.recent_many(agent_id, [reads[at] for at in empty]), what)
            if more is not None:
                for at, got in zip(empty, more[0], strict=True):
                    found[at] = got or found[at]
        return found

    async def count(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind] = ()) -> int:
        found, _ = await self._read(agent_id, lambda b: b.count(agent_id, namespace, kinds), str(namespace))
        return found

    async def search(self, agent_id: str, query: StoreQuery) -> SignalHits:
        found, _ = await self._read(agent_id, lambda b: b.search(agent_id, query), f"agent {agent_id}",
                                    empty=lambda hits: not any(hits.values()))
        return found

    async def find(self, agent_id: str, ids: Sequence[str]) -> list[Memory]:
        # Like ``get``: ids the graph lacks may still wait in its queue, and MongoDB has them.
        found, source = await self._read(agent_id, lambda b: b.find(agent_id, ids), f"agent {agent_id}")
        held = {m.id for m in found}
        missing = [i for i in dict.fromkeys(ids) if i not in held]
        if source == "graph" and missing:
            more = await self._from_mongo(lambda b: b.find(agent_id, missing), f"agent {agent_id}")
            if more is not None and more[0]:
                found = [*found, *more[0]]
        return found

    async def briefs(self, agent_id: str, ids: Sequence[str]) -> list[Brief]:
        # The graph's light read (MongoDB's when it fails). Unlike ``find``, an id the graph
        # does not give is not asked of MongoDB: the ids come from a search the graph answered,
        # and one it leaves out may be deleted there while MongoDB's copy waits in the outbox.
        found, _ = await self._read(agent_id, lambda b: b.briefs(agent_id, ids), f"agent {agent_id}")
        return found

    async def facets(self, agent_id: str, ids: Sequence[str]) -> list[Facet]:
        # As ``briefs``: the ids come from a search the graph answered.
        found, _ = await self._read(agent_id, lambda b: b.facets(agent_id, ids), f"agent {agent_id}")
        return found

    async def admitted(self, agent_id: str, ids: Sequence[str], query: StoreQuery) -> list[Candidate]:
        # The graph signal's ids come from the graph's mentions: the graph's answer (ids and times).
        found, _ = await self._read(agent_id, lambda b: b.admitted(agent_id, ids, query), f"agent {agent_id}")
        return found

    async def export(self, agent_id: str, namespace: Namespace) -> list[Memory]:
        return await self.primary.export(agent_id, namespace)

    async def written_before(self, agent_id: str, before: datetime, limit: int,
                             after: tuple[float, str] | None = None) -> list[Memory]:
        # The graph's, as ``export``: MongoDB mirrors it, and what is purged leaves both.
        return await self.primary.written_before(agent_id, before, limit, after)

    async def expired(self, agent_id: str, now: datetime, limit: int) -> list[Memory]:
        # The graph's, as ``written_before``: what is purged leaves both stores.
        return await self.primary.expired(agent_id, now, limit)

    async def list_memories(self, agent_id: str, listing: MemoryListing) -> ListedPage:
        # The graph's, as ``export``: a cursor names a position in one store's order.
        return await self.primary.list_memories(agent_id, listing)

    async def agents(self) -> list[str]:
        return await self.primary.agents()

    async def unembedded(self, agent_id: str, limit: int, exclude: Collection[str] = ()) -> list[Memory]:
        return await self.primary.unembedded(agent_id, limit, exclude)

    # The knowledge graph: the graph's alone (see the module docstring) ---------------------------

    async def upsert_entities(self, agent_id: str, entities: Sequence[Entity]) -> int:
        return await self.primary.upsert_entities(agent_id, entities)

    async def add_facts(self, agent_id: str, facts: Sequence[Fact]) -> int:
        return await self.primary.add_facts(agent_id, facts)

    async def write_facts(self, agent_id: str, facts: Sequence[Fact],
                          closes: Sequence[Closing] = ()) -> tuple[int, list[str]]:
        return await self.primary.write_facts(agent_id, facts, closes)

    async def mention(self, agent_id: str, memory_id: str, entity_ids: Sequence[str],
                      via: Mapping[str, Sequence[str]] | None = None) -> int:
        return await self.primary.mention(agent_id, memory_id, entity_ids, via)

    async def entity_candidates(self, agent_id: str, namespace: Namespace | str, entity_type: EntityType,
                                limit: int) -> list[Entity]:
        return await self.primary.entity_candidates(agent_id, namespace, entity_type, limit)

    async def entities_by_id(self, agent_id: str, entity_ids: Sequence[str]) -> list[Entity]:
        return await self.primary.entities_by_id(agent_id, entity_ids)

    async def split_entity(self, agent_id: str, entity_id: str, alias: str) -> EntitySplit:
        return await self.primary.split_entity(agent_id, entity_id, alias)

    async def find_entities(self, agent_id: str, namespace: Namespace | str, names: Sequence[str]) -> list[Entity]:
        return await self.primary.find_entities(agent_id, namespace, names)

    async def current_facts(self, agent_id: str, namespace: Namespace | str, entity_ids: Sequence[str],
                            predicate: str | None = None, as_of: datetime | None = None,
                            include_superseded: bool = False, per_entity: int | None = None) -> list[Fact]:
        return await self.primary.current_facts(agent_id, namespace, entity_ids, predicate, as_of, include_superseded,
                                                per_entity)

    async def invalidate_fact(self, agent_id: str, fact_id: str, invalid_at: datetime,
                              superseded_by: str | None = None, corrected_by: str | None = None) -> Fact:
        return await self.primary.invalidate_fact(agent_id, fact_id, invalid_at, superseded_by, corrected_by)

    async def restore_fact(self, agent_id: str, fact_id: str) -> Fact:
        return await self.primary.restore_fact(agent_id, fact_id)

    async def facts_citing(self, agent_id: str, memory_ids: Sequence[str]) -> list[Fact]:
        return await self.primary.facts_citing(agent_id, memory_ids)

    async def set_fact_ends(self, agent_id: str, ends: Mapping[str, datetime | None]) -> int:
        return await self.primary.set_fact_ends(agent_id, ends)

    async def facts_corrected_by(self, agent_id: str, memory_id: str) -> list[Fact]:
        return await self.primary.facts_corrected_by(agent_id, memory_id)

    async def list_entities(self, agent_id: str, namespace: Namespace | str | None = None,
                            entity_type: EntityType | None = None, name_prefix: str | None = None,
                            cursor: str | None = None, limit: int = 50,
                            within: Sequence[Namespace | str] | None = None) -> Page:
        return await self.primary.list_entities(agent_id, namespace, entity_type, name_prefix, cursor, limit, within)

    async def get_fact(self, agent_id: str, fact_id: str) -> Fact:
        return await self.primary.get_fact(agent_id, fact_id)

    async def drop_namespace_entities(self, agent_id: str, namespace: Namespace | str) -> int:
        return await self.primary.drop_namespace_entities(agent_id, namespace)

    async def get_entity(self, agent_id: str, entity_id: str, as_of: datetime | None = None,
                         include_superseded: bool = False, *, within: Sequence[Namespace | str] | None = None,
                         after: tuple[int, str] | None = None, limit: int = 200) -> EntityDetail:
        return await self.primary.get_entity(agent_id, entity_id, as_of, include_superseded, within=within,
                                             after=after, limit=limit)

    async def lookup_entities(self, agent_id: str, namespaces: Sequence[Namespace] | None,
                              names: Sequence[str]) -> list[Entity]:
        return await self.primary.lookup_entities(agent_id, namespaces, names)

    async def memories_mentioning(self, agent_id: str, entity_ids: Sequence[str],
                                  namespaces: Sequence[Namespace] | None, limit: int) -> list[EntityMentions]:
        return await self.primary.memories_mentioning(agent_id, entity_ids, namespaces, limit)

    async def entities_mentioned(self, agent_id: str, memory_ids: Sequence[str],
                                 limit: int) -> dict[str, list[MentionedEntity]]:
        return await self.primary.entities_mentioned(agent_id, memory_ids, limit)
