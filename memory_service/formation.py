"""Forming memories from exactly one claimed window — the one function the worker calls.

The window is read once (the pending messages at claim time), extracted once, written
with ids derived from the window, and only then taken off the pending set. A crash or
an extractor failure before the last step leaves the window pending; running it again
rewrites nothing, because the same window yields the same ids.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass, field

from backends.base import MemoryBackend

from .extraction import Extractor, Window, WindowMessage
from .models import Memory, MemoryKind, Provenance, Shard
from .namespaces import Namespace
from .state import StateStore

log = logging.getLogger(__name__)

_ID_NAMESPACE = uuid.UUID("6f1d7c1e-8a53-4d0b-9a51-2f0c1f2b7a10")
MAX_WINDOW_MESSAGES = 200


def message_memory_id(session_id: str, message_id: str) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, f"message\x1f{session_id}\x1f{message_id}"))


def _formed_id(window_key: str, namespace: str, kind: MemoryKind, index: int) -> str:
    return str(uuid.uuid5(_ID_NAMESPACE, f"{window_key}\x1f{namespace}\x1f{kind.value}\x1f{index}"))


@dataclass(slots=True)
class FormationResult:
    session_id: str
    message_ids: list[str] = field(default_factory=list)
    memories: list[Memory] = field(default_factory=list)
    written: int = 0
    extractor: str = ""

    @property
    def formed(self) -> bool:
        return bool(self.message_ids)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for memory in self.memories:
            out[memory.kind.value] = out.get(memory.kind.value, 0) + 1
        return out


async def form_window(
    *,
    agent_id: str,
    session_id: str,
    backend: MemoryBackend,
    state: StateStore,
    extractor: Extractor,
    shards: list[Shard],
) -> FormationResult:
    result = FormationResult(session_id=session_id, extractor=extractor.name)
    claimed = await state.pending_window(session_id, MAX_WINDOW_MESSAGES)
    if not claimed:
        return result
    session_ns = Namespace.session(session_id)
    ids_by_uuid = {message_memory_id(session_id, mid): mid for mid, _ in claimed}
    stored = {ids_by_uuid[m.id]: m for m in await backend.get(session_ns, list(ids_by_uuid))}
    missing = [mid for mid, _ in claimed if mid not in stored]
    if missing:
        raise RuntimeError(f"session {session_id!r}: pending messages missing from the store: {missing[:5]}")

    messages = tuple(
        WindowMessage(
            message_id=mid,
            sequence=seq,
            role=stored[mid].metadata.role,
            user_id=stored[mid].metadata.user_id or "",
            content=stored[mid].content,
            created_at=stored[mid].valid_at,
        )
        for mid, seq in claimed
    )
    window = Window(agent_id=agent_id, session_id=session_id, messages=messages, shards=tuple(s for s in shards if s.active))
    extraction = await extractor.extract(window)

    first, last = claimed[0][1], claimed[-1][1]
    digest = hashlib.sha256("\x1f".join(mid for mid, _ in claimed).encode()).hexdigest()[:16]
    window_key = f"{session_id}\x1f{first}-{last}\x1f{digest}"
    result.memories = _memories(window, window_key, extraction, last)
    result.written = await backend.write(result.memories)
    result.message_ids = [mid for mid, _ in claimed]
    await state.complete_window(session_id, last, result.message_ids)
    await state.bump(*{m.namespace for m in result.memories})
    log.info(
        "formed session %s messages %d-%d: %s (%d new)", session_id, first, last, result.counts(), result.written
    )
    return result


def _memories(window: Window, window_key: str, extraction, sequence: int) -> list[Memory]:
    valid_at = window.messages[-1].created_at
    users = sorted({m.user_id for m in window.messages if m.role == "user"})
    all_ids = [m.message_id for m in window.messages]
    memories: list[Memory] = []

    def add(kind: MemoryKind, namespace: Namespace, content: str, message_ids, user_id: str | None) -> None:
        index = sum(1 for m in memories if m.kind is kind and m.namespace == str(namespace))
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
                    sequence=sequence,
                ),
                valid_at=valid_at,
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
