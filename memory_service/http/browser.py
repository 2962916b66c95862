"""What keeps a web page in the developer's browser from driving the service.

A keyless server on loopback (API_AUTH=auto, docs/limits.md) trusts every caller, and a
browser is a caller on loopback: any page it shows can send requests to 127.0.0.1. The
same-origin policy stops the page from *reading* the answers, not from *sending*, and
two kinds of request get through without the browser asking first (a CORS preflight,
which this service refuses unless CORS_ALLOW_ORIGINS says otherwise):

* **Simple cross-site requests**: a POST whose body is ``text/plain``,
  ``multipart/form-data`` or ``application/x-www-form-urlencoded``, or has no body at all,
  is sent without a preflight. So a body must be ``application/json`` (415 otherwise),
  which no page can send to another origin without the preflight; and a POST, PUT, PATCH
  or DELETE that carries an ``Origin`` header (browsers add it to every such request from
  another origin) must come from this server's own origin or one CORS_ALLOW_ORIGINS
  lists (403 otherwise): that covers the bodiless POSTs (``.../form``) too.
* **DNS rebinding**: a page at ``attacker.example`` whose name the attacker re-points at
  127.0.0.1 is same-origin with itself, so the browser lets it read every answer. Its
  requests still say ``Host: attacker.example``. So the ``Host`` header must name the
  server (421 otherwise): ALLOWED_HOSTS if set, else, on a loopback bind, the loopback
  names (``localhost``, ``127.0.0.1``, ``::1``, the bound address), with any port. A
  server bound to another address requires keys (no page holds one) and takes any
  ``Host`` unless ALLOWED_HOSTS lists them: behind a proxy or in a cluster the name it
  is reached by is not known here.

Every route is covered, the inspector and the health probes included: the checks run as
ASGI middleware before routing, and never read the body.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from memory_service.access.authorization import is_loopback
from memory_service.domain.errors import preview

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
JSON_MEDIA_TYPE = "application/json"


def allowed_hosts(configured: Sequence[str], bound: str | None) -> frozenset[str] | None:
    """The host names the ``Host`` header may carry (lower case, no port); None: any."""
    if configured:
        names = {_bare(name) for name in configured}
        return None if "*" in names else frozenset(names)
    if bound is not None and is_loopback(bound):
        return frozenset({*LOOPBACK_NAMES, _bare(bound)})
    return None


def host_name(header: str) -> str:
    """The name in a ``Host`` header, lower case, without its port (``[::1]:8080`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() and ":" not in name else header


def _bare(name: str) -> str:
    name = name.strip().lower()
    try:
        return str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        return host_name(name)


def _has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    return "transfer-encoding" in headers or (length is not None and length.strip() not in ("", "0"))


def _is_json(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == JSON_MEDIA_TYPE


class BrowserGuard:
    """ASGI middleware: the three checks of the module's docstring, in the order Host, Origin, body type."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None, cors_origins: Sequence[str] = ()):
        self.app = app
        self.hosts = hosts
        self.cors_origins = frozenset(origin.rstrip("/").lower() for origin in cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope["method"], headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, detail = refusal
        await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)

    def _refusal(self, method: str, headers: Headers) -> tuple[int, str] | None:
        host = headers.get("host", "")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return 421, (f"this server does not answer for the host {preview(host, 60)!r}: it answers for "
                         f"{', '.join(sorted(self.hosts))} (ALLOWED_HOSTS)")
        if method not in UNSAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and not self._same_or_allowed(origin, host):
            return 403, (f"a {method} from the browser origin {preview(origin, 60)!r} is refused: only this "
                         "server's own origin and CORS_ALLOW_ORIGINS may send one")
        if _has_body(headers) and not _is_json(headers.get("content-type")):
            sent = headers.get("content-type")
            return 415, (f"the body's Content-Type is {preview(sent, 40)!r}; request bodies must be "
                         f"{JSON_MEDIA_TYPE!r}" if sent else
                         f"the body has no Content-Type; request bodies must be {JSON_MEDIA_TYPE!r}")
        return None

    def _same_or_allowed(self, origin: str, host: str) -> bool:
        if origin.rstrip("/").lower() in self.cors_origins:
            return True
        parts = urlsplit(origin.strip())
        return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc.lower() == host.strip().lower()
