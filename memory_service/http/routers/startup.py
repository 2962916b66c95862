"""Startup records over HTTP (memory_service/recall/startup.py). Mounted by api.create_app behind ``caller``.

Changing records needs `admin` on the agent, reading them `read`; every change is audited.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, Query, Request
from fastapi.responses import JSONResponse

from memory_service.access.authorization import authorize, caller, reach
from memory_service.access.keys import Principal
from memory_service.domain.models import AgentId, SessionId
from memory_service.http.guard import strict_router
from memory_service.recall.startup import RecordId
from memory_service.schemas.keys import Role
from memory_service.schemas.startup import DeletedStartupRecord, StartupBlock, StartupMode, StartupRecord, StartupRecordIn

router = strict_router(tags=["startup"])
Caller = Depends(caller)


@router.put("/v1/agents/{agent_id}/startup/{record_id}", response_model=StartupRecord)
async def put_startup_record(agent_id: AgentId, record_id: RecordId, body: StartupRecordIn, request: Request,
                             principal: Principal = Caller) -> Any:
    """Create (201) or replace a startup record: `priority` (P0 identity, P1 operating rules,
    P2 behaviour, P3 reference), `title`, `content`. The same record again changes nothing.
    Needs `admin` on the agent."""
    authorize(principal, Role.ADMIN, agent_id)
    service = request.app.state.service
    record, before, changed = await service.put_startup_record(agent_id, record_id, body)
    if changed:
        await service.audit.append(principal.key_id, "startup.put", agent_id, record_id,
                                   before=before.model_dump(mode="json") if before else None,
                                   after=record.model_dump(mode="json"))
    return JSONResponse(status_code=201 if before is None else 200, content=record.model_dump(mode="json"))


@router.get("/v1/agents/{agent_id}/startup", response_model=list[StartupRecord])
async def list_startup_records(agent_id: AgentId, request: Request, principal: Principal = Caller) -> list[StartupRecord]:
    """The agent's startup records, by priority then id. Needs `read` on the agent."""
    authorize(principal, Role.READ, agent_id)
    records: list[StartupRecord] = await request.app.state.service.list_startup_records(agent_id)
    return records


@router.delete("/v1/agents/{agent_id}/startup/{record_id}", response_model=DeletedStartupRecord)
async def delete_startup_record(agent_id: AgentId, record_id: RecordId, request: Request,
                                principal: Principal = Caller) -> DeletedStartupRecord:
    """Delete a startup record (idempotent: `deleted` says whether there was one). Needs `admin`."""
    authorize(principal, Role.ADMIN, agent_id)
    service = request.app.state.service
    before = await service.delete_startup_record(agent_id, record_id)
    if before is not None:
        await service.audit.append(principal.key_id, "startup.delete", agent_id, record_id,
                                   before=before.model_dump(mode="json"))
    return DeletedStartupRecord(id=record_id, deleted=before is not None)


@router.get("/v1/agents/{agent_id}/startup/block", response_model=StartupBlock)
async def get_startup_block(
    agent_id: AgentId,
    request: Request,
    model: str | None = Query(None, max_length=200, description="target model name; selects the budget"),
    session_id: SessionId | None = Query(None, description="the session the block is for (modes first-run and digest)"),
    mode: StartupMode = Query(StartupMode.ALWAYS, description="always, first-run (a session's first call only) or "
                                                              "digest (when the records changed since last sent)"),
    principal: Principal = Caller,
) -> StartupBlock:
    """The agent's startup records within the model's budget, highest priority first; what
    did not fit is listed in `dropped`. With mode first-run or digest, `sent` says whether
    the session gets them now (else `records` is empty). Needs `read` on the agent, for all
    its users; a session of another agent is answered as a session nobody recorded in."""
    authorize(principal, Role.READ, agent_id)
    block: StartupBlock = await request.app.state.service.startup_block(agent_id, model, session_id, mode,
                                                                        reach(request, principal, agent_id))
    return block
