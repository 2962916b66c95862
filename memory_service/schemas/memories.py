"""The memory tools' answers (docs/memory-tools.md): a memory as an agent reads it, and the
answer of a soft delete. The tools themselves are memory_service/curation/tools.py."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from memory_service.domain.models import MemoryKind, Provenance
from memory_service.schemas.graph import EntityOut, FactOut


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
    expires_at: datetime | None = Field(None, description="when it expires: from then on search, the memory block "
                                                          "and browse skip it (memory_get still answers it), and "
                                                          "the next retention run purges it (None: never)")
    corrected_at: datetime | None = Field(None, description="set when it was found wrong and corrected (not "
                                          "outdated: an update says that): kept as history, read by id only "
                                          "(docs/corrections.md)")
    corrected_by: str | None = Field(None, description="the memory that corrected it")
    corrects: str | None = Field(None, description="the memory this one corrects (found wrong)")
    provenance: Provenance
    access_count: int = Field(0, description="memory_get calls (bookkeeping, never used for ranking)")
    last_accessed_at: datetime | None = None
    served_by: str | None = None
    redacted: dict[str, int] | None = Field(
        default=None, description="in the answer of a write or an update: what the agent's redaction policy took out of its "
                          "content, title and tags, by kind (each value is [redacted:<kind>] in the stored text); "
                          "None when nothing was (docs/redaction.md)")


class DeletedOut(BaseModel):
    id: str
    deleted_at: datetime
    purge_at: datetime | None = Field(description="when the retention job purges it (None: PURGE_AFTER_DAYS is 0)")


class WriteBlocksOut(BaseModel):
    """What POST /v1/agents/{agent_id}/writes/parse stored (memory_service/curation/write_blocks.py)."""

    blocks: int = Field(description="write blocks found")
    written: list[MemoryRecord] = Field(description="the memories stored: the blocks' observations, in order")
    entities: list[EntityOut] = Field(default_factory=list, description="the knowledge-graph entities the blocks "
                                      "name (entities, edges' ends, observations' `name`), as stored now")
    facts: list[FactOut] = Field(default_factory=list, description="the facts the blocks' edges state, as stored now")
    superseded: list[str] = Field(default_factory=list, description="ids of the facts this call closed: a "
                                  "single-valued relation (lives_in, works_at...) replaced by the blocks' edge")
    already_stored: list[str] = Field(default_factory=list,
                                      description="ids in `written`, `entities` and `facts` that were stored before "
                                                  "this call (the same text parsed again for the same message: all)")
    redacted: dict[str, int] = Field(default_factory=dict, description="what the agent's redaction policy took out "
                                     "of the text before it was parsed, by kind (docs/redaction.md)")


class CorrectionOut(BaseModel):
    """What POST /v1/agents/{agent_id}/memories/{memory_id}/correct changed (docs/corrections.md)."""

    corrected: MemoryRecord = Field(description="the memory found wrong, as kept now: `corrected_at`, `corrected_by`")
    correction: MemoryRecord = Field(description="the memory that replaces it (`corrects` names the old one)")
    facts_closed: list[str] = Field(default_factory=list, description="ids of the knowledge-graph facts formed from "
                                    "the old memory, closed as wrong (their `corrected_by` is the correction)")
    redacted: dict[str, int] | None = Field(default=None, description="what the agent's redaction policy took out of "
                                            "the correction's content, title and tags, by kind (docs/redaction.md)")


class UncorrectedOut(BaseModel):
    """What POST /v1/agents/{agent_id}/memories/{memory_id}/uncorrect changed (docs/corrections.md)."""

    memory: MemoryRecord = Field(description="the memory that was corrected, live again")
    correction: MemoryRecord | None = Field(description="the correction, soft-deleted (None: purged or erased since)")
    facts_restored: list[str] = Field(default_factory=list, description="ids of the facts the correction had closed, "
                                      "current again")
