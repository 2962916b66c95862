"""The Mongo backend: memories in MongoDB through PyMongo's AsyncMongoClient.

Collections (in MONGODB_DATABASE):
  memories      one document per memory (message, episode, directive, fact, suggestion,
                consolidated, observation), ``_id`` = the memory id, with its agent,
                namespace, kind, content, provenance, time and sequence: the source of
                every read. Beside them, for search: ``search_text`` (what full-text
                search reads, in a text index), ``embedding`` (a BSON float32 vector) with
                ``embedding_model`` (the embedder that made it: search compares a query
                only with vectors of its own model) or, until it has one,
                ``needs_embedding: true`` (a partial index finds those for the backfill);
                while a re-embed runs, ``embedding_next`` and ``embedding_next_model``
                (the new model's vector, staged until it is promoted; docs/embeddings.md). Tool-written memories add ``title``, ``tags``,
                ``confidence``, ``updated_at``; a soft-deleted one has ``deleted_at`` (a
                Unix timestamp), and every read but find/export/unembedded filters it out;
                so with ``expires_at`` (a Unix timestamp) once it has passed, and with
                ``corrected_at`` (a memory found wrong; ``corrected_by``, ``corrects``
                link it and its correction: docs/corrections.md).
  user_memory   one document per (agent, user): the latest consolidated memory and the
                most recent directives, for dashboards and the legacy readers.
  shards        one document per (agent, shard): the latest consolidated memory, the
                most recent suggestions and the FIFO of facts.
  meta          the layout version of ``memories`` (documents stored before search
                existed get their search fields once, in ``start``).

Every write is one atomic operation per document: inserts keyed by memory id (a retry
meets the unique ``_id`` and changes nothing), and ``$push`` with ``$slice``, ``$set``
and ``$max`` on the summaries. Nothing reads a whole document to write it back.

Every read names the agent and filters by it: an agent never reads another's memories,
even in a namespace whose id another agent shares (session ids).

No knowledge graph: entities, facts and mentions (issue 16) live in the graph backend
only. The graph calls of MemoryBackend answer NotSupported here (a 409 saying so, never a
500): the simplest honest answer, and the one the mirror relies on (it sends them to the
graph alone).

Search (docs/mongo-search.md): full text through MongoDB's text index (``$text``, scored
by ``textScore``); vectors by exact cosine similarity computed here, over the scope's
stored vectors (self-hosted MongoDB has no vector index; Atlas's ``$vectorSearch`` is
not used), so its cost grows with the scope.
"""

from __future__ import annotations

import heapq
import logging
import math
import re
import struct
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from bson.binary import VECTOR_SUBTYPE, Binary, BinaryVectorDtype
from pymongo import ASCENDING, DESCENDING, TEXT, AsyncMongoClient, UpdateOne
from pymongo.errors import BulkWriteError, OperationFailure, PyMongoError

from memory_service.backends.base import ListedPage, MemoryBackend, MemoryListing, MemoryState, SignalHits
from memory_service.config import redact_url
from memory_service.domain.models import Memory, MemoryKind, Provenance, StoreQuery
from memory_service.domain.namespaces import Namespace, NamespaceKind

if TYPE_CHECKING:
    from numpy.typing import NDArray

try:  # numpy scores a batch of vectors at once; plain Python does the same, slower
    import numpy
except ImportError:  # pragma: no cover - numpy comes with the service's dependencies
    # mypy types an import as always there; the tests also set it to None, to score without it.
    numpy = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# How many of the most recent items the summary documents keep.
SUMMARY_ITEMS = 100
_DUPLICATE_KEY = 11000
_INDEX_NOT_FOUND = 27
MAX_FULLTEXT_TERMS = 32
# Documents per round trip when reading the scope's vectors.
VECTOR_BATCH = 1000
# The layout of ``memories`` this code writes: 2 = with search_text and embeddings.
LAYOUT_VERSION = 2
_FLOAT32 = BinaryVectorDtype.FLOAT32.value[0]
_NEWEST_FIRST = [("ts", DESCENDING), ("seq", DESCENDING), ("_id", DESCENDING)]
_OLDEST_FIRST = [("ts", ASCENDING), ("seq", ASCENDING), ("_id", ASCENDING)]
_NO_VECTOR = {"embedding": 0, "embedding_next": 0}  # reads never carry vectors back (as on the graph)
_TERM = re.compile(r"\w+")


