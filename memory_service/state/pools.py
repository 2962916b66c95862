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

from typing import TYPE_CHECKING

from redis.asyncio import BlockingConnectionPool, Redis

from memory_service.config import Settings

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


def redis_client(url: str, settings: Settings, *, decode_responses: bool = True) -> Redis:
    """A Redis client owning a bounded pool (closed with the client)."""
    return Redis.from_pool(blocking_pool(url, settings, decode_responses=decode_responses))


def arq_client(url: str, settings: Settings, queue_name: str) -> ArqRedis:
    """arq's Redis client on a bounded pool: arq's own ``create_pool`` takes no read timeout
    and no pool class."""
    from memory_service._vendor.arq.connections import ArqRedis

    client = ArqRedis(blocking_pool(url, settings, decode_responses=False), default_queue_name=queue_name)
    client.auto_close_connection_pool = True  # as Redis.from_pool: the client owns its pool
    return client
