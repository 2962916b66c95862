"""The memory block of one model call (GET /v1/context)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from memory_service.domain.models import ContextType, Recall


class ContextOut(BaseModel):
    xml: str
    chars: int
    budget: int
    sections: dict[str, int]
    dropped: int = Field(description="items left out to fit the budget (left_out.over_budget)")
    source: str = Field(description="where the memories came from: graph, mongo (fallback), cache, last-good "
                                    "(every store failing: the last complete block), none")
    left_out: dict[str, int] = Field(
        default_factory=dict,
        description="relevant candidates and items left out, by why: below_threshold (under min_score, or found by "
                    "the vector signal alone under min_similarity), duplicate (its content shown in another item), "
                    "over_budget")
    context_type: ContextType = ContextType.CHAT
    recall: Recall | None = Field(None, description="the recall settings the block was made with, every one resolved")
