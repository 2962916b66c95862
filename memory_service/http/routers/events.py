"""Change events of an agent's memory (docs/events.md): a server-sent event stream, and
webhooks the worker delivers them to, with their dead letters.

The stream needs `read` on the agent; a key limited to some users is sent only the events
of namespaces it may read (memory_service/events/log.py, ``Visibility``). Webhooks need
`admin` on the agent with a key for all its users: a webhook receives every event of the
agent, whoever's namespace it names. Their changes are audited (``webhook.put``,
``.delete``, ``.replay``, ``.drop``); a webhook's secret is never answered back.
"""

from __future__ import annotations

from fastapi import Header, Path, Query, Response
from fastapi.responses import JSONResponse, StreamingResponse

from memory_service.access.authorization import authorize
from memory_service.domain.errors import InvalidInput
from memory_service.domain.models import AgentId
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import strict_router
from memory_service.schemas.events import EVENT_ID_PATTERN, WEBHOOK_ID_PATTERN, DeadLetterPage, WebhookIn, WebhookOut
from memory_service.schemas.keys import Role

router = strict_router(tags=["events"])
HookId = Path(pattern=WEBHOOK_ID_PATTERN, description="the webhook's id (letters, digits, '-', '_'; at most 64)")
EventId = Path(pattern=EVENT_ID_PATTERN, max_length=41, description="an event's id")


@router.get("/v1/agents/{agent_id}/events", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}})
async def event_stream(
    agent_id: AgentId, service: ServiceDep, principal: CallerDep,
    after: str | None = Query(None, pattern=EVENT_ID_PATTERN, max_length=41,
                              description="resume after this event id (as the Last-Event-ID header); omitted: "
                                          "from now on; 0-0: every event the stream still holds"),
    timeout: float | None = Query(None, gt=0, le=3600, description="end the stream after this many seconds "
                                                                   "(at most EVENTS_SSE_MAX_SECONDS)"),
    last_event_id: str | None = Header(None, max_length=41, description="the last event id the client received"),
) -> StreamingResponse:
    """The agent's change events as they happen (text/event-stream), each `id`, `event` (its
    type) and `data` (the JSON event, without memory content); a heartbeat comment while idle.
    Needs `read`; a key limited to users gets the events of the namespaces it may read."""
    if principal.users is None:
        authorize(principal, Role.READ, agent_id)
        reach = None
    else:
        authorize(principal, Role.READ, agent_id, min(principal.users))
        reach = service.reach(principal, agent_id)
    resume = after or last_event_id
    if resume is not None and not _is_event_id(resume):
        raise InvalidInput("Last-Event-ID: not an event id (<milliseconds>-<sequence>)")
    start = resume or await service.latest_event_id(agent_id)
    stream = service.event_stream(agent_id, start, reach, timeout)
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _is_event_id(text: str) -> bool:
    ms, dash, seq = text.partition("-")
    return bool(dash) and ms.isdigit() and seq.isdigit() and len(ms) <= 20 and len(seq) <= 20 \
        and int(ms) < 2**64 and int(seq) < 2**64


@router.get("/v1/agents/{agent_id}/webhooks", response_model=list[WebhookOut])
async def list_webhooks(agent_id: AgentId, service: ServiceDep, principal: CallerDep) -> list[WebhookOut]:
    """The agent's webhooks with their delivery state (never their secrets). Needs `admin`."""
    authorize(principal, Role.ADMIN, agent_id)
    return await service.list_webhooks(agent_id)


@router.put("/v1/agents/{agent_id}/webhooks/{webhook_id}", response_model=WebhookOut,
            responses={201: {"model": WebhookOut, "description": "created"}})
async def put_webhook(agent_id: AgentId, body: WebhookIn, service: ServiceDep, principal: CallerDep,
                      webhook_id: str = HookId) -> JSONResponse:
    """Create (201) or replace (200) a webhook: `url` (http or https; no loopback or private
    address unless WEBHOOK_ALLOW_PRIVATE) and `secret` (signs each delivery; never answered).
    A new webhook gets the events from now on. Needs `admin` with a key for all users."""
    authorize(principal, Role.ADMIN, agent_id)
    hook, created = await service.put_webhook(agent_id, webhook_id, body, actor=principal.key_id)
    return JSONResponse(hook.model_dump(mode="json"), status_code=201 if created else 200)


@router.get("/v1/agents/{agent_id}/webhooks/{webhook_id}", response_model=WebhookOut)
async def get_webhook(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                      webhook_id: str = HookId) -> WebhookOut:
    """One webhook: its URL, cursor, failed attempts, next attempt, last error and dead letters."""
    authorize(principal, Role.ADMIN, agent_id)
    return await service.webhook(agent_id, webhook_id)


@router.delete("/v1/agents/{agent_id}/webhooks/{webhook_id}", status_code=204)
async def delete_webhook(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                         webhook_id: str = HookId) -> Response:
    """Delete the webhook with its delivery state and dead letters; 404 if there is none."""
    authorize(principal, Role.ADMIN, agent_id)
    await service.delete_webhook(agent_id, webhook_id, actor=principal.key_id)
    return Response(status_code=204)


@router.get("/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters", response_model=DeadLetterPage)
async def webhook_dead_letters(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                               webhook_id: str = HookId) -> DeadLetterPage:
    """The events the worker gave up delivering (after WEBHOOK_MAX_ATTEMPTS), oldest first,
    each with its attempts and last error; `replaying` for those handed back."""
    authorize(principal, Role.ADMIN, agent_id)
    return await service.dead_letters(agent_id, webhook_id)


@router.post("/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}/replay", status_code=202)
async def replay_dead_letter(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                             webhook_id: str = HookId, event_id: str = EventId) -> Response:
    """Deliver the dead letter again: the worker sends it on its next run (once: a failure
    makes it a dead letter again). 404 for an unknown dead letter."""
    authorize(principal, Role.ADMIN, agent_id)
    await service.replay_dead_letter(agent_id, webhook_id, event_id, actor=principal.key_id)
    return Response(status_code=202)


@router.delete("/v1/agents/{agent_id}/webhooks/{webhook_id}/dead-letters/{event_id}", status_code=204)
async def drop_dead_letter(agent_id: AgentId, service: ServiceDep, principal: CallerDep,
                           webhook_id: str = HookId, event_id: str = EventId) -> Response:
    """Drop the dead letter for good; 404 for an unknown one."""
    authorize(principal, Role.ADMIN, agent_id)
    await service.drop_dead_letter(agent_id, webhook_id, event_id, actor=principal.key_id)
    return Response(status_code=204)
