"""A typed client of the memory-service HTTP API, async and sync, with the same methods:
the session loop (record, form, context, search), the memory tools, agents, shards, startup
records, keys, audit, erasure and export. Answers are the service's own models. See docs/client.md."""

from ..startup import DeletedStartupRecord, StartupBlock, StartupRecord
from ._async.client import AsyncMemoryClient
from ._sync.client import MemoryClient
from .errors import (
                     AuthenticationError,
                     ConflictError,
                     InvalidRequest,
                     MemoryApiError,
                     NotFoundError,
                     PermissionDenied,
                     RateLimitError,
                     ServerError,
                     ServiceUnavailable,
)
from .tool_models import DeletedMemory, MemoryRecord

__all__ = [
    "AsyncMemoryClient", "MemoryClient", "MemoryApiError", "InvalidRequest", "AuthenticationError", "PermissionDenied",
    "NotFoundError", "ConflictError", "RateLimitError", "ServerError", "ServiceUnavailable", "MemoryRecord",
    "DeletedMemory", "StartupRecord", "StartupBlock", "DeletedStartupRecord",
]
