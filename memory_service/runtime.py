"""Wiring: build a MemoryService from Settings, on the embedded default or configured URLs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memory_service.backends.embedded import EmbeddedFalkorDB
from memory_service.config import Settings
from memory_service.embedding.embedders import Embedder
from memory_service.formation.jobs import JobQueue
from memory_service.recall.rerank import start_reranker
from memory_service.service import MemoryService
from memory_service.state import metrics, tracing
from memory_service.state.store import StateStore

if TYPE_CHECKING:
    from memory_service.backends.base import MemoryBackend
    from memory_service.backends.mongo import MongoBackend
    from memory_service.formation.consolidation import Consolidator
    from memory_service.formation.extractor import Extractor

log = logging.getLogger(__name__)


def _graph_backend(settings: Settings, state: StateStore, embedding_dimension: int | None = None,
                   untagged_model: str | None = None) -> MemoryBackend:
    """The graph backend; with MONGODB_URI set (and MIRROR_TO_MONGO), mirrored to MongoDB."""
    from memory_service.backends.graph import GraphBackend

    if not settings.falkordb_url:
        raise RuntimeError("FALKORDB_URL is not set and no embedded server was started")
    graph = GraphBackend(settings.falkordb_url, settings, embedding_dimension=embedding_dimension,
                         untagged_model=untagged_model)
    if not (settings.mongodb_uri and settings.mirror_to_mongo):
        return graph
    from memory_service.backends.breaker import CircuitBreaker
    from memory_service.backends.mirror import MirroredBackend
    from memory_service.backends.outbox import TARGETS, Outbox

    outbox = Outbox(state.redis, TARGETS, max_attempts=settings.outbox_max_attempts,
                    alarm_pending=settings.outbox_alarm_pending, max_pending=settings.outbox_max_pending)
    breaker = CircuitBreaker("mongo", failures=settings.mongo_breaker_failures,
                             window=settings.mongo_breaker_window_seconds, cooloff=settings.mongo_breaker_cooloff_seconds)
    return MirroredBackend(graph, _mongo_backend(settings, embedding_dimension, untagged_model), outbox,
                           drain_seconds=settings.outbox_drain_seconds, breaker=breaker,
                           fallback_timeout=settings.mongo_fallback_timeout_seconds,
                           mongo_only=lambda agent_id: state.named_backend(agent_id, "mongo"))


def _mongo_backend(settings: Settings, embedding_dimension: int | None = None,
                   untagged_model: str | None = None) -> MongoBackend:
    from memory_service.backends.mongo import MongoBackend

    if settings.mongodb_uri is None:  # registered only when it is set
        raise RuntimeError("MONGODB_URI is not set")
    return MongoBackend(settings.mongodb_uri.get_secret_value(), settings.mongodb_database,
                        server_selection_timeout_ms=_ms(settings.mongo_server_selection_timeout_seconds),
                        connect_timeout_ms=_ms(settings.mongo_connect_timeout_seconds),
                        socket_timeout_ms=_ms(settings.mongo_socket_timeout_seconds),
                        facts_per_shard=settings.facts_per_shard, embedding_dimension=embedding_dimension,
                        untagged_model=untagged_model)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _llm_options(settings: Settings) -> dict[str, Any]:
    # Keyword arguments of LLMExtractor and StructuredChat (which check the URL and model).
    return {
        "base_url": settings.llm_base_url,
        "model": settings.llm_model,
        "api_key": settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
        "timeout_seconds": settings.llm_timeout_seconds,
        "connect_timeout_seconds": settings.http_connect_timeout_seconds,
        "max_attempts": settings.llm_max_attempts,
    }


def default_extractor(settings: Settings) -> Extractor:
    """The extractor the operator chose: rule-based (the offline default) or an LLM."""
    if settings.extractor == "llm":
        from memory_service.formation.llm_extractor import LLMExtractor

        return LLMExtractor(**_llm_options(settings), known_entities=settings.llm_known_entities,
                            known_facts=settings.llm_known_facts)
    from memory_service.formation.rule_extractor import RuleBasedExtractor

    return RuleBasedExtractor()


def default_consolidator(settings: Settings) -> Consolidator:
    """How pending items are merged: by rule, or by the LLM (by default, as the extractor)."""
    if settings.effective_consolidator == "llm":
        from memory_service.formation.llm_client import StructuredChat
        from memory_service.formation.llm_consolidator import LLMConsolidator

        return LLMConsolidator(StructuredChat(**_llm_options(settings)))
    from memory_service.formation.consolidation import RuleBasedConsolidator

    return RuleBasedConsolidator()


async def start_embedder(settings: Settings, state: StateStore) -> Embedder:
    """The configured embedder, started, and checked against the vectors already stored.

    Stored vectors of another dimension cannot be searched with this embedder's: refuse to
    start (loudly) rather than store vectors that no index can hold. Another model of the
    same dimension starts, with a warning: each vector carries its model's name and search
    compares like with like (docs/embeddings.md, "Changing the model").
    """
    from memory_service.embedding.embedders import build_embedder

    embedder: Embedder = TimedEmbedder(build_embedder(settings))
    await embedder.start()
    stored = await state.record_embedder(embedder.name, embedder.dimension)
    if stored is not None:
        name, dimension = stored
        if dimension != embedder.dimension:
            await embedder.aclose()
            raise RuntimeError(
                f"the configured embedder {embedder.name} gives {embedder.dimension}-dimensional vectors, but this "
                f"store holds {dimension}-dimensional vectors of {name}; configure {name} again (EMBEDDER, "
                "EMBEDDING_MODEL), or start on an empty store"
            )
        if name != embedder.name:
            log.warning("the configured embedder %s differs from %s, which embedded the stored memories: vector "
                        "search compares a query only with vectors of its own model, so until `memory-service "
                        "reembed` has converted them, memories embedded by %s are found by full text alone",
                        embedder.name, name, name)
    return embedder


class TimedEmbedder:
    """The configured embedder, each call observed (operation ``embedding``) and spanned."""

    def __init__(self, inner: Embedder):
        self.inner = inner
        self.name, self.dimension = inner.name, inner.dimension

    async def start(self) -> None:
        await self.inner.start()
        self.dimension = self.inner.dimension  # an endpoint may learn it at start

    async def embed(self, texts: Sequence[str], *, query: bool = False) -> list[list[float]]:
        with metrics.timed("embedding"), tracing.span("memory_service.embed", texts=len(texts)):
            return await self.inner.embed(texts, query=query)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __getattr__(self, name: str) -> Any:  # batch sizes and the like of the embedder itself
        return getattr(self.inner, name)


async def wait_for_stores(settings: Settings) -> None:
    """Wait until FalkorDB and Redis answer PING, retrying with backoff (0.25 s doubling to
    5 s) for up to STORE_STARTUP_WAIT_SECONDS; a line per failed try says what is awaited.
    A store that refuses the connection's credentials, or answers with an error other than
    LOADING, is not waited for: that does not get better by waiting."""
    from redis.exceptions import BusyLoadingError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from memory_service.config import redact_url
    from memory_service.domain.errors import BackendUnavailable
    from memory_service.state.pools import redis_client

    stores = {"graph (FALKORDB_URL)": settings.falkordb_url, "state (REDIS_URL)": settings.redis_url}
    deadline = time.monotonic() + settings.store_startup_wait_seconds
    seen: set[str] = set()
    for name, url in stores.items():
        if not url or url in seen:
            continue
        seen.add(url)
        client = redis_client(url, settings, state=url == settings.redis_url)
        delay, attempt = 0.25, 0
        try:
            while True:
                attempt += 1
                try:
                    await client.ping()
                    if attempt > 1:
                        log.info("the %s store at %s answers (after %d tries)", name, redact_url(url), attempt)
                    break
                except (RedisConnectionError, RedisTimeoutError, BusyLoadingError, OSError) as exc:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BackendUnavailable(
                            f"the {name} store at {redact_url(url)} did not answer within STORE_STARTUP_WAIT_SECONDS="
                            f"{settings.store_startup_wait_seconds:g} ({attempt} tries): {type(exc).__name__}: {exc}") from exc
                    wait = min(delay, left)
                    log.warning("waiting for the %s store at %s: try %d failed (%s: %s); next try in %.2fs, giving up "
                                "in %.0fs", name, redact_url(url), attempt, type(exc).__name__, exc, wait, left)
                    await asyncio.sleep(wait)
                    delay = min(delay * 2, 5.0)
        finally:
            await client.aclose()

async def check_keyspace(state: StateStore) -> None:
    """Warn when the state holds keys of an older layout (memory_service/state/upgrade.py);
    else record the current one."""
    from memory_service.state import upgrade

    try:
        if await upgrade.stale_layout(state.redis):
            log.error("the state store holds keys of an older layout, which this release does not read: stop "
                      "the service and run `memory-service upgrade-keyspace` (docs/operations.md)")
        else:
            await upgrade.mark_current(state.redis)
    except Exception as exc:  # Redis down at start: the service degrades on its own
        log.warning("could not check the keyspace's layout: %s", exc)


@asynccontextmanager
async def open_service(
    settings: Settings | None = None, data_dir: Path | None = None, run_worker: bool | None = None
) -> AsyncIterator[MemoryService]:
    """A running MemoryService; starts (and later stops) the embedded store if no URL is set.

    ``run_worker`` runs an arq worker in this process; by default it does on the embedded
    default (one command, a working service) and not when the stores are configured,
    where workers run as their own processes (``memory-service worker``).
    """
    settings = (settings or Settings()).model_copy()
    embedded = None
    if not settings.falkordb_url:
        embedded = EmbeddedFalkorDB(data_dir or settings.memory_data_dir)
        settings.falkordb_url = embedded.start()
    if run_worker is None:
        run_worker = embedded is not None
    settings.redis_url = settings.redis_url or settings.falkordb_url
    worker = None
    try:
        if embedded is None:  # configured stores may start after this process (compose, Kubernetes)
            await wait_for_stores(settings)
        queue = await JobQueue.connect(settings.job_queue_url(), settings)
        state = StateStore.from_url(settings.redis_url, settings)
        await check_keyspace(state)
        try:
            embedder = await start_embedder(settings, state)
        except BaseException:
            await state.close()
            await queue.close()
            raise
        reranker = await start_reranker(settings)  # None when it cannot load: search runs on fusion alone
        service = MemoryService(settings, state, default_extractor(settings), queue,
                                default_consolidator(settings), embedder=embedder, reranker=reranker)
        untagged = await state.untagged_model()
        service.register_backend("graph", lambda s: _graph_backend(s, service.state, embedder.dimension, untagged))
        await service.pseudonyms.key()  # loaded now: log lines name users by its digests
        await service.index_for_browsing()  # what an older release stored, once
        if settings.mongodb_uri:
            service.register_backend("mongo", lambda s: _mongo_backend(s, embedder.dimension, untagged))
        try:
            await service.registry.get(settings.default_memory_backend)  # fail at start, not on the first call
            if run_worker:
                from memory_service.workers.worker import InProcessWorker

                worker = InProcessWorker(service)
                worker.start()
            yield service
        finally:
            try:
                if worker:
                    await worker.stop()
            finally:
                await service.close()
    finally:
        if embedded:
            embedded.stop()
