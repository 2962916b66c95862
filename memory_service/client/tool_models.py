"""The memory tools' answers: the service's own models (memory_service/curation/tools.py)."""

from __future__ import annotations

from memory_service.curation.tools import DeletedOut as DeletedMemory
from memory_service.curation.tools import MemoryRecord

__all__ = ["DeletedMemory", "MemoryRecord"]
