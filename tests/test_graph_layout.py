"""Data directories of the first layout (one graph per namespace) move into per-agent graphs."""

from __future__ import annotations

from datetime import timedelta

from falkordb.asyncio import FalkorDB

from memory_service.backends.graph import GraphBackend
from memory_service.domain.models import Memory, MemoryKind, Provenance, Role, StoreQuery
from memory_service.domain.namespaces import Namespace

from .helpers import T0

OLD_SAVE = ("MERGE (n:Episodic {uuid: $uuid}) SET n.name = $uuid, n.group_id = $group_id, n.content = $content, "
            "n.valid_at = $valid_at, n.created_at = $valid_at, n.source = 'json', n.kind = $kind, n.ts = $ts, n.seq = $seq")


def memory(i: int, namespace: Namespace, kind: MemoryKind, agent: str = "a1") -> Memory:
    return Memory(id=f"m{i}", kind=kind, namespace=str(namespace), content=f"memory {i} about otters",
                  metadata=Provenance(agent_id=agent, user_id="alice", session_id="s1", message_ids=[f"D1:{i}"],
                                      sequence=i, role=Role.USER if kind is MemoryKind.MESSAGE else None),
                  valid_at=T0 + timedelta(minutes=i))


async def write_old_layout(client: FalkorDB, memories: list[Memory]) -> None:
    """What the first graph backend stored: a graph named by each namespace's group_id."""
    for m in memories:
        namespace = Namespace.parse(m.namespace)
        await client.select_graph(namespace.group_id).query(OLD_SAVE, {
            "uuid": m.id, "group_id": namespace.group_id, "content": m.episode_body(),
            "valid_at": m.valid_at.isoformat(), "kind": m.kind.value, "ts": m.valid_at.timestamp(),
            "seq": m.metadata.sequence})


async def test_first_layout_graphs_move_into_agent_graphs(settings):
    client = FalkorDB.from_url(settings.falkordb_url)
    session, user = Namespace.session("s1"), Namespace.user("a1", "alice")
    old = [memory(1, session, MemoryKind.MESSAGE), memory(2, session, MemoryKind.EPISODE),
           memory(3, user, MemoryKind.DIRECTIVE), memory(4, Namespace.session("s2"), MemoryKind.MESSAGE, agent="a2")]
    await write_old_layout(client, old)
    await client.select_graph("someone_elses_graph").query("CREATE (:Thing {name: 'keep me'})")
    backend = GraphBackend(settings.falkordb_url, settings, embedding_dimension=8)
    try:
        await backend.start()  # moves them
        assert sorted(await client.list_graphs()) == ["ms_agent__a1", "ms_agent__a2", "someone_elses_graph"]
        assert [m.id for m in await backend.export("a1", session)] == ["m1", "m2"]
        assert [m.content for m in await backend.recent("a1", user, [MemoryKind.DIRECTIVE], 5)] == ["memory 3 about otters"]
        assert [m.id for m in await backend.export("a2", Namespace.session("s2"))] == ["m4"]
        assert sorted(m.id for m in await backend.unembedded("a1", 10)) == ["m1", "m2", "m3"]  # for the backfill
        hits = await backend.search("a1", StoreQuery(terms=["otters"], limit=10))
        assert sorted(m.id for m, _ in hits["fulltext"]) == ["m1", "m2", "m3"]
        # Starting again finds nothing to move and changes nothing.
        await backend.start()
        assert await backend.count("a1", session) == 2
    finally:
        await backend.close()
        await client.aclose()
