"""The memory tools over HTTP (docs/memory-tools.md), and browsing an agent's memories
(a filtered list, page by page, and one memory's provenance and history:
memory_service/curation/browse.py).

Search is ``POST /v1/agents/{agent_id}/search`` (with ``tags``). Reading needs `read` on
the agent, changing needs `write` and the operator's MEMORY_WRITE_AGENTS; a key limited
to some users reads what they may see (their user namespaces, the sessions they took part
in, the shards and the agent's namespace; anything else is an unknown memory) and changes
only their own namespaces and sessions (memory_service/access/reach.py). The service audits
every change (``memory.write``, ``.update``, ``.delete``, ``.undelete``, ``.forget``, ``.correct``,
``.uncorrect``, ``.write_blocks``).
"""

from __future__ import annotations

from datetime import datetime

from fastapi import Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from memory_service.access.authorization import authorize
from memory_service.access.cursors import MAX_CURSOR_CHARS
from memory_service.access.keys import Principal
from memory_service.backends.base import MemoryState
from memory_service.curation.corrections import MemoryCorrection
from memory_service.curation.tools import MEMORY_ID_CHARS, MemoryUpdate, MemoryWrite, NamespaceGuard
from memory_service.domain.errors import InvalidInput
from memory_service.domain.limits import MAX_NAMESPACE_CHARS, MESSAGE_CHARS_CEILING
from memory_service.domain.models import AgentId, MemoryKind, MessageId, NamespaceText, OpaqueId, SessionId, UserId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.schemas.browse import MAX_BROWSE_PAGE, MemoryDetail, MemoryPage
from memory_service.schemas.keys import Role
from memory_service.schemas.lifecycle import ForgetIn, ForgetMode, ForgetReport, ReformIn, ReformReport
from memory_service.schemas.memories import CorrectionOut, DeletedOut, MemoryRecord, UncorrectedOut, WriteBlocksOut
from memory_service.service import MemoryService

router = strict_router(tags=["memory tools"])
MemoryId = Path(min_length=1, max_length=MEMORY_ID_CHARS, description="the memory's id")


def _allow(service: MemoryService, principal: Principal, role: Role, agent_id: str) -> NamespaceGuard:
    """Authorize the role on the agent; for a key limited to some users, its reach
    (memory_service/access/reach.py), which the tools check before anything is read out or changed."""
    if principal.users is None:
        authorize(principal, role, agent_id)
        return None
    authorize(principal, role, agent_id, min(principal.users))
    return service.reach(principal, agent_id)


@router.get("/v1/agents/{agent_id}/memories", response_model=MemoryPage)
async def list_memories(
    agent_id: AgentId,
    service: ServiceDep,
    principal: CallerDep,
    namespace: NamespaceText | None = Query(None, min_length=1, max_length=MAX_NAMESPACE_CHARS,
                                            description="only this namespace's ('user:<agent>:<user>', "
                                                        "'session:<session>', 'shard:<agent>:<shard>', 'agent:<agent>')"),
    user_id: UserId | None = Query(None, description="only this user's namespace"),
    session_id: SessionId | None = Query(None, description="only this session's namespace (its messages and "
                                                           "episodes)"),
    kind: list[MemoryKind] = Query([], description="only these kinds (repeat the parameter for several)"),
    tag: list[str] = Query([], max_length=20, description="only memories carrying every one of these tags"),
    since: datetime | None = Query(None, description="valid_at at or after (ISO 8601)"),
    until: datetime | None = Query(None, description="valid_at at or before (ISO 8601)"),
    state: MemoryState = Query(MemoryState.LIVE, description="live (the default: what search and the memory block "
                                                             "read), deleted (soft-deleted), evicted, corrected "
                                                             "(found wrong, kept as history), or all"),
    cursor: str | None = Query(None, min_length=1, max_length=MAX_CURSOR_CHARS,
                               description="the `next` of the previous page (with the same filters)"),
    limit: int = Query(50, ge=1, le=MAX_BROWSE_PAGE),
) -> MemoryPage:
    """The agent's memories, newest first (by valid_at), filtered; one page at a time (pass
    `next` as `cursor`, with the same filters). A page may hold fewer than `limit` while
    `next` is set: keep following it. Listing counts no access. Needs `read`; a key limited
    to some users lists what they may see (their namespaces, their sessions, the shards and
    the agent's)."""
    authorize(principal, Role.READ, agent_id,
              user_id if user_id is not None else min(principal.users) if principal.users else None)
    if any(not t or len(t) > 100 for t in tag):
        raise InvalidInput("tag: 1 to 100 characters each")
    return await service.list_memories(agent_id, service.reach(principal, agent_id), namespace=namespace,
                                       user_id=user_id, session_id=session_id, kinds=kind, tags=tag, since=since,
                                       until=until, state=state, cursor=cursor, limit=limit)


