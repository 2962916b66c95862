"""Startup records on the wire (docs/startup-records.md): a record as an admin writes it
and as it is stored, the answer of a delete, and a startup block. Storing them and choosing
what a block holds is memory_service/recall/startup.py."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_TITLE_CHARS = 200


class Priority(StrEnum):
    P0 = "P0"  # identity
    P1 = "P1"  # operating rules
    P2 = "P2"  # behaviour
    P3 = "P3"  # reference

    @property
    def rank(self) -> int:
        return int(self.value[1])


class StartupMode(StrEnum):
    ALWAYS = "always"
    FIRST_RUN = "first-run"
    DIGEST = "digest"


class StartupRecordIn(BaseModel):
    """A startup record as an admin writes it (the content's limit is STARTUP_MAX_RECORD_CHARS)."""

    model_config = ConfigDict(extra="forbid")

    priority: Priority = Field(description="P0 identity, P1 operating rules, P2 behaviour, P3 reference")
    title: str = Field(min_length=1, max_length=MAX_TITLE_CHARS)
    content: str = Field(min_length=1, max_length=100_000)

    @field_validator("title", "content")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


class StartupRecord(StartupRecordIn):
    id: str
    source: str | None = Field(None, description="the file `memory-service import` made it from, if it did")
    updated_at: datetime

    @property
    def chars(self) -> int:
        """What the record costs of a startup block's budget."""
        return len(self.title) + len(self.content)

    def same_as(self, other: StartupRecord) -> bool:
        return (self.priority, self.title, self.content, self.source) == (
            other.priority, other.title, other.content, other.source)


class DeletedStartupRecord(BaseModel):
    """The answer of a delete: idempotent, so a second delete answers ``deleted: false``."""

    id: str
    deleted: bool = Field(description="whether there was a record to delete")


class DroppedRecord(BaseModel):
    id: str
    priority: Priority
    chars: int


class StartupBlock(BaseModel):
    records: list[StartupRecord] = Field(description="the records to give the model, by priority; empty when not sent")
    chars: int = Field(description="characters of the records' titles and contents")
    budget: int = Field(description="the block's character budget (STARTUP_MODEL_BUDGETS by model, else STARTUP_BUDGET_CHARS)")
    digest: str = Field(description="digest of the records that fit the budget, whether sent or not")
    sent: bool = Field(description="false: the session already has these records (modes first-run and digest)")
    dropped: list[DroppedRecord] = Field(description="records left out to fit the budget, lowest priority first")
    mode: StartupMode
