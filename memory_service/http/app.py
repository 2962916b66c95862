"""The HTTP API: a thin FastAPI layer over MemoryService.

Every route's OpenAPI ``operationId`` is its handler's name (``record_message``, not
FastAPI's default ``record_message_v1_sessions__session_id__messages_post``): generated
clients take their method names from it, so a handler's name is part of the API. Keep
handler names unique across this module and the routers it includes (tests/test_api.py
checks); rename one only as an API change."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError

from memory_service import __version__
from memory_service.access.authorization import authorize, caller, reach, require_operator, resolve_mode, session_owner
from memory_service.access.keys import Principal
from memory_service.config import Settings, redact_addresses
from memory_service.domain.errors import BackendUnavailable, MemoryServiceError
from memory_service.domain.limits import CONTEXT_BUDGET_CEILING, MAX_TOP_K_CEILING
from memory_service.domain.models import (
    Agent,
    AgentId,
    AgentSettings,
    MemoryKind,
    MessageIn,
    SessionId,
    Shard,
    ShardId,
    ShardIn,
    UserId,
)
from memory_service.formation.gates import CHARS_PER_TOKEN
from memory_service.http import access_log, overload
from memory_service.http import guard as request_guard
from memory_service.http.routers import admin as admin_api
from memory_service.http.routers import memories as memory_api
from memory_service.http.routers import startup as startup_api
from memory_service.recall.search import SearchRequest
from memory_service.runtime import open_service
from memory_service.schemas.context import ContextOut
from memory_service.schemas.erasure import ErasureReport, UserExport
from memory_service.schemas.formation import FormationSummary
from memory_service.schemas.keys import Role
from memory_service.schemas.records import RecordOut
from memory_service.schemas.search import Scope, SearchResult
from memory_service.service import MemoryService
from memory_service.stores import outages

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, data_dir: Path | None = None, service: MemoryService | None = None,
               run_worker: bool | None = None, host: str | None = None) -> FastAPI:
    """The app; it opens its own MemoryService (and worker, see open_service) unless one is given.

    ``host`` is where the server listens: with API_AUTH=auto, a loopback host runs without
    keys (development) and any other, or an unknown one, requires them (memory_service/access/authorization.py).
    """
    configured = settings or (service.settings if service else None) or Settings()
    mode = resolve_mode(configured.api_auth, host)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.access_mode = mode
        if service is not None:
            app.state.service = service
            await _announce_access(service, mode, host)
            yield
            return
        async with open_service(settings, data_dir, run_worker=run_worker) as opened:
            app.state.service = opened
            await _announce_access(opened, mode, host)
            yield

    app = FastAPI(
        title="memory-service",
        version=__version__,
        description="Long-term memory for LLM agents: record messages, form memories, get a budgeted XML memory block.",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,  # the included routers' routes too
    )
    # Before the routes: they take its strict JSON route class.
    request_guard.install(app, configured.max_request_bytes)
    if configured.cors_allow_origins:  # off unless configured: browsers may not call the API from other origins
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=configured.cors_allow_origins,
                           allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"], allow_headers=["Authorization", "Content-Type"])

    @app.exception_handler(MemoryServiceError)
    async def _service_error(request: Request, exc: MemoryServiceError) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content={"detail": _public_detail(exc)}, headers=exc.headers())

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return request_guard.invalid_input_answer(exc.errors())

    # Overload and store outages: admission control, 503 with Retry-After, never a 500
    # (memory_service/http/overload.py).
    overload.install(app, configured.overload_retry_after_seconds, configured.api_max_concurrent_requests,
                     configured.api_queue_timeout_seconds, describe=_public_detail)
    access_log.install(app)  # outermost: access-log lines show route templates, not ids or queries
    Caller = Depends(caller)

    def svc(request: Request) -> MemoryService:
        return cast(MemoryService, request.app.state.service)  # set by the lifespan

    @app.post("/v1/sessions/{session_id}/messages", response_model=RecordOut, tags=["sessions"])
    async def record_message(session_id: SessionId, body: MessageIn, request: Request,
                             principal: Principal = Caller) -> RecordOut:
        """Record one message. Idempotent by `message_id`; answers with the formation gate's status.

        Needs `write` on the message's agent (and, for a key limited to users, its user). A
        key limited to users records into a session other users started only if the agent's
        `users_join_sessions` is on; else it is answered as a session of another agent (409)."""
        authorize(principal, Role.WRITE, body.agent_id, body.user_id)
        await svc(request).keys.charge_tokens(principal, math.ceil(len(body.content) / CHARS_PER_TOKEN))
        result = await svc(request).record_message(session_id, body, reach(request, principal, body.agent_id))
        return RecordOut(
            session_id=result.session_id, message_id=result.message_id, sequence=result.sequence,
            duplicate=result.duplicate, gate=result.gate, formation_job=result.formation_job,
        )

    @app.post("/v1/sessions/{session_id}/form", response_model=FormationSummary, tags=["sessions"])
    async def form_memories(
        session_id: SessionId,
        request: Request,
        wait: bool = Query(True, description="answer once the window is stored (else as soon as it is queued)"),
        principal: Principal = Caller,
    ) -> FormationSummary:
        """Enqueue the session's pending window for formation now, whatever the gates say.

        With `wait` (the default) the answer comes once the worker stored the window; a
        formation that fails or takes longer than FORM_WAIT_SECONDS answers 503, and the
        window stays pending. Needs `write` on the session's agent.
        """
        await session_owner(request, principal, session_id, Role.WRITE)
        return await svc(request).form_memories(session_id, wait=wait)

    @app.get("/v1/sessions/{session_id}", tags=["sessions"])
    async def get_session(session_id: SessionId, request: Request, principal: Principal = Caller) -> dict[str, Any]:
        """The session's gate state, formation cursor and the job of its pending window.
        Needs `read` on the session's agent."""
        await session_owner(request, principal, session_id, Role.READ)
        return await svc(request).session_status(session_id)

    @app.get("/v1/context", response_model=ContextOut, tags=["context"])
    async def get_context(
        request: Request,
        agent_id: AgentId = Query(...),
        user_id: UserId = Query(...),
        session_id: SessionId = Query(...),
        model: str | None = Query(None, max_length=200, description="target model name; selects the budget"),
        query: str | None = Query(None, description="what the model is asked now; default: the session's latest "
                                                   "user message. Adds <RelevantMemories>"),
        budget: int | None = Query(None, le=CONTEXT_BUDGET_CEILING, description="character budget; overrides the model's"),
        principal: Principal = Caller,
    ) -> ContextOut:
        """The memory block for one model call, within its character budget, with the memories
        most relevant to the query (or to the session's latest user message). Needs `read` on
        the agent (and, for a key limited to users, the user). A session of another agent, and
        for a key limited to users a session none of them took part in, gets the block of an
        unknown session; such a key's block shows only its users' memory."""
        authorize(principal, Role.READ, agent_id, user_id)
        rendered = await svc(request).assemble_memory_context(agent_id, user_id, session_id, model, query=query,
                                                              budget=budget, reach=reach(request, principal, agent_id))
        return ContextOut(xml=rendered.xml, chars=rendered.chars, budget=rendered.budget,
                          sections=rendered.sections, dropped=rendered.dropped, source=rendered.source)

    @app.get("/v1/search", response_model=SearchResult, tags=["search"])
    async def search_memories(
        request: Request,
        agent_id: AgentId = Query(...),
        query: str = Query(..., description="what to look for, in plain words"),
        scope: Scope = Query(Scope.AGENT, description="session, user, shard, agent, or namespaces"),
        user_id: UserId | None = Query(None, description="scope=user"),
        session_id: SessionId | None = Query(None, description="scope=session"),
        shard_id: str | None = Query(None, max_length=256, description="scope=shard"),
        namespaces: list[str] | None = Query(None, description="scope=namespaces: repeat for each namespace"),
        top_k: int = Query(10, ge=1, le=MAX_TOP_K_CEILING),
        min_score: float | None = Query(None, ge=0, le=1, allow_inf_nan=False),
        kinds: list[MemoryKind] | None = Query(None, description="repeat for each kind; default: every kind"),
        since: datetime | None = Query(None),
        until: datetime | None = Query(None),
        tags: list[str] | None = Query(None, description="repeat for each tag: only memories carrying all of them"),
        principal: Principal = Caller,
    ) -> SearchResult:
        """Search an agent's memories: full-text and vector signals fused by reciprocal rank,
        with recency; every result explained. Needs `read` on the agent; a key limited to
        users searches what they may see: scope user (one of them), session (one they took
        part in), shard, or namespaces of those; not scope agent."""
        try:
            body = SearchRequest(query=query, scope=scope, user_id=user_id, session_id=session_id, shard_id=shard_id,
                                 namespaces=namespaces, top_k=top_k, min_score=min_score, kinds=kinds, since=since,
                                 until=until, tags=tags)
        except ValidationError as exc:  # e.g. too many namespaces: the caller's mistake, answered as such
            raise RequestValidationError(exc.errors()) from None
        _authorize_search(principal, agent_id, body)
        return await svc(request).search(agent_id, body, reach=reach(request, principal, agent_id))

    @app.post("/v1/agents/{agent_id}/search", response_model=SearchResult, tags=["search"])
    async def search_memories_with_body(agent_id: AgentId, body: SearchRequest, request: Request,
                                        principal: Principal = Caller) -> SearchResult:
        """The same search with the request as a JSON body (for long queries and namespace lists)."""
        _authorize_search(principal, agent_id, body)
        return await svc(request).search(agent_id, body, reach=reach(request, principal, agent_id))

    @app.put("/v1/agents/{agent_id}", response_model=Agent, tags=["agents"])
    async def put_agent(agent_id: AgentId, body: AgentSettings, request: Request, principal: Principal = Caller) -> Agent:
        """Create or replace an agent's settings, including its memory backend. Needs `admin`."""
        authorize(principal, Role.ADMIN, agent_id)
        before, agent = await svc(request).agents.replace_agent(agent_id, body)
        await svc(request).audit.append(principal.key_id, "agent.put", agent_id, agent_id,
                                        before=before.model_dump(mode="json") if before else None,
                                        after=agent.model_dump(mode="json"))
        return agent

    @app.get("/v1/agents/{agent_id}", response_model=Agent, tags=["agents"])
    async def get_agent(agent_id: AgentId, request: Request, principal: Principal = Caller) -> Agent:
        """The agent's settings. Needs `read` on the agent, for all its users."""
        authorize(principal, Role.READ, agent_id)
        return await svc(request).get_agent(agent_id)

    @app.put("/v1/agents/{agent_id}/shards/{shard_id}", response_model=Shard, tags=["agents"])
    async def put_shard(agent_id: AgentId, shard_id: ShardId, body: ShardIn, request: Request,
                        principal: Principal = Caller) -> Any:
        """Create or replace a shard: a topic the agent keeps facts and suggestions on. Needs `admin`."""
        authorize(principal, Role.ADMIN, agent_id)
        before, shard = await svc(request).agents.replace_shard(agent_id, shard_id, body)
        await svc(request).audit.append(principal.key_id, "shard.put", agent_id, shard_id,
                                        before=before.model_dump(mode="json") if before else None,
                                        after=shard.model_dump(mode="json"))
        return JSONResponse(status_code=201 if before is None else 200, content=shard.model_dump(mode="json"))

    @app.get("/v1/agents/{agent_id}/shards", response_model=list[Shard], tags=["agents"])
    async def list_shards(agent_id: AgentId, request: Request, principal: Principal = Caller) -> list[Shard]:
        """The agent's shards. Needs `read` on the agent, for all its users."""
        authorize(principal, Role.READ, agent_id)
        return await svc(request).list_shards(agent_id)

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
    async def get_metrics(request: Request, principal: Principal = Caller) -> str:
        """Counters in the Prometheus text format: formations, LLM calls and tokens, consolidations.
        Needs an operator key (they span every agent)."""
        require_operator(principal)
        counters = await svc(request).state.metrics()
        text = "".join(
            f"# TYPE memory_service_{name}_total counter\nmemory_service_{name}_total {value:g}\n"
            for name, value in sorted(counters.items())
        )
        return text + await _gauges(svc(request))

    @app.get("/health/live", tags=["ops"])
    async def check_liveness() -> dict[str, Any]:
        """Liveness: the process answers HTTP. Checks no dependency (GET /health does)."""
        return {"ok": True}

    @app.get("/health", tags=["ops"])
    async def check_health(request: Request) -> JSONResponse:
        """Readiness: `{"ok": ...}`, 503 when a dependency is down. With an operator key, each
        dependency's state too (`?detail=true`); where the stores listen is never shown."""
        report = await svc(request).health()
        status = 200 if report["ok"] else 503
        if request.query_params.get("detail") not in ("1", "true"):
            return JSONResponse(status_code=status, content={"ok": report["ok"]})
        require_operator(await caller(request))
        return JSONResponse(status_code=status, content=_without_addresses(report))

    @app.delete("/v1/agents/{agent_id}/users/{user_id}", response_model=ErasureReport, tags=["users"])
    async def erase_user(agent_id: AgentId, user_id: UserId, request: Request,
                         principal: Principal = Caller) -> ErasureReport:
        """Erase everything of the user with this agent, in every store, index, cache and
        outbox, and report what was removed (docs/erasure.md). A second call reports zeros;
        an unknown user gets an empty report. Needs `admin` on the agent (and the user)."""
        authorize(principal, Role.ADMIN, agent_id, user_id)
        report = await svc(request).erase_user(agent_id, user_id, actor=principal.key_id)
        await svc(request).audit.append(principal.key_id, "user.erase", agent_id,
                                        await svc(request).audit.user_digest(agent_id, user_id), after=report.counts())
        return report

    @app.get("/v1/agents/{agent_id}/users/{user_id}/export", response_model=UserExport, tags=["users"])
    async def export_user(agent_id: AgentId, user_id: UserId, request: Request,
                          principal: Principal = Caller) -> UserExport:
        """Everything held on the user with this agent, as JSON: what an erasure would remove.
        Needs `admin` on the agent (and the user)."""
        authorize(principal, Role.ADMIN, agent_id, user_id)
        return await svc(request).export_user(agent_id, user_id)

    app.include_router(admin_api.router)
    app.include_router(startup_api.router)
    app.include_router(memory_api.router)
    return app


