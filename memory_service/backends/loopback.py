"""Serving an ASGI app on a free loopback port, inside the running event loop.

The demo serves the API this way; the tests and benchmarks serve the API and the fake LLM
endpoint the same way.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn
from starlette.types import ASGIApp

from memory_service.domain.errors import MemoryServiceError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LoopbackServer:
    def __init__(self, app: ASGIApp, port: int | None = None):
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.task: asyncio.Task[None] | None = None

    async def start(self, timeout: float = 30) -> LoopbackServer:
        self.task = asyncio.create_task(self.server.serve())
        for _ in range(int(timeout / 0.02)):
            if self.server.started:
                return self
            if self.task.done():
                self.task.result()  # raises the start-up error, if it was one
                raise MemoryServiceError("the server stopped during start-up")
            await asyncio.sleep(0.02)
        raise MemoryServiceError(f"the server did not start within {timeout:.0f} s")

    async def stop(self) -> None:
        if self.task is not None:
            self.server.should_exit = True
            await self.task

    async def __aenter__(self) -> LoopbackServer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
