"""Errors the public API turns into clear 4xx answers."""

import reprlib

from memory_service.domain import secrets


class MemoryServiceError(Exception):
    """Base class: every error here carries a sentence meant for the caller."""

    status_code = 400

    def headers(self) -> dict[str, str]:
        """Headers the answer carries besides the JSON error."""
        return {}


class InvalidInput(MemoryServiceError, ValueError):
    """The caller sent something malformed; nothing was stored."""

    status_code = 422


class Unauthorized(MemoryServiceError):
    """No key, a malformed one, an unknown one or a revoked one: the same answer for each."""

    status_code = 401

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="memory-service"'}


class Forbidden(MemoryServiceError):
    """A valid key whose agents, users or role do not cover the request."""

    status_code = 403


class PayloadTooLarge(MemoryServiceError):
    """A request that holds more than a limit allows (a batch of too many messages)."""

    status_code = 413


class RateLimited(MemoryServiceError):
    """A key's requests or recorded tokens per minute are spent."""

    status_code = 429

    def __init__(self, message: str, retry_after_seconds: int):
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_seconds)}


class NotFound(MemoryServiceError, LookupError):
    status_code = 404


class Conflict(MemoryServiceError):
    """The request contradicts what is stored (e.g. a session owned by another agent)."""

    status_code = 409


def session_taken(session_id: str) -> Conflict:
    """The one answer to recording into a session the caller may not record into: another
    agent's, or (for a key limited to users) one other users started. It names no one."""
    return Conflict(f"session {preview(session_id)} belongs to another agent or, for a key limited to some users, to "
                    "other users; choose another session_id")


class NotSupported(MemoryServiceError):
    """The agent's store cannot do what was asked (the Mongo backend keeps no knowledge graph).

    409, not 501: the request is well formed and the server works; the agent's configuration
    (its backend) is what stands in the way, and changing it is the caller's remedy."""

    status_code = 409


class BackendUnavailable(MemoryServiceError):
    status_code = 503


class FormationPending(MemoryServiceError):
    """A formation did not finish in time or failed; the window stays pending."""

    status_code = 503


PREVIEW_CHARS = 100  # the most of a caller's bad input an error message quotes

_SHORT = reprlib.Repr(maxlevel=3, maxdict=8, maxlist=8, maxtuple=8, maxset=8, maxstring=PREVIEW_CHARS,
                      maxother=PREVIEW_CHARS)


# How far past the quoted part a secret is looked for: one cut in two is still found whole.
PREVIEW_SECRET_MARGIN = 512


def preview(value: object, limit: int = PREVIEW_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters: enough to recognise a bad input, never an
    echo of a large one, nor of a secret in it (redacted whatever the agent's policy:
    memory_service/domain/secrets.py). Bounded work whatever the size of ``value``, and
    always valid Unicode (repr escapes lone surrogates), so an answer quoting it can always
    be encoded."""
    if isinstance(value, str):
        text = repr(_redacted(value, limit)[: limit + 1])
    elif isinstance(value, int) and value.bit_length() > 4 * limit:
        text = f"<an integer of {value.bit_length()} bits>"  # repr of a huge int is slow, or refused
    else:
        text = _SHORT.repr(_without_secrets(value, limit))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _redacted(text: str, limit: int) -> str:
    return secrets.redact(text[: limit + PREVIEW_SECRET_MARGIN]).text


def _without_secrets(value: object, limit: int, depth: int = 0) -> object:
    """``value`` with the strings it holds redacted, as far as ``_SHORT`` shows it (a request
    body quoted whole: a field missing from a message that holds a key)."""
    if isinstance(value, str):
        return _redacted(value, limit)
    if depth >= _SHORT.maxlevel:
        return value
    if isinstance(value, dict):
        return {_without_secrets(k, limit, depth + 1): _without_secrets(v, limit, depth + 1)
                for k, v in list(value.items())[: _SHORT.maxdict + 1]}
    if isinstance(value, (list, tuple)):
        items = [_without_secrets(v, limit, depth + 1) for v in value[: _SHORT.maxlist + 1]]
        return items if isinstance(value, list) else tuple(items)
    return value
