"""Connection pools for Redis and FalkorDB, bounded and with timeouts, from one Settings.

Every client of the service (state, the job queue, the arq worker, the graph) gets its
own ``BlockingConnectionPool``: at most REDIS_MAX_CONNECTIONS connections; a call that
finds them all busy waits up to REDIS_POOL_TIMEOUT_SECONDS and then fails with
``redis.ConnectionError("No connection available.")``, which the API answers with 503
and Retry-After (memory_service/http/overload.py). redis-py's default pool raises
``MaxConnectionsError`` at once past 100 connections, which reached clients as 500s.

Each connection has a connect timeout and a read timeout, so a store that accepts a
connection and never answers fails the call instead of hanging it. No retries: redis-py's
default (10 retries with backoff, on timeouts too) turned one stalled call into a dozen
timeouts, and retried scripts that may already have run. A dead pooled connection (the
store restarted) is still replaced before use: the pool checks each one it hands out.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from memory_service.config import Settings, is_cluster_url

if TYPE_CHECKING:
    from memory_service._vendor.arq.connections import ArqRedis


def blocking_pool(url: str, settings: Settings, *, decode_responses: bool) -> BlockingConnectionPool:
    """A bounded pool on ``url`` with the settings' timeouts (no retry policy: none retries)."""
    return BlockingConnectionPool.from_url(
        url,
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_seconds,
        socket_connect_timeout=settings.store_connect_timeout_seconds,
        socket_timeout=settings.store_read_timeout_seconds,
        decode_responses=decode_responses,
    )


def redis_client(url: str, settings: Settings, *, decode_responses: bool = True, state: bool = True) -> Redis:
    """A Redis client owning a bounded pool (closed with the client); a cluster client when
    ``url`` is a redis+cluster:// URL or, for the state's REDIS_URL, REDIS_CLUSTER is set
    (``cluster_client``)."""
    if is_cluster_url(url) or (state and settings.redis_cluster):
        return cluster_client(url, settings, decode_responses=decode_responses)
    return Redis.from_pool(blocking_pool(url, settings, decode_responses=decode_responses))


def cluster_client(url: str, settings: Settings, *, decode_responses: bool = True) -> Redis:
    """A Redis Cluster client from the address of one node: it learns the others and the
    slots (CLUSTER SLOTS), sends each command to the node of its key's slot, follows MOVED
    and ASK, and reloads the slots after a failover. Its pools are per node, of at most
    REDIS_MAX_CONNECTIONS each (a call finding one exhausted fails at once rather than
    waiting), with the same timeouts and no retry of a command.

    Typed as ``Redis``: RedisCluster has the commands, scripts and pipelines the service
    calls (with a transaction only on keys of one slot, memory_service/state/keyspace.py),
    and the cluster suite runs them on one (``make test-cluster``)."""
    plain = url.replace("+cluster://", "://", 1)
    client = RedisCluster.from_url(
        plain,
        # RedisCluster's own default retries a command that failed on a connection error or
        # a timeout 10 times with backoff (a stalled node held a call for many read timeouts,
        # and a script that ran could run again); the slots are reloaded on the next call.
        retry=Retry(NoBackoff(), 0),
        max_connections=settings.redis_max_connections,
        socket_connect_timeout=settings.store_connect_timeout_seconds,
        socket_timeout=settings.store_read_timeout_seconds,
        decode_responses=decode_responses,
    )
    return cast(Redis, client)


class OnNode:
    """One node of a cluster client, used as a client of that node alone: every command is
    sent to it (redis-py's ``target_nodes``), over the cluster client's pool for the node.
    For what is per server on a cluster: INFO, CONFIG GET, BGREWRITEAOF, GRAPH.LIST,
    GRAPH.CONFIG (redis-py sends a keyless command to one default node, or refuses it)."""

    def __init__(self, cluster: RedisCluster, node: Any):
        self.cluster, self.node = cluster, node

    def __getattr__(self, command: str) -> Any:
        return functools.partial(getattr(self.cluster, command), target_nodes=self.node)


async def each_primary(client: Any) -> list[tuple[str | None, Any]]:
    """``(address, client)`` of each primary of a cluster client (``OnNode``), or
    ``[(None, client)]`` for a client of one server."""
    if not isinstance(client, RedisCluster):
        return [(None, client)]
    await client.initialize()  # a no-op once it knows the nodes
    return [(node.name, OnNode(client, node)) for node in client.get_primaries()]


async def node_of(client: Any, key: str) -> Any:
    """A client of the server holding ``key``: the node of its slot on a cluster (``OnNode``),
    else ``client`` itself. For keyless commands about that key's server."""
    if not isinstance(client, RedisCluster):
        return client
    await client.initialize()
    return OnNode(client, client.get_node_from_key(key))


def arq_client(url: str, settings: Settings, queue_name: str) -> ArqRedis:
    """arq's Redis client on a bounded pool: arq's own ``create_pool`` takes no read timeout
    and no pool class."""
    from memory_service._vendor.arq.connections import ArqRedis

    client = ArqRedis(blocking_pool(url, settings, decode_responses=False), default_queue_name=queue_name)
    client.auto_close_connection_pool = True  # as Redis.from_pool: the client owns its pool
    return client
