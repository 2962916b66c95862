"""The memory tools' answers (docs/memory-tools.md): a memory as an agent reads it, and the
answer of a soft delete. The tools themselves are memory_service/curation/tools.py."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from memory_service.domain.models import MemoryKind, Provenance


class MemoryRecord(BaseModel):
    id: str
    kind: MemoryKind
    namespace: str
    content: str
    title: str | None = None
    tags: list[str] = Field(default_factory=list)
    confidence: float | None = None
    valid_at: datetime
    created_at: datetime = Field(description="when it was stored (formed memories: their window's time, = valid_at)")
    updated_at: datetime | None = None
    deleted_at: datetime | None = Field(None, description="set while soft-deleted: search and the memory block skip it")
    purge_at: datetime | None = Field(None, description="when the retention job purges it for good (None: never)")
    provenance: Provenance
    access_count: int = Field(0, description="memory_get calls (bookkeeping, never used for ranking)")
    last_accessed_at: datetime | None = None
    served_by: str | None = None


class DeletedOut(BaseModel):
    id: str
    deleted_at: datetime
    purge_at: datetime | None = Field(description="when the retention job purges it (None: PURGE_AFTER_DAYS is 0)")
