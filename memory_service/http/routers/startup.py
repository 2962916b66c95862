"""Startup records over HTTP (memory_service/recall/startup.py).

Changing records needs `admin` on the agent, reading them `read`; the service audits every
change (``startup.put``, ``startup.delete``).
"""

from __future__ import annotations

from typing import Any

from fastapi import Query
from fastapi.responses import JSONResponse

from memory_service.access.authorization import authorize
from memory_service.domain.models import AgentId, SessionId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.recall.startup import RecordId
from memory_service.schemas.keys import Role
from memory_service.schemas.startup import DeletedStartupRecord, StartupBlock, StartupMode, StartupRecord, StartupRecordIn

router = strict_router(tags=["startup"])


@router.put("/v1/agents/{agent_id}/startup/{record_id}", response_model=StartupRecord)
async def put_startup_record(agent_id: AgentId, record_id: RecordId, body: StartupRecordIn, service: ServiceDep,
                             principal: CallerDep) -> Any:
    """Create (201) or replace a startup record: `priority` (P0 identity, P1 operating rules,
    P2 behaviour, P3 reference), `title`, `content`. The same record again changes nothing.
    Needs `admin` on the agent."""
    authorize(principal, Role.ADMIN, agent_id)
    record, before, _ = await service.put_startup_record(agent_id, record_id, body, actor=principal.key_id)
    return JSONResponse(status_code=201 if before is None else 200, content=record.model_dump(mode="json"))


@router.get("/v1/agents/{agent_id}/startup", response_model=list[StartupRecord])
async def list_startup_records(agent_id: AgentId, service: ServiceDep, principal: CallerDep) -> list[StartupRecord]:
    """The agent's startup records, by priority then id. Needs `read` on the agent."""
    authorize(principal, Role.READ, agent_id)
    return await service.list_startup_records(agent_id)


@router.delete("/v1/agents/{agent_id}/startup/{record_id}", response_model=DeletedStartupRecord)
async def delete_startup_record(agent_id: AgentId, record_id: RecordId, service: ServiceDep,
                                principal: CallerDep) -> DeletedStartupRecord:
    """Delete a startup record (idempotent: `deleted` says whether there was one). Needs `admin`."""
    authorize(principal, Role.ADMIN, agent_id)
    before = await service.delete_startup_record(agent_id, record_id, actor=principal.key_id)
    return DeletedStartupRecord(id=record_id, deleted=before is not None)


@router.get("/v1/agents/{agent_id}/startup/block", response_model=StartupBlock)
async def get_startup_block(
    agent_id: AgentId,
    service: ServiceDep,
    principal: CallerDep,
    model: str | None = Query(None, max_length=200, description="target model name; selects the budget"),
    session_id: SessionId | None = Query(None, description="the session the block is for (modes first-run and digest)"),
    mode: StartupMode = Query(StartupMode.ALWAYS, description="always, first-run (a session's first call only) or "
                                                              "digest (when the records changed since last sent)"),
) -> StartupBlock:
    """The agent's startup records within the model's budget, highest priority first; what
    did not fit is listed in `dropped`. With mode first-run or digest, `sent` says whether
    the session gets them now (else `records` is empty). Needs `read` on the agent, for all
    its users; a session of another agent is answered as a session nobody recorded in."""
    authorize(principal, Role.READ, agent_id)
    return await service.startup_block(agent_id, model, session_id, mode, service.reach(principal, agent_id))
