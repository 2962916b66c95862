"""The audit log (memory_service/access/audit.py): who changed what, when, before and after.

Reading an agent's log needs `admin` on the agent; the changes spanning every agent (the
system's log), an operator key. Nothing here writes to the log: the service does, for
every change it makes for a key.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import Query

from memory_service.access.authorization import authorize, require_operator
from memory_service.domain.errors import InvalidInput
from memory_service.domain.models import AgentId, OpaqueId, UserId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.schemas.audit import AuditPage
from memory_service.schemas.keys import Role

router = strict_router(tags=["audit"])


@router.get("/v1/audit", response_model=AuditPage)
async def read_audit(
    service: ServiceDep,
    principal: CallerDep,
    agent_id: AgentId | None = Query(None, description="whose changes; omitted: changes spanning every agent "
                                                       "(operator keys only)"),
    action: str | None = Query(None, max_length=64, description="e.g. agent.put, key.create, user.erase"),
    key_id: OpaqueId | None = Query(None, max_length=64, description="changes made with this key"),
    user_id: UserId | None = Query(None, description="the entries naming this user (the log keeps user ids only as "
                                                     "keyed digests: this one is digested here); needs agent_id"),
    since: datetime | None = Query(None),
    until: datetime | None = Query(None),
    before: str | None = Query(None, max_length=40, pattern=r"^\d{1,20}-\d{1,20}$",
                               description="the `next` of the previous page"),
    limit: int = Query(100, ge=1, le=1000),
) -> AuditPage:
    """The audit log, newest first: who changed what, when, before and after. Needs `admin`
    on the agent (an operator key for the changes spanning every agent)."""
    if agent_id is None:
        if user_id is not None:
            raise InvalidInput("user_id: a user is named per agent; give agent_id too")
        require_operator(principal)
    else:
        authorize(principal, Role.ADMIN, agent_id)
    return await service.audit_page(agent_id, action=action, key_id=key_id, user_id=user_id, since=since, until=until,
                                    before=before, limit=limit)