class MongoBackend(MemoryBackend):
    name = "mongo"

    def __init__(self, uri: str, database: str = "memory_service", *, server_selection_timeout_ms: int = 2000,
                 connect_timeout_ms: int = 2000, socket_timeout_ms: int = 10000,
                 facts_per_shard: int = SUMMARY_ITEMS, embedding_dimension: int | None = None,
                 untagged_model: str | None = None):
        self.uri = uri
        # Every call is bounded: waiting for a reachable server (and for a pooled connection),
        # connecting, and each reply. PyMongo waits for a free connection forever by default.
        self.client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            uri, serverSelectionTimeoutMS=server_selection_timeout_ms, connectTimeoutMS=connect_timeout_ms,
            socketTimeoutMS=socket_timeout_ms, waitQueueTimeoutMS=server_selection_timeout_ms, tz_aware=True,
        )
        self.db = self.client[database]
        self.memories = self.db["memories"]
        self.user_memory = self.db["user_memory"]
        self.shards = self.db["shards"]
        self.meta = self.db["meta"]
        self.facts_per_shard = facts_per_shard
        # When set, vectors of another dimension are refused on write (as on the graph).
        self.embedding_dimension = embedding_dimension
        # The model of vectors stored before each vector carried its model's name.
        self.untagged_model = untagged_model

    async def start(self) -> None:
        await self.client.admin.command("ping")
        # The indexes the reads need: recent-by-kind per namespace, ...
        await self.memories.create_index(
            [("namespace", ASCENDING), ("kind", ASCENDING), ("evicted", ASCENDING), ("ts", DESCENDING), ("seq", DESCENDING)],
            name="namespace_kind_recent",
        )
        # ... an agent's memories by scope (search's filters, the vector scan, migration
        # by agent, ``agents()``), ...
        await self.memories.create_index(
            [("agent_id", ASCENDING), ("namespace", ASCENDING), ("kind", ASCENDING), ("evicted", ASCENDING),
             ("ts", DESCENDING)],
            name="agent_scope",
        )
        # ... full text within an agent (a compound text index: every $text query names
        # the agent, so it reads only that agent's entries), ...
        await self.memories.create_index([("agent_id", ASCENDING), ("search_text", TEXT)], name="agent_text",
                                         default_language="english")
        # ... an agent's memories by time, for the stale purge (``written_before``), ...
        await self.memories.create_index([("agent_id", ASCENDING), ("ts", ASCENDING), ("_id", ASCENDING)],
                                         name="agent_written")
        # ... an agent's memories of some namespaces, newest first (the browse API's list), ...
        await self.memories.create_index([("agent_id", ASCENDING), ("namespace", ASCENDING), ("ts", DESCENDING),
                                          ("_id", DESCENDING)], name="agent_namespace_time")
        # ... and the memories waiting for an embedding (only those are in the index).
        await self.memories.create_index([("agent_id", ASCENDING), ("needs_embedding", ASCENDING)],
                                         name="agent_unembedded", partialFilterExpression={"needs_embedding": True})
        # ... and the memories that expire, for the retention job (``expired``; only those are in the index).
        await self.memories.create_index([("agent_id", ASCENDING), ("expires_at", ASCENDING), ("_id", ASCENDING)],
                                         name="agent_expiry",
                                         partialFilterExpression={"expires_at": {"$type": "number"}})
        # ... and the vectors a re-embed staged (only while it runs).
        await self.memories.create_index([("agent_id", ASCENDING), ("embedding_next_model", ASCENDING)],
                                         name="agent_staged",
                                         partialFilterExpression={"embedding_next_model": {"$exists": True}})
        # agent_scope starts with (agent_id, namespace): the first layout's index is redundant.
        try:
            await self.memories.drop_index("agent_namespace")
        except OperationFailure as exc:
            if exc.code != _INDEX_NOT_FOUND:
                raise
        await self._upgrade_layout()

    async def _upgrade_layout(self) -> None:
        """Give documents stored before search existed their ``search_text`` and the
        ``needs_embedding`` mark, once (idempotent; a crash half-way runs it again)."""
        marker = await self.meta.find_one({"_id": "memories_layout"})
        if marker and marker.get("version", 0) >= LAYOUT_VERSION:
            return
        upgraded = 0
        batch: list[UpdateOne] = []
        async for doc in self.memories.find({"search_text": {"$exists": False}}, _NO_VECTOR):
            fields: dict[str, Any] = {"search_text": _memory(doc).search_text}
            if doc.get("needs_embedding") is None:
                fields["needs_embedding"] = True
            batch.append(UpdateOne({"_id": doc["_id"], "search_text": {"$exists": False}}, {"$set": fields}))
            if len(batch) >= VECTOR_BATCH:
                upgraded += (await self.memories.bulk_write(batch, ordered=False)).modified_count
                batch = []
        if batch:
            upgraded += (await self.memories.bulk_write(batch, ordered=False)).modified_count
        await self.meta.update_one({"_id": "memories_layout"}, {"$max": {"version": LAYOUT_VERSION}}, upsert=True)
        if upgraded:
            log.warning("mongo: %d memories stored before search got their search fields; the embedding "
                        "backfill embeds them", upgraded)

    async def close(self) -> None:
        await self.client.close()

    async def health(self) -> dict[str, Any]:
        try:
            await self.client.admin.command("ping")
            return {"ok": True, "uri": redact_url(self.uri)}
        except PyMongoError as exc:
            return {"ok": False, "uri": redact_url(self.uri), "error": str(exc)}

    async def gauges(self) -> dict[str, float]:
        """``memories_stored{store="mongo"}``: the collection's count from its metadata
        (``estimated_document_count``, no document read), soft-deleted memories included."""
        return {'memories_stored{store="mongo"}': float(await self.memories.estimated_document_count())}

    # Writes ----------------------------------------------------------------------------

    async def write(self, memories: Sequence[Memory]) -> int:
        if not memories:
            return 0
        docs = [self._document(m) for m in memories]
        try:
            result = await self.memories.insert_many(docs, ordered=False)
            inserted = {str(i) for i in result.inserted_ids}
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(e.get("code") != _DUPLICATE_KEY for e in errors):
                raise
            duplicates = {docs[e["index"]]["_id"] for e in errors}
            inserted = {d["_id"] for d in docs} - duplicates
        new = [m for m in memories if m.id in inserted]
        await self._update_summaries(new)
        return len(new)

    def _document(self, memory: Memory) -> dict[str, Any]:
        doc = _document(memory)
        if memory.embedding is not None:
            doc["embedding"] = self._vector(memory.embedding)
            doc["embedding_model"] = memory.embedding_model
        else:
            doc["needs_embedding"] = True
        return doc

    def _vector(self, vector: Sequence[float]) -> Binary:
        if self.embedding_dimension and len(vector) != self.embedding_dimension:
            raise ValueError(f"an embedding of {len(vector)} dimensions cannot be stored beside "
                             f"{self.embedding_dimension}-dimensional vectors")
        return Binary.from_vector([float(x) for x in vector], BinaryVectorDtype.FLOAT32)

    async def _update_summaries(self, memories: Sequence[Memory]) -> None:
        """Keep the user and shard summary documents in step, one atomic update each."""
        ops: dict[str, list[UpdateOne]] = {"user_memory": [], "shards": []}
        for memory in memories:
            ns = Namespace.parse(memory.namespace)
            if ns.kind not in (NamespaceKind.USER, NamespaceKind.SHARD):
                continue
            collection = "user_memory" if ns.kind is NamespaceKind.USER else "shards"
            item = {"id": memory.id, "content": memory.content, "valid_at": memory.valid_at.isoformat()}
            key = {"_id": memory.namespace}
            base = {"$setOnInsert": {"agent_id": ns.fields[0], _second_field(ns): ns.fields[1]}}
            if memory.kind is MemoryKind.CONSOLIDATED:
                # $max on the version: an older version written late never replaces a newer one.
                ops[collection].append(UpdateOne(key, {**base, "$max": {"consolidated_version": memory.metadata.sequence}},
                                                 upsert=True))
                ops[collection].append(UpdateOne(
                    {**key, "consolidated_version": memory.metadata.sequence},
                    {"$set": {"consolidated": {**item, "version": memory.metadata.sequence}}},
                ))
            elif memory.kind in (MemoryKind.DIRECTIVE, MemoryKind.SUGGESTION, MemoryKind.FACT):
                field, keep = {
                    MemoryKind.DIRECTIVE: ("recent_directives", SUMMARY_ITEMS),
                    MemoryKind.SUGGESTION: ("recent_suggestions", SUMMARY_ITEMS),
                    MemoryKind.FACT: ("facts", self.facts_per_shard),
                }[memory.kind]
                ops[collection].append(UpdateOne(
                    key, {**base, "$push": {field: {"$each": [item], "$slice": -keep}}}, upsert=True
                ))
        for name, batch in ops.items():
            if batch:
                await self.db[name].bulk_write(batch, ordered=True)

    async def describe_shard(self, agent_id: str, shard_id: str, name: str, extraction_focus: str, active: bool) -> None:
        await self.shards.update_one(
            {"_id": str(Namespace.shard(agent_id, shard_id))},
            {"$set": {"agent_id": agent_id, "shard_id": shard_id, "name": name,
                      "extraction_focus": extraction_focus, "active": active}},
            upsert=True,
        )

    async def trim(self, agent_id: str, namespace: Namespace, kind: MemoryKind, keep: int) -> int:
        live = {"agent_id": agent_id, "namespace": str(namespace), "kind": kind.value, "evicted": False}
        # The last one kept; everything older goes. A memory inserted meanwhile is newer
        # than it, so a concurrent write is never evicted by this trim.
        cutoff = await self.memories.find_one(live, {"ts": 1, "seq": 1}, sort=_NEWEST_FIRST, skip=max(keep - 1, 0))
        if cutoff is None:
            return 0
        if keep == 0:
            older = {}
        else:
            older = {"$or": [
                {"ts": {"$lt": cutoff["ts"]}},
                {"ts": cutoff["ts"], "seq": {"$lt": cutoff["seq"]}},
                {"ts": cutoff["ts"], "seq": cutoff["seq"], "_id": {"$lt": cutoff["_id"]}},
            ]}
        result = await self.memories.update_many({**live, **older}, {"$set": {"evicted": True}})
        return result.modified_count

    async def set_embeddings(self, agent_id: str, vectors: Mapping[str, Sequence[float]],
                             model: str | None = None) -> int:
        if not vectors:
            return 0
        ops = [UpdateOne({"_id": memory_id, "agent_id": agent_id},
                         {"$set": {"embedding": self._vector(vector), "embedding_model": model},
                          "$unset": {"needs_embedding": ""}})
               for memory_id, vector in vectors.items()]
        result = await self.memories.bulk_write(ops, ordered=False)
        return result.matched_count

    async def delete(self, agent_id: str, ids: Sequence[str]) -> int:
        """The summaries first, then the memories: a crash between the two leaves memories
        that a retry finds again, never a summary still quoting a deleted one."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return 0
        held = await self.memories.find({"agent_id": agent_id, "_id": {"$in": ids}}, {"namespace": 1}).to_list()
        summaries = sorted({d["namespace"] for d in held if d["namespace"].startswith(("user:", "shard:"))})
        for namespace in summaries:
            collection = self.user_memory if namespace.startswith("user:") else self.shards
            await collection.update_one({"_id": namespace}, {"$pull": {field: {"id": {"$in": ids}} for field in
                                                                       ("recent_directives", "recent_suggestions", "facts")}})
            await collection.update_one({"_id": namespace, "consolidated.id": {"$in": ids}}, {"$unset": {"consolidated": ""}})
            if collection is self.user_memory:  # nothing left on the user: no document naming them either
                await self.user_memory.delete_one({"_id": namespace, "consolidated": {"$exists": False},
                                                   "recent_directives.0": {"$exists": False}})
        result = await self.memories.delete_many({"agent_id": agent_id, "_id": {"$in": ids}})
        return int(result.deleted_count)

    async def replace(self, agent_id: str, memories: Sequence[Memory]) -> int:
        if not memories:
            return 0
        # A memory without a vector keeps the stored one while its text is the same (a soft
        # delete, a new title); a new text without one waits for the backfill. A vector staged
        # by a re-embed goes with a new text (the re-embed finds the memory again).
        stored = {d["_id"]: d.get("search_text") for d in await self.memories.find(
            {"agent_id": agent_id, "_id": {"$in": [m.id for m in memories]}}, {"search_text": 1}).to_list()}
        ops = []
        for memory in memories:
            doc = self._document(memory)
            changed = {k: doc[k] for k in ("content", "search_text", "title", "tags", "confidence", "updated_at",
                                            "deleted_at", "expires_at", "corrected_at", "corrected_by", "corrects")}
            update: dict[str, Any]
            same = stored.get(memory.id) == memory.search_text
            staged = {} if same else {"embedding_next": "", "embedding_next_model": ""}
            if "embedding" in doc:
                update = {"$set": {**changed, "embedding": doc["embedding"], "embedding_model": doc["embedding_model"]},
                          "$unset": {"needs_embedding": "", **staged}}
            elif same:
                update = {"$set": changed}
            else:
                update = {"$set": {**changed, "needs_embedding": True},
                          "$unset": {"embedding": "", "embedding_model": "", **staged}}
            ops.append(UpdateOne({"_id": memory.id, "agent_id": agent_id}, update))
        return int((await self.memories.bulk_write(ops, ordered=False)).matched_count)

    async def find(self, agent_id: str, ids: Sequence[str]) -> list[Memory]:
        if not ids:
            return []
        cursor = self.memories.find({"agent_id": agent_id, "_id": {"$in": list(ids)}}, _NO_VECTOR)
        return [_memory(d) for d in await cursor.sort(_OLDEST_FIRST).to_list()]

    async def set_provenance(self, agent_id: str, memories: Sequence[Memory]) -> int:
        if not memories:
            return 0
        ops = [UpdateOne({"_id": m.id, "agent_id": agent_id}, {"$set": {"metadata": m.metadata.model_dump(mode="json")}})
               for m in memories]
        return int((await self.memories.bulk_write(ops, ordered=False)).matched_count)

    # Reads -----------------------------------------------------------------------------

    async def get(self, agent_id: str, namespace: Namespace, ids: Sequence[str]) -> list[Memory]:
        if not ids:
            return []
        cursor = self.memories.find({"agent_id": agent_id, "namespace": str(namespace), "_id": {"$in": list(ids)},
                                     "deleted_at": None, **_unexpired()}, _NO_VECTOR)
        return [_memory(d) for d in await cursor.sort(_OLDEST_FIRST).to_list()]

    async def recent(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind], limit: int) -> list[Memory]:
        if limit <= 0 or not kinds:
            return []
        cursor = self.memories.find(
            {"agent_id": agent_id, "namespace": str(namespace), "kind": {"$in": [k.value for k in kinds]},
             "evicted": False, "deleted_at": None, **_unexpired()},
            _NO_VECTOR,
        ).sort(_NEWEST_FIRST).limit(limit)
        return [self._with_vector_model(d) for d in reversed(await cursor.to_list())]

    def _with_vector_model(self, doc: dict[str, Any]) -> Memory:
        """The memory, and the model of its stored vector (not the vector): the memory block
        reads it to know whether a search like its latest message can reuse the stored vector
        or must embed the text first. A document without a vector carries ``needs_embedding``
        (``_document``, ``_upgrade_layout``); one stored before vectors carried their model is
        of ``untagged_model``."""
        memory = _memory(doc)
        if not doc.get("needs_embedding"):
            memory.embedding_model = doc.get("embedding_model") or self.untagged_model
        return memory

    async def count(self, agent_id: str, namespace: Namespace, kinds: Sequence[MemoryKind] = ()) -> int:
        query: dict[str, Any] = {"agent_id": agent_id, "namespace": str(namespace), "evicted": False, "deleted_at": None,
                                 **_unexpired()}
        if kinds:
            query["kind"] = {"$in": [k.value for k in kinds]}
        return await self.memories.count_documents(query)

    async def export(self, agent_id: str, namespace: Namespace) -> list[Memory]:
        docs = await self.memories.find({"agent_id": agent_id, "namespace": str(namespace)}, _NO_VECTOR).sort(
            _OLDEST_FIRST).to_list()
        return [_memory(d) for d in docs]

    async def written_before(self, agent_id: str, before: datetime, limit: int,
                             after: tuple[float, str] | None = None) -> list[Memory]:
        if limit <= 0:
            return []
        query: dict[str, Any] = {"agent_id": agent_id, "ts": {"$lt": before.timestamp()}}
        if after is not None:
            # The range on ``ts`` bounds the agent_written index scan; the id breaks ties at the cursor.
            query["ts"]["$gte"] = after[0]
            query["$or"] = [{"ts": {"$gt": after[0]}}, {"_id": {"$gt": after[1]}}]
        cursor = self.memories.find(query, _NO_VECTOR).sort([("ts", ASCENDING), ("_id", ASCENDING)]).limit(limit)
        return [_memory(d) for d in await cursor.to_list()]

    async def expired(self, agent_id: str, now: datetime, limit: int) -> list[Memory]:
        if limit <= 0:
            return []
        cursor = self.memories.find({"agent_id": agent_id, "expires_at": {"$type": "number", "$lte": now.timestamp()}},
                                    _NO_VECTOR).sort([("expires_at", ASCENDING), ("_id", ASCENDING)]).limit(limit)
        return [_memory(d) for d in await cursor.to_list()]

    async def list_memories(self, agent_id: str, listing: MemoryListing) -> ListedPage:
        """Newest first through the agent_written index (every namespace) or agent_namespace_time
        (some): the position's range bounds the index scan, so a page costs its size."""
        if listing.limit <= 0 or (listing.namespaces is not None and not listing.namespaces):
            return ListedPage([])
        query: dict[str, Any] = {"agent_id": agent_id}
        if listing.namespaces is not None:
            query["namespace"] = {"$in": list(dict.fromkeys(str(ns) for ns in listing.namespaces))}
        if listing.kinds:
            query["kind"] = {"$in": [MemoryKind(k).value for k in listing.kinds]}
        if listing.tags:
            query["tags"] = {"$all": list(listing.tags)}
        if listing.state is MemoryState.LIVE:
            query.update(evicted=False, deleted_at=None, **_unexpired())
        elif listing.state is MemoryState.DELETED:
            query["deleted_at"] = {"$ne": None}
        elif listing.state is MemoryState.EVICTED:
            query["evicted"] = True
        elif listing.state is MemoryState.CORRECTED:
            query["corrected_at"] = {"$ne": None}
        ts: dict[str, float] = {}
        if listing.since is not None:
            ts["$gte"] = listing.since.timestamp()
        if listing.until is not None:
            ts["$lte"] = listing.until.timestamp()
        if listing.after is not None:
            at, after_id = listing.after
            ts["$lte"] = min(ts.get("$lte", at), at)
            query["$or"] = [{"ts": {"$lt": at}}, {"ts": at, "_id": {"$lt": after_id}}]
        if ts:
            query["ts"] = ts
        cursor = self.memories.find(query, _NO_VECTOR).sort([("ts", DESCENDING), ("_id", DESCENDING)])
        docs = await cursor.limit(listing.limit).to_list()
        memories = [_memory(d) for d in docs]
        resume = (float(docs[-1]["ts"]), str(docs[-1]["_id"])) if len(docs) == listing.limit else None
        return ListedPage(memories, resume)

    async def agents(self) -> list[str]:
        return sorted(a for a in await self.memories.distinct("agent_id") if isinstance(a, str))

    async def unembedded(self, agent_id: str, limit: int, exclude: Collection[str] = ()) -> list[Memory]:
        if limit <= 0:
            return []
        query: dict[str, Any] = {"agent_id": agent_id, "needs_embedding": True}
        if exclude:
            query["_id"] = {"$nin": list(exclude)}
        cursor = self.memories.find(query, _NO_VECTOR).limit(limit)
        return [_memory(d) for d in await cursor.to_list()]

    async def search(self, agent_id: str, query: StoreQuery) -> SignalHits:
        if query.namespaces is not None and not query.namespaces:
            return {}
        scope = _scope(agent_id, query)
        hits: SignalHits = {}
        terms = [t for t in dict.fromkeys(query.terms) if _TERM.fullmatch(t)][:MAX_FULLTEXT_TERMS]
        if terms:
            hits["fulltext"] = await self._fulltext(scope, terms, query.limit)
        vector = query.vector
        if query.like is not None:
            vector = await self.stored_embedding(agent_id, query.like, query.vector_model)
        if vector is not None:
            hits["vector"] = await self._nearest({**scope, **self._same_model(query.vector_model)}, vector, query.limit)
        return hits

    async def stored_embedding(self, agent_id: str, memory_id: str, model: str | None) -> list[float] | None:
        doc = await self.memories.find_one({"_id": memory_id, "agent_id": agent_id, "embedding": {"$exists": True},
                                            **self._same_model(model)}, {"embedding": 1})
        vector = _decode(doc["embedding"]) if doc else None
        return [float(x) for x in vector] if vector is not None else None

    def _same_model(self, model: str | None) -> dict[str, Any]:
        """The filter of stored vectors a query of ``model`` is compared with: its own model's
        (an untagged one, stored before vectors carried their model, is of ``untagged_model``)."""
        if model is None:
            return {}
        return {"embedding_model": {"$in": [model, None]} if model == self.untagged_model else model}

    # Changing the embedding model (the interface's docstrings; docs/embeddings.md) ---------------

    async def reembed_candidates(self, agent_id: str, model: str, after: str | None,
                                 limit: int) -> tuple[list[tuple[str, str]], str | None]:
        done = [{"embedding": {"$exists": True}, **self._same_model(model)}]
        query: dict[str, Any] = {"agent_id": agent_id, "embedding_next_model": {"$ne": model}, "$nor": done}
        if after is not None:
            query["_id"] = {"$gt": after}
        cursor = self.memories.find(query, {"search_text": 1}).sort([("_id", ASCENDING)]).limit(limit)
        docs = await cursor.to_list()
        following = str(docs[-1]["_id"]) if len(docs) >= limit else None
        return [(str(d["_id"]), d.get("search_text") or "") for d in docs], following

    async def stage_embeddings(self, agent_id: str, model: str, vectors: Mapping[str, tuple[str, Sequence[float]]]) -> int:
        if not vectors:
            return 0
        ops = [UpdateOne({"_id": memory_id, "agent_id": agent_id, "search_text": text},
                         {"$set": {"embedding_next": self._vector(vector), "embedding_next_model": model}})
               for memory_id, (text, vector) in vectors.items()]
        return int((await self.memories.bulk_write(ops, ordered=False)).matched_count)

    async def promote_embeddings(self, agent_id: str, model: str, limit: int) -> int:
        docs = await self.memories.find({"agent_id": agent_id, "embedding_next_model": model},
                                        {"embedding_next": 1}).limit(limit).to_list()
        if not docs:
            return 0
        ops = [UpdateOne({"_id": d["_id"], "agent_id": agent_id, "embedding_next_model": model},
                         {"$set": {"embedding": d["embedding_next"], "embedding_model": model},
                          "$unset": {"embedding_next": "", "embedding_next_model": "", "needs_embedding": ""}})
               for d in docs]
        return int((await self.memories.bulk_write(ops, ordered=False)).matched_count)

    async def _fulltext(self, scope: dict[str, Any], terms: Sequence[str], limit: int) -> list[tuple[Memory, float]]:
        """Memories with any of the terms ($text ORs the words), by MongoDB's textScore."""
        if limit <= 0:
            return []
        cursor = self.memories.find(
            {**scope, "$text": {"$search": " ".join(terms)}},
            {**_NO_VECTOR, "text_score": {"$meta": "textScore"}},
        ).sort([("text_score", {"$meta": "textScore"}), ("ts", DESCENDING), ("_id", ASCENDING)]).limit(limit)
        return [(_memory(d), float(d["text_score"])) for d in await cursor.to_list()]

    async def _nearest(self, scope: dict[str, Any], vector: Sequence[float], limit: int) -> list[tuple[Memory, float]]:
        """The ``limit`` memories of the scope most similar to ``vector`` (exact cosine similarity).

        Reads the ``_id`` and vector of every embedded memory in the scope (through the
        agent_scope index) in batches, keeping the best ``limit`` as it goes, then reads
        those memories. Cost: the scope's size.
        """
        if limit <= 0:
            return []
        scorer = _CosineTopK(vector, limit)
        if scorer.empty:
            return []
        cursor = self.memories.find({**scope, "embedding": {"$exists": True}}, {"embedding": 1}, batch_size=VECTOR_BATCH)
        batch: list[tuple[str, Any]] = []
        async for doc in cursor:
            batch.append((doc["_id"], doc["embedding"]))
            if len(batch) >= VECTOR_BATCH:
                scorer.add(batch)
                batch = []
        scorer.add(batch)
        best = scorer.best()
        if not best:
            return []
        docs = {d["_id"]: d for d in await self.memories.find({"_id": {"$in": [i for i, _ in best]}},
                                                               _NO_VECTOR).to_list()}
        return [(_memory(docs[i]), score) for i, score in best if i in docs]


