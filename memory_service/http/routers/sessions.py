"""Sessions: recording messages (one, or a batch of many sessions' messages), forming a
session's pending window, a session's state, and an agent's sessions (the browse API,
memory_service/curation/browse.py).

Recording needs `write` on the message's agent (and, for a key limited to users, its
user) and is charged against the key's token budget; the routes named by a session id
alone are authorized by the agent that owns the session (``authorize_session``).

A batch's body is read item by item: an item that is not a message the service can hold
(U+0000, a lone surrogate, a missing field, content over the limit...) is refused alone,
where the single route's guard refuses the whole body; its size is bounded by
MAX_BATCH_BYTES (memory_service/http/guard.py) and its length by MAX_BATCH_MESSAGES.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi import Query, Request, Response
from pydantic import ValidationError

from memory_service.access.authorization import authorize, authorize_users
from memory_service.access.cursors import MAX_CURSOR_CHARS
from memory_service.domain.errors import InvalidInput, PayloadTooLarge, preview
from memory_service.domain.limits import json_problem
from memory_service.domain.models import (
    AgentId,
    BatchMessageIn,
    MessageBatchIn,
    MessageIn,
    RefusedItem,
    SessionId,
    UserId,
)
from memory_service.domain.namespaces import validate_id
from memory_service.http.deps import CallerDep, ServiceDep
from memory_service.http.guard import UnusableJSON, check_charset, parse_json_values, strict_router
from memory_service.ingest import pacing
from memory_service.ingest.batch import BatchProgress
from memory_service.schemas.browse import MAX_BROWSE_PAGE, SessionPage
from memory_service.schemas.formation import FormationSummary
from memory_service.schemas.keys import Role
from memory_service.schemas.records import BatchOut, RecordOut

router = strict_router(tags=["sessions"])

# A batch body larger than this is parsed in a thread: 8 MB is about a second of CPU, which
# on the event loop would stall every other agent's requests; in a thread they run between
# its turns at the GIL. Its items are then checked on the loop, in paced steps.
PARSE_IN_THREAD_BYTES = 262_144

# The batch route's path, for its larger body limit (MAX_BATCH_BYTES).
BATCH_PATH = re.compile(r"/v1/agents/[^/]+/messages/batch")


@router.post("/v1/sessions/{session_id}/messages", response_model=RecordOut)
async def record_message(session_id: SessionId, body: MessageIn, service: ServiceDep,
                         principal: CallerDep) -> RecordOut:
    """Record one message. Idempotent by `message_id`; answers with the formation gate's status.

    Needs `write` on the message's agent (and, for a key limited to users, its user). A
    key limited to users records into a session other users started only if the agent's
    `users_join_sessions` is on; else it is answered as a session of another agent (409)."""
    authorize(principal, Role.WRITE, body.agent_id, body.user_id)
    await service.charge_tokens(principal, body.content, body.agent_id)
    result = await service.record_message(session_id, body, service.reach(principal, body.agent_id))
    return RecordOut(
        session_id=result.session_id, message_id=result.message_id, sequence=result.sequence,
        duplicate=result.duplicate, gate=result.gate, formation_job=result.formation_job, redacted=result.redacted,
    )


@router.post("/v1/sessions/{session_id}/form", response_model=FormationSummary)
async def form_memories(
    session_id: SessionId,
    service: ServiceDep,
    principal: CallerDep,
    wait: bool = Query(True, description="answer once the window is stored (else as soon as it is queued)"),
) -> FormationSummary:
    """Enqueue the session's pending window for formation now, whatever the gates say.

    With `wait` (the default) the answer comes once the worker stored the window; a
    formation that fails or takes longer than FORM_WAIT_SECONDS answers 503, and the
    window stays pending. Needs `write` on the session's agent.
    """
    await service.authorize_session(principal, session_id, Role.WRITE)
    return await service.form_memories(session_id, wait=wait)


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: SessionId, service: ServiceDep, principal: CallerDep) -> dict[str, Any]:
    """The session's gate state, formation cursor and the job of its pending window.
    Needs `read` on the session's agent."""
    await service.authorize_session(principal, session_id, Role.READ)
    return await service.session_status(session_id)


@router.get("/v1/agents/{agent_id}/sessions", response_model=SessionPage)
async def list_sessions(
    agent_id: AgentId,
    service: ServiceDep,
    principal: CallerDep,
    user_id: UserId | None = Query(None, description="only the sessions this user took part in"),
    cursor: str | None = Query(None, min_length=1, max_length=MAX_CURSOR_CHARS, description="the `next` of the previous page"),
    limit: int = Query(50, ge=1, le=MAX_BROWSE_PAGE),
) -> SessionPage:
    """The agent's sessions, newest first, each with its formation gate, cursor, pending
    window and last activity; one page at a time (pass `next` as `cursor`). Needs `read`; a
    key limited to some users lists the sessions they took part in."""
    authorize(principal, Role.READ, agent_id,
              user_id if user_id is not None else min(principal.users) if principal.users else None)
    return await service.list_sessions(agent_id, service.reach(principal, agent_id), user_id, cursor, limit)


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its ``$defs`` written in place (the route's body is
    described by hand, so FastAPI does not add the models to the OpenAPI components)."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {key: resolve(value) for key, value in node.items()}
        return [resolve(value) for value in node] if isinstance(node, list) else node

    inlined: dict[str, Any] = resolve(schema)
    return inlined


