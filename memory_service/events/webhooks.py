"""An agent's webhooks: where its change events are POSTed, with the secret that signs them,
their delivery state and their dead letters (what the worker gave up delivering).

A webhook's URL must be http(s) and, unless WEBHOOK_ALLOW_PRIVATE, name no loopback,
private, link-local, multicast or reserved address, checked on registration (a refusal is a
422 and stores nothing) and again before each delivery (a name may resolve elsewhere later):
the service must not be made to POST into the network it runs in (SSRF).

The secret is stored (the worker signs with it) and never answered back. Keys: a hash of the
agent's webhooks, and per webhook its delivery state, dead letters and replays, all on the
agent's ``{ev:<agent>}`` slot (memory_service/state/keyspace.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from typing import cast
from urllib.parse import urlsplit

from redis.asyncio import Redis

from memory_service.domain.errors import Conflict, InvalidInput, NotFound, preview
from memory_service.schemas.events import DeadLetter, DeadLetterPage, Event, WebhookIn, WebhookOut
from memory_service.state import keyspace


def _blocked(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
            or ip.is_unspecified)


async def check_url(url: str, allow_private: bool) -> None:
    """InvalidInput unless ``url`` is an http(s) URL whose host may be reached (every address
    it resolves to public, unless ``allow_private``)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(f"url: not a URL ({exc})") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"url: {preview(url)} is not an http(s) URL with a host")
    if parts.username or parts.password:
        raise InvalidInput("url: credentials in the URL are refused (the signature authenticates the service)")
    if allow_private:
        return
    host = parts.hostname
    try:
        addresses = [host] if _is_ip(host) else [
            str(info[4][0]) for info in await asyncio.get_running_loop().getaddrinfo(
                host, port or (443 if parts.scheme.lower() == "https" else 80), type=socket.SOCK_STREAM)]
    except OSError:
        raise InvalidInput(f"url: the host {preview(host)} does not resolve") from None
    if not addresses or any(_blocked(a) for a in addresses):
        raise InvalidInput(f"url: {preview(host)} is a loopback, private or reserved address; the operator allows "
                           "those with WEBHOOK_ALLOW_PRIVATE")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _time(value: str | None) -> datetime | None:
    return datetime.fromtimestamp(float(value), UTC) if value else None


