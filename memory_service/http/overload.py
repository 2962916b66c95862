"""Overload and outages at the API: admission control, and which failures mean "a store
is overloaded, stalled or unreachable: try again later", answered with 503, Retry-After
and a short JSON error, never a 500.

Admission: at most API_MAX_CONCURRENT_REQUESTS requests run at once in a process, and at
most API_MAX_CONCURRENT_PER_AGENT of them for one agent; the next ones wait up to
API_QUEUE_TIMEOUT_SECONDS for a slot, then answer 503 (nothing of such a request was
done). Without a limit, 200 concurrent clients on two cores saw every request take
seconds (the event loop shared by all), pools run dry, and 500s; with one pool for every
agent, 50 clients of one agent sending batches took it whole and another agent's requests
waited behind them (12 ms became 650 ms). So each agent has a share: its requests beyond
it wait even while the pool has room, and a freed slot goes to the waiting agent that
holds the fewest, in turn (round robin) among equals, first come first served within one
agent (``FairSlots``). An agent alone gets its share, not the whole pool.

Which agent a request is counted to (its *lane*) is known before its body is read: the
API key's verified scope (the key is checked here, once: the route's ``caller`` takes the
outcome, memory_service/http/deps.py), narrowed to the agent the path
(``/v1/agents/{id}/...``) or the query (``agent_id=``) names if the key reaches it. A key
of one agent is that agent's whatever the body says (so a batch, whose items name their
sessions, counts to its key's agent); a key of several agents that names none counts to
the key; a request without a valid key counts to one lane for all such; keyless (API_AUTH
off, or a loopback development server) the path's or query's agent, else one lane. A
caller cannot put its requests in another agent's lane: a path naming an agent the key
does not reach counts to the key's own.

Admission is per process: with R replicas an agent may run R times its share at once.
What is shared by every replica is counted in Redis: the rate limits, a key's
(memory_service/access/keys.py) and, with AGENT_REQUESTS_PER_MINUTE, an agent's across all
its keys (memory_service/access/agent_limits.py), charged here once the lane is known and
before a slot is taken: a 429 holds nothing and did nothing. With API_MAX_CONCURRENT_REQUESTS
0 this middleware only does that (no pool, no share, no pacing).
/health, /health/live and /metrics are never queued (a liveness probe queued behind a
flood would get the process restarted for being busy), nor is ``GET /v1/agents/{id}/events`` (a
stream, docs/events.md: EVENTS_SSE_MAX_STREAMS bounds them), nor ``POST /v1/sessions/{id}/form``: with
``wait`` it sleeps until the worker stored the window (up to FORM_WAIT_SECONDS, tens of
seconds with an LLM), and a few sessions ending at once must not take every slot.

Any other error no handler answers is a 500 ``{"detail": "internal error"}``, logged with
its traceback, and the connection stays open (``UnexpectedErrors``): Starlette's own last
resort sends its 500 and then raises the error again for the server to log, and uvicorn,
seeing an error after the answer started, closes the connection, so a keep-alive client
found it reset.

Which failures are outages is memory_service/backends/outages.py's, below HTTP: the outbox and the
group commit ask it too.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memory_service.access.keys import Principal
from memory_service.backends.outages import UNAVAILABLE, is_unavailable
from memory_service.domain.errors import BackendUnavailable, FormationPending, MemoryServiceError, RateLimited
from memory_service.http.access_log import route_template
from memory_service.ingest.pacing import Pacing

log = logging.getLogger(__name__)

# Ours, whose sentence is meant for the caller.
TRY_LATER: tuple[type[MemoryServiceError], ...] = (BackendUnavailable, FormationPending)


# A request that records many things at once (a batch) keeps here, in its state, a callable
# answering what it recorded so far: a 503 cut short after its first write says which items
# were recorded (memory_service/ingest/batch.py, ``BatchProgress``). Without one, a 503 means
# nothing of the request was recorded.
PARTIAL_ANSWER = "partial_answer"


def unavailable(detail: str, retry_after_seconds: int, scope: Scope | None = None) -> JSONResponse:
    content: dict[str, Any] = {"detail": detail, "retry_after": retry_after_seconds}
    partial = (scope or {}).get("state", {}).get(PARTIAL_ANSWER)
    if partial is not None:
        content.update(partial())
    return JSONResponse(status_code=503, headers={"Retry-After": str(retry_after_seconds)}, content=content)


class FairSlots:
    """At most ``limit`` holders at once, at most ``per_lane`` of one lane. A waiter is let in
    when a slot is free and its lane is under its share: the waiting lane holding the fewest
    goes first, lanes holding as many go in turn (the one served longest ago first), and
    within a lane first come, first served."""

    def __init__(self, limit: int, per_lane: int = 0):
        self.limit = limit
        self.per_lane = min(per_lane, limit) if per_lane > 0 else limit
        self.held = 0
        self._held: dict[str, int] = {}
        # Lanes with waiters; the order is the round robin's (a lane served goes to the end).
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def holding(self, lane: str) -> int:
        return self._held.get(lane, 0)

    def waiting(self, lane: str) -> int:
        return len(self._waiting.get(lane, ()))

    async def acquire(self, lane: str) -> None:
        if lane not in self._waiting and self._room(lane):
            self._take(lane)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(lane, deque()).append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():  # let in as it gave up: the slot goes on
                self.release(lane)
            else:
                queue = self._waiting.get(lane)
                if queue is not None and future in queue:
                    queue.remove(future)
                    if not queue:
                        del self._waiting[lane]
            raise

    def release(self, lane: str) -> None:
        self.held -= 1
        left = self._held[lane] - 1
        if left:
            self._held[lane] = left
        else:
            del self._held[lane]
        self._let_in()

    def _room(self, lane: str) -> bool:
        return self.held < self.limit and self._held.get(lane, 0) < self.per_lane

    def _take(self, lane: str) -> None:
        self.held += 1
        self._held[lane] = self._held.get(lane, 0) + 1

    def _let_in(self) -> None:
        while self.held < self.limit:
            ready = [lane for lane in self._waiting if self._held.get(lane, 0) < self.per_lane]
            if not ready:
                return
            lane = min(ready, key=lambda name: self._held.get(name, 0))  # min keeps the first of equals
            queue = self._waiting.pop(lane)
            future = queue.popleft()
            if queue:
                self._waiting[lane] = queue  # to the end of the round
            if future.done():  # its waiter gave up (timed out) and has not run since: it takes nothing
                continue
            self._take(lane)
            future.set_result(None)


# The outcome of checking the request's key (a Principal, a sentence why not, or the error),
# kept in the request's state for the route's ``caller`` (memory_service/http/deps.py).
AUTHENTICATED = "authenticated"
AGENT_LANE = "agent:"
_AGENT_PATH = re.compile(r"/v1/agents/([^/]+)")
MAX_LANE_CHARS = 200
UNLIMITED = 1 << 30  # the pool of a process without API_MAX_CONCURRENT_REQUESTS
LANE_LOOKUP_SECONDS = 1.0


def _agent_named(scope: Scope) -> str | None:
    """The agent the path or the query names, if any."""
    path: str = scope["path"]
    match = _AGENT_PATH.match(path)
    if match:
        return match.group(1)[:MAX_LANE_CHARS]
    query: bytes = scope.get("query_string", b"")
    if b"agent_id=" in query:
        values: list[str] = parse_qs(query.decode("latin-1")).get("agent_id", [])
        if values:
            return values[0][:MAX_LANE_CHARS]
    return None


async def lane_of(scope: Scope) -> str:
    """The lane a request is admitted in (see the module's docstring); with a key, checks it
    once and keeps the outcome in the request's state (``AUTHENTICATED``)."""
    header = Headers(scope=scope).get("authorization")
    principal: Principal | None = None
    if header is not None:
        scheme, _, token = header.partition(" ")
        service = getattr(scope["app"].state, "service", None) if "app" in scope else None
        if scheme.lower() != "bearer" or not token.strip() or service is None:
            return "unauthenticated"
        outcome: Any
        try:
            async with asyncio.timeout(LANE_LOOKUP_SECONDS):
                outcome = await service.authenticate(token.strip())
        except TimeoutError:  # a stalled Redis: the route checks the key again, under the stall guard
            return "unauthenticated"
        except Exception as exc:  # rate limited, or Redis is down: the route answers it as it would have
            outcome = exc
        scope.setdefault("state", {})[AUTHENTICATED] = outcome
        if not isinstance(outcome, Principal):
            return "unauthenticated"
        principal = outcome
    named = _agent_named(scope)
    if principal is not None and principal.agents is not None:
        if named is not None and named in principal.agents:
            return f"{AGENT_LANE}{named}"
        if len(principal.agents) == 1:
            return f"{AGENT_LANE}{next(iter(principal.agents))}"
        return f"key:{principal.key_id}"
    if named is not None:
        return f"{AGENT_LANE}{named}"
    return f"key:{principal.key_id}" if principal is not None else "keyless"


class AdmissionLimit:
    """ASGI middleware: at most ``limit`` requests at once, ``per_agent`` of one agent's lane
    (``lane_of``); the others wait up to ``wait`` seconds for a slot (``FairSlots``), then
    answer 503 with Retry-After."""

    NEVER_QUEUED = frozenset({"/health", "/health/live", "/metrics"})
    LONG_POLL_SUFFIX = "/form"  # POST /v1/sessions/{id}/form
    # GET /v1/agents/{id}/events: a stream minutes long, bounded by EVENTS_SSE_MAX_STREAMS instead.
    STREAM_SUFFIX = "/events"

    def __init__(self, app: ASGIApp, limit: int, wait: float, retry_after_seconds: int = 1, per_agent: int = 0,
                 bulk: re.Pattern[str] | None = None, bulk_pause: float = 0.0, bulk_steps: int = 1,
                 bulk_share: float = 1.0):
        self.app, self.limit, self.wait, self.retry_after = app, limit, wait, retry_after_seconds
        self.slots = FairSlots(limit, per_agent)
        self.bulk = bulk
        self.pacing = Pacing(bulk_pause, bulk_steps, bulk_share)
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.NEVER_QUEUED or (
                scope["method"] == "POST" and scope["path"].endswith(self.LONG_POLL_SUFFIX)) or (
                scope["method"] == "GET" and scope["path"].endswith(self.STREAM_SUFFIX)):
            await self.app(scope, receive, send)
            return
        lane = await lane_of(scope)
        if lane.startswith(AGENT_LANE):
            limited = await self._over_agent_limit(scope, lane.removeprefix(AGENT_LANE))
            if limited is not None:
                await limited(scope, receive, send)
                return
        try:
            async with asyncio.timeout(self.wait):
                await self.slots.acquire(lane)
        except TimeoutError:
            self.refused += 1
            share = self.slots.per_lane
            if share < self.limit and self.slots.holding(lane) >= share:
                detail = (f"this agent's share of the service is in use ({share} of its requests in progress); "
                          "nothing of this request was done: try again shortly")
            else:
                detail = f"the service is at capacity ({self.limit} requests in progress); try again shortly"
            await unavailable(detail, self.retry_after)(scope, receive, send)
            return
        bulk = self.bulk is not None and scope["method"] == "POST" and self.bulk.fullmatch(scope["path"]) is not None
        try:
            with self.pacing.bulk(lane) if bulk else self.pacing.interactive(lane):
                await self.app(scope, receive, send)
        finally:
            self.slots.release(lane)


    @staticmethod
    async def _over_agent_limit(scope: Scope, agent_id: str) -> JSONResponse | None:
        """A 429 if the agent's requests per minute are spent (memory_service/access/agent_limits.py),
        else None (also when Redis cannot say: the route meets the outage itself)."""
        service = getattr(scope["app"].state, "service", None) if "app" in scope else None
        if service is None or not service.counts_agent_requests:
            return None
        try:
            async with asyncio.timeout(LANE_LOOKUP_SECONDS):
                await service.charge_request(agent_id)
        except RateLimited as exc:
            return JSONResponse(status_code=exc.status_code, headers=exc.headers(), content={"detail": str(exc)})
        except Exception:  # noqa: BLE001 - a stalled or absent Redis: the route answers it under the stall guard
            return None
        return None


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
                response = unavailable("a store is overloaded or unreachable; try again shortly", self.retry_after,
                                       scope)
            else:
                log.error("%s %s failed", scope["method"], route, exc_info=exc)
                response = JSONResponse(status_code=500, content={"detail": "internal error"})
            await response(scope, receive, send)


def install(app: FastAPI, retry_after_seconds: int = 1, max_concurrent: int | None = None,
            queue_seconds: float = 1.0, describe: Callable[[MemoryServiceError], str] = str,
            per_agent: int = 0, bulk: re.Pattern[str] | None = None, bulk_pause: float = 0.0,
            bulk_steps: int = 1, bulk_share: float = 1.0) -> None:
    """Answer store outages and overload with 503 + Retry-After on ``app``; with
    ``max_concurrent``, admit at most that many requests at once, ``per_agent`` of one agent
    (the others wait up to ``queue_seconds``). ``describe`` words our own errors for the
    caller (it redacts what a store's error text says about where it listens)."""
    if max_concurrent is not None:  # 0: no pool, no share (an agent's requests per minute still counted here)
        app.add_middleware(AdmissionLimit, limit=max_concurrent or UNLIMITED, wait=queue_seconds,
                           retry_after_seconds=retry_after_seconds, per_agent=per_agent if max_concurrent else 0,
                           bulk=bulk if max_concurrent else None,
                           bulk_pause=bulk_pause, bulk_steps=bulk_steps, bulk_share=bulk_share)

    def unavailable_response(detail: str, request: Request) -> JSONResponse:
        return unavailable(detail, retry_after_seconds, request.scope)

    async def try_later(request: Request, exc: Exception) -> JSONResponse:
        # Registered for TRY_LATER only, all of them ours.
        return unavailable_response(describe(cast(MemoryServiceError, exc)), request)

    async def store_failed(request: Request, exc: Exception) -> JSONResponse:
        # The library's text may name hosts and ports: logged, not sent.
        log.warning("%s %s: a store is unavailable or overloaded: %s: %s", request.method,
                    route_template(request.scope), type(exc).__name__, exc)  # the template: no ids
        return unavailable_response("a store is overloaded or unreachable; try again shortly", request)

    for kind in TRY_LATER:
        app.add_exception_handler(kind, try_later)
    for outage in UNAVAILABLE:
        if not issubclass(outage, TRY_LATER):
            app.add_exception_handler(outage, store_failed)
    # Outermost of the app's own middleware: it sees what every handler left unanswered.
    app.add_middleware(UnexpectedErrors, retry_after_seconds=retry_after_seconds)
