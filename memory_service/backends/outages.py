"""Which failures mean "a store is overloaded, stalled or unreachable: try again later".

Below HTTP, so that the parts that store ask it without importing the API: the API answers
such a failure 503 with Retry-After (memory_service/http/overload.py); the outbox keeps the entry
waiting without counting an attempt, where an entry the store refuses is counted and
dead-lettered after OUTBOX_MAX_ATTEMPTS (memory_service/backends/mirror.py); the group commit fails a batch
whole, where a batch the store refuses is bisected to the rows it refuses
(memory_service/ingest/group_commit.py).
"""

from __future__ import annotations

from pymongo.errors import ConnectionFailure, ExecutionTimeout, WTimeoutError
from redis.exceptions import BusyLoadingError, ClusterDownError, OutOfMemoryError, ReadOnlyError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from memory_service.domain.errors import BackendUnavailable

# Outages and overload, as each client library raises them: OSError covers refused and
# reset connections; TimeoutError (asyncio's too) a stalled store; redis-py's
# ConnectionError covers a full pool ("No connection available.", MaxConnectionsError);
# PyMongo's ConnectionFailure covers AutoReconnect, NetworkTimeout,
# ServerSelectionTimeoutError and WaitQueueTimeoutError. A Redis server out of memory, a
# read-only replica after a failover, and a cluster resharding or down are the store's state,
# not the input's: never answered as the caller's fault (a refused row, memory_service/ingest/group_commit.py).
UNAVAILABLE: tuple[type[Exception], ...] = (
    OSError, TimeoutError, RedisConnectionError, RedisTimeoutError, BusyLoadingError,
    OutOfMemoryError, ReadOnlyError, TryAgainError, ClusterDownError,
    ConnectionFailure, ExecutionTimeout, WTimeoutError, BackendUnavailable,
)


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc``, or an error it was raised from, is an outage or overload of a store."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, UNAVAILABLE):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
