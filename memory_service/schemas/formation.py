"""Formation on the wire: a session's formation gates (in the answer to recording a
message, and GET /v1/sessions/{id}) and what a formation job did (POST .../form, and the
job's own result). The gates are evaluated in memory_service/formation/gates.py."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class GateStatus(BaseModel):
    open: bool
    reason: str
    pending_messages: int
    pending_tokens: float
    min_messages: int
    message_interval: int
    token_interval: int



class FormationSummary(BaseModel):
    """What a formation job did, as the job returns it and the API shows it."""

    session_id: str
    window: int | None = None
    formed: bool = False
    message_ids: list[str] = Field(default_factory=list)
    memories: dict[str, int] = Field(default_factory=dict, description="memories formed from the window, per kind")
    written: int = Field(default=0, description="how many of them were new (0 when the window was already formed)")
    extractor: str = ""
    usage: dict[str, Any] | None = Field(default=None, description="LLM calls, attempts, tokens and seconds, when an LLM formed it")
    llm_budget: str | None = Field(default=None, description="when an LLM budget was spent: why the offline "
                                                              "extractor formed the window, or why it waits")
    waiting: bool = Field(default=False, description="the window stays pending until the LLM budget allows its call "
                                                     "(the agent's `llm_budget.when_spent` is `wait`)")
    job_id: str | None = None
    reason: str = ""

    @classmethod
    def combined(cls, summaries: list[FormationSummary]) -> FormationSummary:
        """Several windows formed by one request, as one answer (the last window's number)."""
        if len(summaries) == 1:
            return summaries[0]
        last = summaries[-1]
        memories: dict[str, int] = {}
        usage: dict[str, Any] | None = None
        for summary in summaries:
            for kind, n in summary.memories.items():
                memories[kind] = memories.get(kind, 0) + n
            if summary.usage:
                usage = {k: (usage or {}).get(k, 0) + v for k, v in summary.usage.items()}
        formed = [s for s in summaries if s.formed]
        return last.model_copy(update={
            "formed": bool(formed), "message_ids": [m for s in summaries for m in s.message_ids],
            "memories": memories, "written": sum(s.written for s in summaries), "usage": usage,
            "reason": f"formed {len(formed)} windows" if formed else last.reason,
            "llm_budget": next((s.llm_budget for s in reversed(summaries) if s.llm_budget), None),
        })
