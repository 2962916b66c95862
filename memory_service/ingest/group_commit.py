"""Group commit: concurrent writes of one agent's messages stored by one backend write.

A record stores its message before it is acknowledged. Under load many records of one
agent arrive together, and each would be a statement of its own: a round trip, and a turn
at the graph's write lock (FalkorDB runs one write at a time per graph). Here writes to
one (backend, agent) wait while that agent's previous write is in flight and then go
together, as one ``backend.write``, as soon as it returns. There is no timer: a lone
record waits for nothing, and the busier the agent, the larger its batches.

Each caller is answered when its row is stored: what is acknowledged is stored, as
without batching. A batch is one statement, stored whole or not at all, so when it fails
the rows are told apart before anyone is answered:

- an outage of the store (``outages.is_unavailable``: refused or reset connections,
  timeouts, a full pool) fails every row of the batch with that error, at once: writing
  the rows again would only wait on the same dead store;
- any other error (the store answered that it cannot take the statement, or a row could
  not be turned into one) is bisected: each half is written again, and so on, until every
  row is stored or fails alone. A row that fails alone gets ``RowRefused`` (its own input:
  the caller answers 4xx); its batch-mates are stored. With one refused row in a batch of
  n that costs about 2·log2(n) more statements (a batch of 256: 16), each answered at once
  by the store; k refused rows cost at most k times that, and a batch whose every row is
  refused 2n - 1 statements. The common case is unchanged: one statement per batch, no timer.

Bounded: a statement holds at most ``max_rows`` rows and ``max_chars`` characters of content
(one row larger than that is written alone), so what one agent sends, however large, holds
the store for one bounded statement at a time, the agent's lane writing one after the
other and other agents' lanes going between. A lane whose task a batch started (its
context) gives way before each statement as the batch's steps do (memory_service/ingest/pacing.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from memory_service.backends.base import MemoryBackend
from memory_service.backends.outages import is_unavailable
from memory_service.domain.models import Memory
from memory_service.ingest import pacing

# Defaults of STORE_WRITE_MAX_ROWS and STORE_WRITE_MAX_CHARS (memory_service/config.py). The
# graph store runs one statement at a time and holds its whole server while it commits one
# (measured on two cores: a PING waited 1-2 s behind a statement of 2 M characters, which
# took 3-6 s; 20-110 ms behind one of 64 K, 0.1-0.2 s), so a batch of 8 MB is cut into
# statements of 64 K characters: other agents' reads and writes go between them.
MAX_BATCH_ROWS = 256
MAX_BATCH_CHARS = 65_536


class RowRefused(Exception):
    """The store refused this row on its own, while its batch-mates were stored: the row's
    input, not the store, is at fault. Nothing of it was stored. ``__cause__`` is the
    store's error (its text is for the server's log, not for the caller)."""


_Row = tuple[Memory, asyncio.Future[None]]


@dataclass(slots=True)
class _Lane:
    """One (backend, agent): the writes waiting, and the task storing them."""

    waiting: deque[_Row] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class GroupCommit:
    def __init__(self, max_rows: int = MAX_BATCH_ROWS, max_chars: int = MAX_BATCH_CHARS):
        self.max_rows, self.max_chars = max_rows, max_chars
        self._lanes: dict[tuple[int, str], _Lane] = {}

    async def write(self, backend: MemoryBackend, agent_id: str, memory: Memory) -> None:
        """Store ``memory`` (of ``agent_id``) with whatever else of the agent waits; returns
        once it is stored. Raises the store's error on an outage, ``RowRefused`` if the
        store refused this row alone."""
        (future,) = self._enqueue(backend, agent_id, [memory])
        await future

    async def write_many(self, backend: MemoryBackend, agent_id: str,
                         memories: Sequence[Memory]) -> list[BaseException | None]:
        """Store ``memories`` (a batch of records of ``agent_id``), in order, with whatever
        else of the agent waits: as many statements as the batch limits make. One answer per
        memory: None (stored), ``RowRefused`` or the outage's error, as ``write`` raises them."""
        return await asyncio.gather(*self._enqueue(backend, agent_id, memories), return_exceptions=True)

    def _enqueue(self, backend: MemoryBackend, agent_id: str, memories: Sequence[Memory]) -> list[asyncio.Future[None]]:
        key = (id(backend), agent_id)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[None]] = []
        for memory in memories:
            futures.append(loop.create_future())
            lane.waiting.append((memory, futures[-1]))
        if lane.task is None:
            lane.task = asyncio.create_task(self._drain(key, lane, backend), name=f"group-commit:{agent_id}")
        return futures

    def _next_batch(self, lane: _Lane) -> list[_Row]:
        batch: list[_Row] = []
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
        batch: list[_Row] = []
        try:
            while lane.waiting:
                await pacing.give_way()  # a batch's rows give way to other agents' requests (ingest/pacing.py)
                batch = self._next_batch(lane)
                if batch:
                    await self._store(backend, batch)
                batch = []
        finally:
            # Cancelled (the process stops): whoever still waits is told, not left hanging.
            for _, future in [*batch, *lane.waiting]:
                if not future.done():
                    future.cancel()
            lane.waiting.clear()
            lane.task = None
            self._lanes.pop(key, None)

    async def _store(self, backend: MemoryBackend, batch: list[_Row]) -> None:
        """Write ``batch`` and answer each of its callers; on an error that is not an
        outage, bisect until each row is stored or fails alone (see the module's docstring)."""
        parts, outage = [batch], None
        while parts:
            rows = parts.pop()
            if outage is not None:  # the store went away during the bisection: no more tries
                _answer(rows, outage)
                continue
            try:
                await backend.write([memory for memory, _ in rows])
            except Exception as exc:
                if is_unavailable(exc):
                    outage = exc
                    _answer(rows, exc)
                elif len(rows) == 1:
                    refused = RowRefused(f"the store refused memory {rows[0][0].id}")
                    refused.__cause__ = exc
                    _answer(rows, refused)
                else:
                    half = len(rows) // 2
                    parts += [rows[half:], rows[:half]]  # the first half is written first
            else:
                _answer(rows, None)


def _answer(rows: list[_Row], error: BaseException | None) -> None:
    for _, future in rows:
        if not future.done():  # its caller may have been cancelled meanwhile
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