def _unexpired() -> dict[str, Any]:
    """The filter of memories neither expired now nor corrected: no ``expires_at`` (missing or
    null), or one still ahead (docs/expiry.md), and no ``corrected_at`` (docs/corrections.md)."""
    return {"expires_at": {"$not": {"$lte": time.time()}}, "corrected_at": None}


def _scope(agent_id: str, query: StoreQuery) -> dict[str, Any]:
    """The filter of a search: the agent's live memories in the namespaces, kinds and time range."""
    scope: dict[str, Any] = {"agent_id": agent_id}
    if query.namespaces is not None:
        scope["namespace"] = {"$in": list(dict.fromkeys(str(ns) for ns in query.namespaces))}
    if query.kinds:
        scope["kind"] = {"$in": [MemoryKind(k).value for k in query.kinds]}
    scope["evicted"] = False
    scope["deleted_at"] = None  # missing or null: not soft-deleted
    scope.update(_unexpired())
    if query.tags:
        scope["tags"] = {"$all": list(query.tags)}
    if query.since or query.until:
        scope["ts"] = {}
        if query.since:
            scope["ts"]["$gte"] = query.since.timestamp()
        if query.until:
            scope["ts"]["$lte"] = query.until.timestamp()
    return scope


class _CosineTopK:
    """The best ``limit`` (id, cosine similarity) of the vectors given in batches."""

    def __init__(self, query: Sequence[float], limit: int):
        self.limit = limit
        self.dimension = len(query)
        norm = math.sqrt(sum(float(x) * float(x) for x in query))
        self.empty = norm == 0.0 or not self.dimension
        unit = [float(x) / norm for x in query] if not self.empty else []
        self.query = numpy.asarray(unit, dtype=numpy.float32) if numpy is not None else unit
        self._best: list[tuple[float, str]] = []
        self.skipped = 0  # stored vectors of another dimension (another embedder's)

    def add(self, batch: Iterable[tuple[str, Any]]) -> None:
        ids, vectors = [], []
        for memory_id, stored in batch:
            vector = _decode(stored)
            if vector is None or len(vector) != self.dimension:
                self.skipped += 1
                continue
            ids.append(memory_id)
            vectors.append(vector)
        if not ids:
            return
        if numpy is not None:
            matrix = numpy.vstack(vectors)
            norms = numpy.linalg.norm(matrix, axis=1)
            with numpy.errstate(divide="ignore", invalid="ignore"):
                scores = numpy.where(norms > 0, (matrix @ self.query) / norms, 0.0)
            scored = zip(scores.tolist(), ids)
        else:
            scored = ((_cosine(self.query, v), i) for i, v in zip(ids, vectors))
        self._best = heapq.nlargest(self.limit, [*self._best, *scored])

    def best(self) -> list[tuple[str, float]]:
        if self.skipped:
            log.warning("vector search skipped %d stored vectors of a dimension other than %d", self.skipped,
                        self.dimension)
        return [(i, float(s)) for s, i in sorted(self._best, key=lambda p: (-p[0], p[1]))]


