"""Pacing bulk work: one agent's batches give way to other agents' requests in the process.

Admission (memory_service/http/overload.py) gives each agent a share of the requests a
process runs at once, but what it admits shares one event loop and one store. A batch of
hundreds of messages is CPU on the loop (its items read and checked, its statements built)
and long pipelines in the store, done with no await between their parts: a neighbour's
request, whose every round trip waits behind whatever of the batches is ready, took 10-30x
its unloaded time while one agent sent batches, though it was admitted at once.

So bulk work (a batch) is done in bounded steps (at most BATCH_STEP_MESSAGES messages and
BATCH_STEP_CHARS characters of content, ``steps``; memory_service/ingest/batch.py and the
batch route), each inside ``async with step()``:

- at most API_BULK_STEPS_AT_ONCE steps run at once in the process, whoever's batches they
  are (first come, first served): a request arriving finds at most that much bulk work under
  way, whatever the agents' shares of admission let in;
- before it runs, a step gives way (``give_way``): while another agent's *interactive*
  request (any admitted request that is not bulk) is in flight in this process, it waits
  until none is, for at most API_BULK_PAUSE_SECONDS. The neighbour's request finds the loop
  and the store with at most the step under way, and the batch goes on as soon as it is
  answered. An agent's own requests, and other agents' batches, never make it wait, and the
  bound keeps bulk work going under a flood of small requests: a step per pause at least.

- after it ran, while another agent has been active in the process within the last
  ACTIVE_SECONDS (a request of its in flight, or ended that recently), a step rests before it
  lets the next step go: as long as it took times (1 - share) / share (API_BULK_SHARE; at
  most API_BULK_PAUSE_SECONDS), holding its place among the steps at once. So while other
  agents are about, bulk work takes at most that share of the process's time (0.5: half),
  however many batches wait. Giving way alone only keeps new steps from starting during a
  neighbour's request; the step under way when it arrives, and the heavy agent's demand for
  the CPU (two shared cores: the process waited for a core far longer than it ran), still
  delayed it. A share of 1 (the default: it has not yet been measured to help, on a machine
  too loaded to tell) never rests: batches then take every moment between other agents'
  requests.

A store statement of a batch gives way too (memory_service/ingest/group_commit.py), without
taking a step of its own: the step that wrote its rows holds one.

Who is bulk and whose interactive request is in flight is told by admission, which knows
each request's lane (its agent) before the body is read: ``interactive(lane)`` around an
interactive request, ``bulk(lane)`` around a bulk one; ``bulk`` keeps the lane in the
request's context, where ``step()`` and ``give_way()`` find it (outside a paced request, a
test or a script, neither waits).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from memory_service.state import metrics

T = TypeVar("T")


# How long after its last request an agent still counts as active, for the bulk share.
ACTIVE_SECONDS = 1.0


class Pacing:
    """The interactive requests in flight per lane, and the bulk steps waiting for them."""

    def __init__(self, max_pause: float, steps_at_once: int = 1, share: float = 1.0):
        self.max_pause = max_pause
        self.share = share
        self.steps = asyncio.Semaphore(steps_at_once)
        self._interactive: Counter[str] = Counter()
        self._total = 0
        self._waiters: set[asyncio.Future[None]] = set()
        self._last_seen: dict[str, float] = {}  # lane -> when its last interactive request ended (loop time)

    def others_busy(self, lane: str) -> bool:
        """Whether an interactive request of a lane other than ``lane`` is in flight."""
        return self._total > self._interactive.get(lane, 0)

    def others_active(self, lane: str) -> bool:
        """Whether another lane than ``lane`` has an interactive request in flight, or had
        one end within ACTIVE_SECONDS."""
        if self.others_busy(lane):
            return True
        since = asyncio.get_running_loop().time() - ACTIVE_SECONDS
        for other, seen in list(self._last_seen.items()):
            if seen < since:
                del self._last_seen[other]
            elif other != lane:
                return True
        return False

    def rest_for(self, lane: str, spent: float) -> float:
        """How long a step of ``lane`` that took ``spent`` seconds rests (see the module's docstring)."""
        if self.share >= 1 or spent <= 0 or not self.others_active(lane):
            return 0.0
        return min(spent * (1 - self.share) / self.share, self.max_pause)

    @contextmanager
    def interactive(self, lane: str) -> Iterator[None]:
        self._interactive[lane] += 1
        self._total += 1
        try:
            yield
        finally:
            self._total -= 1
            self._last_seen[lane] = asyncio.get_running_loop().time()
            self._interactive[lane] -= 1
            if not self._interactive[lane]:
                del self._interactive[lane]
            for waiter in self._waiters:  # each checks again whether it may go on
                if not waiter.done():
                    waiter.set_result(None)

    @contextmanager
    def bulk(self, lane: str) -> Iterator[None]:
        token = _BULK.set(_Bulk(self, lane))
        try:
            yield
        finally:
            _BULK.reset(token)

    async def pause(self, lane: str) -> None:
        """Wait while another lane's interactive request is in flight, at most ``max_pause``."""
        if self.max_pause <= 0 or not self.others_busy(lane):
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            while self.others_busy(lane):
                left = started + self.max_pause - loop.time()
                if left <= 0:
                    return
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiters.add(waiter)
                try:
                    async with asyncio.timeout(left):
                        await waiter
                except TimeoutError:
                    return
                finally:
                    self._waiters.discard(waiter)
        finally:
            metrics.BULK_PAUSE_SECONDS.inc(loop.time() - started)


@dataclass(frozen=True, slots=True)
class _Bulk:
    pacing: Pacing
    lane: str


_BULK: ContextVar[_Bulk | None] = ContextVar("memory_service_bulk", default=None)


async def give_way() -> None:
    """Before bulk work: wait while another agent's request is in flight (see the module's
    docstring); at once outside a paced bulk request."""
    bulk = _BULK.get()
    if bulk is not None:
        await bulk.pacing.pause(bulk.lane)


@asynccontextmanager
async def step() -> AsyncIterator[None]:
    """One step of bulk work: one of the process's API_BULK_STEPS_AT_ONCE, after giving way,
    resting after it for the bulk share while other agents are active."""
    bulk = _BULK.get()
    if bulk is None:
        yield
        return
    pacing = bulk.pacing
    async with pacing.steps:
        await pacing.pause(bulk.lane)
        loop = asyncio.get_running_loop()
        started = loop.time()
        yield
        rest = pacing.rest_for(bulk.lane, loop.time() - started)
        if rest > 0:  # the bulk share: holding its place, so no other step runs meanwhile
            await asyncio.sleep(rest)
            metrics.BULK_PAUSE_SECONDS.inc(rest)


def steps(items: Sequence[T], size: int, chars: int, length: Callable[[T], int]) -> list[slice]:
    """``items`` cut into steps of at most ``size`` items and ``chars`` characters (by
    ``length``; an item longer than ``chars`` is a step alone), in order."""
    bounds: list[slice] = []
    start, held = 0, 0
    for index, item in enumerate(items):
        n = length(item)
        if index > start and (index - start >= size or held + n > chars):
            bounds.append(slice(start, index))
            start, held = index, 0
        held += n
    if start < len(items):
        bounds.append(slice(start, len(items)))
    return bounds
