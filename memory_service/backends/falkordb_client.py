"""The falkordb client of FALKORDB_URL: on one FalkorDB server, or on a Redis Cluster whose
nodes load the FalkorDB module.

Why a module: falkordb's own cluster support is a redis-py ``RedisCluster`` under its
client (a graph's commands name the graph's key, so redis-py sends each to the node of the
key's slot). But its constructor builds that connection itself, after probing the server
with a synchronous INFO, and builds it without the service's pool policy: no connect or
read timeout, unbounded pools, retries of every command (docs/operations.md, "Timeouts").
So for ``redis+cluster://`` the service builds the cluster connection
(memory_service/state/pools.py, ``cluster_client``) and gives it to falkordb's client.

Placement: an agent's graph is one key, ``ms_agent__<agent>``, on the node of that key's
slot, with FalkorDB's log of its queries (``telemetry{ms_agent__<agent>}``, the same slot).
The agent's full-text postings (``keyspace.postings_prefix``) carry the agent's hash tag: one
slot, maybe another node; no script or transaction names both.

What is per server on a cluster goes to every primary: GRAPH.LIST here, SCANs (redis-py's
``scan_iter`` on a cluster client), the erasure's file rewrite (memory_service/state/persistence.py).

A plain ``redis://`` URL of a cluster node is refused at start, naming the URL to write
instead (``redis+cluster://``): falkordb would switch to its own cluster connection (and
falkordb 1.8.1 fails to build it for a URL without a user name), and REDIS_URL, which
defaults to FALKORDB_URL, would get a client of one node.
"""

from __future__ import annotations

import asyncio
from typing import Any

from falkordb.asyncio import FalkorDB
from falkordb.asyncio.cluster import Is_Cluster
from redis.asyncio import Redis

from memory_service.config import Settings, is_cluster_url, redact_url
from memory_service.state.pools import blocking_pool, cluster_client, each_primary


class ClusterFalkorDB(FalkorDB):  # type: ignore[misc]  # falkordb is untyped
    """falkordb's asyncio client over a cluster connection the service built."""

    def __init__(self, connection: Any):  # a RedisCluster (typed as Redis by cluster_client)
        # What FalkorDB.__init__ keeps once it has a connection (it would build its own).
        self.connection = connection
        self.flushdb = connection.flushdb
        self.execute_command = connection.execute_command

    async def list_graphs(self) -> list[str]:
        """Every primary's GRAPH.LIST (each node lists the graphs it holds; redis-py cannot
        route a command without a key)."""
        nodes = await each_primary(self.connection)
        replies = await asyncio.gather(*(node.execute_command("GRAPH.LIST") for _, node in nodes))
        return [name for reply in replies for name in reply]


def falkordb_client(url: str, settings: Settings) -> Any:
    """falkordb's asyncio client on ``url``, with the service's bounded pools and timeouts."""
    if is_cluster_url(url):
        return ClusterFalkorDB(cluster_client(url, settings, decode_responses=True))
    # falkordb probes the server (INFO, synchronously) while constructing the client, and
    # on a cluster node builds its own cluster connection (which fails with KeyError
    # 'username' for a URL without one): its probe is run first. Bounded by the same
    # connect and read timeouts, which the probe takes from the pool.
    pool = blocking_pool(url, settings, decode_responses=True)
    if Is_Cluster(Redis(connection_pool=pool)):
        raise ValueError(f"FALKORDB_URL {redact_url(url)} names a node of a Redis Cluster: write it "
                         f"{redact_url(url).replace('://', '+cluster://', 1)} (docs/operations.md, \"Scaling\")")
    return FalkorDB(connection_pool=pool)
