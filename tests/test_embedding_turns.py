"""Turns at the local model (memory_service/embedding/turns.py): a caller someone waits for
goes before the backlog's next run; the backlog's texts run in small runs, so that caller
waits at most one of them. The local model itself, on real texts."""

from __future__ import annotations

import asyncio
import time

import pytest

from memory_service.embedding.embedders import LocalEmbedder
from memory_service.embedding.turns import Turns, backlog, is_backlog


async def test_a_waiting_caller_goes_before_the_backlog_waiting_longer():
    turns, order = Turns(), []
    release = asyncio.Event()

    async def hold() -> None:
        async with turns.take(backlog=True):
            await release.wait()

    async def take(name: str, is_backlog_run: bool) -> None:
        async with turns.take(backlog=is_backlog_run):
            order.append(name)

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(take("backlog 1", True)), asyncio.create_task(take("backlog 2", True))]
    await asyncio.sleep(0)
    waiters.append(asyncio.create_task(take("query", False)))
    await asyncio.sleep(0)
    assert turns.waiting() == 3
    release.set()
    await asyncio.gather(holder, *waiters)
    assert order == ["query", "backlog 1", "backlog 2"]
    assert turns.waiting() == 0 and not turns._busy


async def holder_and_two_waiters(turns: Turns, order: list[str], backlog: bool):
    """A holder of the turn (until its event is set) and two waiters in line, "gone" first:
    (the holder's release, the holder, gone, kept)."""
    release = asyncio.Event()

    async def hold() -> None:
        async with turns.take(backlog=backlog):
            await release.wait()

    async def take(name: str) -> None:
        async with turns.take(backlog=backlog):
            order.append(name)

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    gone, kept = asyncio.create_task(take("gone")), asyncio.create_task(take("kept"))
    await asyncio.sleep(0)
    return release, holder, gone, kept


async def test_a_cancelled_waiter_gives_its_turn_on():
    turns, order = Turns(), []
    release, holder, gone, kept = await holder_and_two_waiters(turns, order, backlog=False)
    gone.cancel()
    release.set()
    await holder
    await kept
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert order == ["kept"] and not turns._busy


async def test_a_waiter_cancelled_after_the_holder_passed_it_by_raises_only_its_cancellation():
    """The holder lets go first (its hand-on skips the cancelled waiter and gives the turn
    on), then the cancelled waiter runs: it finds itself gone from the line already."""
    turns, order = Turns(), []
    release, holder, gone, kept = await holder_and_two_waiters(turns, order, backlog=True)
    release.set()  # the holder wakes first ...
    gone.cancel()  # ... then the cancelled waiter
    await holder
    await kept
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert order == ["kept"] and not turns._busy and turns.waiting() == 0


def test_backlog_marks_the_calls_made_inside_only():
    assert not is_backlog()
    with backlog():
        assert is_backlog()
    assert not is_backlog()


def test_runs_pad_little_and_hold_at_most_the_run_budget():
    embedder = LocalEmbedder(batch_size=32)
    lengths = [256, 12, 256, 40, 9, 200, 11, 256]
    runs = embedder.runs(lengths)
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
    for run in runs:  # a run pads to its longest text
        assert len(run) <= embedder.batch_size
        assert len(run) == 1 or len(run) * max(lengths[i] for i in run) <= embedder.RUN_TOKENS
    assert [lengths[i] for i in runs[0]] == [9, 11, 12, 40]  # the short ones share a run
    assert LocalEmbedder(batch_size=2).runs([5] * 5) == [[0, 1], [2, 3], [4]]


async def test_the_local_model_serves_a_query_between_two_runs_of_the_backlog():
    embedder = LocalEmbedder()
    await embedder.start()
    try:
        long_turns = [f"turn {i}: " + "we talked about the garden, the tomatoes and the rain " * 30 for i in range(12)]
        alone = await embedder.embed(long_turns[:1])
        done: dict[str, float] = {}

        async def timed(name: str, texts: list[str]) -> list[list[float]]:
            vectors = await embedder.embed(texts)
            done[name] = time.perf_counter()
            return vectors

        with backlog():
            bulk = asyncio.create_task(timed("backlog", long_turns))
        await asyncio.sleep(0.05)  # the backlog is running
        query = await timed("query", ["what grows in the garden?"])
        vectors = await bulk
        assert len(vectors) == 12 and len(query[0]) == embedder.dimension
        assert vectors[0] == pytest.approx(alone[0], abs=1e-5)  # the same vector, whatever the run
        # The query did not wait for the whole backlog (one queue would have served it last).
        assert done["query"] < done["backlog"]
    finally:
        await embedder.aclose()


async def test_the_embedding_job_and_the_backfill_are_the_backlog(settings):
    """What the embedding job and the backfill embed gives way to other callers."""
    from memory_service.domain.models import Memory, MemoryKind, Provenance
    from memory_service.domain.namespaces import Namespace
    from memory_service.embedding.embedders import HashEmbedder
    from memory_service.runtime import open_service

    from .helpers import T0

    seen: list[bool] = []

    class Watching(HashEmbedder):
        async def embed(self, texts, *, query=False):
            seen.append(is_backlog())
            return await super().embed(texts, query=query)

    async with open_service(settings, run_worker=False) as service:
        _, backend = await service.agents.backend_for("a1")
        session = Namespace.session("s1")

        async def unembedded(first: int) -> None:
            await backend.write([Memory(id=f"m{i}", kind=MemoryKind.MESSAGE, namespace=str(session), content=f"note {i}",
                                        metadata=Provenance(agent_id="a1", session_id="s1"), valid_at=T0)
                                 for i in range(first, first + 3)])

        service.pipeline.embedder = Watching(64)
        await unembedded(0)
        assert (await service.pipeline.embed_pending("a1"))["embedded"] == 3
        await unembedded(3)
        assert (await service.pipeline.backfill_embeddings())["embedded"] == 3
        assert seen and all(seen)


def test_a_loop_that_ends_holding_a_turn_leaves_the_model_to_the_other_loops():
    """Turns are per event loop: a thread's loop closed while one of its calls held the
    model's turn does not make every later caller, on another loop, wait for ever."""
    embedder = LocalEmbedder()
    dead = asyncio.new_event_loop()
    held = asyncio.Event()

    async def hold_a_turn() -> None:
        async with embedder._turns_of(asyncio.get_running_loop()).take(backlog=False):
            held.set()
            await asyncio.sleep(3600)

    dead.run_until_complete(embedder.start())
    task = dead.create_task(hold_a_turn())
    dead.run_until_complete(held.wait())
    dead.close()  # the task never lets go of its turn
    del task

    async def embed_elsewhere() -> list[list[float]]:
        return await asyncio.wait_for(embedder.embed(["the ferry leaves at nine"]), 60)

    try:
        assert len(asyncio.run(embed_elsewhere())[0]) == embedder.dimension
    finally:
        asyncio.run(embedder.aclose())
