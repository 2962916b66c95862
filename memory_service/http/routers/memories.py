"""The memory tools over HTTP (docs/memory-tools.md). Mounted by api.create_app behind ``caller``.

Search is ``POST /v1/agents/{agent_id}/search`` (with ``tags``). Reading needs `read` on
the agent, changing needs `write` and the operator's MEMORY_WRITE_AGENTS; a key limited
to some users reads what they may see (their user namespaces, the sessions they took part
in, the shards and the agent's namespace; anything else is an unknown memory) and changes
only their own namespaces and sessions (memory_service/access/reach.py). Every change is audited (``memory.write``, ``.update``, ``.delete``, ``.undelete``).
"""

from __future__ import annotations

from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from memory_service.access.authorization import authorize, caller, reach
from memory_service.access.keys import Principal
from memory_service.curation.tools import MEMORY_ID_CHARS, MemoryUpdate, MemoryWrite, NamespaceGuard
from memory_service.domain.limits import MAX_NAMESPACE_CHARS, MESSAGE_CHARS_CEILING
from memory_service.domain.models import AgentId, MessageId, NamespaceText, OpaqueId, SessionId
from memory_service.http.guard import strict_router
from memory_service.schemas.keys import Role
from memory_service.schemas.memories import DeletedOut, MemoryRecord
from memory_service.service import MemoryService

router = strict_router(tags=["memory tools"])
Caller = Depends(caller)
MemoryId = Path(min_length=1, max_length=MEMORY_ID_CHARS, description="the memory's id")


def _svc(request: Request) -> MemoryService:
    service: MemoryService = request.app.state.service
    return service


def _allow(request: Request, principal: Principal, role: Role, agent_id: str) -> NamespaceGuard:
    """Authorize the role on the agent; for a key limited to some users, its reach
    (memory_service/access/reach.py), which the tools check before anything is read out or changed."""
    if principal.users is None:
        authorize(principal, role, agent_id)
        return None
    authorize(principal, role, agent_id, min(principal.users))
    return reach(request, principal, agent_id)


@router.get("/v1/agents/{agent_id}/memories/{memory_id}", response_model=MemoryRecord)
async def memory_get(agent_id: AgentId, request: Request, memory_id: OpaqueId = MemoryId,
                     principal: Principal = Caller) -> MemoryRecord:
    """memory_get: the full memory with its provenance (a soft-deleted one too, with its
    `deleted_at` and `purge_at`). Counts the access. Needs `read`."""
    guard = _allow(request, principal, Role.READ, agent_id)
    return await _svc(request).memory_get(agent_id, memory_id, guard)


@router.post("/v1/agents/{agent_id}/memories", response_model=MemoryRecord, status_code=201)
async def memory_write(agent_id: AgentId, body: MemoryWrite, request: Request,
                       principal: Principal = Caller) -> JSONResponse:
    """memory_write: store a memory the agent writes itself, in one of its namespaces.
    Needs `write`, and the operator's MEMORY_WRITE_AGENTS listing the agent."""
    guard = _allow(request, principal, Role.WRITE, agent_id)
    record = await _svc(request).memory_write(agent_id, body, guard)
    await _svc(request).audit.append(principal.key_id, "memory.write", agent_id, record.id, after=_audited(record))
    return JSONResponse(status_code=201, content=record.model_dump(mode="json"))


@router.patch("/v1/agents/{agent_id}/memories/{memory_id}", response_model=MemoryRecord)
async def memory_update(agent_id: AgentId, body: MemoryUpdate, request: Request, memory_id: OpaqueId = MemoryId,
                        principal: Principal = Caller) -> MemoryRecord:
    """memory_update: change the fields given (a new content is re-indexed); 409 on a
    soft-deleted memory. Needs `write` and MEMORY_WRITE_AGENTS."""
    guard = _allow(request, principal, Role.WRITE, agent_id)
    before, after = await _svc(request).tools.update(agent_id, memory_id, body, guard)
    changed = sorted(f for f in ("content", "title", "tags", "confidence", "kind")
                     if getattr(before, f) != getattr(after, f))
    await _svc(request).audit.append(principal.key_id, "memory.update", agent_id, memory_id,
                                     before=_audited(before), after={**_audited(after), "changed": changed})
    return after


