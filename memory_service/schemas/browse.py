"""The browse API's answers (memory_service/curation/browse.py): agents, an agent's users and
sessions, a page of memories and one memory with where it came from and what happened to it.

Every list is a page: its items and ``next``, an opaque cursor to pass back as ``cursor``
for the following page (None after the last). A page may hold fewer items than asked while
``next`` is set (the work of one page is bounded): keep following ``next``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from memory_service.schemas.audit import AuditEntry
from memory_service.schemas.formation import GateStatus
from memory_service.schemas.memories import MemoryRecord

MAX_BROWSE_PAGE = 200  # items per page, at most: every list's `limit`


class AgentSummary(BaseModel):
    agent_id: str
    configured: bool = Field(description="whether the agent has settings (PUT /v1/agents/{agent_id}); "
                                         "without, it runs on the defaults")
    users: int = Field(description="users the agent has recorded messages or memories of")
    sessions: int = Field(description="sessions recorded in")


class AgentPage(BaseModel):
    agents: list[AgentSummary]
    next: str | None = Field(None, description="pass as `cursor` for the next page; None: no more")


class UserSummary(BaseModel):
    user_id: str
    sessions: int = Field(description="sessions the user spoke in or had a message recorded under their id")


class UserPage(BaseModel):
    users: list[UserSummary]
    next: str | None = Field(None, description="pass as `cursor` for the next page; None: no more")


class PendingWindow(BaseModel):
    """The window claimed for formation and not finished yet."""

    window: int
    messages: int
    state: str = Field(description="claimed, extracted, written or completed (memory_service/formation/window.py)")


class SessionSummary(BaseModel):
    session_id: str
    agent_id: str
    created_at: datetime | None = Field(None, description="its first message's reservation (None: recorded before "
                                                          "this was kept)")
    last_activity: datetime | None = None
    messages: int = Field(description="sequence numbers given: recorded messages")
    cursor: int = Field(description="the formation cursor: the last sequence formed")
    formed_windows: int
    formed_messages: int
    incognito: bool
    gate: GateStatus = Field(description="the formation gate, with the pending messages and tokens")
    pending_window: PendingWindow | None = None


class SessionPage(BaseModel):
    sessions: list[SessionSummary] = Field(description="newest first (by creation)")
    next: str | None = Field(None, description="pass as `cursor` for the next page; None: no more")


class MemoryPage(BaseModel):
    memories: list[MemoryRecord] = Field(description="newest first (by valid_at, then id); `access_count` as "
                                                     "counted, listing does not count an access")
    next: str | None = Field(None, description="pass as `cursor` (with the same filters) for the next page; "
                                               "None: no more")


class FormedWindow(BaseModel):
    """The formation window that made a memory, as kept when it completed."""

    window: int
    extractor: str
    first_sequence: int
    last_sequence: int
    messages: int
    memories: int = Field(description="memories the window's extraction made")
    formed_at: datetime
    llm_tokens: int | None = Field(default=None, description="tokens its extraction took (0: no LLM call; null: "
                                                             "formed before they were kept)")
    llm_budget: str | None = Field(default=None, description="why the offline extractor formed it: an LLM budget "
                                                             "was spent (docs/llm-budgets.md)")


class MemoryDetail(BaseModel):
    memory: MemoryRecord
    messages: list[MemoryRecord] = Field(description="the recorded messages it was formed from (those still "
                                                     "held), in sequence order")
    window: FormedWindow | None = Field(None, description="the formation window that made it (None: written by a "
                                                          "tool, a message itself, or formed before windows were kept)")
    history: list[AuditEntry] = Field(description="its audit entries, newest first: writes, updates, deletes, "
                                                  "undeletes (formation is not audited)")
    history_complete: bool = Field(description="false when the audit log holds more entries since the memory was "
                                               "written than one read scans (AUDIT_SCAN_LIMIT): older ones may be missing")
