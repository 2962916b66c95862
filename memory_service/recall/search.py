"""Search: scopes, full-text, vector and graph candidates fused by reciprocal rank, a
recency factor, and an explanation for every result.

The graph signal (memory_service/recall/graph_signal.py) ranks the memories that mention
the query's entities, the entities their facts link them to (one or two hops), or those
entities' namesakes in the search's shards (shared topics); each result's explanation lists
those paths. After fusion, the candidates may be re-ranked by structure (centrality,
activation; weights in Settings or per request): a factor between 1 / (1 + weights) and 1
multiplies each score, and each result's explanation shows its contributions.

A search asks the agent's backend for candidates per signal inside a scope (the backend
filters by namespace in its indexes), fuses the ranked lists by reciprocal rank fusion
(RRF: a memory ranked r by a signal gets 1/(k + r) from it), and multiplies by a recency
factor. Scores are normalised so that a memory ranked first by every signal, and new,
scores 1.0. The recency factor falls from 1 toward ``1 - weight`` with a half-life, so
age can cost a memory at most ``weight`` of its score: an old memory still wins over a
newer one whose fused score is less than ``1 - weight`` of its own.

A re-ranker (RERANKER, memory_service/recall/rerank.py; off by default, docs/ranking.md)
may then read the best RERANK_CANDIDATES with the query and re-order them (``rerank``).

Results at or above ``min_score`` are "activated" and returned best first; the best of
those below it stay "candidates" and come back separately, explained, so a caller can
see what almost made it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator

from memory_service.access.reach import Reach
from memory_service.backends.base import Brief, Candidate, Found, MemoryBackend, SignalHits
from memory_service.config import Settings
from memory_service.domain.bm25 import QUERY_STOPWORDS, query_words
from memory_service.domain.errors import Forbidden, InvalidInput, NotFound, NotSupported, preview
from memory_service.domain.graph import query_names
from memory_service.domain.limits import (
    MAX_NAMESPACE_CHARS,
    MAX_RANK_WEIGHT,
    MAX_SEARCH_NAMESPACES,
    MAX_TOP_K_CEILING,
    TAG_CHARS_CEILING,
    TAGS_CEILING,
    check_tags,
    check_time,
)
from memory_service.domain.models import Memory, MemoryKind, NamespaceText, SessionId, ShardId, StoreQuery, UserId
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.domain.question import cues as question_cues
from memory_service.domain.question import feedback_terms
from memory_service.embedding.embedders import Embedder
from memory_service.recall.graph_signal import (
    GraphHits,
    GraphOptions,
    QueryGraph,
    entity_namespaces,
    graph_hits,
    query_graph,
    structure,
)
from memory_service.recall.question_rank import Weights as QuestionWeights
from memory_service.recall.question_rank import facets_of, question_order
from memory_service.recall.render import age
from memory_service.recall.rerank import Reranker
from memory_service.schemas.search import (
    Explanation,
    GraphPath,
    Rerank,
    Scope,
    SearchHit,
    SearchResult,
    SignalScore,
    Structure,
)
from memory_service.state import metrics
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

class SearchRequest(BaseModel):
    """A search, as the API and ``MemoryService.search`` take it."""

    query: str = Field(description="what to look for, in plain words (at most SEARCH_MAX_QUERY_CHARS characters)")
    scope: Scope = Scope.AGENT
    user_id: UserId | None = Field(default=None, description="scope=user: whose memories")
    session_id: SessionId | None = Field(default=None, description="scope=session: which session")
    shard_id: ShardId | None = Field(default=None, description="scope=shard: which shard")
    namespaces: list[Annotated[NamespaceText, Field(max_length=MAX_NAMESPACE_CHARS)]] | None = Field(
        default=None, max_length=MAX_SEARCH_NAMESPACES, description="scope=namespaces: e.g. ['user:agent:alice', 'session:s1']")
    top_k: int = Field(default=10, ge=1, le=MAX_TOP_K_CEILING, description="results to return (at most SEARCH_MAX_TOP_K)")
    min_score: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False,
                                    description="results below it come back as candidates")
    kinds: list[MemoryKind] | None = Field(default=None, max_length=len(MemoryKind), description="only these kinds (default: all)")
    since: datetime | None = Field(default=None, description="only memories at or after this time (UTC unless it says)")
    until: datetime | None = Field(default=None, description="only memories at or before this time (UTC unless it says)")
    tags: list[Annotated[str, Field(min_length=1, max_length=TAG_CHARS_CEILING)]] | None = Field(
        default=None, max_length=TAGS_CEILING,
        description="only memories carrying every one of these tags (at most MAX_MEMORY_TAGS, each MAX_TAG_CHARS)")
    as_of: datetime | None = Field(default=None, description="the graph signal follows the facts true at this time "
                                                              "(default: the current ones)")
    include_superseded: bool = Field(default=False, description="the graph signal follows every fact, superseded "
                                                                "ones included")
    centrality_weight: float | None = Field(
        default=None, ge=0, le=MAX_RANK_WEIGHT, allow_inf_nan=False,
        description="the structural re-rank's weight of centrality (default SEARCH_RANK_CENTRALITY; 0: none)")
    activation_weight: float | None = Field(
        default=None, ge=0, le=MAX_RANK_WEIGHT, allow_inf_nan=False,
        description="the structural re-rank's weight of activation (default SEARCH_RANK_ACTIVATION; 0: none)")

    @field_validator("since", "until", "as_of")
    @classmethod
    def _timezone(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return value
        return check_time(value.replace(tzinfo=UTC) if value.tzinfo is None else value)


def query_terms(text: str) -> list[str]:
    """The query's words for full-text search: lowercase, without question words, each once."""
    return list(dict.fromkeys(query_words(text)))


