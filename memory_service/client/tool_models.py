"""The memory tools' answers, as the issue-10 contract fixes them.

Stand-ins: the tools' routes and their models are built on another branch at the same
time. At the merge these become imports of the service's own models (the client imports
the service's models everywhere else); tests/test_client_tools.py compares their fields
with the server's OpenAPI schema once the routes are there.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from ..models import MemoryKind, Provenance


class MemoryRecord(BaseModel):
    id: str
    kind: MemoryKind
    namespace: str
    content: str
    title: str | None = None
    tags: list[str] = Field(default_factory=list)
    confidence: float | None = None
    valid_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deleted_at: datetime | None = None
    purge_at: datetime | None = None
    provenance: Provenance | None = None
    access_count: int = 0
    last_accessed_at: datetime | None = None
    served_by: str | None = None


class DeletedMemory(BaseModel):
    """The answer to a (soft) delete: a second delete answers the same dates."""

    id: str
    deleted_at: datetime
    purge_at: datetime | None = None
