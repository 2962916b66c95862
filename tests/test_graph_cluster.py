"""The graphs on a Redis Cluster whose nodes load FalkorDB (FALKORDB_URL=redis+cluster://...;
memory_service/backends/falkordb_client.py): each agent's graph on the node of its key's
slot, its postings on the node of its hash tag's, and what is per server (GRAPH.LIST, the
query log's switch, the erasure's file rewrite) asked of the right nodes. Runs in ``make
test-cluster``; without a cluster only the checks of the settings run."""

from __future__ import annotations

import logging
import re
import time

import pytest
import redis
from redis.crc import key_slot

from memory_service.backends.graph import GraphBackend, graph_name
from memory_service.config import Settings
from memory_service.domain.models import Memory, MemoryKind, Provenance, StoreQuery
from memory_service.domain.namespaces import Namespace
from memory_service.domain.text import stem
from memory_service.runtime import open_service
from memory_service.state import keyspace
from memory_service.state.persistence import rewrite

from .conftest import cluster_nodes, cluster_url
from .helpers import msg

AGENTS = [f"agent-{i}" for i in range(8)]

on_cluster = pytest.mark.skipif(not cluster_url(), reason="needs TEST_REDIS_CLUSTER (make test-cluster)")


def memory(agent: str, i: int, text: str) -> Memory:
    return Memory(id=f"{agent}-m{i}", kind=MemoryKind.MESSAGE, namespace=str(Namespace.session(f"{agent}-s")),
                  content=text, metadata=Provenance(agent_id=agent, user_id="alice", session_id=f"{agent}-s"))


def holder(key: str) -> str:
    """redis://host:port of the primary owning ``key``'s slot."""
    slot = key_slot(key.encode())
    with redis.Redis.from_url(cluster_nodes()[0]) as client:
        for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return f"redis://{primary[0].decode()}:{primary[1]}"
    raise AssertionError(f"no node owns slot {slot}")


@pytest.fixture
def backend(graph_backend):
    return graph_backend


@on_cluster
async def test_each_agents_graph_is_on_the_node_of_its_slot_and_every_node_is_listed(backend):
    for agent in AGENTS:
        await backend.write([memory(agent, 0, f"the ferry of {agent}"), memory(agent, 1, "a lighthouse tour")])
    by_node = {}
    for node in cluster_nodes():
        with redis.Redis.from_url(node, decode_responses=True) as client:
            by_node[node] = set(client.execute_command("GRAPH.LIST"))
    assert {g: n for n, graphs in by_node.items() for g in graphs} == {graph_name(a): holder(graph_name(a)) for a in AGENTS}
    assert len([n for n, graphs in by_node.items() if graphs]) > 1  # spread, not all on one node
    assert await backend.agents() == sorted(AGENTS)  # GRAPH.LIST of every primary
    assert (await backend.health())["agent_graphs"] == len(AGENTS)
    backend.settings.metrics_stored_refresh_seconds = 0
    assert (await backend.gauges())['memories_stored{store="graph"}'] == 2 * len(AGENTS)


@on_cluster
async def test_an_agents_postings_are_on_its_tags_node_and_search_rebuild_and_clear_work(backend):
    agents = [a for a in AGENTS if holder(keyspace.postings_stats(a)) != holder(graph_name(a))]
    assert agents  # some agent's postings live on another node than its graph
    agent = agents[0]
    await backend.write([memory(agent, i, text) for i, text in enumerate(
        ["the lighthouse keeper", "a ferry at dawn", "the lighthouse tour at noon"])])
    query = StoreQuery(terms=["lighthouse"], namespaces=None, limit=5)
    assert sorted(m.id for m, _ in (await backend.search(agent, query))["fulltext"]) == [f"{agent}-m0", f"{agent}-m2"]
    with redis.Redis.from_url(holder(keyspace.postings_stats(agent))) as client:
        assert client.exists(keyspace.postings_docs(agent), keyspace.postings_term(agent, stem("lighthouse"))) == 2
    assert await backend.build_postings(agent) == 3  # clear (a SCAN of every primary) and build again
    assert sorted(m.id for m, _ in (await backend.search(agent, query))["fulltext"]) == [f"{agent}-m0", f"{agent}-m2"]
    assert await backend.postings.clear(agent) >= 3
    assert not await backend.postings.built(agent)


