"""The worker's delivery of each agent's change events to its webhooks: at least once, in
order per agent, retried with exponential backoff, then dead-lettered.

Every WEBHOOK_POLL_SECONDS a cron run (memory_service/workers/worker.py) visits the agents with a
webhook, serving up to WEBHOOK_CONCURRENCY webhooks at once: an endpoint that is down (each
try waits out WEBHOOK_TIMEOUT_SECONDS) delays only its own agent's events. Per webhook, under
a lease (two runs never deliver one webhook at once, so its events leave in order):

1. the replays an operator asked for (dead letters handed back), each tried once: a failure
   makes it a dead letter again;
2. the events after the webhook's cursor, oldest first, each POSTed alone (a JSON event,
   signed: memory_service/events/signing.py). A 2xx advances the cursor past it; a failure
   counts an attempt and waits WEBHOOK_RETRY_BASE_SECONDS * 2^(attempts-1) (at most
   WEBHOOK_RETRY_MAX_SECONDS) before the same event is tried again, the later events
   waiting behind it (order per agent). After WEBHOOK_MAX_ATTEMPTS the event becomes a dead
   letter (with its last error) and the cursor moves past it, in one transaction.

So an event is delivered at least once: the cursor moves only after a 2xx (or the dead
letter is stored); a worker dying between the 2xx and the cursor's move sends it again, with
the same event id. Events the stream trimmed (EVENTS_STREAM_MAXLEN) before a webhook far
behind got them are not delivered; the webhook's cursor then jumps to the oldest kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import cast

import httpx
from redis.asyncio import Redis

from memory_service.config import Settings
from memory_service.domain.errors import InvalidInput
from memory_service.events.log import EventLog
from memory_service.events.signing import EVENT_ID_HEADER, EVENT_TYPE_HEADER, SIGNATURE_HEADER, sign
from memory_service.events.webhooks import Webhooks, check_url
from memory_service.schemas.events import Event
from memory_service.state import keyspace

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 300

# Release the lease only if it is still ours (a run outliving its lease must not end the next one's).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Delivery:
    def __init__(self, settings: Settings, redis: Redis, events: EventLog, webhooks: Webhooks):
        self.settings, self.redis, self.events, self.webhooks = settings, redis, events, webhooks
        self._release = redis.register_script(_RELEASE)

    async def run(self) -> dict[str, int]:
        """One pass over every webhook; its counts (delivered, failed, dead)."""
        counts = {"delivered": 0, "failed": 0, "dead": 0}
        timeout = self.settings.webhook_timeout_seconds
        room = asyncio.Semaphore(self.settings.webhook_concurrency)

        async def serve(client: httpx.AsyncClient, agent_id: str, hook_id: str) -> None:
            try:
                await self._under_lease(client, agent_id, hook_id, counts)
            except Exception as exc:  # the lease's store failed: the next run tries again
                log.warning("webhook delivery of agent %s skipped: %s", agent_id, exc)
            finally:
                room.release()

        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=False) as client:
            async with asyncio.TaskGroup() as group:
                async for agent_id in self.redis.sscan_iter(keyspace.HOOK_AGENTS, count=500):
                    for hook_id in await self.webhooks.ids(agent_id):
                        await room.acquire()
                        group.create_task(serve(client, agent_id, hook_id))
        return counts

    async def _under_lease(self, client: httpx.AsyncClient, agent_id: str, hook_id: str, counts: dict[str, int]) -> None:
        lock, token = keyspace.webhook_lock(agent_id, hook_id), uuid.uuid4().hex
        s = self.settings
        lease_ms = int(1000 * (s.webhook_timeout_seconds + 1) * (s.webhook_batch + 2))
        if not await self.redis.set(lock, token, nx=True, px=lease_ms):
            return  # another run delivers it
        try:
            await self._deliver(client, agent_id, hook_id, counts)
        except Exception as exc:  # the store failed mid-run: the next run resumes at the cursor
            log.warning("webhook delivery of agent %s stopped: %s", agent_id, exc)
        finally:
            await self._release(keys=[lock], args=[token])

    async def _deliver(self, client: httpx.AsyncClient, agent_id: str, hook_id: str, counts: dict[str, int]) -> None:
        try:
            record = await self.webhooks.record(agent_id, hook_id)
        except LookupError:
            return  # deleted meanwhile
        url, secret = str(record["url"]), str(record["secret"])
        delivery = keyspace.webhook_delivery(agent_id, hook_id)
        dead_key, replay_key = keyspace.webhook_dead(agent_id, hook_id), keyspace.webhook_replay(agent_id, hook_id)
        for event_id, raw in sorted(cast(dict[str, str], await self.redis.hgetall(replay_key)).items()):
            letter = json.loads(raw)
            error = await self._post(client, url, secret, Event.model_validate(letter["event"]))
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hdel(replay_key, event_id)
                if error is not None:
                    pipe.hset(dead_key, event_id, json.dumps({**letter, "attempts": letter["attempts"] + 1,
                                                              "error": error}))
                await pipe.execute()
            counts["failed" if error else "delivered"] += 1

        state = cast(dict[str, str], await self.redis.hgetall(delivery))
        if float(state.get("next_at") or 0) > time.time():
            return  # backing off
        cursor, attempts = state.get("cursor") or "0-0", int(state.get("attempts") or 0)
        for event in await self.events.read(agent_id, cursor, self.settings.webhook_batch):
            error = await self._post(client, url, secret, event)
            if error is None:
                await self.redis.hset(delivery, mapping={"cursor": event.id, "attempts": 0, "next_at": 0,
                                                         "last_error": ""})
                counts["delivered"] += 1
                attempts = 0
                continue
            attempts += 1
            counts["failed"] += 1
            if attempts < self.settings.webhook_max_attempts:
                wait = min(self.settings.webhook_retry_base_seconds * 2 ** (attempts - 1),
                           self.settings.webhook_retry_max_seconds)
                await self.redis.hset(delivery, mapping={"attempts": attempts, "next_at": time.time() + wait,
                                                         "last_error": error})
                return
            letter = {"event": event.model_dump(mode="json"), "attempts": attempts, "error": error,
                      "dead_at": datetime.now(UTC).isoformat()}
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(dead_key, event.id, json.dumps(letter))
                pipe.hset(delivery, mapping={"cursor": event.id, "attempts": 0, "next_at": 0, "last_error": error})
                await pipe.execute()
            counts["dead"] += 1
            log.warning("webhook %s of agent %s: event %s dead-lettered after %d attempts", hook_id, agent_id,
                        event.id, attempts)
            attempts = 0

    async def _post(self, client: httpx.AsyncClient, url: str, secret: str, event: Event) -> str | None:
        """None on a 2xx, else what went wrong (short, for the dead letter)."""
        try:
            await check_url(url, self.settings.webhook_allow_private)  # a name may resolve elsewhere now
        except InvalidInput as exc:
            return str(exc)[:MAX_ERROR_CHARS]
        body = event.model_dump_json().encode()
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(secret, body),
                   EVENT_ID_HEADER: event.id, EVENT_TYPE_HEADER: event.type.value,
                   "User-Agent": "memory-service-webhooks"}
        try:
            answer = await client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS] or type(exc).__name__
        if 200 <= answer.status_code < 300:
            return None
        return f"HTTP {answer.status_code}"
