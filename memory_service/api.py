"""The HTTP API: a thin FastAPI layer over MemoryService."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from . import __version__
from .config import Settings
from .errors import MemoryServiceError
from .formation import FormationResult
from .gates import GateStatus
from .models import Agent, AgentId, AgentSettings, MessageIn, SessionId, Shard, ShardIn, UserId
from .runtime import open_service
from .service import MemoryService


class FormationOut(BaseModel):
    formed: bool
    message_ids: list[str]
    memories: dict[str, int] = Field(description="memories formed from the window, per kind")
    written: int = Field(description="how many of them were new (0 when the window was already formed)")
    extractor: str

    @classmethod
    def of(cls, result: FormationResult) -> FormationOut:
        return cls(formed=result.formed, message_ids=result.message_ids, memories=result.counts(),
                   written=result.written, extractor=result.extractor)


class RecordOut(BaseModel):
    session_id: str
    message_id: str
    sequence: int
    duplicate: bool
    gate: GateStatus
    formation: FormationOut | None = None


class ContextOut(BaseModel):
    xml: str
    chars: int
    budget: int
    sections: dict[str, int]
    dropped: int


def create_app(settings: Settings | None = None, data_dir: Path | None = None, service: MemoryService | None = None) -> FastAPI:
    """The app; it opens its own MemoryService unless one is given."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if service is not None:
            app.state.service = service
            yield
            return
        async with open_service(settings, data_dir) as opened:
            app.state.service = opened
            yield

    app = FastAPI(
        title="memory-service",
        version=__version__,
        description="Long-term memory for LLM agents: record messages, form memories, get a budgeted XML memory block.",
        lifespan=lifespan,
    )

    @app.exception_handler(MemoryServiceError)
    async def _service_error(request: Request, exc: MemoryServiceError):
        return JSONResponse(status_code=exc.status_code, content={"detail": str(exc)})

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in exc.errors())
        return JSONResponse(status_code=422, content={"detail": problems, "errors": _jsonable(exc.errors())})

    def svc(request: Request) -> MemoryService:
        return request.app.state.service

    @app.post("/v1/sessions/{session_id}/messages", response_model=RecordOut, tags=["sessions"])
    async def record_message(session_id: SessionId, body: MessageIn, request: Request) -> RecordOut:
        """Record one message. Idempotent by `message_id`; answers with the formation gate's status."""
        result = await svc(request).record_message(session_id, body)
        return RecordOut(
            session_id=result.session_id, message_id=result.message_id, sequence=result.sequence,
            duplicate=result.duplicate, gate=result.gate,
            formation=FormationOut.of(result.formation) if result.formation else None,
        )

    @app.post("/v1/sessions/{session_id}/form", response_model=FormationOut, tags=["sessions"])
    async def form(session_id: SessionId, request: Request) -> FormationOut:
        """Form memories from the session's pending messages now, whatever the gates say."""
        return FormationOut.of(await svc(request).form_memories(session_id))

    @app.get("/v1/context", response_model=ContextOut, tags=["context"])
    async def context(
        request: Request,
        agent_id: AgentId = Query(...),
        user_id: UserId = Query(...),
        session_id: SessionId = Query(...),
        model: str | None = Query(None, max_length=200, description="target model name; selects the budget"),
    ) -> ContextOut:
        """The memory block for one model call, within the model's character budget."""
        rendered = await svc(request).assemble_memory_context(agent_id, user_id, session_id, model)
        return ContextOut(xml=rendered.xml, chars=rendered.chars, budget=rendered.budget,
                          sections=rendered.sections, dropped=rendered.dropped)

    @app.put("/v1/agents/{agent_id}", response_model=Agent, tags=["agents"])
    async def put_agent(agent_id: AgentId, body: AgentSettings, request: Request) -> Agent:
        """Create or replace an agent's settings, including its memory backend."""
        return await svc(request).put_agent(agent_id, body)

    @app.get("/v1/agents/{agent_id}", response_model=Agent, tags=["agents"])
    async def get_agent(agent_id: AgentId, request: Request) -> Agent:
        return await svc(request).get_agent(agent_id)

    @app.put("/v1/agents/{agent_id}/shards/{shard_id}", response_model=Shard, tags=["agents"])
    async def put_shard(agent_id: AgentId, shard_id: str, body: ShardIn, request: Request) -> Any:
        """Create or replace a shard: a topic the agent keeps facts and suggestions on."""
        shard, created = await svc(request).put_shard(agent_id, shard_id, body)
        return JSONResponse(status_code=201 if created else 200, content=shard.model_dump(mode="json"))

    @app.get("/v1/agents/{agent_id}/shards", response_model=list[Shard], tags=["agents"])
    async def list_shards(agent_id: AgentId, request: Request) -> list[Shard]:
        return await svc(request).list_shards(agent_id)

    @app.get("/health", tags=["ops"])
    async def health(request: Request) -> JSONResponse:
        """Each dependency's state; 503 when one is down."""
        report = await svc(request).health()
        return JSONResponse(status_code=200 if report["ok"] else 503, content=report)

    return app


def _jsonable(errors: list[dict]) -> list[dict]:
    return [{k: (v if isinstance(v, (str, int, float, list, type(None))) else str(v)) for k, v in e.items() if k != "ctx"} for e in errors]
