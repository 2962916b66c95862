"""Change events and webhooks on the wire (docs/events.md). Emitting and reading events is
memory_service/events/log.py; webhooks and their delivery, memory_service/events/webhooks.py
and memory_service/events/delivery.py.

An event names what changed (memory ids, kind, namespace, the user of a user namespace) and
what caused it (a formed window, an API key, the retention job), never a memory's content:
a host fetches the memory with its own key, so the key's reach and the memory's current
state (updated since, deleted, erased) decide what it reads. A content copied into a stream
or a webhook's dead letters would outlive an erasure and reach whoever reads the stream.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

WEBHOOK_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
EVENT_ID_PATTERN = r"^\d{1,20}-\d{1,20}$"
MAX_URL_CHARS = 2048
MIN_SECRET_CHARS, MAX_SECRET_CHARS = 16, 256


class EventType(StrEnum):
    FORMED = "formed"  # a window's memories written by formation (cause: session_id, window)
    WRITTEN = "written"  # a memory tool or write block stored memories (cause: key_id)
    UPDATED = "updated"  # a memory tool changed a memory
    DELETED = "deleted"  # soft-deleted (undelete brings it back until the purge)
    UNDELETED = "undeleted"
    PURGED = "purged"  # removed for good by the retention job (reason: deleted or stale)
    SUPERSEDED = "superseded"  # knowledge-graph facts closed by newer ones (memory_ids: the facts' ids)
    ERASED = "erased"  # a user erased (no user id kept: only callers for every user see it)
    # Memories purged by the retention run past their expires_at (invisible from then on already;
    # reason: expired; docs/expiry.md).
    EXPIRED = "expired"
    # A memory found wrong and replaced (docs/corrections.md): memory_ids = [the memory corrected,
    # its correction]; and the knowledge-graph facts it closed as wrong (kind 'graph_fact').
    CORRECTED = "corrected"
    UNCORRECTED = "uncorrected"  # a correction undone: memory_ids = [the memory, live again; the correction, deleted]
    # Declared for the features that emit them, not built yet: emitted when that feature lands.
    FORGOTTEN = "forgotten"


class Event(BaseModel):
    """One change of an agent's memory. ``id`` orders the agent's events and is the same at
    every delivery of the event: a host de-duplicates on it."""

    id: str = Field(description="the event's id, increasing per agent (its stream entry id)")
    agent_id: str
    type: EventType
    at: datetime
    memory_ids: list[str] = Field(default_factory=list, description="the memories (for superseded: the facts)")
    kind: str | None = Field(default=None, description="their kind (for superseded: 'graph_fact')")
    namespace: str | None = None
    user_id: str | None = Field(default=None, description="the user of a user namespace")
    session_id: str | None = Field(default=None, description="the cause: the session of a formed window")
    window: int | None = Field(default=None, description="the cause: the window's number in its session")
    key_id: str | None = Field(default=None, description="the cause: the API key that made the change")
    reason: str | None = Field(default=None, description="the cause, for purged: 'deleted' or 'stale'")


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=MAX_URL_CHARS, description="an http(s) URL the events are POSTed to")
    secret: str = Field(min_length=MIN_SECRET_CHARS, max_length=MAX_SECRET_CHARS,
                        description="the HMAC-SHA256 key of the signature header; never answered back")

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str) -> str:
        if not value.isprintable() or value != value.strip():
            raise ValueError("secret: printable characters without leading or trailing space")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://", value, re.IGNORECASE):
            raise ValueError("url: an http:// or https:// URL")
        return value


class WebhookOut(BaseModel):
    id: str
    agent_id: str
    url: str
    created_at: datetime
    cursor: str | None = Field(default=None, description="the last event delivered (or dead-lettered)")
    attempts: int = Field(default=0, description="failed deliveries of the event after the cursor")
    next_attempt_at: datetime | None = None
    last_error: str | None = None
    dead_letters: int = 0


class DeadLetter(BaseModel):
    event: Event
    attempts: int
    error: str
    dead_at: datetime
    replaying: bool = Field(default=False, description="replay asked: the worker delivers it again")


class DeadLetterPage(BaseModel):
    dead_letters: list[DeadLetter]
