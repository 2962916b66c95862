"""Access-log lines that name no user and quote no query: the route template, not the path.

uvicorn logs each request as ``<client> - "GET <path>?<query> HTTP/1.1" 200``, and the
paths and query strings of this API hold user ids (``/v1/agents/a/users/eve/export``,
``?user_id=eve``) and users' words (``?query=...``). A filter on the ``uvicorn.access``
logger puts the matched route's template in the path's place
(``GET /v1/agents/{agent_id}/users/{user_id}/export 200``), whatever log configuration the
operator gives uvicorn; a request no route matched is logged as ``(no route)``.

uvicorn writes the line from inside the send call of the request's own task, so the
request's scope reaches the filter through a context variable the middleware sets first.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

ACCESS_LOGGER = "uvicorn.access"
NO_ROUTE = "(no route)"

_request_scope: ContextVar[Scope | None] = ContextVar("memory_service_request_scope", default=None)


def route_template(scope: Scope) -> str:
    """The template of the route that serves ``scope`` (matched now if routing did not
    run, e.g. a request refused by a middleware), else NO_ROUTE."""
    route: Any = scope.get("route")
    if route is None:
        for candidate in getattr(getattr(scope.get("app"), "router", None), "routes", ()):
            try:
                match, _ = candidate.matches(scope)
            except Exception:  # a scope the route cannot read: not this one
                continue
            if match is not Match.NONE:
                route = candidate
                break
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else NO_ROUTE


class RouteTemplateAccessLog(logging.Filter):
    """uvicorn's access line with the route template in place of the path and query."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:  # client, method, path, HTTP version, status
            scope = _request_scope.get()
            record.args = (args[0], args[1], route_template(scope) if scope is not None else NO_ROUTE, args[3], args[4])
        return True


class _RememberScope:
    """Outermost middleware: keeps the request's scope where the access-log filter finds it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            _request_scope.set(scope)
        await self.app(scope, receive, send)


def install(app: Any) -> None:
    """Add the middleware to ``app`` (a Starlette app) and the filter to uvicorn's access
    logger (once per process)."""
    app.add_middleware(_RememberScope)
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, RouteTemplateAccessLog) for f in logger.filters):
        logger.addFilter(RouteTemplateAccessLog())
