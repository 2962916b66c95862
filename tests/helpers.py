"""Small builders shared by the tests."""

import asyncio
import time
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from memory_service.domain.models import MessageIn
from memory_service.state import keyspace

T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)


def msg(agent: str, user: str, content: str, *, role: str = "user", mid: str | None = None, minute: int = 0, **extra) -> MessageIn:
    return MessageIn(agent_id=agent, user_id=user, role=role, content=content, message_id=mid,
                     created_at=T0 + timedelta(minutes=minute), **extra)


async def record_all(service, session_id: str, agent: str, lines: list[tuple[str, str, str]]):
    """Record (user, role, content) lines with ids '<session>-<i>'; return the results."""
    return [
        await service.record_message(session_id, msg(agent, user, content, role=role, mid=f"{session_id}-{i}", minute=i))
        for i, (user, role, content) in enumerate(lines)
    ]


async def wait_embedded(service, agent_id: str, timeout: float = 60) -> None:
    """Until the worker has embedded every memory of the agent: a record is acknowledged
    before its embedding, which its agent's embedding job adds (docs/ingest.md). A bound,
    not a speed check."""
    import asyncio

    _, backend = await service.agents.backend_for(agent_id)
    for _ in range(int(timeout / 0.05)):
        if not await backend.unembedded(agent_id, 1):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"memories of agent {agent_id!r} still unembedded after {timeout}s")


async def watch_queries(service, agent_id: str) -> tuple[list[str], list[tuple[Any, list[str]]]]:
    """From now on, the texts the service embeds as queries, and each search the agent's
    backend runs (its store query and the signals that answered): the two calls wrapped."""
    embedder, backend = service.retriever.embedder, (await service.agents.backend_for(agent_id))[1]
    embedded: list[str] = []
    searches: list[tuple[Any, list[str]]] = []
    embed, search = embedder.embed, backend.search

    async def counting_embed(texts, *, query=False):
        embedded.extend(texts if query else [])
        return await embed(texts, query=query)

    async def counting_search(agent, store_query):
        hits = await search(agent, store_query)
        searches.append((store_query, sorted(hits)))
        return hits

    embedder.embed, backend.search = counting_embed, counting_search
    return embedded, searches


async def wait_embedding_idle(url: str, agent_id: str, timeout: float = 60) -> None:
    """Until the agent's embedding job has finished and let go of its lock: a test that
    compares the store before and after a request must not see that job's writes."""
    import asyncio

    from .conftest import state_redis

    redis = state_redis(url)  # the cluster's, when the suite's state is on one
    try:
        for _ in range(int(timeout / 0.05)):
            if not await redis.exists(keyspace.embed_due(agent_id), keyspace.embed_lock(agent_id)):
                return
            await asyncio.sleep(0.05)
    finally:
        await redis.aclose()
    raise AssertionError(f"the embedding job of agent {agent_id!r} still runs after {timeout}s")


async def queued_jobs(service, function: str) -> int:
    """Jobs of ``function`` in the queue. arq's ``queued_jobs`` raises when a listed job
    finishes before it is read: the list is read again."""
    for _ in range(20):
        try:
            return len([j for j in await service.queue.pool.queued_jobs() if j.function == function])
        except RuntimeError:  # 'job ... not found': it completed meanwhile
            await asyncio.sleep(0.01)
    raise AssertionError(f"the queue of {function} jobs kept changing under every read")


async def queued_formations(service) -> int:
    """Formation jobs in the queue (records also enqueue their agent's embedding job)."""
    from memory_service.formation.jobs import FORM_JOB

    return await queued_jobs(service, FORM_JOB)


async def outbox_drained(backend, timeout: float = 30) -> None:
    """Until a mirrored backend's outbox holds nothing (a bound, not a speed check)."""
    for _ in range(int(timeout / 0.05)):
        if not any((await backend.outbox.depth()).values()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"outbox not drained: {await backend.outbox.depth()}")


@asynccontextmanager
async def mirrored_service(settings, mongo_uri: str, mongo_database: str, directory, **overrides):
    """A service with a worker whose graph, an embedded store of its own in ``directory``, is
    mirrored to MongoDB (state stays on the suite's store): yields (service, the graph's URL)."""
    from pydantic import SecretStr

    from memory_service.backends.embedded import EmbeddedFalkorDB
    from memory_service.runtime import open_service

    graph = EmbeddedFalkorDB(directory)
    graph.start()
    config = settings.model_copy(update={
        "falkordb_url": graph.url, "redis_url": settings.falkordb_url, "mongodb_uri": SecretStr(mongo_uri),
        "mongodb_database": mongo_database, "outbox_drain_seconds": 0.1, **overrides})
    try:
        async with open_service(config, run_worker=True) as service:
            yield service, graph.url
    finally:
        graph.stop()


def shows_episode(xml: str) -> bool:
    """Whether a memory block shows an episode: as an <Episode>, or folded into the item that
    shows its every sentence (``also="... episode"``: each thing is shown once)."""
    from xml.etree import ElementTree as ET

    root = ET.fromstring(xml)
    return root.find(".//Episode") is not None or any("episode" in (e.get("also") or "").split() for e in root.iter())


async def until_healthy(http, process, seconds: float, log_tail, pause: float = 0.2) -> None:
    """Wait until a server started as ``process`` answers ``/health`` 200 through ``http``;
    fail with ``log_tail()`` (its log's end) if it exits or ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if (await http.get("/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, log_tail()
        await asyncio.sleep(pause)
