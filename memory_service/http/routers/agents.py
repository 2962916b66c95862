"""Agents and their shards: settings (including the memory backend) and topics, and the
list of agents a key may see (the browse API, memory_service/curation/browse.py).

Changing them needs `admin` on the agent, reading them (and the agent's LLM usage) `read` for all its users; every
change is audited by the service (``agent.put``, ``shard.put``). Listing agents needs any
valid key, and lists the agents it reaches.
"""

from __future__ import annotations

from typing import Any

from fastapi import Query
from fastapi.responses import JSONResponse

from memory_service.access.authorization import authorize
from memory_service.access.cursors import MAX_CURSOR_CHARS
from memory_service.domain.models import Agent, AgentId, AgentSettings, Shard, ShardId, ShardIn
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.schemas.browse import MAX_BROWSE_PAGE, AgentPage
from memory_service.schemas.keys import Role
from memory_service.schemas.usage import AgentUsage

router = strict_router(tags=["agents"])


@router.get("/v1/agents", response_model=AgentPage)
async def list_agents(
    service: ServiceDep,
    principal: CallerDep,
    cursor: str | None = Query(None, min_length=1, max_length=MAX_CURSOR_CHARS, description="the `next` of the previous page"),
    limit: int = Query(50, ge=1, le=MAX_BROWSE_PAGE),
) -> AgentPage:
    """The agents this key reaches (every agent that recorded a message, got settings or had a
    memory written, for a key over every agent), by id, with their numbers of users and
    sessions; one page at a time (pass `next` as `cursor`). Any valid key."""
    return await service.list_agents(principal, cursor, limit)


@router.put("/v1/agents/{agent_id}", response_model=Agent)
async def put_agent(agent_id: AgentId, body: AgentSettings, service: ServiceDep, principal: CallerDep) -> Agent:
    """Create or replace an agent's settings, including its memory backend. Needs `admin`."""
    authorize(principal, Role.ADMIN, agent_id)
    return await service.put_agent(agent_id, body, actor=principal.key_id)


@router.get("/v1/agents/{agent_id}", response_model=Agent)
async def get_agent(agent_id: AgentId, service: ServiceDep, principal: CallerDep) -> Agent:
    """The agent's settings. Needs `read` on the agent, for all its users."""
    authorize(principal, Role.READ, agent_id)
    return await service.get_agent(agent_id)


@router.get("/v1/agents/{agent_id}/usage", response_model=AgentUsage)
async def agent_usage(agent_id: AgentId, service: ServiceDep, principal: CallerDep) -> AgentUsage:
    """The agent's LLM usage (tokens, calls, windows formed by the LLM or offline) today and this
    month, UTC, against its budgets (`llm_budget` in its settings) and the deployment's caps.
    Needs `read` on the agent, for all its users: usage is the agent's, not a user's."""
    authorize(principal, Role.READ, agent_id)
    return await service.agent_usage(agent_id)


@router.put("/v1/agents/{agent_id}/shards/{shard_id}", response_model=Shard)
async def put_shard(agent_id: AgentId, shard_id: ShardId, body: ShardIn, service: ServiceDep,
                    principal: CallerDep) -> Any:
    """Create or replace a shard: a topic the agent keeps facts and suggestions on. Needs `admin`."""
    authorize(principal, Role.ADMIN, agent_id)
    shard, created = await service.put_shard(agent_id, shard_id, body, actor=principal.key_id)
    return JSONResponse(status_code=201 if created else 200, content=shard.model_dump(mode="json"))


@router.get("/v1/agents/{agent_id}/shards", response_model=list[Shard])
async def list_shards(agent_id: AgentId, service: ServiceDep, principal: CallerDep) -> list[Shard]:
    """The agent's shards. Needs `read` on the agent, for all its users."""
    authorize(principal, Role.READ, agent_id)
    return await service.list_shards(agent_id)
