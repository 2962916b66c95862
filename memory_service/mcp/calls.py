"""What every tool of `memory-service mcp` does around its API requests, whichever profile
serves it (server.py's memory tools, reference.py's knowledge-graph tools): pick the key a
call is made with (over HTTP the caller's own) and turn what went wrong into the tool's
error result, named, so that the model reads why and nothing else leaks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from memory_service.client import AsyncMemoryClient, MemoryApiError

T = TypeVar("T")


class Api:
    """The API as the tools reach it: ``client`` for the calls, with ``pass_through_keys``
    a request's own ``Authorization: Bearer`` key (HTTP) replacing the client's for that call."""

    def __init__(self, client: AsyncMemoryClient, *, pass_through_keys: bool) -> None:
        self._client = client
        self._pass_through_keys = pass_through_keys

    def client(self, ctx: Context) -> AsyncMemoryClient:
        if not self._pass_through_keys:
            return self._client
        header = (ctx.headers or {}).get("authorization")
        if header is None:
            return self._client
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ToolError("the Authorization header must be 'Bearer <memory-service API key>'")
        return self._client.with_api_key(key.strip())

    async def call(self, request: Callable[[], Awaitable[T]]) -> T:
        """``request()`` (one API call or several), its failures as the tool's error result."""
        try:
            return await request()
        except MemoryApiError as exc:  # the API's refusal, named
            raise ToolError(f"memory-service answered {exc.status} ({type(exc).__name__}): {exc.detail}") from None
        except httpx.TransportError as exc:  # the API is down or unreachable: say so, not a traceback
            raise ToolError(f"memory-service at {self._client.base_url} did not answer "
                            f"({type(exc).__name__}: {exc or 'no detail'})") from None
