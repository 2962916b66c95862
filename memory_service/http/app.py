"""The HTTP API: a thin FastAPI layer over MemoryService.

``create_app`` only builds the app: its lifespan (which opens the service and keeps it in
``app.state``), the request guard, CORS, admission control, the access log, the error
answers, and one router per resource (memory_service/http/routers/). Each route takes its
dependencies from memory_service/http/deps.py (``ServiceDep``, ``CallerDep``), authorizes
the caller and calls one method of the facade (memory_service/service.py), which writes the
audit entry of any change; no route reaches past the facade (tests/test_http_layer.py).

Every route's OpenAPI ``operationId`` is its handler's name (``record_message``, not
FastAPI's default ``record_message_v1_sessions__session_id__messages_post``): generated
clients take their method names from it, so a handler's name is part of the API. Keep
handler names unique across the routers (tests/test_api.py checks); rename one only as an
API change."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from memory_service import __version__
from memory_service.access.authorization import resolve_mode
from memory_service.backends import outages
from memory_service.config import Settings, redact_addresses
from memory_service.domain.errors import BackendUnavailable, MemoryServiceError
from memory_service.http import access_log, browser, inspector, overload, telemetry
from memory_service.http import guard as request_guard
from memory_service.http.routers import (
    agents,
    audit,
    context,
    entities,
    events,
    health,
    keys,
    memories,
    search,
    sessions,
    startup,
    users,
)
from memory_service.runtime import open_service
from memory_service.schemas.context import ContextOut
from memory_service.schemas.records import RecordOut
from memory_service.service import MemoryService
from memory_service.state import metrics as process_metrics

__all__ = ["ContextOut", "RecordOut", "create_app", "operation_id"]

# In the order their paths appear in the OpenAPI schema.
ROUTERS = (sessions, context, search, agents, health, users, keys, audit, startup, memories, entities, events)

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, data_dir: Path | None = None, service: MemoryService | None = None,
               run_worker: bool | None = None, host: str | None = None) -> FastAPI:
    """The app; it opens its own MemoryService (and worker, see open_service) unless one is given.

    ``host`` is where the server listens: with API_AUTH=auto, a loopback host runs without
    keys (development) and any other, or an unknown one, requires them (memory_service/access/authorization.py).
    """
    configured = settings or (service.settings if service else None) or Settings()
    mode = resolve_mode(configured.api_auth, host)
    probes = telemetry.StoreProbes(configured.store_probe_timeout_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.access_mode = mode
        try:
            if service is not None:
                app.state.service = service
                await _announce_access(service, mode, host)
                yield
                return
            async with open_service(settings, data_dir, run_worker=run_worker) as opened:
                app.state.service = opened
                await _announce_access(opened, mode, host)
                async with metrics_port(opened, configured.metrics_port):
                    yield
        finally:
            await probes.aclose()

    app = FastAPI(
        title="memory-service",
        version=__version__,
        description="Long-term memory for LLM agents: record messages, form memories, get a budgeted XML memory block.",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,  # the included routers' routes too
        **_without_native_telemetry(),
    )
    # Before the routes: they take its strict JSON route class.
    request_guard.install(app, configured.max_request_bytes, [
        request_guard.LargerBodies(sessions.BATCH_PATH, configured.max_batch_bytes, "MAX_BATCH_BYTES")])
    if configured.cors_allow_origins:  # off unless configured: browsers may not call the API from other origins
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=configured.cors_allow_origins,
                           allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
                           expose_headers=["X-Request-ID", "Retry-After"])

    @app.exception_handler(MemoryServiceError)
    async def _service_error(request: Request, exc: MemoryServiceError) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content={"detail": _public_detail(exc)}, headers=exc.headers())

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return request_guard.invalid_input_answer(exc.errors())

    # A frozen store: 503 at once (inside admission: only the request's own work is timed).
    app.add_middleware(telemetry.StallGuard, probes=probes, stall_seconds=configured.store_stall_seconds,
                       retry_after_seconds=configured.overload_retry_after_seconds)
    # Overload and store outages: admission control, 503 with Retry-After, never a 500
    # (memory_service/http/overload.py).
    overload.install(app, configured.overload_retry_after_seconds, configured.api_max_concurrent_requests,
                     configured.api_queue_timeout_seconds, describe=_public_detail,
                     per_agent=configured.api_max_concurrent_per_agent, bulk=sessions.BATCH_PATH,
                     bulk_pause=configured.api_bulk_pause_seconds, bulk_steps=configured.api_bulk_steps_at_once,
                     bulk_share=configured.api_bulk_share)
    access_log.install(app)  # access-log lines show route templates, not ids or queries
    # Before any route, the inspector's included: what a web page in a browser must not reach
    # (DNS rebinding, simple cross-site writes; memory_service/http/browser.py).
    app.add_middleware(browser.BrowserGuard, hosts=browser.allowed_hosts(configured.allowed_hosts, host),
                       cors_origins=configured.cors_allow_origins)
    app.add_middleware(telemetry.RequestTelemetry)  # outermost: request id, span, latency (memory_service/http/telemetry.py)
    for resource in ROUTERS:
        app.include_router(resource.router)
    # The web inspector (INSPECTOR; on loopback by default): a page over the same API, no data of its own.
    inspector.install(app, configured.inspector, host)
    return app


@asynccontextmanager
async def metrics_port(service: MemoryService, port: int | None) -> AsyncIterator[None]:
    """METRICS_PORT: the registry served without a key on a port of its own (a thread of
    prometheus_client's), its store gauges refreshed every STORE_GAUGES_REFRESH_SECONDS."""
    if not port:
        yield
        return
    from prometheus_client import start_http_server

    from memory_service.http.routers.health import refresh_store_gauges

    server, thread = start_http_server(port, addr="0.0.0.0", registry=process_metrics.REGISTRY)
    log.info("metrics on port %d (GET /metrics, no key)", port)

    async def refresh() -> None:
        while True:
            try:
                await refresh_store_gauges(service)
            except Exception as exc:  # the store is down: the last values stay, /health says why
                log.debug("store gauges not refreshed: %s", exc)
            await asyncio.sleep(STORE_GAUGES_REFRESH_SECONDS)

    task = asyncio.create_task(refresh())
    try:
        yield
    finally:
        task.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


STORE_GAUGES_REFRESH_SECONDS = 15


def _without_native_telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry (``FastAPI(telemetry=...)``, new in its recent releases) turned
    off: once a tracer provider is installed (OTEL_TRACES) it opens its own server span with
    ``url.path`` and ``url.query`` (user and session ids, the query's words) and spans for
    dependencies and serialisation. RequestTelemetry (memory_service/http/telemetry.py) spans
    each request with its route template only. An older FastAPI has no such option."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False,
                          "auto_configure": False}}


