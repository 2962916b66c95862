"""Errors the public API turns into clear 4xx answers."""

import reprlib


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


PREVIEW_CHARS = 100  # the most of a caller's bad input an error message quotes

_SHORT = reprlib.Repr(maxlevel=3, maxdict=8, maxlist=8, maxtuple=8, maxset=8, maxstring=PREVIEW_CHARS,
                      maxother=PREVIEW_CHARS)


def preview(value: object, limit: int = PREVIEW_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters: enough to recognise a bad input, never an
    echo of a large one. Bounded work whatever the size of ``value``, and always valid
    Unicode (repr escapes lone surrogates), so an answer quoting it can always be encoded."""
    if isinstance(value, str):
        text = repr(value[: limit + 1])
    elif isinstance(value, int) and value.bit_length() > 4 * limit:
        text = f"<an integer of {value.bit_length()} bits>"  # repr of a huge int is slow, or refused
    else:
        text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
