"""Which failures mean "a store is overloaded, stalled or unreachable: try again later",
and the API's answer to them: 503 with Retry-After and a short JSON error, never a 500.

``is_unavailable`` is also what the outbox uses to tell an outage of a store (the entry
waits, its attempts are not counted) from an entry the store refuses (counted, and
dead-lettered after OUTBOX_MAX_ATTEMPTS).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pymongo.errors import ConnectionFailure, ExecutionTimeout, WTimeoutError
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import BackendUnavailable, FormationPending

log = logging.getLogger(__name__)

# Outages and overload, as each client library raises them: OSError covers refused and
# reset connections; TimeoutError (asyncio's too) a stalled store; redis-py's
# ConnectionError covers a full pool ("No connection available.", MaxConnectionsError);
# PyMongo's ConnectionFailure covers AutoReconnect, NetworkTimeout,
# ServerSelectionTimeoutError and WaitQueueTimeoutError.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError, TimeoutError, RedisConnectionError, RedisTimeoutError, BusyLoadingError,
    ConnectionFailure, ExecutionTimeout, WTimeoutError, BackendUnavailable,
)
# Ours, whose sentence is meant for the caller.
TRY_LATER: tuple[type[BaseException], ...] = (BackendUnavailable, FormationPending)


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


def install(app: FastAPI, retry_after_seconds: int = 1) -> None:
    """Answer store outages and overload with 503 + Retry-After on ``app``."""

    def unavailable(detail: str) -> JSONResponse:
        return JSONResponse(status_code=503, headers={"Retry-After": str(retry_after_seconds)},
                            content={"detail": detail, "retry_after": retry_after_seconds})

    async def try_later(request: Request, exc: Exception) -> JSONResponse:
        return unavailable(str(exc))

    async def store_failed(request: Request, exc: Exception) -> JSONResponse:
        # The library's text may name hosts and ports: logged, not sent.
        log.warning("%s %s: a store is unavailable or overloaded: %s: %s", request.method, request.url.path,
                    type(exc).__name__, exc)
        return unavailable("a store is overloaded or unreachable; try again shortly")

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Anything else that got this far: an outage wrapped in another error is still a
        # 503; a bug stays a 500 (Starlette logs it after this handler).
        if is_unavailable(exc):
            return await store_failed(request, exc)
        return JSONResponse(status_code=500, content={"detail": "internal error"})

    for kind in TRY_LATER:
        app.add_exception_handler(kind, try_later)
    for kind in UNAVAILABLE:
        if not issubclass(kind, TRY_LATER):
            app.add_exception_handler(kind, store_failed)
    app.add_exception_handler(Exception, unexpected)
