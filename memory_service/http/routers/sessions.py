"""Sessions: recording messages, forming a session's pending window, a session's state, and
an agent's sessions (the browse API, memory_service/curation/browse.py).

Recording needs `write` on the message's agent (and, for a key limited to users, its
user) and is charged against the key's token budget; the routes named by a session id
alone are authorized by the agent that owns the session (``authorize_session``).
"""

from __future__ import annotations

from typing import Any

from fastapi import Query

from memory_service.access.authorization import authorize
from memory_service.domain.models import AgentId, MessageIn, SessionId, UserId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.schemas.browse import MAX_BROWSE_PAGE, SessionPage
from memory_service.schemas.formation import FormationSummary
from memory_service.schemas.keys import Role
from memory_service.schemas.records import RecordOut

router = strict_router(tags=["sessions"])


@router.post("/v1/sessions/{session_id}/messages", response_model=RecordOut)
async def record_message(session_id: SessionId, body: MessageIn, service: ServiceDep,
                         principal: CallerDep) -> RecordOut:
    """Record one message. Idempotent by `message_id`; answers with the formation gate's status.

    Needs `write` on the message's agent (and, for a key limited to users, its user). A
    key limited to users records into a session other users started only if the agent's
    `users_join_sessions` is on; else it is answered as a session of another agent (409)."""
    authorize(principal, Role.WRITE, body.agent_id, body.user_id)
    await service.charge_tokens(principal, body.content)
    result = await service.record_message(session_id, body, service.reach(principal, body.agent_id))
    return RecordOut(
        session_id=result.session_id, message_id=result.message_id, sequence=result.sequence,
        duplicate=result.duplicate, gate=result.gate, formation_job=result.formation_job,
    )


@router.post("/v1/sessions/{session_id}/form", response_model=FormationSummary)
async def form_memories(
    session_id: SessionId,
    service: ServiceDep,
    principal: CallerDep,
    wait: bool = Query(True, description="answer once the window is stored (else as soon as it is queued)"),
) -> FormationSummary:
    """Enqueue the session's pending window for formation now, whatever the gates say.

    With `wait` (the default) the answer comes once the worker stored the window; a
    formation that fails or takes longer than FORM_WAIT_SECONDS answers 503, and the
    window stays pending. Needs `write` on the session's agent.
    """
    await service.authorize_session(principal, session_id, Role.WRITE)
    return await service.form_memories(session_id, wait=wait)


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: SessionId, service: ServiceDep, principal: CallerDep) -> dict[str, Any]:
    """The session's gate state, formation cursor and the job of its pending window.
    Needs `read` on the session's agent."""
    await service.authorize_session(principal, session_id, Role.READ)
    return await service.session_status(session_id)


@router.get("/v1/agents/{agent_id}/sessions", response_model=SessionPage)
async def list_sessions(
    agent_id: AgentId,
    service: ServiceDep,
    principal: CallerDep,
    user_id: UserId | None = Query(None, description="only the sessions this user took part in"),
    cursor: str | None = Query(None, min_length=1, max_length=1000, description="the `next` of the previous page"),
    limit: int = Query(50, ge=1, le=MAX_BROWSE_PAGE),
) -> SessionPage:
    """The agent's sessions, newest first, each with its formation gate, cursor, pending
    window and last activity; one page at a time (pass `next` as `cursor`). Needs `read`; a
    key limited to some users lists the sessions they took part in."""
    authorize(principal, Role.READ, agent_id,
              user_id if user_id is not None else min(principal.users) if principal.users else None)
    return await service.list_sessions(agent_id, service.reach(principal, agent_id), user_id, cursor, limit)
