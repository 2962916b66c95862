"""The typed dependencies every route takes: the service, and the caller its key makes.

A route names them in its signature (``service: ServiceDep, principal: CallerDep``) and
FastAPI provides them per request: the MemoryService that create_app's lifespan keeps in
``app.state``, and the principal of the request's API key. One place says how a request
reaches the service, and it reaches the facade only (memory_service/service.py): a route
authorizes the principal (memory_service/access/authorization.py) and calls one method.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from memory_service.access.keys import LOCAL, Principal
from memory_service.domain.errors import Unauthorized
from memory_service.http.overload import AUTHENTICATED
from memory_service.service import MemoryService


async def get_service(request: Request) -> MemoryService:
    """The app's MemoryService (create_app's lifespan sets it).

    A coroutine although it awaits nothing: FastAPI runs a plain function dependency in its
    thread pool, a thread hop on every request (measured: 0.15 ms of the API's CPU per
    recorded message, bench/ingest_bench.py)."""
    service: MemoryService = request.app.state.service
    return service


ServiceDep = Annotated[MemoryService, Depends(get_service)]

# Declares the scheme in the OpenAPI schema (the docs' "Authorize" button); ``caller``
# reads the header itself, to answer each kind of bad header with its own sentence.
_BEARER = HTTPBearer(auto_error=False, scheme_name="apiKey",
                     description="An API key: `msk_<key id>_<secret>` (memory-service keys create)")


async def caller(request: Request, service: ServiceDep,
                 _declared: HTTPAuthorizationCredentials | None = Security(_BEARER)) -> Principal:
    """The request's principal, from ``Authorization: Bearer <key>``; 401 without a valid key.

    With API_AUTH open (``app.state.access_mode``), a request without the header acts as
    the local operator; a key that is sent is checked all the same. Admission checked it
    already to learn the request's agent (memory_service/http/overload.py): its outcome is
    taken, not checked (and counted) again."""
    header = request.headers.get("authorization")
    if header is None:
        if request.app.state.access_mode == "open":
            return LOCAL
        raise Unauthorized("this route needs an API key: send 'Authorization: Bearer <key>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
    checked = request.scope.get("state", {}).get(AUTHENTICATED)
    if isinstance(checked, Exception):
        raise checked
    principal = checked if checked is not None else await service.authenticate(token.strip())
    if isinstance(principal, str):
        raise Unauthorized(principal)
    return principal


CallerDep = Annotated[Principal, Depends(caller)]
