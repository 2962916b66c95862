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
    (``hops`` 0), one that facts link to one of them (``hops`` 1 or 2: ``path`` names the
    entities from the query's one, ``facts`` the facts followed), or the namesake of one of
    those in a shard or the agent namespace (``topic``: a shared topic)."""

    entity: str = Field(description="the entity's name")
    entity_id: str
    via: str | None = Field(None, description="the last fact followed to reach the entity (None: a query entity or a topic)")
    hops: int = Field(0, description="facts followed from the query's entity: 0, 1 or 2")
    path: list[str] = Field(default_factory=list,
                            description="the entities' names from the query's entity to this one")
    facts: list[str] = Field(default_factory=list, description="the facts followed, in order (one per hop)")
    topic: bool = Field(False, description="reached as the namesake, in a shard or the agent namespace, of the last "
                                           "entity of ``path``")
    weight: float = Field(description="what the path adds: SEARCH_GRAPH_HOP_DECAY per hop (x SEARCH_GRAPH_TOPIC_WEIGHT "
                                      "for a topic), divided by log2(2 + degree) of the entity and of any entity "
                                      "passed through")


class EntityWeight(BaseModel):
    """One of a result's entities as the structural re-rank counted it."""

    entity: str = Field(description="the entity's name")
    entity_id: str
    degree: int = Field(description="its mentions and facts: the hub penalty is 1 / log2(2 + degree)")
    closeness: float = Field(description="its closeness to the query: its best path's weight before the hub penalty "
                                         "(1 for a query entity; 0 when the graph signal did not reach it)")
    shared: int = Field(description="how many other candidates mention it")


class Structure(BaseModel):
    """The structural re-rank of a result: centrality and activation, each on a fixed scale
    capped at 1, and the factor they make of them."""

    centrality: float = Field(description="sum over its entities of closeness x hub penalty (at most 1)")
    activation: float = Field(description="sum over its entities of hub penalty x the share of the other candidates "
                                          "that mention the entity (at most 1)")
    centrality_weight: float
    activation_weight: float
    factor: float = Field(description="(1 + wc x centrality + wa x activation) / (1 + wc + wa): 1 for the best "
                                      "on both, never below 1 / (1 + wc + wa)")
    entities: list[EntityWeight] = Field(default_factory=list, description="the entities it mentions that were counted")


class Rerank(BaseModel):
    """What the re-ranker (RERANKER, memory_service/recall/rerank.py) made of a result it read."""

    model: str = Field(description='the re-ranker, e.g. "local:nanoranker-1.2"')
    score: float = Field(description="the model's own score of the (query, memory) pair: higher is more relevant")
    rank: int = Field(description="the model's rank of the memory among the candidates it read (1 = best)")
    fused_rank: int = Field(description="the memory's rank before the re-ranker (1 = best)")
    combined: float = Field(description="weight/(k + rank) + 1/(k + fused_rank), normalised to the best possible "
                                        "(RERANK_WEIGHT, SEARCH_RRF_K): the order the results are in")


class Explanation(BaseModel):
    signals: dict[str, SignalScore] = Field(description="each signal that found the memory")
    fused: float = Field(description="reciprocal rank fusion: sum of weight/(k + rank), normalised to the best possible; "
                                     "the graph's term is multiplied by its score (at most 1), its ties share their "
                                     "mean rank")
    recency: float = Field(description="factor for age, between 1 - SEARCH_RECENCY_WEIGHT and 1")
    age_days: float
    score: float = Field(description="fused x recency (x structure's factor, when re-ranked); the candidates the "
                                     "re-ranker read keep their scores' values, given out again in its order")
    activated: bool = Field(description="score >= min_score (always, without a min_score)")
    graph: list[GraphPath] = Field(default_factory=list,
                                   description="the graph signal's paths to the memory: which entities, which facts")
    structure: Structure | None = Field(default=None, description="the structural re-rank's contributions (None: no re-rank ran, "
                                                          "both weights being 0 or the store having no graph)")
    rerank: Rerank | None = Field(default=None, description="the re-ranker's score and ranks (None: no re-ranker read "
                                                            "this result)")


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
