"""What an erasure of a user removed, and the export of what is held on a user
(DELETE /v1/agents/{id}/users/{uid}, GET .../export). The erasure itself, and what "held
on a user" means, are memory_service/curation/erasure.py and docs/erasure.md."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from memory_service.domain.models import MemoryKind
from memory_service.schemas.graph import EntityOut, FactOut


class SharedRemoval(BaseModel):
    id: str
    kind: MemoryKind
    namespace: str
    reason: str


class ErasureReport(BaseModel):
    """What one erasure removed. A second erasure of the same user reports zeros."""

    agent_id: str
    user_id: str
    memories: dict[str, int] = Field(default_factory=dict, description="memories removed, per kind")
    stores: dict[str, int] = Field(default_factory=dict, description="memories each store held and removed")
    sessions_touched: list[str] = Field(default_factory=list,
                                        description="sessions other users spoke in: the user's messages taken out")
    sessions_removed: list[str] = Field(default_factory=list, description="sessions of the user alone: removed whole")
    shared_removed: list[SharedRemoval] = Field(
        default_factory=list, description="memories formed from the user's and other users' contributions: removed "
                                          "whole, nothing formed again in their place")
    entities: int = Field(default=0, description="knowledge-graph entities of the user's namespace deleted, with their facts "
                          "and mentions")
    provenance_rewritten: int = Field(default=0, description="other users' memories whose provenance listed the user: "
                                                     "the user's id taken out, content kept")
    ledger_entries: int = Field(default=0, description="message ids taken out of session ledgers (Redis)")
    windows_dropped: int = Field(default=0, description="formation windows holding the user's messages, dropped")
    consolidation_items: int = Field(default=0, description="removed memories taken off consolidation queues")
    outbox_entries: int = Field(default=0, description="queued or dead-lettered store writes rewritten without the user's data")
    job_results: int = Field(default=0, description="kept job results and queued jobs naming the user, deleted")
    cached_blocks: int = Field(default=0, description="cached memory blocks of the agent deleted (any could show the user)")
    user_keys: int = Field(default=0, description="the user's own Redis keys deleted (indexes, consolidation, generation)")
    query_log_entries: int = Field(default=0, description="entries of the stores' own logs of recent queries trimmed "
                                                  "(FalkorDB's quote their parameters)")
    keys_revoked: list[str] = Field(default_factory=list, description="API keys limited to the user alone: revoked, "
                                                                      "the user's id in them replaced by its digest")
    keys_narrowed: list[str] = Field(default_factory=list, description="API keys for the user and others: the user "
                                                                       "taken out")
    audit_entries: int = Field(default=0, description="entries of the agent's audit log naming the user, all by its "
                                                      "keyed digest (never the id): kept, nothing to rewrite")
    persistence: dict[str, str] = Field(default_factory=dict, description="per Redis server (named by the stores on "
                                        "it): its append-only file rewritten without the erased data, or why not")
    logs: str = Field(default="the service's log lines name users only by keyed digest and hold no query or message "
                              "text; access-log lines show route templates", description="what the logs hold")
    notes: list[str] = Field(default_factory=list)

    @property
    def removed(self) -> int:
        return sum(self.memories.values())

    def counts(self) -> dict[str, Any]:
        """The report without ids (for the audit log, which must not keep what was erased)."""
        numbers = self.model_dump(mode="json", exclude={"agent_id", "user_id", "notes", "logs"})
        for listed in ("sessions_touched", "sessions_removed", "shared_removed", "keys_revoked", "keys_narrowed"):
            numbers[listed] = len(numbers[listed])
        return numbers


class ExportedMemory(BaseModel):
    id: str
    kind: MemoryKind
    namespace: str
    content: str
    valid_at: datetime
    session_id: str | None = None
    message_ids: list[str] = Field(default_factory=list, description="the user's own messages it came from")
    role: str | None = None


class SharedReference(BaseModel):
    """A memory formed from the user's and other users' messages: named, its content
    withheld (it holds other users' words); an erasure removes it."""

    id: str
    kind: MemoryKind
    namespace: str
    valid_at: datetime


class SessionMembership(BaseModel):
    session_id: str
    messages: int = Field(description="messages recorded under the user's id")
    other_speakers: int = Field(description="how many other users recorded messages in it")


class UserExport(BaseModel):
    agent_id: str
    user_id: str
    exported_at: datetime
    sessions: list[SessionMembership] = Field(default_factory=list)
    messages: list[ExportedMemory] = Field(default_factory=list)
    episodes: list[ExportedMemory] = Field(default_factory=list)
    directives: list[ExportedMemory] = Field(default_factory=list)
    consolidations: list[ExportedMemory] = Field(default_factory=list)
    shard_contributions: list[ExportedMemory] = Field(default_factory=list, description="facts and suggestions")
    other: list[ExportedMemory] = Field(default_factory=list)
    shared: list[SharedReference] = Field(default_factory=list)
    entities: list[EntityOut] = Field(default_factory=list, description="the knowledge graph's entities of the user's "
                                      "namespace (the erasure deletes them)")
    facts: list[FactOut] = Field(default_factory=list, description="their facts in the user's namespace, superseded "
                                 "ones too")
