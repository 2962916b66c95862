"""The answer of GET /v1/agents/{agent_id}/usage: an agent's LLM usage against its budgets."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from memory_service.domain.models import LLMBudget


class PeriodUsage(BaseModel):
    """LLM usage in one UTC day or month (formation and consolidation together)."""

    period: str = Field(description="the day (2026-12-07) or month (2026-12), UTC")
    resets_at: datetime = Field(description="when the next period starts")
    tokens: int = Field(default=0, description="tokens counted against the budget: the settled calls' own and the "
                                               "estimates of calls in flight")
    reserved: int = Field(default=0, description="estimates of calls in flight (a worker killed mid-call leaves its "
                                                 "estimate counted)")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = Field(default=0, description="LLM requests that answered")
    attempts: int = Field(default=0, description="LLM requests sent, retries included")
    formations: int = Field(default=0, description="windows extracted by the LLM")
    consolidations: int = Field(default=0, description="merges made by the LLM")
    offline_formations: int = Field(default=0, description="windows extracted offline because a budget was spent")
    offline_consolidations: int = Field(default=0, description="merges made by rule because a budget was spent")
    waits: int = Field(default=0, description="formation runs that left a window pending because a budget was spent "
                                              "(`when_spent: wait`)")
    limit: int | None = Field(default=None, description="the agent's budget for the period; null: none")
    remaining: int | None = Field(default=None, description="tokens left of it (never below 0); null: no budget")


class DeploymentCap(BaseModel):
    limit: int | None = Field(default=None, description="LLM_TOKENS_PER_DAY or LLM_TOKENS_PER_MONTH; null: none")
    spent: bool = Field(default=False, description="whether every agent's calls together reached it")


class DeploymentCaps(BaseModel):
    day: DeploymentCap
    month: DeploymentCap


class AgentUsage(BaseModel):
    agent_id: str
    budget: LLMBudget = Field(description="the agent's budgets, as its settings hold them")
    day: PeriodUsage
    month: PeriodUsage
    deployment: DeploymentCaps = Field(description="the deployment-wide caps, which hold for every agent")
