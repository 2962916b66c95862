"""API keys: create, list, revoke (memory_service/access/keys.py).

Every route needs an admin key, and reaches only keys within its own scope: an agent's
admin manages the keys of its agent (and its users), an operator key every key. The
service audits each change (``key.create``, ``key.revoke``).
"""

from __future__ import annotations

from fastapi import Path
from fastapi.responses import JSONResponse

from memory_service.access.keys import Principal
from memory_service.domain.errors import Forbidden
from memory_service.domain.models import OpaqueId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.schemas.keys import ApiKey, KeyIn, NewKey, Role

router = strict_router(tags=["keys"])


@router.post("/v1/keys", response_model=NewKey, status_code=201)
async def create_key(body: KeyIn, service: ServiceDep, principal: CallerDep) -> JSONResponse:
    """Create an API key; the answer holds the key itself, shown this once.

    Needs an admin key whose scope holds the new key's: an agent's admin makes keys for its
    agent (and its users), an operator key makes keys for any agent and operator keys.
    """
    _require_admin(principal)
    if not principal.covers(body):
        raise Forbidden("this API key cannot create a key beyond its own agents, users and role")
    created = await service.create_key(body, actor=principal.key_id)
    return JSONResponse(status_code=201, content=created.model_dump(mode="json"))


@router.get("/v1/keys", response_model=list[ApiKey])
async def list_keys(service: ServiceDep, principal: CallerDep) -> list[ApiKey]:
    """The keys within this key's scope (never their secrets). Needs `admin`."""
    _require_admin(principal)
    return await service.list_keys(principal)


@router.delete("/v1/keys/{key_id}", response_model=ApiKey)
async def revoke_key(service: ServiceDep, principal: CallerDep, key_id: OpaqueId = Path(max_length=64)) -> ApiKey:
    """Revoke a key at once, on every replica (idempotent). Needs an admin key whose scope
    holds the key's; a key out of reach is answered as an unknown one."""
    _require_admin(principal)
    return await service.revoke_key(key_id, principal)


def _require_admin(principal: Principal) -> None:
    if principal.role is not Role.ADMIN:
        raise Forbidden(f"this API key's role is {principal.role.value}; this needs admin")