def _decode(stored: Any) -> NDArray[Any] | Sequence[float] | None:
    """A stored vector (BSON float32 vector, or an array of numbers) as numpy or a list."""
    if isinstance(stored, Binary) and stored.subtype == VECTOR_SUBTYPE:
        data = bytes(stored)
        if len(data) < 2 or data[0] != _FLOAT32 or (len(data) - 2) % 4:
            return None
        if numpy is not None:
            return numpy.frombuffer(data, dtype="<f4", offset=2)
        return struct.unpack(f"<{(len(data) - 2) // 4}f", data[2:])
    if isinstance(stored, list):
        return numpy.asarray(stored, dtype=numpy.float32) if numpy is not None else [float(x) for x in stored]
    return None


def _cosine(unit_query: Sequence[float], vector: Sequence[float]) -> float:
    norm = math.sqrt(sum(x * x for x in vector))
    return sum(q * x for q, x in zip(unit_query, vector)) / norm if norm else 0.0


def _second_field(namespace: Namespace) -> str:
    return "user_id" if namespace.kind is NamespaceKind.USER else "shard_id"


def _document(memory: Memory) -> dict[str, Any]:
    return {
        "_id": memory.id,
        "namespace": memory.namespace,
        "kind": memory.kind.value,
        "content": memory.content,
        "metadata": memory.metadata.model_dump(mode="json"),
        "agent_id": memory.metadata.agent_id,
        "valid_at": memory.valid_at.isoformat(),  # a string: BSON dates keep only milliseconds
        "ts": memory.valid_at.timestamp(),
        "seq": memory.metadata.sequence,
        "evicted": memory.evicted,
        "search_text": memory.search_text,
        "title": memory.title,
        "tags": list(memory.tags),
        "confidence": memory.confidence,
        "updated_at": memory.updated_at.isoformat() if memory.updated_at else None,
        "deleted_at": memory.deleted_at.timestamp() if memory.deleted_at else None,
        "expires_at": memory.expires_at.timestamp() if memory.expires_at else None,
        "corrected_at": memory.corrected_at.timestamp() if memory.corrected_at else None,
        "corrected_by": memory.corrected_by,
        "corrects": memory.corrects,
    }


def _memory(doc: dict[str, Any]) -> Memory:
    return Memory(
        id=doc["_id"],
        kind=doc["kind"],
        namespace=doc["namespace"],
        content=doc["content"],
        metadata=Provenance.model_validate(doc["metadata"]),
        valid_at=doc["valid_at"],
        evicted=doc.get("evicted", False),
        title=doc.get("title"),
        tags=doc.get("tags") or [],
        confidence=doc.get("confidence"),
        updated_at=doc.get("updated_at"),
        deleted_at=datetime.fromtimestamp(float(doc["deleted_at"]), UTC) if doc.get("deleted_at") is not None else None,
        expires_at=datetime.fromtimestamp(float(doc["expires_at"]), UTC) if doc.get("expires_at") is not None else None,
        corrected_at=(datetime.fromtimestamp(float(doc["corrected_at"]), UTC)
                      if doc.get("corrected_at") is not None else None),
        corrected_by=doc.get("corrected_by"),
        corrects=doc.get("corrects"),
        served_by="mongo",
    )
