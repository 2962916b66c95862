"""Overload and outages at the API: admission control, and which failures mean "a store
is overloaded, stalled or unreachable: try again later", answered with 503, Retry-After
and a short JSON error, never a 500.

Admission: at most API_MAX_CONCURRENT_REQUESTS requests run at once in a process; the
next ones wait (first come, first served) up to API_QUEUE_TIMEOUT_SECONDS for a slot,
then answer 503. Without it, 200 concurrent clients on two cores saw every request take
seconds (the event loop shared by all), pools run dry, and 500s; with it, the admitted
requests run at the speed of a loaded process and the rest are told when to come back.
/health and /metrics are never queued, nor is ``POST /v1/sessions/{id}/form``: with
``wait`` it sleeps until the worker stored the window (up to FORM_WAIT_SECONDS, tens of
seconds with an LLM), and a few sessions ending at once must not take every slot.

Any other error no handler answers is a 500 ``{"detail": "internal error"}``, logged with
its traceback, and the connection stays open (``UnexpectedErrors``): Starlette's own last
resort sends its 500 and then raises the error again for the server to log, and uvicorn,
seeing an error after the answer started, closes the connection, so a keep-alive client
found it reset.

Which failures are outages is memory_service/stores/outages.py's, below HTTP: the outbox and the
group commit ask it too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memory_service.domain.errors import BackendUnavailable, FormationPending, MemoryServiceError
from memory_service.http.access_log import route_template
from memory_service.stores.outages import UNAVAILABLE, is_unavailable

log = logging.getLogger(__name__)

# Ours, whose sentence is meant for the caller.
TRY_LATER: tuple[type[MemoryServiceError], ...] = (BackendUnavailable, FormationPending)


def unavailable(detail: str, retry_after_seconds: int) -> JSONResponse:
    return JSONResponse(status_code=503, headers={"Retry-After": str(retry_after_seconds)},
                        content={"detail": detail, "retry_after": retry_after_seconds})


class AdmissionLimit:
    """ASGI middleware: at most ``limit`` requests at once; the others wait up to ``wait``
    seconds for a slot, then answer 503 with Retry-After."""

    NEVER_QUEUED = frozenset({"/health", "/metrics"})
    LONG_POLL_SUFFIX = "/form"  # POST /v1/sessions/{id}/form

    def __init__(self, app: ASGIApp, limit: int, wait: float, retry_after_seconds: int = 1):
        self.app, self.limit, self.wait, self.retry_after = app, limit, wait, retry_after_seconds
        self._slots = asyncio.Semaphore(limit)
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.NEVER_QUEUED or (
                scope["method"] == "POST" and scope["path"].endswith(self.LONG_POLL_SUFFIX)):
            await self.app(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.wait):
                await self._slots.acquire()
        except TimeoutError:
            self.refused += 1
            response = unavailable(f"the service is at capacity ({self.limit} requests in progress); try again shortly",
                                   self.retry_after)
            await response(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._slots.release()


class UnexpectedErrors:
    """ASGI middleware: an error no handler answered becomes a 503 (an outage caused it) or
    a 500, logged here and not raised again, so the server keeps the connection."""

    def __init__(self, app: ASGIApp, retry_after_seconds: int = 1):
        self.app, self.retry_after = app, retry_after_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:  # half an answer is out: only closing the connection can tell the client
                raise
            route = getattr(scope.get("route"), "path", "an unrouted path")  # the template: no ids in the log
            if is_unavailable(exc):
                log.warning("%s %s: a store is unavailable or overloaded: %s: %s", scope["method"], route,
                            type(exc).__name__, exc)
                response = unavailable("a store is overloaded or unreachable; try again shortly", self.retry_after)
            else:
                log.error("%s %s failed", scope["method"], route, exc_info=exc)
                response = JSONResponse(status_code=500, content={"detail": "internal error"})
            await response(scope, receive, send)


def install(app: FastAPI, retry_after_seconds: int = 1, max_concurrent: int | None = None,
            queue_seconds: float = 1.0, describe: Callable[[MemoryServiceError], str] = str) -> None:
    """Answer store outages and overload with 503 + Retry-After on ``app``; with
    ``max_concurrent``, admit at most that many requests at once (the others wait up to
    ``queue_seconds``). ``describe`` words our own errors for the caller (it redacts what
    a store's error text says about where it listens)."""
    if max_concurrent:
        app.add_middleware(AdmissionLimit, limit=max_concurrent, wait=queue_seconds,
                           retry_after_seconds=retry_after_seconds)

    def unavailable_response(detail: str) -> JSONResponse:
        return unavailable(detail, retry_after_seconds)

    async def try_later(request: Request, exc: Exception) -> JSONResponse:
        # Registered for TRY_LATER only, all of them ours.
        return unavailable_response(describe(cast(MemoryServiceError, exc)))

    async def store_failed(request: Request, exc: Exception) -> JSONResponse:
        # The library's text may name hosts and ports: logged, not sent.
        log.warning("%s %s: a store is unavailable or overloaded: %s: %s", request.method,
                    route_template(request.scope), type(exc).__name__, exc)  # the template: no ids
        return unavailable_response("a store is overloaded or unreachable; try again shortly")

    for kind in TRY_LATER:
        app.add_exception_handler(kind, try_later)
    for outage in UNAVAILABLE:
        if not issubclass(outage, TRY_LATER):
            app.add_exception_handler(outage, store_failed)
    # Outermost of the app's own middleware: it sees what every handler left unanswered.
    app.add_middleware(UnexpectedErrors, retry_after_seconds=retry_after_seconds)
