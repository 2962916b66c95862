"""Consolidation: merging a namespace's pending directives or suggestions into one memory.

A user's directives become one consolidated memory (<= USER_MEMORY_WORDS), a shard's
suggestions its consolidated memory (<= SHARD_MEMORY_WORDS), each versioned. The items to
merge are the head of a Redis list (memory_service.state.store); formation appends to its tail.
A run merges exactly the ``count`` items it was enqueued with, writes version+1 with a
deterministic id (a retry rewrites nothing), and only then drops those items from the
head with a compare-and-set on the version, so an item pushed meanwhile is never lost.

Merging is the consolidator's: by rule (the offline default), or by one LLM call with
CONSOLIDATOR=llm, the default when EXTRACTOR=llm (memory_service.formation.llm_consolidator). A merge that fails
raises; the job is retried and the items stay pending (and shown) until one succeeds.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from memory_service.access.pseudonyms import namespace_for_log
from memory_service.backends.base import MemoryBackend
from memory_service.domain.models import Memory, MemoryKind, Provenance, utcnow
from memory_service.domain.namespaces import Namespace, NamespaceKind
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.memories import embed_memories
from memory_service.formation.extractor import ExtractionUsage
from memory_service.formation.rule_extractor import content_words, limit_words
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

_ID_NAMESPACE = uuid.UUID("0b6a1c53-7e0f-4b0e-9d0c-6a2d4f1e9c42")


def consolidated_memory_id(namespace: Namespace, version: int) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, f"{namespace}\x1f{version}"))


@dataclass(frozen=True, slots=True)
class Merged:
    content: str
    usage: ExtractionUsage | None = None  # what a model call cost, for consolidators that make one
    fallback: str | None = None  # why it was merged by rule and not by the LLM (a budget spent: formation/budgets.py)


class Consolidator(Protocol):
    name: str

    async def merge(self, previous: str | None, items: list[str], word_limit: int, *, subject: str = "") -> Merged:
        """``previous`` (the latest consolidated memory) and ``items`` (oldest first) as one
        memory of at most ``word_limit`` words; ``subject`` says whose or what it is."""


class RuleBasedConsolidator:
    """No model: one line per item, newest first, near-duplicates dropped, oldest cut at the limit.

    Each item stays its own line: merging never concatenates two statements into one. Newer
    items win because a user's latest statement of a preference supersedes older ones. Two
    items are the same point when their content words and numbers (stemmed, function words
    and chat filler set aside) share at least ``NEAR_DUPLICATE`` of their union ("Please
    always answer in French." and "Always answer in French, please!"; not "seat 1" and
    "seat 2"); the newer one is kept.
    """

    name = "rules"

    async def merge(self, previous: str | None, items: list[str], word_limit: int, *, subject: str = "") -> Merged:
        lines = [f"- {' '.join(item.split())}" for item in reversed(items)]
        lines += [line for line in (previous or "").splitlines() if line.strip()]
        kept: list[tuple[str, frozenset[str]]] = []
        for line in lines:
            words = frozenset([*content_words(line), *re.findall(r"\d+(?:[.:,]\d+)*", line)])
            words = words or frozenset([line.casefold().strip("- .")])
            if not any(same_point(words, other) for _, other in kept):
                kept.append((line, words))
        return Merged(fit_lines("\n".join(line for line, _ in kept), word_limit))


# Share of content words two statements must have in common to be one point.
NEAR_DUPLICATE = 0.8


def same_point(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether two statements' content words say the same thing (see RuleBasedConsolidator)."""
    if not a or not b:
        return a == b
    return len(a & b) / len(a | b) >= NEAR_DUPLICATE


def fit_lines(text: str, word_limit: int) -> str:
    """Whole lines of ``text``, first to last, while they fit in ``word_limit`` words.

    A consolidated memory is one point per line, most important first: a point that does
    not fit is dropped, not cut, unless it is the first (an overlong memory is still one).
    """
    kept: list[str] = []
    words = 0
    for line in text.splitlines():
        size = len(line.split())
        if not size:
            continue
        if words + size > word_limit:
            if not kept:
                kept.append(limit_words(line, word_limit))
            break
        kept.append(" ".join(line.split()))
        words += size
    return "\n".join(kept)


def _subject(namespace: Namespace) -> str:
    if namespace.kind is NamespaceKind.USER:
        return f"the standing rules, preferences and personal context of user {namespace.fields[1]}"
    return f"the shared suggestions and plans on shard {namespace.fields[1]}"


async def latest_consolidated(backend: MemoryBackend, agent_id: str, namespace: Namespace) -> Memory | None:
    found = await backend.recent(agent_id, namespace, [MemoryKind.CONSOLIDATED], 1)
    return found[-1] if found else None


async def consolidate(
    *,
    namespace: Namespace,
    version: int,
    count: int,
    backend: MemoryBackend,
    state: StateStore,
    consolidator: Consolidator,
    word_limit: int,
    agent_id: str,
    embedder: Embedder | None = None,
) -> dict[str, Any]:
    """Merge the ``count`` oldest pending items of ``namespace`` into version ``version + 1``."""
    key = str(namespace)
    # The job's result, as arq stores it (a JSON-like dict): also "usage" and "reason", when they apply.
    outcome: dict[str, Any] = {"namespace": key, "version": version, "consolidated": False, "items": 0}
    if await state.consolidation_version(key) != version:
        return {**outcome, "reason": "version already consolidated"}
    ids = await state.consolidation_pending(key, count)
    # Once each: a formation whose effects were applied twice (a crash between applying and
    # marking them, memory_service/formation/window.py) queued its items twice.
    unique = list(dict.fromkeys(ids))
    found = {m.id: m for m in await backend.get(agent_id, namespace, unique)}
    items = [found[i] for i in unique if i in found]  # order of the list: oldest first
    if len(items) < len(unique):
        log.warning("consolidating %s: %d pending item(s) no longer stored", namespace_for_log(key),
                    len(unique) - len(items))
    if not items:  # e.g. their user was erased: a version of nothing would only repeat the last
        return {**outcome, "reason": "nothing left to merge"}
    previous = await latest_consolidated(backend, agent_id, namespace)
    merged = await consolidator.merge(previous.content if previous else None, [m.content for m in items], word_limit,
                                      subject=_subject(namespace))
    content = merged.content
    if merged.usage:
        outcome["usage"] = asdict(merged.usage)
    if merged.fallback:
        outcome["llm_budget"] = merged.fallback
    memory = Memory(
        id=consolidated_memory_id(namespace, version + 1),
        kind=MemoryKind.CONSOLIDATED,
        namespace=key,
        content=fit_lines(content, word_limit),
        metadata=Provenance(
            agent_id=agent_id,
            user_id=namespace.fields[1] if namespace.kind is NamespaceKind.USER else None,
            user_ids=sorted({u for m in items for u in m.metadata.user_ids}),
            message_ids=[mid for m in items for mid in m.metadata.message_ids],
            memory_ids=[m.id for m in items],
            sequence=version + 1,
        ),
        # Never older than the version it replaces: reads order by time, then sequence.
        valid_at=max([m.valid_at for m in items] + ([previous.valid_at] if previous else []), default=utcnow()),
    )
    await embed_memories(embedder, [memory])
    await backend.write([memory])  # the same id on a retry: the first write stands
    if await state.finish_consolidation(key, version, len(ids)) < 0:
        return {**outcome, "reason": "version already consolidated"}
    log.info("consolidated %d item(s) of %s into version %d", len(ids), namespace_for_log(key), version + 1)
    return {**outcome, "version": version + 1, "consolidated": True, "items": len(ids)}
