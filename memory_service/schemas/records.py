"""The answers to recording messages: one (POST /v1/sessions/{id}/messages) or a batch
(POST /v1/agents/{agent_id}/messages/batch)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from memory_service.schemas.formation import GateStatus

REDACTED_DESCRIPTION = ("what the agent's redaction policy took out of the content before it was stored, by kind "
                        "(e.g. {\"api_key\": 1}): each value is [redacted:<kind>] in the stored text; empty when "
                        "nothing was (docs/redaction.md)")


class RecordOut(BaseModel):
    session_id: str
    message_id: str
    sequence: int
    duplicate: bool
    gate: GateStatus
    formation_job: str | None = Field(default=None, description="id of the job forming the session's window, when a gate opened")
    redacted: dict[str, int] = Field(default_factory=dict, description=REDACTED_DESCRIPTION)


# What became of one item of a batch: recorded (stored and pending, as a 200 of the single
# route), duplicate (recorded before with the same content: nothing changed), refused (the
# item's own fault, as the single route's 4xx: do not send it again unchanged) or failed
# (an outage, as its 503: send it again with the same message_id).
ItemStatus = Literal["recorded", "duplicate", "refused", "failed"]


class BatchItemOut(BaseModel):
    index: int = Field(description="the item's position in the batch, from 0")
    status: ItemStatus
    session_id: str | None = Field(default=None, description="as sent (None when the item could not be read)")
    message_id: str | None = None
    sequence: int | None = Field(default=None, description="the message's sequence number in its session (recorded, duplicate)")
    code: int | None = Field(default=None, description="refused or failed: the status the single-message route would answer")
    detail: str | None = Field(default=None, description="refused or failed: why")
    redacted: dict[str, int] = Field(default_factory=dict, description="recorded or duplicate: " + REDACTED_DESCRIPTION)


class BatchSessionOut(BaseModel):
    """A session the batch recorded in: its formation gate after the batch's last message of it."""

    session_id: str
    gate: GateStatus
    formation_job: str | None = Field(default=None, description="id of the job forming the session's window, when a gate opened")


class BatchOut(BaseModel):
    recorded: int
    duplicate: int
    refused: int
    failed: int
    items: list[BatchItemOut] = Field(description="one per message sent, in the batch's order")
    sessions: list[BatchSessionOut] = Field(description="the sessions whose messages were committed, in first-seen order")
