"""The Mongo backend: memories in MongoDB through PyMongo's AsyncMongoClient.

Collections (in MONGODB_DATABASE):
  memories      one document per memory (message, episode, directive, fact, suggestion,
                consolidated, observation), ``_id`` = the memory id, with its namespace,
                kind, content, provenance, time and sequence: the source of every read.
  user_memory   one document per (agent, user): the latest consolidated memory and the
                most recent directives, for dashboards and the legacy readers.
  shards        one document per (agent, shard): the latest consolidated memory, the
                most recent suggestions and the FIFO of facts.

Every write is one atomic operation per document: inserts keyed by memory id (a retry
meets the unique ``_id`` and changes nothing), and ``$push`` with ``$slice``, ``$set``
and ``$max`` on the summaries. Nothing reads a whole document to write it back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, UpdateOne
from pymongo.errors import BulkWriteError, PyMongoError

from memory_service.config import redact_url
from memory_service.models import Memory, MemoryKind, Provenance
from memory_service.namespaces import Namespace, NamespaceKind

from .base import MemoryBackend

log = logging.getLogger(__name__)

# How many of the most recent items the summary documents keep.
SUMMARY_ITEMS = 100
_DUPLICATE_KEY = 11000


class MongoBackend(MemoryBackend):
    name = "mongo"

    def __init__(self, uri: str, database: str = "memory_service", *, timeout_ms: int = 5000,
                 facts_per_shard: int = SUMMARY_ITEMS):
        self.uri = uri
        self.client: AsyncMongoClient = AsyncMongoClient(
            uri, serverSelectionTimeoutMS=timeout_ms, connectTimeoutMS=timeout_ms, tz_aware=True
        )
        self.db = self.client[database]
        self.memories = self.db["memories"]
        self.user_memory = self.db["user_memory"]
        self.shards = self.db["shards"]
        self.facts_per_shard = facts_per_shard

    async def start(self) -> None:
        await self.client.admin.command("ping")
        # The indexes the reads need: recent-by-kind per namespace, and migration by agent.
        await self.memories.create_index(
            [("namespace", ASCENDING), ("kind", ASCENDING), ("evicted", ASCENDING), ("ts", DESCENDING), ("seq", DESCENDING)],
            name="namespace_kind_recent",
        )
        await self.memories.create_index([("agent_id", ASCENDING), ("namespace", ASCENDING)], name="agent_namespace")

    async def close(self) -> None:
        await self.client.close()

    async def health(self) -> dict:
        try:
            await self.client.admin.command("ping")
            return {"ok": True, "uri": redact_url(self.uri)}
        except PyMongoError as exc:
            return {"ok": False, "uri": redact_url(self.uri), "error": str(exc)}

    # Writes ----------------------------------------------------------------------------

    async def write(self, memories: Sequence[Memory]) -> int:
        if not memories:
            return 0
        docs = [_document(m) for m in memories]
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

    async def trim(self, namespace: Namespace, kind: MemoryKind, keep: int) -> int:
        live = {"namespace": str(namespace), "kind": kind.value, "evicted": False}
        newest_first = [("ts", DESCENDING), ("seq", DESCENDING), ("_id", DESCENDING)]
        # The last one kept; everything older goes. A memory inserted meanwhile is newer
        # than it, so a concurrent write is never evicted by this trim.
        cutoff = await self.memories.find_one(live, {"ts": 1, "seq": 1}, sort=newest_first, skip=max(keep - 1, 0))
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

    # Reads -----------------------------------------------------------------------------

    async def get(self, namespace: Namespace, ids: Sequence[str]) -> list[Memory]:
        if not ids:
            return []
        cursor = self.memories.find({"namespace": str(namespace), "_id": {"$in": list(ids)}})
        docs = await cursor.sort([("ts", ASCENDING), ("seq", ASCENDING), ("_id", ASCENDING)]).to_list()
        return [_memory(d) for d in docs]

    async def recent(self, namespace: Namespace, kinds: Sequence[MemoryKind], limit: int) -> list[Memory]:
        if limit <= 0:
            return []
        cursor = self.memories.find(
            {"namespace": str(namespace), "kind": {"$in": [k.value for k in kinds]}, "evicted": False}
        ).sort([("ts", DESCENDING), ("seq", DESCENDING), ("_id", DESCENDING)]).limit(limit)
        return [_memory(d) for d in reversed(await cursor.to_list())]

    async def count(self, namespace: Namespace, kinds: Sequence[MemoryKind] = ()) -> int:
        query: dict[str, Any] = {"namespace": str(namespace), "evicted": False}
        if kinds:
            query["kind"] = {"$in": [k.value for k in kinds]}
        return await self.memories.count_documents(query)

    async def export(self, namespace: Namespace) -> list[Memory]:
        docs = await self.memories.find({"namespace": str(namespace)}).sort(
            [("ts", ASCENDING), ("seq", ASCENDING), ("_id", ASCENDING)]
        ).to_list()
        return [_memory(d) for d in docs]


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
    )
