"""The memory block of one model call (memory_service/recall/assembler.py), within its budget."""

from __future__ import annotations

from datetime import datetime

from fastapi import Query

from memory_service.access.authorization import authorize
from memory_service.domain.limits import CONTEXT_BUDGET_CEILING, MAX_HOST_WINDOW
from memory_service.domain.models import AgentId, ContextType, Recall, RecallScope, SessionId, UserId
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
                                               "user message. Adds <RelevantMemories>, unless it is small talk "
                                               "(greetings, thanks, farewells, assent: nothing to search for)"),
    budget: int | None = Query(None, le=CONTEXT_BUDGET_CEILING, description="character budget; overrides the model's"),
    as_of: datetime | None = Query(None, description="<KnownFacts> shows the facts true at this time (UTC unless it "
                                                     "says), not the current ones"),
    context_type: ContextType = Query(ContextType.CHAT, description="what the query is (chat turn, task, document): "
                                                                    "the agent's settings for it apply"),
    min_score: float | None = Query(None, ge=0, le=1, allow_inf_nan=False,
                                    description="leave out memories whose fused score is below it"),
    min_similarity: float | None = Query(None, ge=-1, le=1, allow_inf_nan=False,
                                         description="leave out memories found by the vector signal alone below "
                                                     "this cosine similarity"),
    top_k: int | None = Query(None, ge=0, le=1000, description="most query-relevant memories to show"),
    scope: RecallScope | None = Query(None, description="where relevant memories are looked for: session, user, "
                                                        "shared (those, the shards and the agent's namespace)"),
    host_window: int | None = Query(None, ge=0, le=MAX_HOST_WINDOW,
                                    description="how many of the session's latest messages (any role) the host "
                                                "already sends to the model: left out of the relevant memories"),
) -> ContextOut:
    """The memory block for one model call, within its character budget, with the memories
    most relevant to the query (or to the session's latest user message; none for small talk,
    which has nothing to search for). Needs `read` on
    the agent (and, for a key limited to users, the user). A session of another agent, and
    for a key limited to users a session none of them took part in, gets the block of an
    unknown session; such a key's block shows only its users' memory.

    The relevant memories: at most `top_k`, from `scope`, none below `min_score` (or, found by
    the vector signal alone, below `min_similarity`), none of the session's latest `host_window`
    messages (the host sends those to the model itself); each unset one comes from the agent's
    settings for `context_type`, then the agent's, then the server's. The answer says how many
    were left out and why (`left_out`) and the settings used (`recall`)."""
    authorize(principal, Role.READ, agent_id, user_id)
    rendered = await service.assemble_memory_context(agent_id, user_id, session_id, model, query=query,
                                                     budget=budget, reach=service.reach(principal, agent_id),
                                                     as_of=as_of, context_type=context_type,
                                                     recall=Recall(min_score=min_score, min_similarity=min_similarity,
                                                                   top_k=top_k, scope=scope, host_window=host_window))
    return ContextOut(xml=rendered.xml, chars=rendered.chars, budget=rendered.budget,
                      sections=rendered.sections, dropped=rendered.dropped, source=rendered.source,
                      left_out=rendered.left_out, context_type=context_type,
                      recall=Recall(**rendered.recall) if rendered.recall else None)