@router.get("/v1/agents/{agent_id}/memories/{memory_id}/detail", response_model=MemoryDetail)
async def get_memory_detail(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                            memory_id: OpaqueId = MemoryId) -> MemoryDetail:
    """One memory with its provenance (the recorded messages it was formed from, the window
    and the extractor that formed it), its access count and its history (its audit entries).
    Counts no access (memory_get does). Needs `read`; a key limited to some users sees the
    memories they may see."""
    guard = _allow(service, principal, Role.READ, agent_id)
    return await service.memory_detail(agent_id, memory_id, guard)


@router.get("/v1/agents/{agent_id}/memories/{memory_id}", response_model=MemoryRecord)
async def memory_get(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                     memory_id: OpaqueId = MemoryId) -> MemoryRecord:
    """memory_get: the full memory with its provenance (a soft-deleted one too, with its
    `deleted_at` and `purge_at`). Counts the access. Needs `read`."""
    guard = _allow(service, principal, Role.READ, agent_id)
    return await service.memory_get(agent_id, memory_id, guard)


@router.post("/v1/agents/{agent_id}/memories", response_model=MemoryRecord, status_code=201)
async def memory_write(agent_id: AgentId, body: MemoryWrite, service: ServiceDep, principal: CallerDep) -> JSONResponse:
    """memory_write: store a memory the agent writes itself, in one of its namespaces.
    201; with an `idempotency_key` already used, 200 and the memory stored then (409 if it
    was another content, namespace or kind). Needs `write`, and the operator's
    MEMORY_WRITE_AGENTS listing the agent."""
    guard = _allow(service, principal, Role.WRITE, agent_id)
    record, already = await service.memory_write_answer(agent_id, body, guard, actor=principal.key_id)
    return JSONResponse(status_code=200 if already else 201, content=record.model_dump(mode="json"))


@router.patch("/v1/agents/{agent_id}/memories/{memory_id}", response_model=MemoryRecord)
async def memory_update(agent_id: AgentId, body: MemoryUpdate, service: ServiceDep, principal: CallerDep,
                        memory_id: OpaqueId = MemoryId) -> MemoryRecord:
    """memory_update: change the fields given (a new content is re-indexed); 409 on a
    soft-deleted memory. Needs `write` and MEMORY_WRITE_AGENTS."""
    guard = _allow(service, principal, Role.WRITE, agent_id)
    return await service.memory_update(agent_id, memory_id, body, guard, actor=principal.key_id)


@router.delete("/v1/agents/{agent_id}/memories/{memory_id}", response_model=DeletedOut)
async def memory_delete(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                        memory_id: OpaqueId = MemoryId) -> DeletedOut:
    """memory_delete: soft delete. Search and the memory block skip it at once; the
    retention job purges it after PURGE_AFTER_DAYS. Idempotent: a second call answers the
    same dates. Needs `write` and MEMORY_WRITE_AGENTS."""
    guard = _allow(service, principal, Role.WRITE, agent_id)
    return await service.memory_delete(agent_id, memory_id, guard, actor=principal.key_id)


@router.post("/v1/agents/{agent_id}/memories/{memory_id}/undelete", response_model=MemoryRecord)
async def memory_undelete(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                          memory_id: OpaqueId = MemoryId) -> MemoryRecord:
    """memory_undelete: a soft-deleted memory is live again (a live one is answered as it is).
    Needs `write` and MEMORY_WRITE_AGENTS."""
    guard = _allow(service, principal, Role.WRITE, agent_id)
    return await service.memory_undelete(agent_id, memory_id, guard, actor=principal.key_id)


@router.post("/v1/agents/{agent_id}/memories/{memory_id}/forget", response_model=ForgetReport)
async def memory_forget(agent_id: AgentId, service: ServiceDep, principal: CallerDep, body: ForgetIn | None = None,
                        memory_id: OpaqueId = MemoryId) -> ForgetReport:
    """memory_forget: forget a message or a memory with everything formed from it
    (docs/forget.md): the window of a forgotten message formed again from its other
    messages, consolidated versions that merged it, the graph facts that came from it, its
    vectors, postings and the cached blocks that showed it. `soft` (the default) takes it
    all out of every read at once and is undone by `POST .../undelete`; `hard` deletes it
    for good, as an erasure does (needs `admin`). Answers what went (ids and counts).
    Asked again after a crash, it finishes the forget. A message in the window being formed
    right now: 409 (try again once it is formed). Needs `write` (`admin` for hard); not
    MEMORY_WRITE_AGENTS."""
    mode = body.mode if body is not None else ForgetMode.SOFT
    guard = _allow(service, principal, Role.ADMIN if mode is ForgetMode.HARD else Role.WRITE, agent_id)
    return await service.memory_forget(agent_id, memory_id, mode, guard, actor=principal.key_id)


