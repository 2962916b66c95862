"""An agent's change events as server-sent events (``GET /v1/agents/{agent_id}/events``).

Bounded three ways, so that streams cannot take what other requests need:

- each waits in ``XREAD BLOCK`` at most EVENTS_SSE_HEARTBEAT_SECONDS (then sends a heartbeat
  comment, which also finds a client gone), on a connection of a pool of its own of
  EVENTS_SSE_MAX_STREAMS connections: never one of the API's store pool, whose calls must
  not wait behind a stream. Past that many streams in the process, 503 before the stream
  starts (the admission limit does not count streams: memory_service/http/overload.py);
- a stream ends after EVENTS_SSE_MAX_SECONDS (or the caller's shorter ``timeout``); the
  client reconnects with ``Last-Event-ID`` and misses nothing the stream still holds;
- each read takes at most READ_BATCH events.

Each event is ``id: <event id>``, ``event: <type>``, ``data: <JSON event>``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from memory_service.access.reach import Reach
from memory_service.config import Settings
from memory_service.domain.errors import BackendUnavailable
from memory_service.events.log import EventLog, Visibility
from memory_service.state.pools import redis_client

READ_BATCH = 100


class EventStreams:
    def __init__(self, settings: Settings, events: EventLog):
        self.settings, self.events = settings, events
        self.active = 0
        self._client: Redis | None = None

    def _reader(self) -> tuple[Redis, float]:
        """The streams' own pool (created on first use) and how long one read may wait; the
        state's client when no REDIS_URL is known (a service built by hand, not by
        memory_service/runtime.py): its reads then wait less than its read timeout."""
        s = self.settings
        if s.redis_url is None:
            return self.events.redis, min(s.events_sse_heartbeat_seconds, s.store_read_timeout_seconds / 2)
        if self._client is None:
            tuned = s.model_copy(update={
                "redis_max_connections": s.events_sse_max_streams, "redis_pool_timeout_seconds": 1.0,
                "store_read_timeout_seconds": s.store_read_timeout_seconds + s.events_sse_heartbeat_seconds})
            self._client = redis_client(s.redis_url, tuned)
        return self._client, s.events_sse_heartbeat_seconds

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def open(self, agent_id: str, after: str, reach: Reach | None, seconds: float | None) -> AsyncIterator[str]:
        """The stream's text, after checking there is room for it (BackendUnavailable, 503)."""
        if self.active >= self.settings.events_sse_max_streams:
            raise BackendUnavailable(f"this process serves {self.active} event streams (EVENTS_SSE_MAX_STREAMS); "
                                     "try again shortly")
        self.active += 1
        return self._stream(agent_id, after, reach, min(seconds or self.settings.events_sse_max_seconds,
                                                         self.settings.events_sse_max_seconds))

    async def _stream(self, agent_id: str, after: str, reach: Reach | None, seconds: float) -> AsyncIterator[str]:
        try:
            deadline = time.monotonic() + seconds
            visibility = Visibility(reach)
            client, longest = self._reader()
            yield f"retry: 1000\n: events of agent {agent_id} after {after}\n\n"
            while (left := deadline - time.monotonic()) > 0:
                wait = min(left, longest)
                events = await self.events.read(agent_id, after, READ_BATCH, client, max(1, int(wait * 1000)))
                if not events:
                    yield ": heartbeat\n\n"
                    continue
                after = events[-1].id
                for event in await visibility.shown(events):
                    yield f"id: {event.id}\nevent: {event.type.value}\ndata: {event.model_dump_json()}\n\n"
                # A reader shown nothing of a batch still moves on: its next resume starts past it.
                yield f": read to {after}\n\n"
        finally:
            self.active -= 1
