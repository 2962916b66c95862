"""The answer to recording a message (POST /v1/sessions/{id}/messages)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from memory_service.schemas.formation import GateStatus


class RecordOut(BaseModel):
    session_id: str
    message_id: str
    sequence: int
    duplicate: bool
    gate: GateStatus
    formation_job: str | None = Field(None, description="id of the job forming the session's window, when a gate opened")