@on_cluster
async def test_the_query_log_is_purged_on_the_graphs_node_without_a_warning(backend, caplog):
    agent = AGENTS[0]
    await backend.write([memory(agent, 0, "the ferry leaves at nine")])
    caplog.set_level(logging.WARNING)
    assert await backend.purge_query_log(agent) > 0  # GRAPH.CONFIG asked of the graph's node
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    with redis.Redis.from_url(holder(graph_name(agent))) as client:
        assert not client.exists(f"telemetry{{{graph_name(agent)}}}")


@on_cluster
async def test_the_erasures_file_rewrite_asks_every_primary(settings):
    async with open_service(settings, run_worker=False) as service:
        _, graph = await service.agents.backend_for("a1")
        outcome = await rewrite([("state", service.state.redis), *(("graph", s) for s in graph.redis_servers())])
    # The same nodes hold both stores: one entry each, named by address (the test nodes keep no files).
    assert outcome == {f"state+graph {node.removeprefix('redis://')}": "aof off" for node in cluster_nodes()}


@on_cluster
async def test_a_stalled_node_fails_a_graph_query_after_one_read_timeout_and_the_next_call_works(settings):
    quick = settings.model_copy(update={"store_read_timeout_seconds": 0.3})
    backend = GraphBackend(quick.falkordb_url, quick)
    await backend.start()
    graph = backend.client.select_graph(graph_name(AGENTS[0]))
    try:
        await backend.write([memory(AGENTS[0], 0, "the ferry leaves at nine")])
        with redis.Redis.from_url(holder(graph_name(AGENTS[0]))) as node:
            node.execute_command("CLIENT", "PAUSE", 3000, "ALL")  # answers nothing for 3 s
            started = time.monotonic()
            try:
                with pytest.raises(redis.TimeoutError):
                    await graph.ro_query("MATCH (n) RETURN count(n)")
                # Once, not retried (RedisCluster's default: 10 times with backoff, through the stall).
                assert time.monotonic() - started < 1.5
            finally:
                node.execute_command("CLIENT", "UNPAUSE")
        assert (await graph.ro_query("MATCH (n:Episodic) RETURN count(n)")).result_set == [[1]]
    finally:
        await backend.close()


@on_cluster
async def test_falkordb_url_alone_puts_the_state_on_the_cluster_and_the_queue_needs_a_plain_redis(settings):
    alone = settings.model_copy(update={"redis_url": None})
    async with open_service(alone, run_worker=False) as service:
        await service.record_message("s1", msg("a1", "alice", "the ferry leaves at nine"))
        assert service.settings.state_is_cluster() and (await service.session_gate("s1")).pending_messages == 1
    with pytest.raises(ValueError, match="REDIS_URL, or the FALKORDB_URL it defaults to, is a Redis Cluster"):
        async with open_service(alone.model_copy(update={"queue_redis_url": None}), run_worker=False):
            pass


@on_cluster
async def test_a_plain_url_of_a_cluster_node_is_refused_naming_the_cluster_scheme(settings):
    node = cluster_nodes()[0]
    expected = f"names a node of a Redis Cluster: write it {node.replace('://', '+cluster://')}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        GraphBackend(node, settings)


def test_a_cluster_as_the_job_queue_is_refused():
    settings = Settings(_env_file=None, redis_url="redis+cluster://127.0.0.1:7000",
                        queue_redis_url="rediss+cluster://127.0.0.1:7001")
    with pytest.raises(ValueError, match="QUEUE_REDIS_URL names a Redis Cluster"):
        settings.job_queue_url()
    assert Settings(_env_file=None, redis_url="rediss+cluster://127.0.0.1:7000").state_is_cluster()


@on_cluster
async def test_readiness_reads_every_primary_and_the_warm_up_writes_each_graph_on_its_node(backend):
    """Readiness (memory_service/backends/readiness.py) asks each primary of the cluster, not
    the node the URL names: its run ids are every node's own; and after a (simulated) restart
    of the servers the warm-up writes every agent graph, on whichever node holds it, before
    health says ready."""
    from memory_service.backends import readiness

    for agent in AGENTS:
        await backend.write([memory(agent, 0, f"the harbour of {agent}")])
    why, runs = await readiness.check(backend.client.connection)
    nodes = cluster_nodes()
    own = set()
    for node in nodes:
        with redis.Redis.from_url(node, decode_responses=True) as client:
            own.add(client.info("server")["run_id"])
    assert why is None and set(runs) == own and len(runs) == len(nodes)
    backend._warmed = ()  # as if every server had started again since the last warm-up
    health = await backend.health()
    if not health["ok"]:  # the warm-up runs in the background: ready once it is done
        await backend._warming[1]
        health = await backend.health()
    assert health["ok"] and health["agent_graphs"] == len(AGENTS)
    assert backend._warmed == runs
