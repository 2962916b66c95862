"""A search's answer (POST /v1/agents/{id}/search): every result explained, and the scope
it ran in. How a search runs is memory_service/recall/search.py."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from memory_service.domain.models import MemoryKind


class Scope(StrEnum):
    SESSION = "session"  # one session's messages and episodes
    USER = "user"  # a user's directives and every session of the agent they spoke in
    SHARD = "shard"  # one shard's facts, suggestions and consolidated memory
    AGENT = "agent"  # everything the agent holds
    NAMESPACES = "namespaces"  # an explicit list of the agent's namespaces


class SignalScore(BaseModel):
    score: float = Field(description="the signal's own score: BM25-like for fulltext, cosine similarity for vector")
    rank: int = Field(description="1 = the signal's best candidate")


class GraphPath(BaseModel):
    """How the graph signal reached a memory: it mentions ``entity``, one of the query's own
    (``via`` None) or one a current fact links to one of them (``via`` that fact's text)."""

    entity: str = Field(description="the entity's name")
    entity_id: str
    via: str | None = Field(None, description="the fact linking a query entity to this one (one hop), or None")
    weight: float = Field(description="what the path adds: 1 (0.5 one hop out) divided by log2(2 + the entity's degree)")


class Explanation(BaseModel):
    signals: dict[str, SignalScore] = Field(description="each signal that found the memory")
    fused: float = Field(description="reciprocal rank fusion: sum of 1/(k + rank), normalised to the best possible")
    recency: float = Field(description="factor for age, between 1 - SEARCH_RECENCY_WEIGHT and 1")
    age_days: float
    score: float = Field(description="fused x recency")
    activated: bool = Field(description="score >= min_score (always, without a min_score)")
    graph: list[GraphPath] = Field(default_factory=list,
                                   description="the graph signal's paths to the memory: which entities, which facts")


class SearchHit(BaseModel):
    id: str
    kind: MemoryKind
    namespace: str
    content: str
    valid_at: datetime
    age: str = Field(description='e.g. "5 days ago"')
    score: float
    activated: bool
    source_message_ids: list[str] = Field(description="the recorded messages this memory is, or was formed from")
    session_id: str | None = None
    user_id: str | None = None
    role: str | None = None
    served_by: str | None = Field(None, description='the store that answered: "graph", or "mongo" when the graph could not')
    title: str | None = Field(None, description="the title a memory tool gave it")
    tags: list[str] = Field(default_factory=list, description="the tags a memory tool gave it")
    explanation: Explanation


class SearchResult(BaseModel):
    query: str
    scope: Scope
    namespaces: int | None = Field(description="how many namespaces the scope spans (None: all of the agent's)")
    signals: list[str] = Field(description="the signals that ran")
    degraded: list[str] = Field(default_factory=list, description="signals that could not run, and why")
    results: list[SearchHit] = Field(description="activated results, best first")
    candidates: list[SearchHit] = Field(default_factory=list, description="the best results below min_score")
    took_ms: float
