"""The memory tools' answers: the service's own wire models (memory_service/schemas/memories.py),
under the names the client gives them."""

from __future__ import annotations

from memory_service.schemas.memories import CorrectionOut, MemoryRecord, UncorrectedOut, WriteBlocksOut
from memory_service.schemas.memories import DeletedOut as DeletedMemory

__all__ = ["CorrectionOut", "DeletedMemory", "MemoryRecord", "UncorrectedOut", "WriteBlocksOut"]