def operation_id(route: APIRoute) -> str:
    """A route's OpenAPI operationId: its handler's name, e.g. ``record_message``."""
    return route.name


def _authorize_search(principal: Principal, agent_id: str, body: SearchRequest) -> None:
    """A key for all of an agent's users searches any scope; a key for some users, what they
    may see (the search itself keeps each scope to the key's reach): never scope agent, and
    scope user for one of them only."""
    if principal.users is None:
        authorize(principal, Role.READ, agent_id)
    elif body.scope is Scope.USER:
        authorize(principal, Role.READ, agent_id, body.user_id)
    elif body.scope is Scope.AGENT:
        authorize(principal, Role.READ, agent_id)  # refused: scope agent spans every user
    else:
        authorize(principal, Role.READ, agent_id, min(principal.users))


async def _announce_access(service: MemoryService, mode: str, host: str | None) -> None:
    """Say at start who may call: open on loopback (development) or keys; refuse to serve
    with keys required and none to present."""
    if mode == "open":
        where = f"on {host}" if host else "anywhere (API_AUTH=off)"
        log.warning("API keys are not required: listening %s, every caller without a key acts as the operator. "
                    "Set API_AUTH=keys (or bind a non-loopback address) to require keys.", where)
        return
    if not await service.keys.any_key():
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


def _without_addresses(value: Any) -> Any:
    """A report without URLs or host:port pairs: anyone who can reach /health may read it."""
    if isinstance(value, dict):
        return {k: _without_addresses(v) for k, v in value.items() if k not in ("url", "uri")}
    if isinstance(value, list):
        return [_without_addresses(v) for v in value]
    return redact_addresses(value) if isinstance(value, str) else value


async def _gauges(service: MemoryService) -> str:
    """The live backends' current values (outbox depth and dead letters, breakers) as gauges."""
    values: dict[str, float] = {}
    try:
        backends = await service.registry.live()
    except Exception:  # the default backend cannot start: /health says why
        backends = []
    for backend in backends:
        try:
            values.update(await backend.gauges())
        except Exception:  # its store is down: /health says so; the counters still answer
            continue
    lines, typed = [], set()
    for sample, value in sorted(values.items()):
        name = "memory_service_" + sample.partition("{")[0]
        if name not in typed:
            typed.add(name)
            lines.append(f"# TYPE {name} gauge\n")
        lines.append(f"memory_service_{sample} {value:g}\n")
    return "".join(lines)