class Webhooks:
    """The agents' webhooks in Redis (``redis``: the state store's client, decoding)."""

    def __init__(self, redis: Redis, allow_private: bool, max_per_agent: int):
        self.redis, self.allow_private, self.max_per_agent = redis, allow_private, max_per_agent

    async def put(self, agent_id: str, hook_id: str, body: WebhookIn) -> tuple[WebhookOut, bool]:
        """(the webhook, whether it is new). Replacing one keeps its cursor and dead letters."""
        await check_url(body.url, self.allow_private)
        hooks = keyspace.webhooks(agent_id)
        existing = cast(str | None, await self.redis.hget(hooks, hook_id))
        if existing is None and await self.redis.hlen(hooks) >= self.max_per_agent:
            raise Conflict(f"agent {preview(agent_id)} has {self.max_per_agent} webhooks already "
                           "(WEBHOOK_MAX_PER_AGENT); delete one first")
        created = json.loads(existing)["created_at"] if existing else datetime.now(UTC).timestamp()
        record = {"url": body.url, "secret": body.secret, "created_at": created}
        delivery = keyspace.webhook_delivery(agent_id, hook_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(hooks, hook_id, json.dumps(record))
            if existing is None:  # a new webhook gets the events from now on, not the stream's past
                last = cast(list[tuple[str, object]], await self.redis.xrevrange(keyspace.event_stream(agent_id),
                                                                                count=1))
                pipe.hset(delivery, mapping={"cursor": last[0][0] if last else "0-0", "attempts": 0})
            await pipe.execute()
        await self.redis.sadd(keyspace.HOOK_AGENTS, agent_id)
        return await self.get(agent_id, hook_id), existing is None

    async def record(self, agent_id: str, hook_id: str) -> dict[str, str | float]:
        """The stored webhook (with its secret); NotFound."""
        raw = cast(str | None, await self.redis.hget(keyspace.webhooks(agent_id), hook_id))
        if raw is None:
            raise NotFound(f"agent {preview(agent_id)} has no webhook {preview(hook_id)}")
        return cast(dict[str, str | float], json.loads(raw))

    async def ids(self, agent_id: str) -> list[str]:
        return sorted(cast(list[str], await self.redis.hkeys(keyspace.webhooks(agent_id))))

    async def get(self, agent_id: str, hook_id: str) -> WebhookOut:
        record = await self.record(agent_id, hook_id)
        state = cast(dict[str, str], await self.redis.hgetall(keyspace.webhook_delivery(agent_id, hook_id)))
        dead = await self.redis.hlen(keyspace.webhook_dead(agent_id, hook_id))
        return WebhookOut(id=hook_id, agent_id=agent_id, url=str(record["url"]),
                          created_at=datetime.fromtimestamp(float(record["created_at"]), UTC),
                          cursor=state.get("cursor") or None, attempts=int(state.get("attempts") or 0),
                          next_attempt_at=_time(state.get("next_at")), last_error=state.get("last_error") or None,
                          dead_letters=dead)

    async def list(self, agent_id: str) -> list[WebhookOut]:
        return [await self.get(agent_id, hook_id) for hook_id in await self.ids(agent_id)]

    async def delete(self, agent_id: str, hook_id: str) -> None:
        """Delete the webhook, its delivery state and its dead letters; NotFound."""
        await self.record(agent_id, hook_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(keyspace.webhooks(agent_id), hook_id)
            pipe.delete(keyspace.webhook_delivery(agent_id, hook_id), keyspace.webhook_dead(agent_id, hook_id),
                        keyspace.webhook_replay(agent_id, hook_id))
            await pipe.execute()
        if not await self.ids(agent_id):
            await self.redis.srem(keyspace.HOOK_AGENTS, agent_id)

    async def dead_letters(self, agent_id: str, hook_id: str) -> DeadLetterPage:
        await self.record(agent_id, hook_id)
        dead = cast(dict[str, str], await self.redis.hgetall(keyspace.webhook_dead(agent_id, hook_id)))
        replay = cast(dict[str, str], await self.redis.hgetall(keyspace.webhook_replay(agent_id, hook_id)))
        letters = [DeadLetter.model_validate({**json.loads(raw), "replaying": False}) for raw in dead.values()]
        letters += [DeadLetter.model_validate({**json.loads(raw), "replaying": True}) for raw in replay.values()]
        return DeadLetterPage(dead_letters=sorted(letters, key=lambda d: _order(d.event.id)))

    async def replay(self, agent_id: str, hook_id: str, event_id: str) -> None:
        """Hand the dead letter back to the worker, which delivers it once more (a failure
        makes it a dead letter again); NotFound."""
        await self._move(agent_id, hook_id, event_id, keyspace.webhook_dead, keyspace.webhook_replay)

    async def drop(self, agent_id: str, hook_id: str, event_id: str) -> None:
        await self.record(agent_id, hook_id)
        removed = await self.redis.hdel(keyspace.webhook_dead(agent_id, hook_id), event_id)
        removed += await self.redis.hdel(keyspace.webhook_replay(agent_id, hook_id), event_id)
        if not removed:
            raise NotFound(f"webhook {preview(hook_id)} has no dead letter {preview(event_id)}")

    async def forget(self, agent_id: str, doomed: Callable[[Event], bool]) -> int:
        """Drop the dead letters (and replays) of the agent's webhooks whose event ``doomed``
        judges (an erasure's, a purge's); how many."""
        dropped = 0
        for hook_id in await self.ids(agent_id):
            for key in (keyspace.webhook_dead(agent_id, hook_id), keyspace.webhook_replay(agent_id, hook_id)):
                held = cast(dict[str, str], await self.redis.hgetall(key))
                gone = [i for i, raw in held.items() if doomed(Event.model_validate(json.loads(raw)["event"]))]
                if gone:
                    dropped += await self.redis.hdel(key, *gone)
        return dropped

    async def _move(self, agent_id: str, hook_id: str, event_id: str, source: object, target: object) -> None:
        await self.record(agent_id, hook_id)
        src, dst = source(agent_id, hook_id), target(agent_id, hook_id)  # type: ignore[operator]
        raw = cast(str | None, await self.redis.hget(src, event_id))
        if raw is None:
            if await self.redis.hexists(dst, event_id):
                return  # asked twice: already moved
            raise NotFound(f"webhook {preview(hook_id)} has no dead letter {preview(event_id)}")
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(dst, event_id, raw)
            pipe.hdel(src, event_id)
            await pipe.execute()


def _order(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)