@router.delete("/v1/agents/{agent_id}/memories/{memory_id}", response_model=DeletedOut)
async def memory_delete(agent_id: AgentId, request: Request, memory_id: OpaqueId = MemoryId,
                        principal: Principal = Caller) -> DeletedOut:
    """memory_delete: soft delete. Search and the memory block skip it at once; the
    retention job purges it after PURGE_AFTER_DAYS. Idempotent: a second call answers the
    same dates. Needs `write` and MEMORY_WRITE_AGENTS."""
    guard = _allow(request, principal, Role.WRITE, agent_id)
    deleted, changed = await _svc(request).tools.delete(agent_id, memory_id, guard)
    if changed:
        await _svc(request).audit.append(principal.key_id, "memory.delete", agent_id, memory_id,
                                         after=deleted.model_dump(mode="json"))
    return deleted


@router.post("/v1/agents/{agent_id}/memories/{memory_id}/undelete", response_model=MemoryRecord)
async def memory_undelete(agent_id: AgentId, request: Request, memory_id: OpaqueId = MemoryId,
                          principal: Principal = Caller) -> MemoryRecord:
    """memory_undelete: a soft-deleted memory is live again (a live one is answered as it is).
    Needs `write` and MEMORY_WRITE_AGENTS."""
    guard = _allow(request, principal, Role.WRITE, agent_id)
    record, changed = await _svc(request).tools.undelete(agent_id, memory_id, guard)
    if changed:
        await _svc(request).audit.append(principal.key_id, "memory.undelete", agent_id, memory_id,
                                         after=_audited(record))
    return record


class WriteBlocksIn(BaseModel):
    """Model output that may carry <memory_write> (or <shadow_write>) blocks."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MESSAGE_CHARS_CEILING,
                      description="the model's output, at most MAX_MESSAGE_CHARS characters; text outside blocks is ignored")
    namespace: NamespaceText = Field(min_length=1, max_length=MAX_NAMESPACE_CHARS,
                                     description="where the blocks' memories live, as for memory_write (e.g. 'user:<agent>:<user>')")
    session_id: SessionId | None = Field(default=None, description="the session the output was said in (provenance)")
    message_id: MessageId | None = Field(default=None, description="the message that carried it (provenance)")


class WriteBlocksOut(BaseModel):
    blocks: int = Field(description="write blocks found")
    written: list[MemoryRecord] = Field(description="the memories stored: observations, then entities, then edges")


@router.post("/v1/agents/{agent_id}/writes/parse", response_model=WriteBlocksOut)
async def parse_writes(agent_id: AgentId, body: WriteBlocksIn, request: Request,
                       principal: Principal = Caller) -> WriteBlocksOut:
    """Store the <memory_write> / <shadow_write> blocks of a model's output. All or nothing:
    a malformed block fails the call with 422 saying which block, where (line, column) and
    which field, and nothing is stored. Needs `write` and MEMORY_WRITE_AGENTS."""
    guard = _allow(request, principal, Role.WRITE, agent_id)
    blocks, records = await _svc(request).parse_writes(agent_id, body.text, body.namespace, body.session_id,
                                                       body.message_id, guard)
    if records:
        await _svc(request).audit.append(principal.key_id, "memory.write_blocks", agent_id, body.message_id,
                                         after={"blocks": blocks, "memories": [_audited(r) for r in records]})
    return WriteBlocksOut(blocks=blocks, written=records)


def _audited(record: MemoryRecord) -> dict[str, object]:
    """What the audit log keeps of a memory: never its words (content, title, tags), which
    the log would otherwise keep after the retention job purged them (no route edits it)."""
    return {"id": record.id, "kind": record.kind.value, "namespace": record.namespace,
            "content_chars": len(record.content), "deleted_at": record.deleted_at.isoformat() if record.deleted_at else None}
