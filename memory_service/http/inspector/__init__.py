"""The web inspector (docs/inspector.md): a page served at /inspector that shows what the
service holds, why a memory reached a prompt, what formation made of a window, the
knowledge graph around an entity and the audit log.

The page holds no data and no secret. It is one static document (page.html) and its
scripts and styles (static/, which holds assets only: no second copy of the page), which call the same JSON API as any client, with the key typed into the page:
so it never shows more than that key may see, and every refusal is the API's own. The key
lives in a variable of the page's script only, never in cookies or the browser's storage;
a reload forgets it. A cookie would be sent by the browser on its own, which would make
every write route open to cross-site requests; a header the script sets is not.

It is served when ``INSPECTOR`` says so: ``auto`` (the default) on a server bound to
loopback only, ``on`` everywhere, ``off`` never. Its routes are not API operations: they
are left out of the OpenAPI schema (the generated clients and tests/test_access.py's
route list), and tests/test_inspector.py checks them instead.

Every answer under /inspector, the static files and their 404s included, carries the same
SECURITY_HEADERS: a file served without them could be framed or sniffed on its own.

Nothing is fetched from another origin: the libraries it draws with (Chart.js, Cytoscape.js)
are committed under static/vendor/ with their licences (``make inspector-vendor`` copies
them from npm), and the page's Content-Security-Policy allows its own origin only.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memory_service.access.authorization import is_loopback

PAGE = Path(__file__).resolve().parent / "page.html"
STATIC = Path(__file__).resolve().parent / "static"
PATH = "/inspector"

# The page's own origin only: scripts, styles, images, and the API it calls. No inline script
# or style element (Cytoscape.js adds one unless the page has its id: index.html gives it to
# inspector.css, which holds its rule), no frames.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def enabled(setting: str, host: str | None) -> bool:
    """Whether to serve the inspector: ``auto`` on a loopback host only (an unknown host is
    not known to be loopback)."""
    if setting == "on":
        return True
    if setting == "off":
        return False
    return host is not None and is_loopback(host)


def install(app: FastAPI, setting: str, host: str | None) -> bool:
    """Add the page and its static files to ``app`` if ``setting`` and ``host`` say so."""
    if not enabled(setting, host):
        return False
    page = PAGE.read_bytes()
    router = APIRouter(include_in_schema=False)

    @router.get(PATH, response_class=HTMLResponse)
    @router.get(PATH + "/", response_class=HTMLResponse)
    async def inspector_page() -> HTMLResponse:
        return HTMLResponse(page, headers=SECURITY_HEADERS)

    app.include_router(router)
    app.mount(PATH + "/static", WithSecurityHeaders(StaticFiles(directory=STATIC)), name="inspector-static")
    return True


class WithSecurityHeaders:
    """ASGI wrapper: every answer of ``app``, its errors included, carries SECURITY_HEADERS
    (those it set itself are replaced)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
            await send(message)

        try:
            await self.app(scope, receive, with_headers)
        except HTTPException as exc:  # StaticFiles' 404 and 405, answered here rather than by the app
            await PlainTextResponse(str(exc.detail), status_code=exc.status_code, headers=exc.headers)(
                scope, receive, with_headers)
