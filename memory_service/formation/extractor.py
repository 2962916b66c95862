"""Turning one conversation window into memories: the extractor interface.

Formation (memory_service.formation.steps) claims a window, calls ONE extractor on it, and
writes what comes back with deterministic ids. Extractors never write anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

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
class Window:
    """Exactly the messages formation claimed, oldest first, plus the agent's active shards."""

    agent_id: str
    session_id: str
    messages: tuple[WindowMessage, ...]
    shards: tuple[Shard, ...] = ()


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
class Extraction:
    episode: str | None = None  # <= ~50 words: what happened in the window
    items: list[ExtractedItem] = field(default_factory=list)
    usage: ExtractionUsage | None = None


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
