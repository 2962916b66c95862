"""The memory block of one model call (memory_service/recall/assembler.py), within its budget."""

from __future__ import annotations

from datetime import datetime

from fastapi import Query

from memory_service.access.authorization import authorize
from memory_service.domain.limits import CONTEXT_BUDGET_CEILING
from memory_service.domain.models import AgentId, SessionId, UserId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.schemas.context import ContextOut
from memory_service.schemas.keys import Role

router = strict_router(tags=["context"])



@router.get("/v1/context", response_model=ContextOut)
async def get_context(
    service: ServiceDep,
    principal: CallerDep,
    agent_id: AgentId = Query(...),
    user_id: UserId = Query(...),
    session_id: SessionId = Query(...),
    model: str | None = Query(None, max_length=200, description="target model name; selects the budget"),
    query: str | None = Query(None, description="what the model is asked now; default: the session's latest "
                                               "user message. Adds <RelevantMemories>"),
    budget: int | None = Query(None, le=CONTEXT_BUDGET_CEILING, description="character budget; overrides the model's"),
    as_of: datetime | None = Query(None, description="<KnownFacts> shows the facts true at this time (UTC unless it "
                                                     "says), not the current ones"),
) -> ContextOut:
    """The memory block for one model call, within its character budget, with the memories
    most relevant to the query (or to the session's latest user message). Needs `read` on
    the agent (and, for a key limited to users, the user). A session of another agent, and
    for a key limited to users a session none of them took part in, gets the block of an
    unknown session; such a key's block shows only its users' memory."""
    authorize(principal, Role.READ, agent_id, user_id)
    rendered = await service.assemble_memory_context(agent_id, user_id, session_id, model, query=query,
                                                     budget=budget, reach=service.reach(principal, agent_id),
                                                     as_of=as_of)
    return ContextOut(xml=rendered.xml, chars=rendered.chars, budget=rendered.budget,
                      sections=rendered.sections, dropped=rendered.dropped, source=rendered.source)
