"""The knowledge graph over HTTP (issue 16; docs/graph.md, "The API"): an agent's entities,
one entity with its facts and neighbours, undoing the invalidation of a fact, and undoing a
merge (splitting an alias off an entity).

Reading needs `read` on the agent, restoring a fact or splitting an entity `write` (as
undeleting a memory does).
A key limited to some users sees the entities and facts of the namespaces its users may see
(theirs, the shards', the agent's: memory_service/access/reach.py); an entity of another
user's namespace is answered as an unknown one, and the facts and neighbours of an entity
that come from namespaces it may not see are left out. On an agent whose backend keeps no
graph (Mongo) every route answers 409 saying so.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import Path, Query

from memory_service.access.authorization import authorize
from memory_service.access.cursors import MAX_CURSOR_CHARS
from memory_service.access.keys import Principal
from memory_service.access.reach import Reach
from memory_service.domain.graph import EntityType
from memory_service.domain.limits import MAX_NAMESPACE_CHARS
from memory_service.domain.models import AgentId, NamespaceText, UserId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.schemas.graph import (
    DEFAULT_FACT_PAGE,
    ENTITY_ID_PATTERN,
    FACT_ID_PATTERN,
    MAX_ENTITY_PAGE,
    MAX_FACT_PAGE,
    EntityDetailOut,
    EntityPage,
    EntitySplitIn,
    EntitySplitOut,
    FactOut,
)
from memory_service.schemas.keys import Role
from memory_service.service import MemoryService

router = strict_router(tags=["knowledge graph"])
EntityId = Path(pattern=ENTITY_ID_PATTERN, description="the entity's id (`ent_` and 24 hex digits)")
FactId = Path(pattern=FACT_ID_PATTERN, description="the fact's id (`fact_` and 24 hex digits)")


def _reach(service: MemoryService, principal: Principal, role: Role, agent_id: str,
           user_id: str | None = None) -> Reach:
    """Authorize the role on the agent (for ``user_id``, when the route names one); the caller's reach."""
    if principal.users is None:
        authorize(principal, role, agent_id, user_id)
    else:
        authorize(principal, role, agent_id, user_id if user_id is not None else min(principal.users))
    return service.reach(principal, agent_id)


@router.get("/v1/agents/{agent_id}/entities", response_model=EntityPage)
async def list_entities(
    agent_id: AgentId,
    service: ServiceDep,
    principal: CallerDep,
    namespace: NamespaceText | None = Query(None, min_length=1, max_length=MAX_NAMESPACE_CHARS,
                                            description="only this namespace's entities ('user:<agent>:<user>', "
                                                        "'shard:<agent>:<shard>', 'agent:<agent>')"),
    user_id: UserId | None = Query(None, description="only this user's entities (their namespace)"),
    type: EntityType | None = Query(None, description="only entities of this type"),  # noqa: A002 - the API's name
    name: str | None = Query(None, min_length=1, max_length=200,
                             description="only entities whose (normalised) name starts with this"),
    cursor: str | None = Query(None, min_length=1, max_length=MAX_CURSOR_CHARS,
                               description="the `next` of the previous page (same filters)"),
    limit: int = Query(50, ge=1, le=MAX_ENTITY_PAGE),
) -> EntityPage:
    """An agent's entities, ordered by name, one page at a time (pass `next` as `cursor`).
    Needs `read`; a key limited to some users lists what its users may see."""
    reach = _reach(service, principal, Role.READ, agent_id, user_id)
    return await service.list_entities(agent_id, namespace=namespace, user_id=user_id, entity_type=type,
                                       name_prefix=name, cursor=cursor, limit=limit, reach=reach)


@router.get("/v1/agents/{agent_id}/entities/{entity_id}", response_model=EntityDetailOut)
async def get_entity(
    agent_id: AgentId,
    service: ServiceDep,
    principal: CallerDep,
    entity_id: str = EntityId,
    as_of: datetime | None = Query(None, description="the facts true at this time (ISO 8601)"),
    include_superseded: bool = Query(False, description="every fact, the invalidated ones too (history)"),
    cursor: str | None = Query(None, min_length=1, max_length=MAX_CURSOR_CHARS,
                               description="the `next` of the previous page of facts (same `as_of`, `include_superseded`)"),
    limit: int = Query(DEFAULT_FACT_PAGE, ge=1, le=MAX_FACT_PAGE, description="facts per page"),
) -> EntityDetailOut:
    """One entity, one page of its current facts (or those true `as_of`, or all with
    `include_superseded`), oldest first, the entities that page's facts link it to, and
    `facts_total`/`neighbours_total`; pass `next` as `cursor` for the next page. Every fact
    carries its text, `valid_at`, `invalid_at` and `superseded_by`. Needs `read`."""
    reach = _reach(service, principal, Role.READ, agent_id)
    return await service.get_entity(agent_id, entity_id, as_of=as_of, include_superseded=include_superseded,
                                    reach=reach, cursor=cursor, limit=limit)


@router.post("/v1/agents/{agent_id}/facts/{fact_id}/restore", response_model=FactOut)
async def restore_fact(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                       fact_id: str = FactId) -> FactOut:
    """Undo an invalidation: the fact is current again; the fact that replaced it stays as it
    is. 409 if the fact is current. Needs `write`; a key limited to some users restores facts
    of its users' namespaces only. Audited as `fact.restore`."""
    reach = _reach(service, principal, Role.WRITE, agent_id)
    return await service.restore_fact(agent_id, fact_id, reach=reach, actor=principal.key_id)


@router.post("/v1/agents/{agent_id}/entities/{entity_id}/split", response_model=EntitySplitOut)
async def split_entity(agent_id: AgentId, body: EntitySplitIn, service: ServiceDep, principal: CallerDep,
                       entity_id: str = EntityId) -> EntitySplitOut:
    """Undo a merge: the alias becomes an entity of its own again (same type and namespace),
    and the facts and mentions that came through that name move to it. 404 for an unknown
    entity, 422 for a name that is not one of its aliases, 409 for its own name. Needs
    `write`; a key limited to some users splits entities of its users' namespaces only.
    Audited as `entity.split`."""
    reach = _reach(service, principal, Role.WRITE, agent_id)
    return await service.split_entity(agent_id, entity_id, body.alias, reach=reach, actor=principal.key_id)
