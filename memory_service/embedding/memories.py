"""Memories given their embedding before they are written: the one step every write path
takes (formation, consolidation, the memory tools, the legacy import, the backfill).

Each vector carries the name of the model that made it (``Memory.embedding_model``): the
stores keep it beside the vector, and search compares a query only with vectors of its own
model (docs/embeddings.md, "Changing the model").

A failing embedder never fails a write: the memory is stored without its vector and the
backfill embeds it later, so this step logs and carries on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from memory_service.domain.models import Memory
from memory_service.embedding.embedders import Embedder

log = logging.getLogger(__name__)


async def embed_memories(embedder: Embedder | None, memories: Sequence[Memory]) -> int:
    """Give memories their embedding before they are written; how many got one.

    A failing embedder is logged and leaves them without (0): they are stored anyway and the
    backfill (the worker's cron job, ``memory-service backfill-embeddings``) embeds them later.
    """
    todo = [m for m in memories if m.embedding is None]
    if embedder is None or not todo:
        return 0
    try:
        vectors = await embedder.embed([m.search_text for m in todo])
    except Exception as exc:
        log.warning("could not embed %d memories; they stay stored without, for the backfill: %s", len(todo), exc)
        return 0
    for memory, vector in zip(todo, vectors):
        memory.embedding, memory.embedding_model = list(vector), embedder.name
    return len(todo)
