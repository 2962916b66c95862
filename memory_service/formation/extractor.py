"""Turning one conversation window into memories: the extractor interface.

Formation (memory_service.formation.steps) claims a window, calls ONE extractor on it, and
writes what comes back with deterministic ids. Extractors never write anything.

The knowledge graph's share: an extractor that returns no graph (``Extraction.graph`` None,
the rule extractor) has the window's entities and facts read by the offline
``memory_service.formation.entities.extract_graph``. One that returns a graph (the LLM
extractor) declares ``known_limits`` (``GraphExtractor``): formation then looks up, before
the call and without a model, the stored entities the window names and their current
facts (``Window.known``, memory_service.formation.known_graph), so that the one call can
also say which of those facts the window makes no longer true.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from memory_service.domain.graph import Entity, ExtractedEntity, ExtractedFact, Fact
from memory_service.domain.models import MemoryKind, Role, Shard


@dataclass(frozen=True, slots=True)
class WindowMessage:
    message_id: str
    sequence: int
    role: Role
    user_id: str
    content: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class KnownGraph:
    """Stored entities a window names and their current facts, looked up before extraction
    in the namespaces the window writes to (its users', its active shards', the agent's)."""

    entities: tuple[Entity, ...] = ()
    facts: tuple[Fact, ...] = ()  # numbered 1.. in the order given, as the LLM sees them


@dataclass(frozen=True, slots=True)
class Window:
    """Exactly the messages formation claimed, oldest first, plus the agent's active shards
    (and, for an extractor that asks, what the graph already knows: ``known``)."""

    agent_id: str
    session_id: str
    messages: tuple[WindowMessage, ...]
    shards: tuple[Shard, ...] = ()
    known: KnownGraph = KnownGraph()


@dataclass(frozen=True, slots=True)
class ExtractedItem:
    kind: MemoryKind  # DIRECTIVE, FACT or SUGGESTION
    content: str
    message_ids: tuple[str, ...]  # the window messages it was formed from
    # For directives and personal facts: whose they are (stored in that user's namespace);
    # for shard items: the user who said it, if a user did.
    user_id: str | None = None
    # For shard facts and suggestions: the shard. A FACT without one is a personal fact:
    # about user_id, kept in their namespace (memory_service.formation.personal).
    shard_id: str | None = None


@dataclass(slots=True)
class ExtractionUsage:
    """What extracting one window cost. Extractors that call no model leave ``Extraction.usage`` None."""

    calls: int = 0  # requests that returned a completion (HTTP 200), usable or not
    attempts: int = 0  # requests sent, including those that failed
    prompt_tokens: int = 0  # as the endpoint reported them, summed over the calls
    completion_tokens: int = 0
    latency_seconds: float = 0.0  # wall time of the whole extraction, retries and backoff included


@dataclass(slots=True)
class ExtractedGraph:
    """The knowledge graph's share of a window, as an extractor states it."""

    entities: list[ExtractedEntity] = field(default_factory=list)
    facts: list[ExtractedFact] = field(default_factory=list)
    supersedes: list[str] = field(default_factory=list)  # ids of ``Window.known`` facts no longer true


@dataclass(slots=True)
class Extraction:
    episode: str | None = None  # <= ~50 words: what happened in the window
    items: list[ExtractedItem] = field(default_factory=list)
    usage: ExtractionUsage | None = None
    graph: ExtractedGraph | None = None  # None: formation reads the graph offline (extract_graph)
    # Set when the configured extractor's call would have crossed an LLM budget
    # (memory_service/formation/budgets.py): the extractor that made it instead, and why.
    extractor: str | None = None
    fallback: str | None = None


class ExtractionFailed(RuntimeError):
    """The extractor could not produce an extraction for a window; the window stays pending.

    ``usage`` is what the failed attempts cost, when the extractor measured it.
    """

    def __init__(self, message: str, *, usage: ExtractionUsage | None = None) -> None:
        super().__init__(message)
        self.usage = usage


class Extractor(Protocol):
    name: str

    async def extract(self, window: Window) -> Extraction: ...


@dataclass(frozen=True, slots=True)
class KnownLimits:
    """How much of the stored graph an extractor is shown: at most ``entities`` entities and
    ``facts`` current facts (0 and 0: nothing is looked up)."""

    entities: int
    facts: int


@runtime_checkable
class GraphExtractor(Extractor, Protocol):
    """An extractor that states the window's graph itself and is shown the known one first."""

    known_limits: KnownLimits