def operation_id(route: APIRoute) -> str:
    """A route's OpenAPI operationId: its handler's name, e.g. ``record_message``."""
    return route.name


async def _announce_access(service: MemoryService, mode: str, host: str | None) -> None:
    """Say at start who may call: open on loopback (development) or keys; refuse to serve
    with keys required and none to present."""
    if mode == "open":
        where = f"on {host}" if host else "anywhere (API_AUTH=off)"
        log.warning("API keys are not required: listening %s, every caller without a key acts as the operator. "
                    "Set API_AUTH=keys (or bind a non-loopback address) to require keys.", where)
        return
    if not await service.any_key():
        raise RuntimeError("API keys are required (API_AUTH=%s, host %s) but none exists: create one with "
                           "`memory-service keys create --name ops --role admin` (an operator key), or set "
                           "OPERATOR_API_KEY; API_AUTH=off serves without keys (not for a reachable address)"
                           % (service.settings.api_auth, host or "unknown"))
    log.info("API keys are required on every route but GET /health/live and GET /health")


STORE_WORDS_WITHHELD = "(the store's error is in the server log)"


def _public_detail(exc: MemoryServiceError) -> str:
    """The error's sentence, without what a store's failure says about the store.

    An outage's words (connection refused, a timeout) are kept without the addresses they
    quote: they tell the caller why to come back later. Any other store error's words (a
    query the store refused: "Failed to parse query parameter 'rows'") are the store's
    internals: logged, and replaced by STORE_WORDS_WITHHELD. Only the store's words
    change: the sentence around them names sessions, messages and jobs, whose ids may look
    like host:port ("form:s1:3"). A 503 with no cause to quote describes a backend as a
    whole, so all of it is redacted.
    """
    detail = str(exc)
    if exc.status_code < 500:
        return detail  # about the caller's input
    causes: list[BaseException] = []
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    while cause is not None and len(causes) < 5:
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not causes:
        return redact_addresses(detail) if isinstance(exc, BackendUnavailable) else detail
    withheld = False
    for cause in causes:
        text = str(cause)
        if not text:
            continue
        if outages.is_unavailable(cause):
            detail = detail.replace(text, redact_addresses(text))
        elif text in detail:
            detail = detail.replace(f"{type(cause).__name__}: {text}", text).replace(text, STORE_WORDS_WITHHELD)
            withheld = True
    if withheld:
        log.warning("%s answered without the store's words: %s (caused by %s)", type(exc).__name__, exc,
                    "; ".join(f"{type(c).__name__}: {c}" for c in causes))
    return detail
