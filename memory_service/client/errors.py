"""The client's errors: one class per family of answers, each carrying the status and the
service's own sentence (``detail``)."""

from __future__ import annotations

import httpx


class MemoryApiError(Exception):
    """The API answered an error. ``status`` is the HTTP status, ``detail`` the service's
    sentence saying what was wrong (which field, which limit, which key)."""

    def __init__(self, status: int, detail: str, *, method: str = "", path: str = "", retry_after: float | None = None):
        super().__init__(f"{status} {method} {path}: {detail}".replace("  ", " "))
        self.status = status
        self.detail = detail
        self.method = method
        self.path = path
        self.retry_after = retry_after  # seconds, from the answer's Retry-After (429, 503)


class InvalidRequest(MemoryApiError):
    """400, 413 or 422: malformed input; nothing was stored."""


class AuthenticationError(MemoryApiError):
    """401: no key, or a malformed, unknown or revoked one."""


class PermissionDenied(MemoryApiError):
    """403: a valid key whose agents, users or role do not cover the request (or memory
    writes that the operator has not turned on for the agent)."""


class NotFoundError(MemoryApiError):
    """404: no such session, agent, key or memory (or one of another agent: the same answer)."""


class ConflictError(MemoryApiError):
    """409: the request contradicts what is stored."""


class RateLimitError(MemoryApiError):
    """429: the key's requests or tokens per minute are spent; ``retry_after`` says when to
    come back. Raised once the client's retries are spent."""


class ServerError(MemoryApiError):
    """5xx."""


class ServiceUnavailable(ServerError):
    """503: a store is down or overloaded, or a formation did not finish in time; raised once
    the client's retries are spent (or at once for a call that is not retried)."""


_BY_STATUS: dict[int, type[MemoryApiError]] = {
    400: InvalidRequest, 413: InvalidRequest, 422: InvalidRequest, 401: AuthenticationError, 403: PermissionDenied,
    404: NotFoundError, 409: ConflictError, 429: RateLimitError, 503: ServiceUnavailable,
}
DETAIL_CHARS = 2_000  # of an answer that is not the service's JSON (a proxy's page): enough to see what it is


def error_for(response: httpx.Response, retry_after: float | None = None) -> MemoryApiError:
    """The exception for an error answer."""
    status = response.status_code
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else MemoryApiError)
    return kind(status, _detail(response), method=response.request.method, path=response.request.url.path,
                retry_after=retry_after)


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:DETAIL_CHARS] or response.reason_phrase
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):
        return detail
    return str(detail if detail is not None else body)[:DETAIL_CHARS]
