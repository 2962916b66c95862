"""The graph backend: memories as Graphiti episodes on FalkorDB, one graph per namespace.

Each namespace is a Graphiti group_id and, on FalkorDB, its own graph. Episodes are
written with Graphiti's own FalkorDB save query, so Graphiti can later run entity
extraction on them (``add_episode(uuid=...)``); two extra properties make reads cheap:
``kind`` (the memory kind) and ``ts``/``seq`` (a numeric sort key, because ISO strings
with and without microseconds do not sort reliably).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import Any

from memory_service.config import Settings, redact_url
from memory_service.models import Memory, MemoryKind
from memory_service.namespaces import Namespace

from .base import MemoryBackend

log = logging.getLogger(__name__)


def _disable_telemetry_unless_asked(settings: Settings) -> None:
    # graphiti-core reads this variable when it is imported; private conversations
    # must not leave the machine by default.
    os.environ["GRAPHITI_TELEMETRY_ENABLED"] = "true" if settings.graphiti_telemetry_enabled else "false"


def _save_query() -> str:
    from graphiti_core.driver.driver import GraphProvider
    from graphiti_core.models.nodes.node_db_queries import get_episode_node_save_query

    query = get_episode_node_save_query(GraphProvider.FALKORDB)
    anchor = "RETURN n.uuid AS uuid"
    if anchor not in query:  # fail loudly if graphiti-core changes its query shape
        raise RuntimeError("graphiti-core's FalkorDB episode save query changed; update backends/graph.py")
    return query.replace(anchor, "SET n.kind = $kind, n.ts = $ts, n.seq = $seq, n.evicted = $evicted " + anchor)


_READ_FIELDS = "n.uuid AS uuid, n.content AS content, n.valid_at AS valid_at, n.evicted AS evicted"


class GraphBackend(MemoryBackend):
    name = "graph"

    def __init__(self, url: str, settings: Settings | None = None):
        self.settings = settings or Settings()
        _disable_telemetry_unless_asked(self.settings)
        from falkordb.asyncio import FalkorDB

        self.url = url
        self.client = FalkorDB.from_url(url)
        self._drivers: dict[str, Any] = {}
        self._driver_lock = asyncio.Lock()
        self._query = _save_query()

    async def start(self) -> None:
        await self.client.connection.ping()

    async def close(self) -> None:
        await self.client.aclose()

    async def health(self) -> dict:
        try:
            await self.client.connection.ping()
            return {"ok": True, "url": redact_url(self.url), "graphs_cached": len(self._drivers)}
        except Exception as exc:  # health reports, it never raises
            return {"ok": False, "url": redact_url(self.url), "error": str(exc)}

    async def _driver(self, namespace: Namespace):
        """One Graphiti driver per group, cached: each new driver re-runs index creation."""
        group_id = namespace.group_id
        driver = self._drivers.get(group_id)
        if driver is not None:
            return driver
        async with self._driver_lock:
            driver = self._drivers.get(group_id)
            if driver is None:
                from graphiti_core.driver.falkordb_driver import FalkorDriver

                driver = FalkorDriver(falkor_db=self.client, database=group_id)
                if driver._init_task is not None:  # indexes first, so reads never race them
                    await driver._init_task
                self._drivers[group_id] = driver
        return driver

    async def _query_rows(self, namespace: Namespace, cypher: str, **params: Any) -> list[dict]:
        driver = await self._driver(namespace)
        result = await driver.execute_query(cypher, **params)
        return result[0] if result else []

    async def write(self, memories: Sequence[Memory]) -> int:
        by_namespace: dict[str, list[Memory]] = {}
        for memory in memories:
            by_namespace.setdefault(memory.namespace, []).append(memory)
        written = 0
        for namespace_text, group in by_namespace.items():
            namespace = Namespace.parse(namespace_text)
            existing = await self._existing_ids(namespace, [m.id for m in group])
            driver = await self._driver(namespace)
            for memory in group:
                if memory.id in existing:
                    continue
                await driver.execute_query(self._query, **self._episode_args(namespace, memory))
                existing.add(memory.id)
                written += 1
        return written

    def _episode_args(self, namespace: Namespace, memory: Memory) -> dict[str, Any]:
        from graphiti_core.nodes import EpisodeType

        source = EpisodeType.message if memory.kind is MemoryKind.MESSAGE else EpisodeType.json
        return {
            "uuid": memory.id,
            "name": f"{memory.kind.value}:{memory.id}",
            "group_id": namespace.group_id,
            "source_description": f"memory-service {memory.kind.value}",
            "source": source.value,
            "content": memory.episode_body(),
            "entity_edges": [],
            "created_at": memory.valid_at,
            "valid_at": memory.valid_at,
            "kind": memory.kind.value,
            "ts": memory.valid_at.timestamp(),
            "seq": memory.metadata.sequence,
            "evicted": True if memory.evicted else None,  # null removes the property
        }

    async def _existing_ids(self, namespace: Namespace, ids: list[str]) -> set[str]:
        rows = await self._query_rows(
            namespace, "MATCH (n:Episodic) WHERE n.uuid IN $ids RETURN n.uuid AS uuid", ids=ids
        )
        return {row["uuid"] for row in rows}

    async def get(self, namespace: Namespace, ids: Sequence[str]) -> list[Memory]:
        if not ids:
            return []
        rows = await self._query_rows(
            namespace,
            f"MATCH (n:Episodic) WHERE n.uuid IN $ids RETURN {_READ_FIELDS} ORDER BY n.ts, n.seq, n.uuid",
            ids=list(ids),
        )
        return [self._memory(namespace, row) for row in rows]

    async def recent(self, namespace: Namespace, kinds: Sequence[MemoryKind], limit: int) -> list[Memory]:
        if limit <= 0:
            return []
        rows = await self._query_rows(
            namespace,
            f"MATCH (n:Episodic) WHERE n.kind IN $kinds AND n.evicted IS NULL RETURN {_READ_FIELDS} "
            "ORDER BY n.ts DESC, n.seq DESC, n.uuid DESC LIMIT $limit",
            kinds=[k.value for k in kinds],
            limit=limit,
        )
        return [self._memory(namespace, row) for row in reversed(rows)]

    async def count(self, namespace: Namespace, kinds: Sequence[MemoryKind] = ()) -> int:
        where = "WHERE n.evicted IS NULL " + ("AND n.kind IN $kinds " if kinds else "")
        rows = await self._query_rows(
            namespace, f"MATCH (n:Episodic) {where}RETURN count(n) AS c", kinds=[k.value for k in kinds]
        )
        return int(rows[0]["c"]) if rows else 0

    async def trim(self, namespace: Namespace, kind: MemoryKind, keep: int) -> int:
        rows = await self._query_rows(
            namespace,
            "MATCH (n:Episodic) WHERE n.kind = $kind AND n.evicted IS NULL "
            "WITH n ORDER BY n.ts DESC, n.seq DESC, n.uuid DESC SKIP $keep "
            "SET n.evicted = true RETURN count(n) AS c",
            kind=kind.value,
            keep=keep,
        )
        return int(rows[0]["c"]) if rows else 0

    async def export(self, namespace: Namespace) -> list[Memory]:
        rows = await self._query_rows(
            namespace, f"MATCH (n:Episodic) WHERE n.kind IS NOT NULL RETURN {_READ_FIELDS} ORDER BY n.ts, n.seq, n.uuid"
        )
        return [self._memory(namespace, row) for row in rows]

    @staticmethod
    def _memory(namespace: Namespace, row: dict) -> Memory:
        memory = Memory.from_episode_body(
            id=row["uuid"], namespace=str(namespace), body=row["content"], valid_at=row["valid_at"]
        )
        memory.evicted = bool(row.get("evicted"))
        return memory
