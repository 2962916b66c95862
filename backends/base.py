"""The one interface every memory backend implements (and the contract tests check)."""

from __future__ import annotations

import contextvars
from abc import ABC, abstractmethod
from collections.abc import Sequence

from memory_service.models import Memory, MemoryKind
from memory_service.namespaces import Namespace

# The stores that served the reads of the current task, for backends that read from more
# than one ("graph", "mongo"): the memory context reports where it came from.
read_sources: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("read_sources", default=None)


def served_by(source: str) -> None:
    if (sources := read_sources.get()) is not None:
        sources.add(source)


class MemoryBackend(ABC):
    """Stores memories by namespace. Writes are idempotent by ``Memory.id``."""

    name: str

    async def start(self) -> None:
        """Connect and check the store; raise to make the registry fall back."""

    async def close(self) -> None:
        """Release connections."""

    async def describe_shard(self, agent_id: str, shard_id: str, name: str, extraction_focus: str, active: bool) -> None:
        """Record a shard's settings where this store keeps them (by default it does not)."""

    @abstractmethod
    async def health(self) -> dict:
        """``{"ok": bool, ...}`` with whatever helps an operator."""

    @abstractmethod
    async def write(self, memories: Sequence[Memory]) -> int:
        """Store memories whose id is not stored yet; return how many were new.

        Writing an id that exists changes nothing, so a retried formation is a no-op.
        """

    @abstractmethod
    async def get(self, namespace: Namespace, ids: Sequence[str]) -> list[Memory]:
        """The memories of ``namespace`` with these ids (missing ids are skipped)."""

    @abstractmethod
    async def recent(self, namespace: Namespace, kinds: Sequence[MemoryKind], limit: int) -> list[Memory]:
        """The ``limit`` most recent memories of these kinds, oldest first."""

    @abstractmethod
    async def trim(self, namespace: Namespace, kind: MemoryKind, keep: int) -> int:
        """Evict all but the ``keep`` most recent memories of ``kind``; return how many went.

        Evicted memories are no longer read by ``recent`` or counted; the retention policy
        removes them for good. Idempotent.
        """

    @abstractmethod
    async def export(self, namespace: Namespace) -> list[Memory]:
        """Every memory of the namespace, evicted ones included, oldest first (for migration)."""

    @abstractmethod
    async def count(self, namespace: Namespace, kinds: Sequence[MemoryKind] = ()) -> int:
        """How many live (not evicted) memories of these kinds, or of all, the namespace holds."""
