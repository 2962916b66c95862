"""A typed client of the memory-service HTTP API, async and sync, with the same methods:
the session loop (record, form, context, search), the memory tools, agents, shards, startup
records, keys, audit, erasure and export. Answers are the service's own wire models
(memory_service.schemas). It imports nothing of the server, so `pip install memory-service`
(httpx and pydantic) is all it needs. See docs/client.md."""

from memory_service.client._async.client import AsyncMemoryClient
from memory_service.client._sync.client import MemoryClient
from memory_service.client.errors import (
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
from memory_service.client.tool_models import CorrectionOut, DeletedMemory, MemoryRecord, UncorrectedOut, WriteBlocksOut
from memory_service.domain.models import keyed_memory_id
from memory_service.schemas.startup import DeletedStartupRecord, StartupBlock, StartupRecord

__all__ = [
    "AsyncMemoryClient", "MemoryClient", "MemoryApiError", "InvalidRequest", "AuthenticationError", "PermissionDenied",
    "NotFoundError", "ConflictError", "RateLimitError", "ServerError", "ServiceUnavailable", "MemoryRecord",
    "DeletedMemory", "CorrectionOut", "UncorrectedOut", "StartupRecord", "StartupBlock", "DeletedStartupRecord",
    "WriteBlocksOut", "keyed_memory_id",
]
