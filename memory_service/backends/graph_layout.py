"""Moving data directories of the first layout (one FalkorDB graph per namespace) into the
current one (one graph per agent; see memory_service/backends/graph.py).

A graph of the first layout is named by its namespace's group_id (``session__s1``,
``user__a__alice``). Each is copied into its agent's graph (the agent is in every memory's
provenance) with idempotent writes, checked, and only then deleted, so a crash at any point
leaves every memory in at least one graph and running again finishes the job. Copied
memories carry no embedding: they are marked for the backfill, which the worker runs.

It is given the FalkorDB client and the backend to write through (any ``MemoryBackend``;
GraphBackend.start passes itself), not the GraphBackend class: graph.py imports this
module, and this module does not import graph.py back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from memory_service.backends.base import MemoryBackend
from memory_service.domain.models import Memory
from memory_service.domain.namespaces import Namespace

if TYPE_CHECKING:
    from falkordb.asyncio import FalkorDB  # untyped: Any to mypy, named for the reader

log = logging.getLogger(__name__)


def old_layout_namespace(graph: str) -> Namespace | None:
    try:
        return Namespace.from_group_id(graph)
    except Exception:
        return None


async def migrate_layout(client: FalkorDB, backend: MemoryBackend,
                         on_graph: Callable[[str, int], None] | None = None) -> dict[str, int]:
    """Copy every first-layout graph of ``client`` into its agent's graph through ``backend``,
    then delete it; counts."""
    report = {"graphs": 0, "memories": 0}
    for name in await client.list_graphs():
        namespace = old_layout_namespace(name)
        if namespace is None:
            continue
        graph = client.select_graph(name)
        result = await graph.ro_query(
            "MATCH (n:Episodic) WHERE n.kind IS NOT NULL "
            "RETURN n.uuid, n.content, n.valid_at, n.evicted ORDER BY n.ts, n.seq"
        )
        memories = []
        for uuid, body, valid_at, evicted in result.result_set:
            memory = Memory.from_episode_body(id=uuid, namespace=str(namespace), body=body, valid_at=valid_at)
            memory.evicted = bool(evicted)
            memories.append(memory)
        await backend.write(memories)
        by_agent: dict[str, set[str]] = {}
        for memory in memories:
            by_agent.setdefault(memory.metadata.agent_id, set()).add(memory.id)
        for agent_id, ids in by_agent.items():
            stored = {m.id for m in await backend.get(agent_id, namespace, list(ids))}
            if stored != ids:
                raise RuntimeError(f"layout migration: graph {name!r} copied {len(stored)} of {len(ids)} memories "
                                   f"of agent {agent_id!r}; it is kept, run again")
        await graph.delete()
        report["graphs"] += 1
        report["memories"] += len(memories)
        if on_graph:
            on_graph(name, len(memories))
    if report["graphs"]:
        log.warning("storage layout: moved %d memories from %d per-namespace graphs into per-agent graphs",
                    report["memories"], report["graphs"])
    return report
