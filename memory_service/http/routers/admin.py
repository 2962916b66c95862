"""Admin routes: API keys and the audit log. Mounted by api.create_app behind ``caller``."""

from __future__ import annotations

from datetime import datetime

from fastapi import Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from memory_service.access.authorization import authorize, caller, require_operator
from memory_service.access.keys import Principal
from memory_service.domain.errors import Forbidden, InvalidInput, NotFound
from memory_service.domain.models import AgentId, OpaqueId, UserId
from memory_service.http.guard import strict_router
from memory_service.schemas.audit import AuditPage
from memory_service.schemas.keys import ApiKey, KeyIn, NewKey, Role

router = strict_router()
Caller = Depends(caller)


@router.post("/v1/keys", response_model=NewKey, status_code=201, tags=["keys"])
async def create_key(body: KeyIn, request: Request, principal: Principal = Caller) -> JSONResponse:
    """Create an API key; the answer holds the key itself, shown this once.

    Needs an admin key whose scope holds the new key's: an agent's admin makes keys for its
    agent (and its users), an operator key makes keys for any agent and operator keys.
    """
    _require_admin(principal)
    if not principal.covers(body):
        raise Forbidden("this API key cannot create a key beyond its own agents, users and role")
    service = request.app.state.service
    created = await service.keys.create(body, created_by=principal.key_id)
    record = ApiKey.model_validate(created.model_dump(exclude={"key"}))
    await service.audit.append_each(principal.key_id, "key.create", body.agents, created.key_id,
                                    after=record.model_dump(mode="json"))
    return JSONResponse(status_code=201, content=created.model_dump(mode="json"))


@router.get("/v1/keys", response_model=list[ApiKey], tags=["keys"])
async def list_keys(request: Request, principal: Principal = Caller) -> list[ApiKey]:
    """The keys within this key's scope (never their secrets). Needs `admin`."""
    _require_admin(principal)
    keys: list[ApiKey] = await request.app.state.service.keys.list(principal)
    return keys


@router.delete("/v1/keys/{key_id}", response_model=ApiKey, tags=["keys"])
async def revoke_key(request: Request, key_id: OpaqueId = Path(max_length=64), principal: Principal = Caller) -> ApiKey:
    """Revoke a key at once, on every replica (idempotent). Needs an admin key whose scope
    holds the key's; a key out of reach is answered as an unknown one."""
    _require_admin(principal)
    service = request.app.state.service
    try:
        key = await service.keys.get(key_id)
    except NotFound:
        raise NotFound(f"no key {key_id[:40]!r}") from None
    if not principal.covers(key):
        raise NotFound(f"no key {key_id[:40]!r}")
    revoked, changed = await service.keys.revoke(key_id)
    if changed:
        await service.audit.append_each(principal.key_id, "key.revoke", key.agents, key_id,
                                        before=key.model_dump(mode="json"), after=revoked.model_dump(mode="json"))
    result: ApiKey = revoked
    return result


@router.get("/v1/audit", response_model=AuditPage, tags=["audit"])
async def read_audit(
    request: Request,
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
    principal: Principal = Caller,
) -> AuditPage:
    """The audit log, newest first: who changed what, when, before and after. Needs `admin`
    on the agent (an operator key for the changes spanning every agent)."""
    if agent_id is None:
        if user_id is not None:
            raise InvalidInput("user_id: a user is named per agent; give agent_id too")
        require_operator(principal)
    else:
        authorize(principal, Role.ADMIN, agent_id)
    page: AuditPage = await request.app.state.service.audit.read(
        agent_id, action=action, key_id=key_id, user_id=user_id, since=since, until=until, before=before, limit=limit)
    return page


def _require_admin(principal: Principal) -> None:
    if principal.role is not Role.ADMIN:
        raise Forbidden(f"this API key's role is {principal.role.value}; this needs admin")
