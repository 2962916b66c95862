"""What every request leaves behind: a request id, a span, a latency sample; and the guard
that answers 503 at once when a store is frozen.

``RequestTelemetry`` (the outermost middleware) takes the caller's ``X-Request-ID`` when it
is a safe token (memory_service/state/logs.py says which), makes one otherwise, returns it
in the response and keeps it in a context variable for the request, so that every log
line of the request (the access line too) and its span carry it. It opens the request's
span (continuing a W3C ``traceparent`` the caller sent) and observes
``memory_service_http_request_duration_seconds{method, route, status}`` with the route
template, never the path.

``StallGuard`` tells a frozen store from a slow one. A request still running after
STORE_STALL_SECONDS probes each store it may be waiting on (FalkorDB, Redis) with a PING
on a connection of its own (``StoreProbe``), which waits at most
STORE_PROBE_TIMEOUT_SECONDS. A store that answers is alive, only busy (FalkorDB runs
queries on worker threads and answers PING meanwhile): the request goes on, up to the
stores' read timeout, probing again every STORE_STALL_SECONDS. A store that does not answer
(its process stopped, its host gone, a network path that swallows packets) is frozen: the
request is cancelled and answered 503 with Retry-After, about STORE_STALL_SECONDS +
STORE_PROBE_TIMEOUT_SECONDS (1 s by default) after it arrived instead of after
STORE_READ_TIMEOUT_SECONDS (10). Probes are shared: one in flight per store, its answer
reused for a quarter of a second. GET /v1/context is not guarded (its own deadline
serves a smaller or last good block instead), nor are /health and /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from opentelemetry.propagate import extract
from opentelemetry.trace import SpanKind
from redis.asyncio import BlockingConnectionPool, Redis
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memory_service.http.access_log import route_template
from memory_service.http.overload import unavailable
from memory_service.state import metrics, tracing
from memory_service.state.logs import REQUEST_ID_HEADER, new_request_id, request_id, valid_request_id

log = logging.getLogger(__name__)

_HEADER = REQUEST_ID_HEADER.lower().encode()


class RequestTelemetry:
    """Request id, span and latency histogram of each HTTP request."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        rid = valid_request_id(headers.get(REQUEST_ID_HEADER.lower())) or new_request_id()
        token = request_id.set(rid)
        status = 500  # if the app fails before it answers, the server answers 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (_HEADER, rid.encode())]
            await send(message)

        metrics.HTTP_IN_FLIGHT.inc()
        method = scope["method"]
        try:
            parent = extract(headers)
            with tracing.tracer().start_as_current_span(f"{method} request", context=parent, kind=SpanKind.SERVER) as span:
                span.set_attribute("http.request.method", method)
                span.set_attribute("memory_service.request_id", rid)
                try:
                    await self.app(scope, receive, send_with_id)
                finally:
                    route = route_template(scope)
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                    span.set_attribute("http.response.status_code", status)
        finally:
            metrics.HTTP_IN_FLIGHT.dec()
            metrics.HTTP_REQUESTS.labels(method, route_template(scope), str(status)).observe(time.perf_counter() - started)
            request_id.reset(token)


