"""A live session's user message embedded as it is recorded, for the memory block that follows.

In a session loop the client records the user's message and asks for the memory block at
once. The block searches with that message (it has no query), and the worker has not
embedded it yet: its job comes after the record. So the block ran the model itself, on
its path, after its first reads; then the worker ran it again for the store.

Here a session counts as live in this process once a block without a query was asked for
it (within ``LIVE_SECONDS``). A user message recorded in a live session is embedded at
once, in the background, as the worker would embed it (its search text, the embedder's
model); the vector is stored as the worker stores it (the worker's job then finds nothing
to do for it), and the block that asks for it awaits that run instead of starting its
own: the model runs once, and from the record on, not after the block's first reads.
The run claims the message first, as the job and the backfill do
(memory_service/embedding/once.py): a message another process claimed first is theirs to
embed (the block then embeds its question itself), so a stored message is embedded once.

Bounded: at most ``MAX_IN_FLIGHT`` runs at a time (a message past it waits for the
worker, as before), ``MAX_LIVE_SESSIONS`` sessions remembered, ``MAX_KEPT`` vectors kept
(the oldest dropped), each for ``KEEP_SECONDS`` (then dropped, by a timer in an idle
process). Per process: a block served by another replica embeds the message itself, as
before. Imports and batches are never embedded here: no block asks for their sessions. A
failing embedder or store is logged; the message then waits for the worker and the block
embeds it, as before.
CONTEXT_EMBED_ON_RECORD=false turns it off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable

from memory_service.backends.base import MemoryBackend
from memory_service.domain.models import Memory, MemoryKind, Role
from memory_service.embedding.embedders import Embedder
from memory_service.embedding.once import embed_once
from memory_service.state.store import StateStore

log = logging.getLogger(__name__)

LIVE_SECONDS = 600.0  # a session whose block was asked this recently is live
MAX_IN_FLIGHT = 4
MAX_LIVE_SESSIONS = 10_000
MAX_KEPT = 256
KEEP_SECONDS = 60.0


class FreshVectors:
    def __init__(self, embedder: Embedder | None, enabled: bool = True, state: StateStore | None = None):
        self.embedder = embedder if enabled else None
        self.state = state  # the embedding claims and the counter; without it, nothing runs
        self._live: OrderedDict[str, float] = OrderedDict()  # session id -> when its block was last asked
        self._kept: OrderedDict[str, tuple[float, asyncio.Future[list[float] | None]]] = OrderedDict()  # memory id ->
        self._running: set[asyncio.Task[None]] = set()
        self._sweep: asyncio.TimerHandle | None = None  # drops the expired vectors of an idle process

    def block_asked(self, session_id: str) -> None:
        """A block without a query was asked for ``session_id``: its next user messages are
        embedded as they are recorded."""
        if self.embedder is None:
            return
        self._live[session_id] = time.monotonic()
        self._live.move_to_end(session_id)
        while len(self._live) > MAX_LIVE_SESSIONS:
            self._live.popitem(last=False)

    def recorded(self, agent_id: str, backend: MemoryBackend, memory: Memory) -> bool:
        """``memory`` (a message) was recorded for the first time: embed it now when it is a
        user's, in a live session, and a run is free. Whether a run started."""
        if self.embedder is None or self.state is None or memory.kind is not MemoryKind.MESSAGE or memory.metadata.role not in (None, Role.USER):
            return False
        asked = self._live.get(memory.metadata.session_id or "")
        if asked is None or time.monotonic() - asked > LIVE_SECONDS or len(self._running) >= MAX_IN_FLIGHT:
            return False
        vector: asyncio.Future[list[float] | None] = asyncio.get_running_loop().create_future()
        self._keep(memory.id, vector)
        task = asyncio.create_task(self._embed(agent_id, backend, memory.model_copy(), vector))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return True

    def vector(self, memory_id: str) -> Awaitable[list[float] | None] | None:
        """The run embedding ``memory_id`` (its vector, or None if the model failed), or None
        when this process started none (or dropped it)."""
        kept = self._kept.get(memory_id)
        if kept is None or time.monotonic() - kept[0] > KEEP_SECONDS:
            return None
        return asyncio.shield(kept[1])  # a block past its deadline does not cancel the run

    async def close(self) -> None:
        """Stop the runs in progress (their messages wait for the worker, as before); a block
        still awaiting one is answered None (a run cancelled before it began never answers)."""
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        for _, vector in self._kept.values():
            if not vector.done():
                vector.set_result(None)
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    def _keep(self, memory_id: str, vector: asyncio.Future[list[float] | None]) -> None:
        self._kept[memory_id] = (time.monotonic(), vector)
        self._kept.move_to_end(memory_id)
        self._drop()
        if self._sweep is None:  # an idle process drops them too, once they expire
            self._sweep = asyncio.get_running_loop().call_later(KEEP_SECONDS, self._swept)

    def _swept(self) -> None:
        self._sweep = None
        self._drop()
        if self._kept:
            oldest = next(iter(self._kept.values()))[0]
            self._sweep = asyncio.get_running_loop().call_later(
                max(0.0, oldest + KEEP_SECONDS - time.monotonic()), self._swept)

    def _drop(self) -> None:
        """Drop the kept vectors past ``MAX_KEPT`` or ``KEEP_SECONDS`` (the oldest are first)."""
        now = time.monotonic()
        while self._kept and (len(self._kept) > MAX_KEPT or now - next(iter(self._kept.values()))[0] > KEEP_SECONDS):
            _, (_, dropped) = self._kept.popitem(last=False)
            if not dropped.done():  # a block awaiting it embeds the message itself; the run still stores it
                dropped.set_result(None)

    async def _embed(self, agent_id: str, backend: MemoryBackend, memory: Memory,
                     vector: asyncio.Future[list[float] | None]) -> None:
        embedder, state = self.embedder, self.state
        assert embedder is not None and state is not None

        def embedded(turn: object) -> None:  # the block need not wait for the store's write
            if not vector.done():
                vector.set_result(memory.embedding)

        stored = 0
        try:
            stored = (await embed_once(embedder, state.embed_claims, backend, agent_id, [memory], 1, embedded)).stored
        except Exception as exc:  # the worker's job embeds it, as before
            log.warning("embedding a live message failed; the worker embeds it: %s", exc)
        finally:
            if not vector.done():
                vector.set_result(memory.embedding)  # None: the model failed, or another process claimed it
        if stored:
            try:
                await state.add_metrics(embedded_at_record=stored)
            except Exception as exc:
                log.warning("could not count a live message's embedding: %s", exc)
