"""Forming memories from exactly one claimed window — the one function the worker calls.

A claim (memory_service.state) is a snapshot of the session's pending messages, kept in
Redis until the window is complete. Formation reads exactly those messages, makes one
extractor call, writes the memories with ids derived from the window, and only then
completes the claim with a compare-and-set. A crash or an extractor failure before that
leaves the claim in place; running it again rewrites nothing, because the same window
yields the same ids, and the compare-and-set lets only one run complete it.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import asdict, dataclass, field

from pydantic import BaseModel, Field

from .backend import MemoryBackend

from .extraction import ExtractionUsage, Extractor, Window, WindowMessage
from .models import Memory, MemoryKind, Provenance, Shard
from .namespaces import Namespace
from .retrieval import embed_memories
from .state import Claim, StateStore

log = logging.getLogger(__name__)

_ID_NAMESPACE = uuid.UUID("6f1d7c1e-8a53-4d0b-9a51-2f0c1f2b7a10")


def message_memory_id(session_id: str, message_id: str) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, f"message\x1f{session_id}\x1f{message_id}"))


def _formed_id(window_key: str, namespace: str, kind: MemoryKind, index: int) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, f"{window_key}\x1f{namespace}\x1f{kind.value}\x1f{index}"))


@dataclass(slots=True)
class FormationResult:
    session_id: str
    window: int | None = None
    message_ids: list[str] = field(default_factory=list)
    memories: list[Memory] = field(default_factory=list)
    written: int = 0
    extractor: str = ""
    usage: ExtractionUsage | None = None
    already_formed: bool = False  # another run completed this window first

    @property
    def formed(self) -> bool:
        return bool(self.message_ids) and not self.already_formed

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for memory in self.memories:
            out[memory.kind.value] = out.get(memory.kind.value, 0) + 1
        return out


class FormationSummary(BaseModel):
    """What a formation job did, as the job returns it and the API shows it."""

    session_id: str
    window: int | None = None
    formed: bool = False
    message_ids: list[str] = Field(default_factory=list)
    memories: dict[str, int] = Field(default_factory=dict, description="memories formed from the window, per kind")
    written: int = Field(default=0, description="how many of them were new (0 when the window was already formed)")
    extractor: str = ""
    usage: dict | None = Field(default=None, description="LLM calls, attempts, tokens and seconds, when an LLM formed it")
    job_id: str | None = None
    reason: str = ""

    @classmethod
    def combined(cls, summaries: list[FormationSummary]) -> FormationSummary:
        """Several windows formed by one request, as one answer (the last window's number)."""
        if len(summaries) == 1:
            return summaries[0]
        last = summaries[-1]
        memories: dict[str, int] = {}
        usage: dict | None = None
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
        })

    @classmethod
    def of(cls, result: FormationResult) -> FormationSummary:
        return cls(session_id=result.session_id, window=result.window, formed=result.formed,
                   message_ids=result.message_ids if result.formed else [],
                   memories=result.counts() if result.formed else {}, written=result.written,
                   extractor=result.extractor, usage=asdict(result.usage) if result.usage else None,
                   reason="formed" if result.formed else "window already formed")


# Kinds that are merged into a consolidated memory once enough of them are pending.
CONSOLIDATED_KINDS = (MemoryKind.DIRECTIVE, MemoryKind.SUGGESTION)


async def form_window(
    *,
    claim: Claim,
    agent_id: str,
    backend: MemoryBackend,
    state: StateStore,
    extractor: Extractor,
    shards: list[Shard],
    embedder=None,
) -> FormationResult:
    """Form exactly the claimed window. Safe to run again: the same claim writes the same ids."""
    session_id = claim.session_id
    result = FormationResult(session_id=session_id, window=claim.window, extractor=extractor.name)
    session_ns = Namespace.session(session_id)
    ids_by_uuid = {message_memory_id(session_id, mid): mid for mid in claim.message_ids}
    stored = {ids_by_uuid[m.id]: m for m in await backend.get(agent_id, session_ns, list(ids_by_uuid))}
    missing = [mid for mid in claim.message_ids if mid not in stored]
    if missing:
        raise RuntimeError(f"session {session_id!r}: messages of window {claim.window} missing from the store: {missing[:5]}")

    messages = tuple(
        WindowMessage(
            message_id=mid,
            sequence=seq,
            role=stored[mid].metadata.role,
            user_id=stored[mid].metadata.user_id or "",
            content=stored[mid].content,
            created_at=stored[mid].valid_at,
        )
        for mid, seq in claim.messages
    )
    window = Window(agent_id=agent_id, session_id=session_id, messages=messages, shards=tuple(s for s in shards if s.active))
    extraction = await extractor.extract(window)
    result.usage = extraction.usage

    digest = hashlib.sha256("\x1f".join(claim.message_ids).encode()).hexdigest()[:16]
    window_key = f"{session_id}\x1f{claim.window}\x1f{digest}"
    result.memories = _memories(window, window_key, extraction)
    await embed_memories(embedder, result.memories)
    result.written = await backend.write(result.memories)
    result.message_ids = claim.message_ids
    consolidate = [(m.namespace, m.id) for m in result.memories if m.kind in CONSOLIDATED_KINDS]
    if await state.complete_window(claim, consolidate, written=[m.namespace for m in result.memories]) < 0:
        result.already_formed = True
        log.info("session %s window %d was already formed; wrote %d new", session_id, claim.window, result.written)
        return result
    log.info("formed session %s window %d (%d messages): %s (%d new)",
             session_id, claim.window, len(messages), result.counts(), result.written)
    return result


def _memories(window: Window, window_key: str, extraction) -> list[Memory]:
    users = sorted({m.user_id for m in window.messages if m.role == "user"})
    all_ids = [m.message_id for m in window.messages]
    by_id = {m.message_id: m for m in window.messages}
    memories: list[Memory] = []

    def add(kind: MemoryKind, namespace: Namespace, content: str, message_ids, user_id: str | None) -> None:
        index = sum(1 for m in memories if m.kind is kind and m.namespace == str(namespace))
        # An item is as old as the latest message it was formed from, so that the items of
        # one window keep the conversation's order.
        sources = [by_id[mid] for mid in message_ids if mid in by_id] or [window.messages[-1]]
        latest = max(sources, key=lambda m: (m.created_at, m.sequence))
        memories.append(
            Memory(
                id=_formed_id(window_key, str(namespace), kind, index),
                kind=kind,
                namespace=str(namespace),
                content=content,
                metadata=Provenance(
                    agent_id=window.agent_id,
                    user_id=user_id,
                    user_ids=users,
                    session_id=window.session_id,
                    message_ids=list(message_ids),
                    sequence=latest.sequence,
                ),
                valid_at=latest.created_at,
            )
        )

    if extraction.episode:
        add(MemoryKind.EPISODE, Namespace.session(window.session_id), extraction.episode, all_ids, users[0] if len(users) == 1 else None)
    shard_ids = {s.shard_id for s in window.shards}
    for item in extraction.items:
        if item.kind is MemoryKind.DIRECTIVE and item.user_id:
            add(item.kind, Namespace.user(window.agent_id, item.user_id), item.content, item.message_ids, item.user_id)
        elif item.kind in (MemoryKind.FACT, MemoryKind.SUGGESTION) and item.shard_id in shard_ids:
            add(item.kind, Namespace.shard(window.agent_id, item.shard_id), item.content, item.message_ids, item.user_id)
        else:
            log.warning("dropping extracted %s with no valid target: %r", item.kind, item)
    return memories
