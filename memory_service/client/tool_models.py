"""The memory tools' answers: the service's own models (memory_service/curation.py)."""

from __future__ import annotations

from ..curation import DeletedOut as DeletedMemory
from ..curation import MemoryRecord

__all__ = ["DeletedMemory", "MemoryRecord"]
