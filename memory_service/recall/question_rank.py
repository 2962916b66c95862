"""Question-aware ranking: what the question says about *where* its answer is, applied to
the fused candidates.

The signals rank what a memory says. The question also names whose words it asks about,
the period it means and whether it gathers from several places (memory_service/domain/
question.py reads those cues). Each cue becomes a factor on the best
SEARCH_QUESTION_WINDOW fused candidates, read from their ``Facet`` (speaker, role,
session, time: one light read for those the signals answered as ids), each behind its own
weight so that each can be measured alone (docs/ranking.md has the figures):

- **people** (SEARCH_QUESTION_PEOPLE): the candidates said by a person the question names
  (a speaker whose name is among its words), or by the assistant when it asks what "you"
  said, keep their score; the others' is divided by ``1 + weight``. Only when the cue
  separates the candidates: a question naming every speaker, or none, changes nothing;
- **time** (SEARCH_QUESTION_TIME): the same for the candidates of the period the question
  names ("last week", "in May 2023", read from its ``as_of`` date); a question asking for
  the earliest ("first", "originally") ranks without the recency factor, which favours the
  newest;
- **aggregation** (SEARCH_QUESTION_AGGREGATE): for a question that gathers ("how many",
  "in total"), the order is built greedily, each candidate's score divided by
  ``1 + weight`` once per better candidate of its session already placed: the evidence
  of five sessions before five turns of one.

Every factor is at most 1 and only re-orders: it never adds a result, nor takes one away
but by ``min_score``. The scores stay on fusion's scale.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from memory_service.backends.base import Candidate, Facet, Found, MemoryBackend
from memory_service.config import Settings
from memory_service.domain.question import Cues


@dataclass(frozen=True, slots=True)
class Weights:
    """The question-aware factors' weights (0: off)."""

    people: float = 0.0
    time: float = 0.0
    aggregate: float = 0.0
    aggregate_always: bool = False
    window: int = 50

    @property
    def on(self) -> bool:
        """Whether any factor is on (else the question is not even read)."""
        return self.window > 0 and bool(self.people or self.time or self.aggregate)

    @classmethod
    def of(cls, settings: Settings) -> Weights:
        return cls(settings.search_question_people, settings.search_question_time, settings.search_question_aggregate,
                   settings.search_question_aggregate_always, settings.search_question_window)

    def wanted(self, cues: Cues) -> bool:
        """Whether any factor can apply to a question with these cues (else nothing is read)."""
        if self.window <= 0:
            return False
        return bool(self.people and (cues.names or cues.assistant) or self.time and (cues.period or cues.first)
                    or self.aggregate and (cues.aggregate or self.aggregate_always))


def named(facet: Facet, words: frozenset[str]) -> bool:
    """Whether the question's ``words`` name one of the candidate's speakers (every word of the
    name). An assistant's message is the assistant's, whatever user it was recorded for."""
    if facet.role == "assistant":
        return False
    return any(all(part in words for part in speaker.split()) for speaker in facet.speakers if speaker)


def _separating(favoured: Sequence[bool]) -> bool:
    """A cue that favours all the candidates, or none, says nothing about them."""
    return any(favoured) and not all(favoured)


def factors(facets: Sequence[Facet | None], cues: Cues, weights: Weights) -> list[float]:
    """Each candidate's factor from people and time (in (0, 1]), in order; None: not read."""
    out = [1.0] * len(facets)

    def favour(favoured: list[bool], weight: float) -> None:
        if _separating(favoured):
            out[:] = [x if keep else x / (1 + weight) for x, keep in zip(out, favoured, strict=True)]

    if weights.people:
        favour([f is not None and (cues.assistant and f.role == "assistant" or named(f, cues.words))
                for f in facets], weights.people)
    if weights.time and cues.period is not None:
        start, end = cues.period
        favour([f is not None and start <= f.valid_at < end for f in facets], weights.time)
    return out


def spread[T](items: Sequence[tuple[T, float, str | None]], weight: float) -> list[tuple[T, float]]:
    """``items`` (item, score, session) in a greedy order: each next the best by its score
    divided by ``1 + weight`` once per item of its session placed before it; with that score.
    Items of no session are never divided."""
    left = list(items)
    placed: Counter[str] = Counter()
    out: list[tuple[T, float]] = []
    while left:
        best_at, best = 0, -1.0
        for at, (_, score, session) in enumerate(left):
            value = score / (1 + weight) ** placed[session] if session is not None else score
            if value > best:
                best_at, best = at, value
        item, _, session = left.pop(best_at)
        if session is not None:
            placed[session] += 1
        out.append((item, best))
    return out


async def facets_of(backend: MemoryBackend, agent_id: str, candidates: Sequence[Candidate]) -> list[Facet | None]:
    """Each candidate's facet, in order (None: no longer live): one read for those found as ids."""
    wanted = [c.id for c in candidates if isinstance(c, Found)]
    read = {f.id: f for f in await backend.facets(agent_id, wanted)} if wanted else {}
    return [read.get(c.id) if isinstance(c, Found) else Facet.of(c) for c in candidates]


def question_order(facets: Sequence[Facet | None], cues: Cues, weights: Weights,
                   scores: Sequence[tuple[float, float]]) -> list[tuple[int, float]]:
    """The new order of candidates with these ``facets`` and (score, recency factor)
    ``scores``, best first: (the candidate's index, its new score). The search applies it
    (memory_service/recall/search.py, ``Retriever.questioned``)."""
    values = factors(facets, cues, weights)
    scored: list[tuple[int, float, str | None]] = []
    for at, ((score, recency), factor, facet) in enumerate(zip(scores, values, facets, strict=True)):
        if weights.time and cues.first and recency > 0:
            score = score / recency  # the earliest is asked for: age costs nothing
        scored.append((at, score * factor, facet.session_id if facet is not None else None))
    if weights.aggregate and (cues.aggregate or weights.aggregate_always):
        return spread(scored, weights.aggregate)
    return [(at, score) for at, score, _ in sorted(scored, key=lambda x: (-x[1], x[0]))]
