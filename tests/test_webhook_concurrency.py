"""Webhook delivery serves the agents' webhooks at once (WEBHOOK_CONCURRENCY), each in order
under its own lease: an endpoint that is slow or down holds up only its own agent's events
(memory_service/events/delivery.py). Real Redis and FalkorDB, the service in process, two
real webhook endpoints on loopback."""

from __future__ import annotations

import asyncio
import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from memory_service.backends.loopback import LoopbackServer
from memory_service.curation.tools import MemoryWrite
from memory_service.domain.models import MemoryKind
from memory_service.runtime import open_service
from memory_service.schemas.events import WebhookIn

from .conftest import flush, suite_settings

SECRET = "s3cret-s3cret-s3cret"
AGENTS = ("north", "south")


class Meeting:
    """Two endpoints that each answer only once the other has been called: a delivery that
    serves one webhook after the other times out on the first one it calls."""

    def __init__(self) -> None:
        self.called = {agent: asyncio.Event() for agent in AGENTS}
        self.got: dict[str, list[dict]] = {agent: [] for agent in AGENTS}

        def endpoint(agent: str, other: str):
            async def hook(request: Request) -> Response:
                self.got[agent].append(json.loads(await request.body()))
                self.called[agent].set()
                await asyncio.wait_for(self.called[other].wait(), 10)
                return Response(status_code=204)
            return hook

        self.app = Starlette(routes=[Route(f"/{a}", endpoint(a, b), methods=["POST"])
                                     for a, b in (AGENTS, AGENTS[::-1])])


async def one_event_each_then_deliver(service, base_url: str) -> dict[str, int]:
    """A webhook for each agent, one event for each, then one delivery run: its counts."""
    for agent in AGENTS:
        await service.put_webhook(agent, "main", WebhookIn(url=f"{base_url}/{agent}", secret=SECRET))
        await service.memory_write(agent, MemoryWrite(namespace=f"agent:{agent}", kind=MemoryKind.OBSERVATION,
                                                      content=f"The {agent} gate opens at nine."))
    return await service.deliver_webhooks()


async def test_two_webhooks_are_served_at_once_so_neither_waits_for_the_other(falkordb_url):
    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, memory_write_agents=["*"], webhook_allow_private=True,
                              webhook_timeout_seconds=3, webhook_retry_base_seconds=60)
    meeting = Meeting()
    async with LoopbackServer(meeting.app) as hooks, open_service(settings, run_worker=False) as service:
        counts = await one_event_each_then_deliver(service, hooks.base_url)
        # One after the other, the first endpoint would wait for the second, time out and fail.
        assert counts == {"delivered": 2, "failed": 0, "dead": 0}
        assert [[e["agent_id"] for e in meeting.got[a]] for a in AGENTS] == [["north"], ["south"]]
        assert [(await service.webhook(a, "main")).attempts for a in AGENTS] == [0, 0]


async def test_one_webhook_at_a_time_is_still_delivered_in_order(falkordb_url):
    """WEBHOOK_CONCURRENCY=1 is the serial delivery: the two endpoints that need each other
    cannot both answer in one run (one fails and is retried later), the other is delivered."""
    await flush(falkordb_url)
    settings = suite_settings(falkordb_url, memory_write_agents=["*"], webhook_allow_private=True,
                              webhook_timeout_seconds=1, webhook_retry_base_seconds=60, webhook_concurrency=1)
    meeting = Meeting()
    async with LoopbackServer(meeting.app) as hooks, open_service(settings, run_worker=False) as service:
        counts = await one_event_each_then_deliver(service, hooks.base_url)
        assert counts["failed"] == 1 and counts["delivered"] == 1