@router.post("/v1/agents/{agent_id}/messages/batch", response_model=BatchOut,
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": _inlined(MessageBatchIn.model_json_schema())}}}})
async def record_batch(agent_id: AgentId, request: Request, service: ServiceDep, principal: CallerDep) -> Response:
    """Record many messages of the agent's sessions in one request: each item as the
    single-message route records it (idempotent by its required `message_id`, in order per
    session, the same gates and formation), each answered on its own: `recorded`,
    `duplicate`, `refused` (with the status the single route would answer, and why) or
    `failed` (an outage: send it again). One bad item does not fail the others.

    Needs `write` on the agent; a key limited to users records only its users' messages
    (the others are refused, 403; a batch of none of them answers 403). At most
    MAX_BATCH_MESSAGES items (else 413) in at most MAX_BATCH_BYTES (else 413). A 503 cut
    short after the batch's first write carries the same fields: what was recorded, and
    each other item `failed` (send those again with the same `message_id`)."""
    check_charset(request.headers.get("content-type"))
    body = await request.body()
    items = await _read_body(body, service.settings.max_batch_messages, service.settings.batch_step_messages,
                             service.settings.batch_step_chars)
    users = [item.user_id if isinstance(item, BatchMessageIn) else None for item in items]
    for index, refused in enumerate(authorize_users(principal, Role.WRITE, agent_id, users)):
        item = items[index]
        if refused is not None and isinstance(item, BatchMessageIn):
            items[index] = RefusedItem(refused, item.session_id, item.message_id)
    progress = BatchProgress()
    request.state.partial_answer = progress.so_far  # a 503 cut short says what was recorded (overload.PARTIAL_ANSWER)
    answer = await service.record_batch(agent_id, items, principal, progress)
    # The answer as FastAPI would send it (response_model BatchOut, the same bytes), built in
    # one dump, as a step of the batch: its validation and encoding again by FastAPI took 3x
    # the CPU, on the loop, outside the batch's paced steps.
    async with pacing.step():
        return Response(answer.model_dump_json(by_alias=True), media_type="application/json")


async def _read_body(body: bytes, limit: int, step_messages: int, step_chars: int) -> list[BatchMessageIn | RefusedItem]:
    """The body's items, each a message or refused; checked in steps that give way to other
    agents' requests (memory_service/ingest/pacing.py)."""
    if len(body) > PARSE_IN_THREAD_BYTES:  # the event loop's other requests run between the GIL's turns
        value = await asyncio.to_thread(parse_json_values, body)
    else:
        async with pacing.step():
            value = parse_json_values(body)
    raw = _batch_items(value, limit)
    items: list[BatchMessageIn | RefusedItem] = []
    for part in pacing.steps(range(len(raw)), step_messages, step_chars, lambda index: _content_chars(raw[index])):
        async with pacing.step():
            items += [_read_item(index, raw[index]) for index in range(part.start, part.stop)]
    return items


def _content_chars(item: Any) -> int:
    content = item.get("content") if isinstance(item, dict) else None
    return len(content) if isinstance(content, str) else 0


def _batch_items(body: Any, limit: int) -> list[Any]:
    """The body's list of items, the envelope checked (a body that is not one is refused whole)."""
    if not isinstance(body, dict) or set(body) != {"messages"} or not isinstance(body["messages"], list):
        raise UnusableJSON(("body",), 'the body must be an object with one key, "messages": a list of messages')
    items: list[Any] = body["messages"]
    if not items:
        raise UnusableJSON(("body", "messages"), "the batch holds no message")
    if len(items) > limit:
        raise PayloadTooLarge(f"the batch holds {len(items)} messages, more than {limit} (MAX_BATCH_MESSAGES): "
                              "send it in smaller batches")
    return items


def _read_item(index: int, item: Any) -> BatchMessageIn | RefusedItem:
    """One item as a message, or refused (422) saying why, with the ids it names if readable."""
    named = item if isinstance(item, dict) else {}
    ids = [_echoed(named.get("session_id"), colon_allowed=False), _echoed(named.get("message_id"), colon_allowed=True)]
    where = ("body", "messages", index)
    problem = json_problem(item, where)
    if problem is not None:
        return RefusedItem(InvalidInput(f"{_at(problem[0])}: {problem[1]}"), *ids)
    try:
        return BatchMessageIn.model_validate(item)
    except ValidationError as exc:
        reasons = "; ".join(f"{_at((*where, *e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        return RefusedItem(InvalidInput(reasons), *ids)


def _echoed(value: Any, colon_allowed: bool) -> str | None:
    """An id a refused item named, to echo in its answer: only a valid id (at most
    MAX_ID_LENGTH characters, the id the service would store and list); anything else is
    not echoed (the item's ``index`` says which it was), so an answer never quotes a large
    or hostile value whole."""
    if not isinstance(value, str) or json_problem(value, ()):
        return None
    try:
        validate_id(value, "id", colon_allowed=colon_allowed)
    except InvalidInput:
        return None
    return value


def _at(loc: tuple[str | int, ...]) -> str:
    """Where in the body, as the guard's 422 answers say it: messages.3.content."""
    shown = [part if isinstance(part, int) or (len(part) <= 40 and part.isprintable()) else preview(part, 40)
             for part in loc if part != "body"]
    return ".".join(str(part) for part in shown)
