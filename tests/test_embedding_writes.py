"""Writes while the embedder is down, the backfill, and a dimension mismatch at start: the
real service against a real OpenAI-compatible embeddings server on loopback."""

from __future__ import annotations

import pytest

from memory_service.domain.models import MemoryKind
from memory_service.runtime import open_service

from .conftest import suite_settings
from .helpers import msg, record_all, wait_embedded


async def unembedded(service, agent_id: str) -> list[str]:
    _, backend = await service.agents.backend_for(agent_id)
    return sorted(m.metadata.message_ids[0] for m in await backend.unembedded(agent_id, 1000))


async def test_a_down_embedder_loses_no_write_and_the_backfill_embeds_later(remote_service, embeddings):
    service = remote_service
    embeddings.down = True
    await record_all(service, "s1", "a1", [("alice", "user", f"Note {i}: the spare key is under pot {i}.")
                                           for i in range(5)])
    assert await unembedded(service, "a1") == [f"s1-{i}" for i in range(5)]
    found = await service.search("a1", "spare key under pot 3")
    assert found.degraded and found.degraded[0].startswith("vector:")
    assert found.results[0].source_message_ids == ["s1-3"]  # full text finds it at once
    assert found.signals == ["fulltext"]

    summary = await service.form_memories("s1")  # formation too stores without vectors
    assert summary.formed and summary.memories["episode"] == 1
    _, backend = await service.agents.backend_for("a1")
    kinds = {m.kind for m in await backend.unembedded("a1", 1000)}
    assert kinds == {MemoryKind.MESSAGE, MemoryKind.EPISODE}

    report = await service.backfill_embeddings(batch=2)  # the embedder is still down
    assert report == {"embedded": 0, "failed_batches": 1}

    embeddings.down = False
    first = await service.backfill_embeddings(batch=2, limit=3)  # interrupted after 3 ...
    assert first["embedded"] == 3
    rest = await service.backfill_embeddings(batch=2)  # ... and resumed
    assert rest["embedded"] == 3 and await backend.unembedded("a1", 1000) == []
    found = await service.search("a1", "spare key under pot 3")
    assert found.degraded == [] and "vector" in found.results[0].explanation.signals


async def test_a_recovered_embedder_embeds_new_writes_after_the_record(remote_service, embeddings):
    before = embeddings.texts
    await remote_service.record_message("s1", msg("a1", "alice", "The wifi password is on the fridge."))
    await wait_embedded(remote_service, "a1")  # by the job the record enqueued (or the backfill cron)
    assert embeddings.texts > before


async def test_a_dimension_mismatch_fails_loudly_at_start(falkordb_url, settings):
    async with open_service(suite_settings(falkordb_url, embedding_dimension=64), run_worker=False) as service:
        await service.record_message("s1", msg("a1", "alice", "hello"))
    with pytest.raises(RuntimeError, match=r"gives 32-dimensional vectors, but this store holds 64-dimensional"):
        async with open_service(suite_settings(falkordb_url, embedding_dimension=32), run_worker=False):
            pass
    # The same dimension starts again, and what was stored is intact.
    async with open_service(suite_settings(falkordb_url, embedding_dimension=64), run_worker=False) as service:
        assert (await service.search("a1", "hello")).results[0].content == "alice: hello"
