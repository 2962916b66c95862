"""What the async and the sync client share: paths, bodies, retry delays, answers parsed
into the service's own models. Nothing here does I/O."""

from __future__ import annotations

import email.utils
import enum
import time
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from memory_service.client.errors import MemoryApiError, error_for

T = TypeVar("T")

DEFAULT_TIMEOUT = 150.0  # seconds: POST /form waits up to FORM_WAIT_SECONDS (120 by default) for the worker
DEFAULT_MAX_RETRIES = 3
DEFAULT_MAX_RETRY_WAIT = 30.0  # the longest one wait may be, whatever Retry-After asks
BACKOFF_BASE = 0.5  # without a Retry-After: 0.5, 1, 2, ... seconds, capped like it

_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def parse(shape: Any, response: httpx.Response) -> Any:
    """The answer's JSON as ``shape`` (a model or e.g. ``list[Shard]``)."""
    adapter = _ADAPTERS.get(shape)
    if adapter is None:
        adapter = _ADAPTERS[shape] = TypeAdapter(shape)
    return adapter.validate_json(response.content)


def seg(value: str) -> str:
    """One path segment, escaped: an id can never reach another route."""
    return quote(value, safe="")


class Unset(enum.Enum):
    """A field not given: left out of a partial update (where None clears it)."""

    UNSET = "UNSET"


UNSET = Unset.UNSET


def body(**fields: Any) -> dict[str, Any]:
    """A JSON body of the fields given (None: left out, the service's default applies)."""
    return {name: value for name, value in fields.items() if value is not None}


def patch(**fields: Any) -> dict[str, Any]:
    """A partial update's body: every field but the UNSET ones, None included (it clears)."""
    return {name: value for name, value in fields.items() if value is not UNSET}


def query_params(**fields: Any) -> dict[str, Any]:
    """Query parameters of the fields given; datetimes as ISO 8601, lists repeated."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if value is None:
            continue
        if hasattr(value, "isoformat"):
            value = value.isoformat()
        elif isinstance(value, bool):
            value = "true" if value else "false"
        out[name] = value
    return out


def retry_after(response: httpx.Response) -> float | None:
    """Seconds the answer's Retry-After asks for (delay-seconds or an HTTP date), if any."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def retry_delay(response: httpx.Response, attempt: int, cap: float) -> float:
    """How long to wait before attempt ``attempt + 1``: Retry-After when given, else an
    exponential backoff; never more than ``cap``."""
    asked = retry_after(response)
    return min(cap, asked if asked is not None else BACKOFF_BASE * 2**attempt)


def retryable(response: httpx.Response, idempotent: bool) -> bool:
    """429 is answered before the request runs (rate limits are checked first), so any call
    may be sent again; after a 503 only a call that is safe to repeat is."""
    return response.status_code == 429 or (response.status_code == 503 and idempotent)


def failure(response: httpx.Response) -> MemoryApiError:
    return error_for(response, retry_after(response))
