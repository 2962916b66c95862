"""The answers of forgetting a memory and of re-forming windows (docs/forget.md, docs/reform.md).
Ids and counts only: a report never quotes what was forgotten."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from memory_service.domain.models import SessionId, UserId


class ForgetMode(StrEnum):
    SOFT = "soft"  # out of every read at once, kept until the purge: undone by undelete
    HARD = "hard"  # gone for good from every store, index, cache and log the service keeps, as an erasure is


class ForgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: ForgetMode = Field(default=ForgetMode.SOFT, description="soft: undoable (POST .../undelete) until the "
                             "purge; hard: gone for good, as an erasure is (needs `admin`)")


class ReformedWindow(BaseModel):
    session_id: str
    window: int
    messages: int = Field(description="messages the window was formed from this time")
    removed: list[str] = Field(description="ids of the memories its earlier extraction made, taken out")
    removed_kinds: dict[str, int] = Field(default_factory=dict, description="those, by kind")
    formed: list[str] = Field(description="ids of the memories the new extraction made")
    facts: list[str] = Field(default_factory=list, description="facts that came from the removed memories alone: "
                             "deleted (hard) or closed (soft)")
    entities: int = Field(default=0, description="entities deleted: nothing links to them any more")
    llm_calls: int = 0


class ForgetReport(BaseModel):
    """What a forget took out: the memory, what was formed from it, and where it was shown."""

    id: str = Field(description="the memory forgotten")
    agent_id: str
    mode: ForgetMode
    undoable: bool = Field(description="soft: POST .../undelete brings everything back")
    forgotten_at: datetime
    memories: dict[str, int] = Field(description="memories taken out, by kind (the memory, what was formed from it, "
                                     "consolidated versions that merged any of them)")
    memory_ids: list[str] = Field(description="their ids")
    reformed: list[ReformedWindow] = Field(default_factory=list, description="windows formed again without a "
                                           "forgotten message")
    facts: list[str] = Field(default_factory=list, description="knowledge-graph facts that came from them alone: "
                             "deleted (hard) or closed (soft)")
    entities: int = Field(default=0, description="entities deleted because nothing links to them any more (hard)")
    requeued: int = Field(default=0, description="other items of a removed consolidated version, queued to be merged "
                          "again (hard)")
    cached_blocks: int = Field(default=0, description="cached and last good memory blocks deleted")
    ledger_entries: int = Field(default=0, description="entries of the session ledger taken out (hard)")
    query_log_entries: int = Field(default=0, description="entries of the graph store's query log deleted (hard)")
    persistence: dict[str, str] = Field(default_factory=dict, description="append-only file rewrites asked of each "
                                        "server (hard), as in an erasure's report")


class ReformIn(BaseModel):
    """Which formed windows to form again with the extractor configured now."""

    model_config = ConfigDict(extra="forbid")

    user_id: UserId | None = Field(default=None, description="only the sessions this user took part in")
    session_id: SessionId | None = Field(default=None, description="only this session")
    since: AwareDatetime | None = Field(default=None, description="only windows formed at or after this time (ISO 8601 "
                                   "with a time zone)")
    dry_run: bool = Field(default=False, description="count the windows and the extractor calls, change nothing")
    run_id: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$",
                               description="a run's name: the same name again resumes it, skipping the windows it "
                                           "re-formed (default: a new run)")
    limit: int | None = Field(default=None, ge=1, le=100_000, description="at most this many windows in this call "
                              "(the rest: call again with the same run_id)")


class ReformReport(BaseModel):
    agent_id: str
    run_id: str
    dry_run: bool
    extractor: str = Field(description="the extractor configured now, which forms the windows")
    sessions: int = Field(description="sessions looked at")
    windows: int = Field(description="windows chosen (formed, matching the filters)")
    skipped: int = Field(description="windows this run re-formed before (resumed) or left for the next call (limit)")
    reformed: int = Field(description="windows re-formed by this call (0 on a dry run)")
    llm_calls: int = Field(description="extractor calls made (a dry run: the calls it would take, one per window "
                           "for an LLM extractor, 0 offline)")
    memories_removed: int = 0
    memories_formed: int = 0
    done: bool = Field(description="every chosen window is re-formed by this run")
