"""An agent's users: their list (the browse API), everything held on one (export) and its
erasure (docs/erasure.md).

Listing needs `read` on the agent (a key limited to some users lists them only); export and
erasure need `admin` on the agent (and the user); an erasure is audited by the service
(``user.erase``, naming the user only by its keyed digest).
"""

from __future__ import annotations

from fastapi import Query

from memory_service.access.authorization import authorize
from memory_service.access.cursors import MAX_CURSOR_CHARS
from memory_service.domain.models import AgentId, UserId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.schemas.browse import MAX_BROWSE_PAGE, UserPage
from memory_service.schemas.erasure import ErasureReport, UserExport
from memory_service.schemas.keys import Role

router = strict_router(tags=["users"])


@router.get("/v1/agents/{agent_id}/users", response_model=UserPage)
async def list_users(
    agent_id: AgentId,
    service: ServiceDep,
    principal: CallerDep,
    cursor: str | None = Query(None, min_length=1, max_length=MAX_CURSOR_CHARS, description="the `next` of the previous page"),
    limit: int = Query(50, ge=1, le=MAX_BROWSE_PAGE),
) -> UserPage:
    """The agent's users (who spoke, had a message recorded under their id, or had a memory
    written in their namespace), by id, with their numbers of sessions; one page at a time.
    Needs `read`; a key limited to some users lists them."""
    authorize(principal, Role.READ, agent_id, min(principal.users) if principal.users else None)
    return await service.list_users(agent_id, service.reach(principal, agent_id), cursor, limit)


@router.delete("/v1/agents/{agent_id}/users/{user_id}", response_model=ErasureReport)
async def erase_user(agent_id: AgentId, user_id: UserId, service: ServiceDep, principal: CallerDep) -> ErasureReport:
    """Erase everything of the user with this agent, in every store, index, cache and
    outbox, and report what was removed (docs/erasure.md). A second call reports zeros;
    an unknown user gets an empty report. Needs `admin` on the agent (and the user)."""
    authorize(principal, Role.ADMIN, agent_id, user_id)
    return await service.erase_user(agent_id, user_id, actor=principal.key_id)


@router.get("/v1/agents/{agent_id}/users/{user_id}/export", response_model=UserExport)
async def export_user(agent_id: AgentId, user_id: UserId, service: ServiceDep, principal: CallerDep) -> UserExport:
    """Everything held on the user with this agent, as JSON: what an erasure would remove.
    Needs `admin` on the agent (and the user)."""
    authorize(principal, Role.ADMIN, agent_id, user_id)
    return await service.export_user(agent_id, user_id)
