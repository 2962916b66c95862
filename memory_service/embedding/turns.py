"""Turns at a model that runs one call at a time: someone waiting goes before the backlog.

The local model runs one call at a time in its own thread (memory_service/embedding/embedders.py).
Two kinds of work share it: work someone is waiting for (a search's query, the memories a
formation window made, a record-time run in a live session) and the backlog (the embedding
job and the backfill, embedding what was recorded without a vector, hundreds of long turns
at a time). In one queue, a `POST /form?wait=true` right after a session's 20 turns were
recorded waited for the whole of their embedding, about two seconds on two shared cores,
before it could embed the five short memories it formed (bench/form_call.py).

So the backlog takes its turns in small runs, and between two runs a waiting caller goes
first: someone waits at most one backlog run. A task marks its calls as backlog with
``backlog()`` (a context variable, so the embedder's protocol and every embedder other than
the local one are unchanged: a remote endpoint serves calls concurrently, and the hash
embedder does not wait).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar

_BACKLOG: ContextVar[bool] = ContextVar("embedding_backlog", default=False)


@contextmanager
def backlog() -> Iterator[None]:
    """The calls made inside are backlog: they give way to any other caller waiting."""
    token = _BACKLOG.set(True)
    try:
        yield
    finally:
        _BACKLOG.reset(token)


def is_backlog() -> bool:
    return _BACKLOG.get()


class Turns:
    """One holder at a time; when it lets go, the turn goes to the first waiting caller,
    else to the first waiting backlog run. Per event loop (an embedder keeps one for each loop
    that calls it)."""

    def __init__(self) -> None:
        self._busy = False
        self._waiting: dict[bool, deque[asyncio.Future[None]]] = {False: deque(), True: deque()}  # by backlog

    @asynccontextmanager
    async def take(self, backlog: bool) -> AsyncIterator[None]:
        if self._busy or self._waiting[False] or (backlog and self._waiting[True]):
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting[backlog].append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # handed the turn as it was cancelled
                    self._hand_on()
                elif turn in self._waiting[backlog]:  # a hand-on may have passed it by already
                    self._waiting[backlog].remove(turn)
                raise
        else:
            self._busy = True
        try:
            yield
        finally:
            self._hand_on()

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def _hand_on(self) -> None:
        for queue in (self._waiting[False], self._waiting[True]):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)  # the turn passes on: still busy
                    return
        self._busy = False