class StoreProbe:
    """PING on a connection of its own, bounded by ``timeout``: is the store answering at all?"""

    FRESH_SECONDS = 0.25

    def __init__(self, name: str, url: str, timeout: float):
        self.name, self.timeout = name, timeout
        # A cluster's URL names one of its nodes: the probe PINGs that node (a frozen cluster
        # node is what it looks for; a failed-over one answers the cluster client's retry).
        url = url.replace("+cluster://", "://", 1)
        self.client = Redis.from_pool(BlockingConnectionPool.from_url(
            url, max_connections=2, timeout=timeout, socket_timeout=timeout, socket_connect_timeout=timeout))
        self._pending: asyncio.Task[bool] | None = None
        self._last = (float("-inf"), True)

    async def alive(self) -> bool:
        checked, answer = self._last
        if time.monotonic() - checked < self.FRESH_SECONDS:
            return answer
        if self._pending is None or self._pending.done():
            self._pending = asyncio.create_task(self._ping())
        return await asyncio.shield(self._pending)

    async def _ping(self) -> bool:
        try:
            async with asyncio.timeout(self.timeout):
                await self.client.ping()
            answer = True
        except Exception as exc:  # timed out, refused, reset: not answering
            log.warning("the %s store did not answer a probe within %.1fs: %s: %s", self.name, self.timeout,
                        type(exc).__name__, exc)
            answer = False
        self._last = (time.monotonic(), answer)
        return answer

    async def aclose(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        await self.client.aclose()


class StoreProbes:
    """The probes of the stores the app's service uses, made on first need, closed with the app."""

    def __init__(self, probe_seconds: float):
        self.probe_seconds = probe_seconds
        self.probes: list[StoreProbe] | None = None

    def of(self, scope: Scope) -> list[StoreProbe]:
        if self.probes is None:
            settings = getattr(getattr(scope["app"].state, "service", None), "settings", None)
            if settings is None:
                return []
            by_url: dict[str, StoreProbe] = {}
            for name, url in (("graph", settings.falkordb_url), ("state", settings.redis_url)):
                if url and url not in by_url:
                    by_url[url] = StoreProbe(name, url, self.probe_seconds)
            self.probes = list(by_url.values())
        return self.probes

    async def aclose(self) -> None:
        for probe in self.probes or ():
            await probe.aclose()
        self.probes = None


class StallGuard:
    """503 with Retry-After, at once, for a request stuck on a store that stopped answering.

    The request runs in its own task, watched by a timer (no task of its own per request:
    one cost the single-message route a task, a future and a wait's callbacks every time,
    for a timer that fires only on a stall). Once STORE_STALL_SECONDS pass without an
    answer started, the stores are probed; a frozen one cancels the request's task (as
    ``asyncio.timeout`` does: ``uncancel`` tells its cancellation from another's) and the
    503 is answered here; live ones re-arm the timer."""

    UNGUARDED = frozenset({"/health", "/health/live", "/metrics", "/v1/context"})

    def __init__(self, app: ASGIApp, probes: StoreProbes, stall_seconds: float, retry_after_seconds: int):
        self.app, self.probes, self.stall, self.retry_after = app, probes, stall_seconds, retry_after_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.UNGUARDED or route_template(scope) in self.UNGUARDED:
            await self.app(scope, receive, send)
            return
        watch = _Watch(self, scope, send)
        try:
            await self.app(scope, receive, watch.tracked)
            if not watch.frozen or watch.answering:
                return
            watch.task.uncancel()  # the app took our cancellation and returned unanswered
        except asyncio.CancelledError:
            if not watch.frozen or watch.task.uncancel() > 0 or watch.answering:
                raise  # not (only) ours: the client went away, the server stops
        finally:
            watch.stop()
        for name in watch.frozen:
            metrics.STORE_FROZEN.labels(name).inc()
        log.warning("%s %s: answered 503, the %s store does not answer", scope["method"],
                    route_template(scope), " and ".join(watch.frozen))
        response = unavailable(f"the {' and '.join(watch.frozen)} store does not answer; try again shortly",
                               self.retry_after, scope)
        await response(scope, receive, send)


class _Watch:
    """One guarded request: its answer's start seen, the timer, the probes of a stall."""

    def __init__(self, guard: StallGuard, scope: Scope, send: Send):
        self.guard, self.scope, self.send = guard, scope, send
        task = asyncio.current_task()
        assert task is not None  # an ASGI app runs in a task
        self.task: asyncio.Task[Any] = task
        self.answering = False
        self.frozen: list[str] = []
        self.done = False
        self.loop = asyncio.get_running_loop()
        self.timer: asyncio.TimerHandle | None = self.loop.call_later(guard.stall, self._stalled)
        self.probing: asyncio.Task[None] | None = None

    async def tracked(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.answering = True
        await self.send(message)

    def _stalled(self) -> None:
        self.timer = None
        if not (self.done or self.answering):
            self.probing = self.loop.create_task(self._probe())

    async def _probe(self) -> None:
        probes = self.guard.probes.of(self.scope)
        alive = await asyncio.gather(*(p.alive() for p in probes))
        if self.done or self.answering:
            return
        frozen = [p.name for p, ok in zip(probes, alive, strict=True) if not ok]
        if frozen:
            self.frozen = frozen
            self.task.cancel()
        else:  # alive, only busy: look again after another stall period
            self.timer = self.loop.call_later(self.guard.stall, self._stalled)

    def stop(self) -> None:
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
        if self.probing is not None and not self.probing.done():
            self.probing.cancel()
