"""The memory block of one model call (GET /v1/context)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ContextOut(BaseModel):
    xml: str
    chars: int
    budget: int
    sections: dict[str, int]
    dropped: int
    source: str = Field(description="where the memories came from: graph, mongo (fallback), cache, last-good "
                                    "(every store failing: the last complete block), none")