@router.post("/v1/agents/{agent_id}/reform", response_model=ReformReport)
async def reform_windows(agent_id: AgentId, body: ReformIn, service: ServiceDep, principal: CallerDep) -> ReformReport:
    """Re-form the agent's formed windows (all, a user's sessions, or one session; those
    formed since a time) with the extractor configured now (docs/reform.md): the memories
    each window's old extraction made are replaced by the new ones in one step per window.
    Memories written by hand or by tools are never touched. `dry_run` says how many windows
    and extractor calls it would take, changing nothing; `limit` bounds one call, and the
    same `run_id` again resumes the run (skipping the windows it re-formed). An unknown
    session (or another agent's): 404. Needs `admin` for all of the agent's users."""
    authorize(principal, Role.ADMIN, agent_id)
    return await service.reform(agent_id, body, actor=principal.key_id)


@router.post("/v1/agents/{agent_id}/memories/{memory_id}/correct", response_model=CorrectionOut)
async def memory_correct(agent_id: AgentId, body: MemoryCorrection, service: ServiceDep, principal: CallerDep,
                         memory_id: OpaqueId = MemoryId) -> CorrectionOut:
    """memory_correct: the memory was wrong (not outdated: that is memory_update). A new memory
    with the right content takes its place (`correction`, whose `corrects` names the old one);
    the old one is kept as history (`corrected_at`, `corrected_by`), read by id only: search,
    the memory block and browse's live list skip it. The knowledge-graph facts formed from it
    close as wrong (`facts_closed`). Undo with `.../uncorrect`. 409 on a memory deleted,
    expired or corrected already; 422 on a recorded message or an unchanged content. Needs
    `write` and MEMORY_WRITE_AGENTS (docs/corrections.md)."""
    guard = _allow(service, principal, Role.WRITE, agent_id)
    return await service.memory_correct(agent_id, memory_id, body, guard, actor=principal.key_id)


@router.post("/v1/agents/{agent_id}/memories/{memory_id}/uncorrect", response_model=UncorrectedOut)
async def memory_uncorrect(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                           memory_id: OpaqueId = MemoryId) -> UncorrectedOut:
    """Undo memory_correct on `memory_id` (the memory that was corrected): it is live again, its
    correction soft-deleted, the facts the correction closed current again. 409 if it is not
    corrected, or its correction was corrected since. Needs `write` and MEMORY_WRITE_AGENTS."""
    guard = _allow(service, principal, Role.WRITE, agent_id)
    return await service.memory_uncorrect(agent_id, memory_id, guard, actor=principal.key_id)


class WriteBlocksIn(BaseModel):
    """Model output that may carry <memory_write> (or <shadow_write>) blocks."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MESSAGE_CHARS_CEILING,
                      description="the model's output, at most MAX_MESSAGE_CHARS characters; text outside blocks is ignored")
    namespace: NamespaceText = Field(min_length=1, max_length=MAX_NAMESPACE_CHARS,
                                     description="where the blocks' memories live, as for memory_write (e.g. 'user:<agent>:<user>')")
    session_id: SessionId | None = Field(default=None, description="the session the output was said in (provenance)")
    message_id: MessageId | None = Field(default=None, description="the message that carried it (provenance)")


@router.post("/v1/agents/{agent_id}/writes/parse", response_model=WriteBlocksOut)
async def parse_writes(agent_id: AgentId, body: WriteBlocksIn, service: ServiceDep,
                       principal: CallerDep) -> WriteBlocksOut:
    """Store the <memory_write> / <shadow_write> blocks of a model's output. All or nothing:
    a malformed block fails the call with 422 saying which block, where (line, column) and
    which field, and nothing is stored. Observations are memories; entities and edges are
    written to the knowledge graph in the namespace given (a Mongo agent keeps no graph:
    409, nothing stored). Idempotent: the same text parsed again for the same message
    (session_id, message_id) and namespace stores nothing new and answers the same ids,
    listed in `already_stored`. Needs `write` and MEMORY_WRITE_AGENTS."""
    guard = _allow(service, principal, Role.WRITE, agent_id)
    return await service.parse_writes(agent_id, body.text, body.namespace, body.session_id, body.message_id, guard,
                                      actor=principal.key_id)

