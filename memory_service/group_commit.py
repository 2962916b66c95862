"""Group commit: concurrent writes of one agent's messages stored by one backend write.

A record stores its message before it is acknowledged. Under load many records of one
agent arrive together, and each would be a statement of its own: a round trip, and a turn
at the graph's write lock (FalkorDB runs one write at a time per graph). Here writes to
one (backend, agent) wait while that agent's previous write is in flight and then go
together, as one ``backend.write``, as soon as it returns. There is no timer: a lone
record waits for nothing, and the busier the agent, the larger its batches.

Each caller is answered when its batch is stored, or with the batch's error (a write is
one statement per agent, so a failed batch stored nothing of it): what is acknowledged is
stored, as without batching.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from .backend import MemoryBackend
from .models import Memory

MAX_BATCH_ROWS = 256
MAX_BATCH_CHARS = 2_000_000  # of content: a statement's parameters stay a few MB at most


@dataclass(slots=True)
class _Lane:
    """One (backend, agent): the writes waiting, and the task storing them."""

    waiting: deque[tuple[Memory, asyncio.Future[None]]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class GroupCommit:
    def __init__(self, max_rows: int = MAX_BATCH_ROWS, max_chars: int = MAX_BATCH_CHARS):
        self.max_rows, self.max_chars = max_rows, max_chars
        self._lanes: dict[tuple[int, str], _Lane] = {}

    async def write(self, backend: MemoryBackend, agent_id: str, memory: Memory) -> None:
        """Store ``memory`` (of ``agent_id``) with whatever else of the agent waits; returns
        once it is stored, raises the batch's error if the write failed."""
        key = (id(backend), agent_id)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane.waiting.append((memory, future))
        if lane.task is None:
            lane.task = asyncio.create_task(self._drain(key, lane, backend), name=f"group-commit:{agent_id}")
        await future

    def _next_batch(self, lane: _Lane) -> list[tuple[Memory, asyncio.Future[None]]]:
        batch: list[tuple[Memory, asyncio.Future[None]]] = []
        chars = 0
        while lane.waiting and len(batch) < self.max_rows:
            memory, future = lane.waiting[0]
            if batch and chars + len(memory.content) > self.max_chars:
                break
            lane.waiting.popleft()
            if not future.done():  # a caller cancelled before its turn: its message is not written
                batch.append((memory, future))
                chars += len(memory.content)
        return batch

    async def _drain(self, key: tuple[int, str], lane: _Lane, backend: MemoryBackend) -> None:
        batch: list[tuple[Memory, asyncio.Future[None]]] = []
        try:
            while lane.waiting:
                batch = self._next_batch(lane)
                if not batch:
                    continue
                try:
                    await backend.write([memory for memory, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for _, future in batch:
                        if not future.done():
                            future.set_result(None)
                batch = []
        finally:
            # Cancelled (the process stops): whoever still waits is told, not left hanging.
            for _, future in [*batch, *lane.waiting]:
                if not future.done():
                    future.cancel()
            lane.waiting.clear()
            lane.task = None
            self._lanes.pop(key, None)