def recency_factor(age_days: float, half_life_days: float, weight: float) -> float:
    decay: float = 0.5 ** (max(age_days, 0.0) / half_life_days)  # typeshed: float ** float may be complex
    return 1.0 - weight + weight * decay


GRAPH = "graph"
FEEDBACK = "feedback"


def tied_ranks(ranked: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Each id's rank, equal scores sharing the mean of the ranks they span (1-based): a run
    of ties carries no order, so none of them gets the first one's place."""
    out: dict[str, float] = {}
    start = 0
    while start < len(ranked):
        end = start
        while end + 1 < len(ranked) and ranked[end + 1][1] == ranked[start][1]:
            end += 1
        for memory_id, _ in ranked[start:end + 1]:
            out[memory_id] = (start + end) / 2 + 1
        start = end + 1
    return out


@dataclass(slots=True)
class Scored:
    """A candidate's score and how it came about: what the answer's Explanation says, kept as
    plain values while a search ranks its candidates (about a hundred; the answer explains
    only those it returns, the memory block none)."""

    signals: dict[str, tuple[float, int]]  # signal -> (its score, its rank)
    fused: float
    recency: float
    age_days: float
    score: float
    activated: bool
    graph: list[GraphPath]
    structure: Structure | None = None
    rerank: Rerank | None = None

    def explanation(self) -> Explanation:
        """The answer's form (built from valid values: not validated again)."""
        extra: dict[str, Any] = {name: value for name, value in (("structure", self.structure),
                                                                 ("rerank", self.rerank)) if value is not None}
        return Explanation.model_construct(
            signals={name: SignalScore.model_construct(score=score, rank=rank)
                     for name, (score, rank) in self.signals.items()},
            fused=self.fused, recency=self.recency, age_days=self.age_days, score=self.score,
            activated=self.activated, graph=self.graph, **extra)


def fuse(hits: SignalHits, settings: Settings, now: datetime, min_score: float | None,
         paths: dict[str, list[GraphPath]] | None = None,
         weighing: dict[str, float] | None = None) -> list[tuple[Candidate, Scored]]:
    """Every candidate once, with how it scored (and its graph ``paths``), best first.

    The graph signal is fused on its own terms: its score is evidence on a fixed scale (1 =
    a mention of a query entity nothing else is linked to; a hub's mention weighs
    1/log2(2 + degree)), so its contribution is multiplied by that score (at most 1), and
    memories it scores alike share the mean of their ranks. Else a hub's fifty mentions,
    all alike, would enter the fusion as ranks 1 to 50 in arbitrary order, as if the signal
    had ranked them, and the hub penalty, uniform across them, would change nothing.

    ``weighing``: signals' weights beyond SEARCH_SIGNAL_WEIGHTS (feedback's)."""
    k = settings.search_rrf_k
    memories: dict[str, Candidate] = {}
    signals: dict[str, dict[str, tuple[float, int]]] = {}
    places: dict[tuple[str, str], float] = {}  # (signal, memory id) -> the rank fusion counts
    for signal, ranked in hits.items():
        for rank, (memory, score) in enumerate(ranked, start=1):
            known = memories.get(memory.id)
            if known is None or isinstance(known, Found):  # a memory read beats one to read
                memories[memory.id] = memory
            signals.setdefault(memory.id, {})[signal] = (round(score, 6), rank)
            places[(signal, memory.id)] = rank
        if signal == GRAPH:
            for memory_id, place in tied_ranks([(m.id, score) for m, score in ranked]).items():
                places[(signal, memory_id)] = place
    weights = {signal: (weighing or {}).get(signal, settings.search_signal_weights.get(signal, 1.0)) for signal in hits}
    best_possible = sum(weights.values()) / (k + 1) if hits else 1.0
    half_life, weight = settings.search_recency_half_life_days, settings.search_recency_weight
    paths = paths or {}
    explained = []
    for memory_id, found in signals.items():
        memory = memories[memory_id]
        fused = sum(weights[name] * (min(score, 1.0) if name == GRAPH else 1.0) / (k + places[(name, memory_id)])
                    for name, (score, _) in found.items()) / best_possible
        age_days = (now - memory.valid_at).total_seconds() / 86_400
        recency = recency_factor(age_days, half_life, weight)
        score = fused * recency
        explained.append((memory, Scored(
            signals=found, fused=round(fused, 6), recency=round(recency, 6), age_days=round(age_days, 3),
            score=round(score, 6), activated=min_score is None or score >= min_score, graph=paths.get(memory_id, []),
        )))
    explained.sort(key=_best_first)
    return explained


def _best_first(pair: tuple[Candidate, Scored]) -> tuple[float, float, str]:
    """Higher score first; between equal scores, the newer, then by id."""
    return -pair[1].score, -pair[0].valid_at.timestamp(), pair[0].id


def restructure(ranked: list[tuple[Candidate, Scored]], structures: dict[str, Structure],
                min_score: float | None) -> list[tuple[Candidate, Scored]]:
    """``ranked`` with each score multiplied by its structure's factor, best first again."""
    out = []
    for memory, scored in ranked:
        found = structures.get(memory.id)
        if found is None:
            out.append((memory, scored))
            continue
        score = round(scored.score * found.factor, 6)
        out.append((memory, replace(scored, score=score, structure=found,
                                    activated=min_score is None or score >= min_score)))
    out.sort(key=_best_first)
    return out


def rerank(ranked: list[tuple[Candidate, Scored]], scores: Sequence[float], model: str, k: int, weight: float,
           min_score: float | None) -> list[tuple[Candidate, Scored]]:
    """``ranked`` with its first ``len(scores)`` in a new order: the reciprocal rank fusion of
    their fused order (weight 1) and the re-ranker's order of ``scores`` (weight ``weight``),
    ``k`` as fusion's. The rest follow as they were.

    The re-ranker's scores are on a scale of their own, so only its order enters, as the
    signals' orders enter fusion: a pair it is sure of moves up, but one model's opinion
    does not erase what the signals agreed on. The re-ordered results keep the set of
    scores they had, given out again in the new order: scores stay in descending order and
    on fusion's scale, so ``min_score`` means what it meant, and as many are activated."""
    n = len(scores)
    head, tail = ranked[:n], ranked[n:]
    by_model = sorted(range(n), key=lambda i: (-scores[i], i))
    model_rank = {i: place for place, i in enumerate(by_model, start=1)}
    best = (1 + weight) / (k + 1)
    combined = [(1 / (k + i + 1) + weight / (k + model_rank[i])) / best for i in range(n)]
    values = sorted((s.score for _, s in head), reverse=True)
    out = []
    for value, i in zip(values, sorted(range(n), key=lambda i: (-combined[i], i)), strict=True):
        memory, scored = head[i]
        out.append((memory, replace(
            scored, score=value, activated=min_score is None or value >= min_score,
            rerank=Rerank(model=model, score=round(float(scores[i]), 6), rank=model_rank[i], fused_rank=i + 1,
                          combined=round(combined[i], 6)))))
    return out + tail


def hit(memory: Memory, scored: Scored, now: datetime) -> SearchHit:
    """The answer's form of a ranked memory (built from a validated memory: not validated again)."""
    meta = memory.metadata
    return SearchHit.model_construct(
        id=memory.id, kind=memory.kind, namespace=memory.namespace,
        content=memory.search_text,
        valid_at=memory.valid_at, age=age(memory.valid_at, now), score=scored.score,
        activated=scored.activated, source_message_ids=memory.source_message_ids,
        session_id=meta.session_id, user_id=meta.user_id, role=meta.role, served_by=memory.served_by,
        title=memory.title, tags=list(memory.tags), explanation=scored.explanation(),
    )


def _needed[T](value: T | None, scope: Scope, name: str) -> T:
    """``value``, the request's field ``name`` that ``scope`` needs; InvalidInput if it is unset or empty."""
    if not value:
        raise InvalidInput(f"scope={scope.value} needs {name}")
    return value


@dataclass(frozen=True)
class Ranking:
    """A search's candidates, best first, each with how it scored; the signals that ran,
    those that could not (and why), and the time recency was measured from.

    A candidate may be a ``Found`` (its id and time: the backend ranked it without reading
    it); ``read`` gives the memories of those a caller keeps."""

    ranked: list[tuple[Candidate, Scored]]
    signals: list[str]
    degraded: list[str]
    now: datetime
    backend: MemoryBackend
    agent_id: str

    def results(self, top_k: int) -> list[tuple[Candidate, Scored]]:
        """The best ``top_k`` activated (at or above the search's min_score)."""
        return [pair for pair in self.ranked if pair[1].activated][:top_k]

    def candidates(self, top_k: int) -> list[tuple[Candidate, Scored]]:
        """The best ``top_k`` below min_score."""
        return [pair for pair in self.ranked if not pair[1].activated][:top_k]

    async def read(self, pairs: Sequence[tuple[Candidate, Scored]]) -> list[tuple[Memory, Scored]]:
        """``pairs`` with each candidate's memory, in order (one read for those not read yet);
        one deleted or evicted since the search ranked it is left out."""
        return await read_found(self.backend, self.agent_id, pairs)

    async def briefs(self, pairs: Sequence[tuple[Candidate, Scored]]) -> list[tuple[Brief, Scored]]:
        """``read``, each candidate's ``Brief`` only (what the memory block shows of it)."""
        return await _resolved(pairs, lambda ids: self.backend.briefs(self.agent_id, ids), Brief.of)


async def read_found[T](backend: MemoryBackend, agent_id: str,
                        pairs: Sequence[tuple[Candidate, T]]) -> list[tuple[Memory, T]]:
    """``pairs`` with each ``Found`` replaced by its memory, read in one call, in order; one
    that is no longer live (deleted or evicted since it was found) is left out."""
    async def live(ids: list[str]) -> list[Memory]:
        return [m for m in await backend.find(agent_id, ids) if m.live]

    return await _resolved(pairs, live, lambda memory: memory)


async def _resolved[R: (Memory, Brief), T](pairs: Sequence[tuple[Candidate, T]],
                                            read: Callable[[list[str]], Awaitable[Sequence[R]]],
                                            of: Callable[[Memory], R]) -> list[tuple[R, T]]:
    """``pairs`` with each candidate as ``read`` gives it (for each ``Found``, one call for
    all; those it does not give are left out) or ``of`` a memory read already, in order."""
    wanted = [c.id for c, _ in pairs if isinstance(c, Found)]
    got = {r.id: r for r in await read(wanted)} if wanted else {}
    out = []
    for candidate, value in pairs:
        resolved = got.get(candidate.id) if isinstance(candidate, Found) else of(candidate)
        if resolved is not None:
            out.append((resolved, value))
    return out


class Retriever:
    """Runs searches for the service: scope checks, the query's embedding, fusion, the re-ranker."""

    def __init__(self, settings: Settings, state: StateStore, embedder: Embedder | None = None,
                 reranker: Reranker | None = None):
        self.settings = settings
        self.state = state
        self.embedder = embedder
        self.reranker = reranker

    def graph_options(self) -> GraphOptions:
        s = self.settings
        return GraphOptions(hops=s.search_graph_hops, decay=s.search_graph_hop_decay, fanout=s.search_graph_fanout,
                            topic_weight=s.search_graph_topic_weight)

    def validate(self, request: SearchRequest) -> None:
        s = self.settings
        if not request.query.strip():
            raise InvalidInput("query must not be empty")
        if len(request.query) > s.search_max_query_chars:
            raise InvalidInput(f"query is {len(request.query)} characters long; the limit is {s.search_max_query_chars}")
        if request.top_k > s.search_max_top_k:
            raise InvalidInput(f"top_k is {request.top_k}; the limit is {s.search_max_top_k}")
        if request.since and request.until and request.since > request.until:
            raise InvalidInput("since must not be after until")
        if request.tags:
            check_tags(request.tags, s.max_memory_tags, s.max_tag_chars)

    async def scope_namespaces(self, agent_id: str, request: SearchRequest,
                               reach: Reach | None = None) -> list[Namespace] | None:
        """The namespaces a scope spans (None: all of the agent's). Never another agent's, nor
        what ``reach`` (the caller's, memory_service/access/reach.py) does not see: a session it
        does not see is answered as an unknown one, another user's namespace is refused."""
        reach = reach or Reach(self.state, agent_id)
        scope = request.scope
        if scope is Scope.AGENT:
            if reach.confined:
                raise Forbidden(f"this API key is limited to some users of agent {agent_id!r}; scope agent needs a key "
                                "for all of them")
            return None
        if scope is Scope.SESSION:
            session_id = _needed(request.session_id, scope, "session_id")
            await self._seen_session(reach, session_id)
            return [Namespace.session(session_id)]
        if scope is Scope.USER:
            user_id = _needed(request.user_id, scope, "user_id")
            self._seen_user(reach, user_id)
            return await self.user_namespaces(agent_id, user_id)
        if scope is Scope.SHARD:
            return [Namespace.shard(agent_id, _needed(request.shard_id, scope, "shard_id"))]
        namespaces = []
        for text in _needed(request.namespaces, scope, "namespaces"):
            namespace = Namespace.parse(text)
            if namespace.kind is NamespaceKind.SESSION:
                await self._seen_session(reach, namespace.fields[0])
            elif namespace.fields[0] != agent_id:
                raise NotFound(f"namespace {preview(text)} is not one of agent {agent_id!r}'s")
            elif namespace.kind is NamespaceKind.USER:
                self._seen_user(reach, namespace.fields[1])
            namespaces.append(namespace)
        return list(dict.fromkeys(namespaces))

    async def user_namespaces(self, agent_id: str, user_id: str) -> list[Namespace]:
        """The "user" scope: the user's own namespace and every session of the agent they spoke in."""
        sessions = await self.state.user_sessions(agent_id, user_id)
        return [Namespace.user(agent_id, user_id), *map(Namespace.session, sessions)]

    @staticmethod
    async def _seen_session(reach: Reach, session_id: str) -> None:
        # Unknown, foreign and unseen sessions get the same answer: nothing reveals others' ids.
        if not await reach.sees_session(session_id):
            raise NotFound(f"session {session_id!r} has no messages recorded by agent {reach.agent_id!r}")

    @staticmethod
    def _seen_user(reach: Reach, user_id: str) -> None:
        # Whether or not the user exists: the answer depends on the key alone.
        if not reach.sees_user(user_id):
            raise Forbidden(f"this API key is limited to some users of agent {reach.agent_id!r}, and {user_id!r} is "
                            "not one of them")

    async def embed_query(self, text: str) -> tuple[list[float] | None, str | None]:
        """The query's embedding, or None and why (search then runs on full text alone)."""
        if self.embedder is None:
            return None, "no embedder configured"
        try:
            return (await self.embedder.embed([text], query=True))[0], None
        except Exception as exc:  # a failing embedder degrades search, it never fails it
            log.warning("search without vectors: the embedder failed: %s", exc)
            return None, f"{type(exc).__name__}: {exc}"

    async def search(self, agent_id: str, backend: MemoryBackend, request: SearchRequest,
                     namespaces: Sequence[Namespace] | None = None, resolve_scope: bool = True,
                     reach: Reach | None = None, found: QueryGraph | None = None,
                     like: str | None = None) -> SearchResult:
        """``found``: the query's entities and facts when the caller read them already (the
        memory block does, to show the facts); else they are read here, in the scope's
        namespaces that hold entities (every one of the agent's for scope agent).

        ``like``: the id of a stored memory whose text is the query (the memory block without
        a query searches with the session's latest user message): its stored embedding, when
        it has one of this embedder's model, is the query's, and the model is not run."""
        started = time.perf_counter()
        self.validate(request)  # before the scope's reads: a bad request reads nothing
        if resolve_scope:
            namespaces = await self.scope_namespaces(agent_id, request, reach)
        ranking = await self.rank(agent_id, backend, request, namespaces, found, like)
        now = ranking.now
        results, candidates = ranking.results(request.top_k), ranking.candidates(request.top_k)
        read = await ranking.read([*results, *candidates])
        if reach is not None:  # each hit's provenance as the caller may see it
            read = list(zip(await reach.shown([m for m, _ in read]), (e for _, e in read), strict=True))
        shown = {m.id for m, _ in results}
        return SearchResult(
            query=request.query, scope=request.scope,
            namespaces=None if namespaces is None else len(namespaces),
            signals=ranking.signals, degraded=ranking.degraded,
            results=[hit(m, e, now) for m, e in read if m.id in shown],
            candidates=[hit(m, e, now) for m, e in read if m.id not in shown],
            took_ms=round((time.perf_counter() - started) * 1000, 3),
        )

    async def rank(self, agent_id: str, backend: MemoryBackend, request: SearchRequest,
                   namespaces: Sequence[Namespace] | None,
                   found: QueryGraph | Callable[[], Awaitable[QueryGraph | None]] | None = None,
                   like: str | None = None, vector: list[float] | None = None) -> Ranking:
        """The search's candidates ranked and explained, in ``namespaces`` (None: the agent's
        whole graph), before they are cut to ``top_k`` and put in the answer's form: what
        ``search`` answers with, and what the memory block reads (it needs no hits).

        ``found`` as in ``search``, or a function giving them (None: read them here), called
        only when the graph signal needs them, after the backend's candidates: the memory
        block reads them beside the search.

        ``vector``: the query's embedding by this embedder, made already (the memory block's,
        for a message embedded as it was recorded): the model does not run."""
        self.validate(request)
        # Like a stored memory: the store reads its vector with the search; the model runs only
        # when it has none of this embedder's model yet (a message just recorded).
        stored = like if like is not None and self.embedder is not None and vector is None else None
        vector, why_not = (vector, None) if vector is not None or stored else await self.embed_query(request.query)
        store_query = StoreQuery(
            terms=query_terms(request.query), vector=vector, like=stored,
            vector_model=self.embedder.name if self.embedder is not None and (vector is not None or stored) else None,
            namespaces=namespaces, kinds=request.kinds,
            since=request.since, until=request.until,
            limit=max(self.settings.search_candidates, request.top_k), tags=tuple(dict.fromkeys(request.tags or ())),
        )
        hits = await backend.search(agent_id, store_query)
        if stored and "vector" not in hits:
            vector, why_not = await self.embed_query(request.query)
            if vector is not None:
                nearest = await backend.search(agent_id, replace(store_query, terms=[], like=None, vector=vector))
                hits = {**hits, **{signal: found for signal, found in nearest.items() if signal == "vector"}}
        degraded = []
        if vector is not None and "vector" not in hits:
            why_not = "the store's vector index did not answer (rebuilding after a restart?)"
        if why_not:
            degraded.append(f"vector: {why_not}")
        graph = GraphHits()
        weights = (self.settings.search_rank_centrality if request.centrality_weight is None else request.centrality_weight,
                   self.settings.search_rank_activation if request.activation_weight is None else request.activation_weight)
        started_graph = time.perf_counter()
        try:
            if self.settings.search_graph_signal:
                if callable(found):
                    found = await found()
                if found is None:
                    found = await query_graph(backend, agent_id,
                                              None if namespaces is None else entity_namespaces(namespaces),
                                              query_names(request.query, QUERY_STOPWORDS), request.as_of,
                                              request.include_superseded)
                graph = await graph_hits(backend, agent_id, store_query, found, self.graph_options(), request.as_of,
                                         request.include_superseded)
                metrics.SEARCH_SIGNALS.labels(GRAPH).observe(time.perf_counter() - started_graph)
        except NotSupported:
            pass  # a store without a graph: search runs on its other signals
        except Exception as exc:  # a failing graph read degrades search, it never fails it
            metrics.SEARCH_SIGNALS.labels(GRAPH).observe(time.perf_counter() - started_graph)
            log.warning("search without the graph signal: %s", exc)
            degraded.append(f"graph: {type(exc).__name__}: {exc}")
        if graph.hits:
            hits = {**hits, GRAPH: graph.hits}
        now = datetime.now(UTC)
        ranked = fuse(hits, self.settings, now, request.min_score, graph.paths)
        if self.settings.search_feedback_weight > 0 and store_query.terms and ranked:
            try:
                hits, ranked = await self.fed_back(agent_id, backend, store_query, hits, ranked, now, request.min_score,
                                                   graph.paths)
            except Exception as exc:  # as the signals: the first order stands
                log.warning("search without feedback: %s", exc)
                degraded.append(f"feedback: {type(exc).__name__}: {exc}")
        if self.settings.search_graph_signal and any(weights) and ranked:
            try:
                structures = await structure(backend, agent_id, [m.id for m, _ in ranked], graph.closeness, *weights)
                ranked = restructure(ranked, structures, request.min_score)
            except NotSupported:
                pass
            except Exception as exc:  # as the signal: the fused order stands
                log.warning("search without the structural re-rank: %s", exc)
                degraded.append(f"structure: {type(exc).__name__}: {exc}")
        if ranked and QuestionWeights.of(self.settings).on:
            try:
                ranked = await self.questioned(agent_id, backend, request, ranked, now)
            except Exception as exc:
                log.warning("search without question-aware ranking: %s", exc)
                degraded.append(f"question: {type(exc).__name__}: {exc}")
        ranked = await self.reranked(agent_id, backend, request, ranked, degraded)
        return Ranking(ranked, sorted(hits), degraded, now, backend, agent_id)

    async def questioned(self, agent_id: str, backend: MemoryBackend, request: SearchRequest,
                         ranked: list[tuple[Candidate, Scored]], now: datetime) -> list[tuple[Candidate, Scored]]:
        """``ranked`` with the question's factors (memory_service/recall/question_rank.py) on
        its best SEARCH_QUESTION_WINDOW, best first again; as it was when no factor applies to
        this question (then nothing is read)."""
        weights = QuestionWeights.of(self.settings)
        cues = question_cues(request.query, request.as_of or now)
        if not weights.wanted(cues):
            return ranked
        head, tail = ranked[:weights.window], ranked[weights.window:]
        facets = await facets_of(backend, agent_id, [c for c, _ in head])
        order = question_order(facets, cues, weights, [(s.score, s.recency) for _, s in head])
        out = []
        for at, value in order:
            candidate, scored = head[at]
            value = round(value, 6)
            out.append((candidate, scored if value == scored.score else replace(
                scored, score=value, activated=request.min_score is None or value >= request.min_score)))
        # The tail keeps its scores: merged by score, a demoted candidate may fall below it.
        return sorted([*out, *tail], key=lambda pair: -pair[1].score) if tail else out

    async def fed_back(self, agent_id: str, backend: MemoryBackend, store_query: StoreQuery, hits: SignalHits,
                       ranked: list[tuple[Candidate, Scored]], now: datetime, min_score: float | None,
                       paths: dict[str, list[GraphPath]]) -> tuple[SignalHits, list[tuple[Candidate, Scored]]]:
        """Pseudo-relevance feedback: the words the best SEARCH_FEEDBACK_DOCS share
        (memory_service/domain/question.py), searched by full text with the query's, fused
        in as the signal ``feedback`` (weight SEARCH_FEEDBACK_WEIGHT). The hits and their
        fusion; as they were when the best share no word the query lacks."""
        s = self.settings
        best = await _resolved(ranked[:s.search_feedback_docs], lambda ids: backend.briefs(agent_id, ids), Brief.of)
        # A message's text starts with its speaker's name ("alice: ..."): who said it, not what about.
        texts = [b.text.partition(": ")[2] or b.text if b.kind is MemoryKind.MESSAGE else b.text for b, _ in best]
        extra = feedback_terms(texts, store_query.terms, s.search_feedback_terms)
        if not extra:
            return hits, ranked
        more = await backend.search(agent_id, replace(store_query, terms=[*store_query.terms, *extra], vector=None,
                                                      like=None, vector_model=None))
        if not more.get("fulltext"):
            return hits, ranked
        hits = {**hits, FEEDBACK: more["fulltext"]}
        return hits, fuse(hits, s, now, min_score, paths, {FEEDBACK: s.search_feedback_weight})

    async def reranked(self, agent_id: str, backend: MemoryBackend, request: SearchRequest,
                       ranked: list[tuple[Candidate, Scored]], degraded: list[str]) -> list[tuple[Candidate, Scored]]:
        """``ranked`` after the re-ranker read its best RERANK_CANDIDATES (as it was without one,
        or when it fails: a failing re-ranker degrades search, it never fails it)."""
        s = self.settings
        n = min(s.rerank_candidates, len(ranked))
        if self.reranker is None or s.reranker == "none" or n < 2 or s.rerank_weight <= 0:
            return ranked
        head = await read_found(backend, agent_id, ranked[:n])  # their texts (less any deleted meanwhile)
        ranked, n = [*head, *ranked[n:]], len(head)
        try:
            scores = await self.reranker.score(request.query, [m.search_text for m, _ in head])
            if len(scores) != n:
                raise RuntimeError(f"{len(scores)} scores for {n} candidates")
        except Exception as exc:
            log.warning("search without the re-ranker: %s", exc)
            degraded.append(f"rerank: {type(exc).__name__}: {exc}")
            return ranked
        return rerank(ranked, scores, self.reranker.name, s.search_rrf_k, s.rerank_weight, request.min_score)


def snippet(text: str, terms: Sequence[str], chars: int) -> str:
    """``text`` cut to about ``chars`` around its first matching term (whole when short)."""
    if len(text) <= chars:
        return text
    lowered = text.lower()
    positions = [p for t in terms if (p := lowered.find(t)) >= 0]
    center = min(positions) if positions else 0
    start = max(0, min(center - chars // 3, len(text) - chars))
    piece = text[start:start + chars]
    return ("…" if start else "") + piece.strip() + ("…" if start + chars < len(text) else "")
