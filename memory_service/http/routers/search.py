"""Search (memory_service/recall/search.py): as query parameters, or as a JSON body for long
queries and namespace lists. A key limited to some users searches only what they may see."""

from __future__ import annotations

from datetime import datetime

from fastapi import Query
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from memory_service.access.authorization import authorize
from memory_service.access.keys import Principal
from memory_service.domain.limits import MAX_RANK_WEIGHT, MAX_TOP_K_CEILING
from memory_service.domain.models import AgentId, MemoryKind, SessionId, UserId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.recall.search import SearchRequest
from memory_service.schemas.keys import Role
from memory_service.schemas.search import Scope, SearchResult

router = strict_router(tags=["search"])


@router.get("/v1/search", response_model=SearchResult)
async def search_memories(
    service: ServiceDep,
    principal: CallerDep,
    agent_id: AgentId = Query(...),
    query: str = Query(..., description="what to look for, in plain words"),
    scope: Scope = Query(Scope.AGENT, description="session, user, shard, agent, or namespaces"),
    user_id: UserId | None = Query(None, description="scope=user"),
    session_id: SessionId | None = Query(None, description="scope=session"),
    shard_id: str | None = Query(None, max_length=256, description="scope=shard"),
    namespaces: list[str] | None = Query(None, description="scope=namespaces: repeat for each namespace"),
    top_k: int = Query(10, ge=1, le=MAX_TOP_K_CEILING),
    min_score: float | None = Query(None, ge=0, le=1, allow_inf_nan=False),
    kinds: list[MemoryKind] | None = Query(None, description="repeat for each kind; default: every kind"),
    since: datetime | None = Query(None),
    until: datetime | None = Query(None),
    tags: list[str] | None = Query(None, description="repeat for each tag: only memories carrying all of them"),
    centrality_weight: float | None = Query(None, ge=0, le=MAX_RANK_WEIGHT, allow_inf_nan=False,
                                            description="re-rank weight of centrality (default SEARCH_RANK_CENTRALITY)"),
    activation_weight: float | None = Query(None, ge=0, le=MAX_RANK_WEIGHT, allow_inf_nan=False,
                                            description="re-rank weight of activation (default SEARCH_RANK_ACTIVATION)"),
) -> SearchResult:
    """Search an agent's memories: full-text, vector and graph signals fused by reciprocal
    rank, with recency and, when weighted, a structural re-rank; every result explained. Needs `read` on the agent; a key limited to
    users searches what they may see: scope user (one of them), session (one they took
    part in), shard, or namespaces of those; not scope agent."""
    try:
        body = SearchRequest(query=query, scope=scope, user_id=user_id, session_id=session_id, shard_id=shard_id,
                             namespaces=namespaces, top_k=top_k, min_score=min_score, kinds=kinds, since=since,
                             until=until, tags=tags, centrality_weight=centrality_weight,
                             activation_weight=activation_weight)
    except ValidationError as exc:  # e.g. too many namespaces: the caller's mistake, answered as such
        raise RequestValidationError(exc.errors()) from None
    _authorize_search(principal, agent_id, body)
    return await service.search(agent_id, body, reach=service.reach(principal, agent_id))


@router.post("/v1/agents/{agent_id}/search", response_model=SearchResult)
async def search_memories_with_body(agent_id: AgentId, body: SearchRequest, service: ServiceDep,
                                    principal: CallerDep) -> SearchResult:
    """The same search with the request as a JSON body (for long queries and namespace lists)."""
    _authorize_search(principal, agent_id, body)
    return await service.search(agent_id, body, reach=service.reach(principal, agent_id))


def _authorize_search(principal: Principal, agent_id: str, body: SearchRequest) -> None:
    """A key for all of an agent's users searches any scope; a key for some users, what they
    may see (the search itself keeps each scope to the key's reach): never scope agent, and
    scope user for one of them only."""
    if principal.users is None:
        authorize(principal, Role.READ, agent_id)
    elif body.scope is Scope.USER:
        authorize(principal, Role.READ, agent_id, body.user_id)
    elif body.scope is Scope.AGENT:
        authorize(principal, Role.READ, agent_id)  # refused: scope agent spans every user
    else:
        authorize(principal, Role.READ, agent_id, min(principal.users))
