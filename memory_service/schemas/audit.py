"""A page of the audit log (GET /v1/audit); the log itself is memory_service/access/audit.py."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class AuditEntry(BaseModel):
    id: str = Field(description="the entry's stream id: its time in ms and a sequence number")
    at: datetime
    key_id: str = Field(description="who: the id of the API key (or 'local', 'operator', 'cli')")
    action: str = Field(description="what, e.g. agent.put, shard.put, key.create, key.revoke, user.erase, agent.migrate")
    agent_id: str | None = None
    target: str | None = Field(None, description="what the change applies to, e.g. a shard, key or user id")
    before: Any = None
    after: Any = None


class AuditPage(BaseModel):
    entries: list[AuditEntry]
    next: str | None = Field(None, description="pass as `before` to read older entries; None: no more")
    scanned: int = Field(description="entries looked at to answer (at most AUDIT_SCAN_LIMIT)")
