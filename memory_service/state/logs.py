"""One log format for the service, uvicorn and arq: text or JSON lines, each with its request id.

``configure`` sets up the root logger once per process (``serve``, ``worker``, ``mcp``):
LOG_FORMAT=text is ``<time> <LEVEL> <logger> [<request id>]: <message>``, LOG_FORMAT=json one
object per line (``ts``, ``level``, ``logger``, ``message``, ``request_id``, ``trace_id``,
and ``exc`` for a traceback). uvicorn is started without a logging configuration of its
own (``log_config=None``), so its lines, the access log among them, go through the same
handler.

The request id lives in a context variable that the HTTP middleware
(memory_service/http/telemetry.py) sets for the whole request: every line logged while the
request is served, the access log line included (uvicorn writes it from the request's own
task), carries it. ``REQUEST_ID_HEADER`` is read from the caller when it is a safe token
(``valid_request_id``) and made otherwise.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from contextvars import ContextVar

from memory_service.state import tracing

REQUEST_ID_HEADER = "X-Request-ID"
MAX_REQUEST_ID_CHARS = 128
# Letters, digits and - _ . : / + = (UUIDs, ULIDs, trace ids, base64): nothing that could
# break a log line or a header (no spaces, quotes, control characters).
_SAFE = re.compile(r"^[A-Za-z0-9._:/+=-]+$")

request_id: ContextVar[str | None] = ContextVar("memory_service_request_id", default=None)


def valid_request_id(value: str | None) -> str | None:
    """``value`` if it is a request id this service will repeat, else None."""
    if value and len(value) <= MAX_REQUEST_ID_CHARS and _SAFE.match(value):
        return value
    return None


def new_request_id() -> str:
    return secrets.token_hex(16)


class RequestContext(logging.Filter):
    """Puts the request id (and trace id) of the current request on every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        record.trace_id = tracing.current_trace_id()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("request_id", "trace_id"):
            if (value := getattr(record, key, None)) is not None:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(rid)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        rid = getattr(record, "request_id", None)
        record.rid = f" [{rid}]" if rid else ""
        return super().format(record)


def configure(level: str = "info", fmt: str = "text") -> None:
    """The root logger's one handler, in ``fmt`` (text or json), at ``level``; uvicorn's
    and arq's loggers hand their lines to it."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestContext())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "arq"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
