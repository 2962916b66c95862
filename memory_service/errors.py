"""Errors the public API turns into clear 4xx answers."""


class MemoryServiceError(Exception):
    """Base class: every error here carries a sentence meant for the caller."""

    status_code = 400


class InvalidInput(MemoryServiceError, ValueError):
    """The caller sent something malformed; nothing was stored."""

    status_code = 422


class NotFound(MemoryServiceError, LookupError):
    status_code = 404


class Conflict(MemoryServiceError):
    """The request contradicts what is stored (e.g. a session owned by another agent)."""

    status_code = 409


class BackendUnavailable(MemoryServiceError):
    status_code = 503


class FormationPending(MemoryServiceError):
    """A formation did not finish in time or failed; the window stays pending."""

    status_code = 503
